"""Standard output that its reader going away does not end a training run through.

A run piped into ``| head -1`` (or a log reader that quits) loses its reader early: the next write
raises ``BrokenPipeError``, which the rich progress bar answers by exiting the process with status
1 and nothing saved. A run started with standard output closed (``>&-``, some job launchers) has
``sys.stdout`` None, on which the bar's first ``isatty()`` failed. Training owes its reader
nothing: here a broken pipe points descriptor 1 at ``/dev/null``, says so once on stderr, and the
run goes on to its checkpoints and export; a closed standard output is ``/dev/null`` from the start.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO


class SparedOutput:
    """``stream`` whose writes and flushes survive its reader's exit (the module docstring)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._gone = False

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._lost()
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._lost()

    def _lost(self) -> None:
        self._gone = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())  # the interpreter's last flush goes there too
        os.close(devnull)
        print("note: standard output's reader went away; the run goes on writing nothing there",
              file=sys.stderr, flush=True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def spared_stdout() -> Iterator[None]:
    """``sys.stdout`` spared for the block (:class:`SparedOutput`; ``/dev/null`` if closed), then
    as it was."""
    before = sys.stdout
    with contextlib.ExitStack() as stack:
        sys.stdout = (stack.enter_context(open(os.devnull, "w")) if before is None
                      else SparedOutput(before))  # type: ignore[assignment]
        try:
            yield
        finally:
            sys.stdout = before
