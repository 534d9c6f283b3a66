"""Building a search state without the cyclic garbage collector's passes.

A bank's build makes hundreds of thousands of objects that all live on (records, their tuples,
turns, nodes). CPython starts a collection by the count of objects allocated and not freed, so
such a build sets off collection after collection, and each full one walks every object of the
process, the loaded models' included: at 10,000 records most of the time of reading them back
went there. None of the build's objects forms a cycle, so nothing is left for a collection
to free; the collector is paused while it runs and resumes after (as it was: a caller that
had it off keeps it off). Concurrent builds share the pause: it ends with the last of them.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_paused = 0
_resume = False


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off for the block (see the module docstring)."""
    global _paused, _resume
    with _lock:
        if _paused == 0:
            _resume = gc.isenabled()
            gc.disable()
        _paused += 1
    try:
        yield
    finally:
        with _lock:
            _paused -= 1
            if _paused == 0 and _resume:
                gc.enable()
