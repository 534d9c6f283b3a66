"""The memory's gauges for ``/metrics``: records (AMUs), open segments and unfinished jobs, and the
memory's per-user caches (search states held, their estimated bytes, user streams held).

The memory API has no counters of its own, so they are read from the store through a second,
read-only connection (SQLite WAL readers never wait for the writer, and the memory's lock is not
taken, so a scrape never delays a request). Open segments are the (user, session) pairs whose
stored turns no committed segment covers yet; counting them reads the uncovered turns of the
users that have any (:meth:`Store.backlog_users`, one grouped count), not every user's turns.
The caches' sizes come from the memory itself (``Memory.cache_gauges``), which reads them
without its lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from retrieval.memory.backends import open_store
from retrieval.memory.store_contract import Store


class StoreGauges:
    """Callable returning ``amus``, ``open_segments`` and ``unfinished_jobs`` of the store at
    ``target`` (a directory or a URL), with what ``caches`` returns."""

    def __init__(self, target: str | Path, caches: Callable[[], Mapping[str, float]]) -> None:
        self.target, self.caches = target, caches
        self._store: Store | None = None
        self._lock = threading.Lock()

    def __call__(self) -> dict[str, float]:
        with self._lock:
            if self._store is None:  # opened at the first scrape: the memory has created the store by then
                self._store = open_store(self.target, read_only=True)
            store = self._store
            open_segments = sum(len({turn.session_id for turn in store.uncovered_turns(user)})
                                for user in store.backlog_users())
            return {"amus": store.count(include_archived=False), "open_segments": open_segments,
                    "unfinished_jobs": len(store.unfinished()), **self.caches()}

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None
