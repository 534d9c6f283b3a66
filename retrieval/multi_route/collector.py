"""The cyclic garbage collector and the search states: paused while a state is built, and, in
a serving process, kept from walking the states held.

A bank's build makes hundreds of thousands of objects that all live on (records, their tuples,
turns, nodes). CPython starts a collection by the count of objects allocated and not freed, so
such a build sets off collection after collection, and each full one walks every object of the
process, the loaded models' included: at 10,000 records most of the time of reading them back
went there. None of the build's objects forms a cycle, so nothing is left for a collection
to free; the collector is paused while it runs and resumes after (as it was: a caller that
had it off keeps it off). Concurrent builds share the pause: it ends with the last of them.

A serving process also keeps those objects out of the later full collections
(:class:`LongLivedFreezer`, installed by :func:`retrieval.service.launch.open_memory`). A full
collection walks every tracked object, so with 100 users' states held (1.7 million objects) each
one held the interpreter, and every request in flight, for 0.2 to 1 s, several times a minute
under load. After a full collection whose survivors outside the frozen generation number
:data:`FREEZE_OBJECTS` or more, they are frozen (``gc.freeze``): the next full collections walk
only what was made since. A frozen object is still freed when its last reference goes (the states
are acyclic: a dropped state goes at once); only a cycle among objects frozen while alive, which
dies later, waits until the frozen objects are walked again: the first full collection
:data:`THAW_SECONDS` or more after the last thaw thaws them (``gc.unfreeze``), and the next one
walks everything once.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

FREEZE_OBJECTS = 20_000
"""Survivors of a full collection (outside the frozen generation) from which a serving process
freezes them: a user's state of 760 records is ~8,500 objects, so two or three new states. The few
hundred request objects in flight when it freezes are frozen with them (until the thaw, if they
die in a cycle)."""
THAW_SECONDS = 600.0
"""How long a serving process keeps objects frozen before its next full collection thaws them, so
that the one after walks every object and frees the cycles that died frozen: one pause as long as
without the freezer every ten minutes or more, instead of several a minute."""

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


class LongLivedFreezer:
    """A ``gc.callbacks`` entry that freezes the survivors of full collections once they number
    ``objects`` or more, and thaws them at the first full collection ``thaw_s`` seconds or more
    after the last thaw (see the module docstring)."""

    def __init__(self, objects: int = FREEZE_OBJECTS, thaw_s: float = THAW_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.objects, self.thaw_s, self.clock = objects, thaw_s, clock
        self.thawed = clock()
        self.full_collections = 0
        """Full collections since installed, and the seconds they held the interpreter (freezing
        and thawing included): read by the service's ``/metrics``."""
        self.full_seconds = 0.0
        self._began = 0.0

    def install(self) -> LongLivedFreezer:
        """Run after every collection of this process, in place of a freezer installed before."""
        gc.callbacks[:] = [entry for entry in gc.callbacks if not isinstance(entry, LongLivedFreezer)]
        gc.callbacks.append(self)
        return self

    def remove(self) -> None:
        """Stop, and thaw what is frozen."""
        gc.callbacks[:] = [entry for entry in gc.callbacks if entry is not self]
        gc.unfreeze()

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._began = time.perf_counter()
            return
        now = self.clock()
        if now - self.thawed >= self.thaw_s:
            gc.unfreeze()  # the next full collection walks every object once
            self.thawed = now
        elif len(gc.get_objects(generation=2)) >= self.objects:
            gc.freeze()
        self.full_collections += 1
        self.full_seconds += time.perf_counter() - self._began


def installed_freezer() -> LongLivedFreezer | None:
    """The freezer this process runs, if any."""
    return next((entry for entry in gc.callbacks if isinstance(entry, LongLivedFreezer)), None)
