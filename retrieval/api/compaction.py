"""The compaction a purge owes, run behind the delete that owed it.

A purge's rows are gone when its transaction commits: from that moment no search, get, list or
history of the memory returns them. Their trace in the store's files (FTS5 terms, the pages
SQLite rebalanced, the WAL's frames) goes with the compaction (:meth:`~retrieval.memory.
store_contract.Purging.compact`: on SQLite an FTS5 optimize, a ``VACUUM`` and a WAL truncation).
The ``VACUUM`` rewrites the whole file while it holds the store's writer, so it costs the size of
every user's data, not of what was deleted (4-6 s for an 810 MB store on the 2-core machine of
``docs/performance.md``), and every user's writes wait for it.

So a delete returns once its purge commits, and :class:`Compactions` runs the compaction on a
thread of its own: :data:`COMPACT_AFTER_S` after the first purge that owes one (the deletes
within that second share it), and never sooner after the last compaction ended than
:data:`COMPACT_SPACING` times as long as it took, so compactions hold the writer for at most about
a tenth of the time however often users delete. One that did not finish (another process held
an older snapshot of the store open, or the disk was full) is tried again :data:`COMPACT_RETRY_S`
later (sooner after another purge), and so on while none finishes. One owed when the memory
closes runs then; one a killed process owed runs when a writer opens the store
(:func:`compact_owed`). On PostgreSQL the compaction a purge owes is nothing (``VACUUM FULL`` is
the operator's ``retrieval.store compact``).
"""

from __future__ import annotations

import logging
import threading
import time

from retrieval.memory.errors import StoreFault
from retrieval.memory.faults import passing
from retrieval.memory.store_contract import Store

logger = logging.getLogger(__name__)

COMPACT_AFTER_S = 1.0
"""Seconds from a purge that owes a compaction to the compaction (the purges meanwhile share it)."""
COMPACT_SPACING = 9.0
"""A compaction starts no sooner after the last one ended than this many times the seconds that
one took: compactions hold the store's writer for at most 1 / (1 + this) of the time."""
COMPACT_RETRY_S = 60.0
"""Seconds from a compaction that did not finish to the next try (the spacing applies too): a
reader still holding its snapshot costs each try :data:`retrieval.memory.purge.CHECKPOINT_WAIT_S`
of the writer's time."""


def compact_owed(store: Store) -> bool:
    """Do the compaction a purge owes (:meth:`~retrieval.memory.store_contract.Purging.compact_owed`);
    whether none is owed afterwards. A store that cannot do it now (SQLite's VACUUM needs about
    the database's size free on its disk; a reader holds an older snapshot) keeps it owed, for
    the next try, purge, close or writing open, and the caller goes on: what was deleted is
    deleted, only its trace in free pages waits. Only a passing fault
    (:func:`retrieval.memory.faults.passing`: the disk's, another writer's) is borne so."""
    try:
        return store.compact_owed()
    except StoreFault as err:
        if not passing(err):  # a damaged store is reported, not left behind a warning
            raise
        logger.warning("the compaction a purge owes could not run; it stays owed: %s", err)
        return False


class Compactions:
    """Runs the store's owed compaction behind the purges (see the module docstring)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._changed = threading.Condition()
        self._due: float | None = None  # when the next compaction starts; None: none is owed
        self._rested = 0.0  # the earliest start the last compaction's spacing allows
        self._closed = False
        self._thread: threading.Thread | None = None

    def owed(self) -> None:
        """A purge committed that owes a compaction: one runs :data:`COMPACT_AFTER_S` from now
        (sooner if one is due sooner; a try again a minute away is brought forward), or when the
        spacing after the last one allows, whichever is later (a purge that commits while one
        runs owes the next)."""
        self._due_in(COMPACT_AFTER_S)

    def kept(self) -> None:
        """A compaction was just kept from finishing (a reader held the log, the disk was full):
        try again :data:`COMPACT_RETRY_S` from now, unless one is due sooner."""
        self._due_in(COMPACT_RETRY_S)

    def _due_in(self, seconds: float) -> None:
        with self._changed:
            due = time.monotonic() + seconds
            if self._closed or (self._due is not None and self._due <= due):
                return
            self._due = due
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="memory-compaction", daemon=True)
                self._thread.start()
            self._changed.notify()

    def close(self) -> None:
        """Stop the thread after the compaction it runs, then run one still owed here (a reader
        of the store leaves it to the writer)."""
        with self._changed:
            self._closed = True
            self._changed.notify()
        if self._thread is not None:
            self._thread.join()
        if not self._store.read_only:
            self._compact()

    def _run(self) -> None:
        while self._next():
            began = time.monotonic()
            done = self._compact()
            ended = time.monotonic()
            with self._changed:
                self._rested = ended + COMPACT_SPACING * (ended - began)
            if not done:
                self.kept()

    def _next(self) -> bool:
        """Wait until a compaction is due and the last one's spacing has passed (True) or the
        memory closes (False)."""
        with self._changed:
            while not self._closed:
                start = None if self._due is None else max(self._due, self._rested)
                now = time.monotonic()
                if start is not None and now >= start:
                    self._due = None
                    return True
                self._changed.wait(None if start is None else start - now)
            return False

    def _compact(self) -> bool:
        """The owed compaction; whether none is owed afterwards. What stops it is logged and the
        compaction stays owed, for the next try, purge, close or writing open; a damaged store
        too, which the open then refuses (:func:`compact_owed`) and which the memory's own reads
        meet where they touch it."""
        try:
            return compact_owed(self._store)
        except Exception:
            logger.exception("the compaction a purge owes failed; it stays owed")
            return False
