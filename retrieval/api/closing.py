"""The lock that serialises the calls on one :class:`retrieval.api.memory.Memory` and, once the
memory is closed, refuses them with :class:`StoreUnavailable` (instead of SQLite's error about a
closed database)."""

from __future__ import annotations

import threading

from retrieval.api.errors import StoreUnavailable


class CallLock:
    """A re-entrant lock that is unusable after :meth:`close`."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.closed = False

    def close(self) -> None:
        with self._lock:
            self.closed = True

    def __enter__(self) -> CallLock:
        self._lock.acquire()
        if self.closed:
            self._lock.release()
            raise StoreUnavailable("the memory is closed; open it again (Memory.open)")
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
