"""Draining writes on shutdown: a write that started finishes before the memory closes.

uvicorn answers SIGTERM by refusing new connections and waiting (up to its graceful timeout)
for in-flight requests; a write running in a worker thread cannot be cancelled, though, so the
memory is closed only once every write that entered the gate has left it. A write arriving
after shutdown began is refused (503), never half-done: a turn acknowledged with 200 was
committed before the answer was sent.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class ShuttingDown(RuntimeError):
    """The server is draining: the write was not started."""


class WriteGate:
    """Counts writes in progress; :meth:`close` stops new ones and waits for the rest."""

    def __init__(self) -> None:
        self._idle = threading.Condition()
        self._active = 0
        self._closed = False

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._idle:
            if self._closed:
                raise ShuttingDown("the server is shutting down; retry the write against its replacement")
            self._active += 1
        try:
            yield
        finally:
            with self._idle:
                self._active -= 1
                self._idle.notify_all()

    def close(self, timeout_s: float | None = None) -> bool:
        """Refuse new writes and wait for running ones; False if some still run after ``timeout_s``."""
        with self._idle:
            self._closed = True
            return self._idle.wait_for(lambda: self._active == 0, timeout_s)
