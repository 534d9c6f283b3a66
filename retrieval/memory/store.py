"""The SQLite backend of the store contract (:mod:`retrieval.memory.store_contract`): the durable,
append-only AMU store in WAL mode, ``<directory>/amus.sqlite3``.

The store keeps the raw turns beside the records and records ingestion progress per
conversation: a segment's turns, its records and its progress row commit in one transaction, so
a crash loses at most the segment being processed. It also records which models built it
(:meth:`AMUStore.bind`: the fingerprinter whose codes it stores, the segmentation embedder, the
extractor), so a resumed run with other models is refused instead of mixing them.

:class:`AMUStore` is made of parts over one :class:`~retrieval.memory.connection.SQLiteConnection`
(one writer, a reader per thread, the writer lock per role, the schema check): the turn log
(:mod:`~retrieval.memory.turn_log`), record reads (:mod:`~retrieval.memory.reads`) and writes
(:mod:`~retrieval.memory.record_writes`), evidence indexes (:mod:`~retrieval.memory.indexing`),
the vector cache (:mod:`~retrieval.memory.cache`), jobs (:mod:`~retrieval.memory.job_rows`),
change markers (:mod:`~retrieval.memory.versions`), purge (:mod:`~retrieval.memory.purge`) and
meta entries (:mod:`~retrieval.memory.meta_rows`); the contract's methods are delegated to them
once for both backends (:class:`~retrieval.memory.delegation.StoreParts`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from retrieval.memory.cache import ArrayCache
from retrieval.memory.connection import DB_NAME, SQLiteConnection, missing_store
from retrieval.memory.delegation import StoreParts
from retrieval.memory.errors import StoreFault, StoreGone
from retrieval.memory.indexing import EvidenceReads
from retrieval.memory.job_rows import JobRows
from retrieval.memory.meta_rows import StoreMeta
from retrieval.memory.purge import Purge
from retrieval.memory.reads import StoreReads
from retrieval.memory.record_writes import RecordWrites
from retrieval.memory.schema import FOREIGN_OBJECT_HINT, SCHEMA_OBJECTS, schema_objects
from retrieval.memory.turn_log import TurnLog
from retrieval.memory.versions import StoreVersions, user_rows


class AMUStore(StoreParts):
    """Durable AMU store in ``<directory>/amus.sqlite3``; use as a context manager or call
    :meth:`close`. The methods are those of :class:`retrieval.memory.store_contract.Store`.

    Args:
        directory: the store directory (created when writable and missing).
        read_only: open without a lock and refuse writes (a missing store is an error).
        role: the writer role whose lock is held while open for writing ("ingest" by default,
            "consolidate" for the background worker).
    """

    DB_NAME = DB_NAME
    _purge: Purge  # the SQLite part, which knows whether a reader kept its last compaction from finishing

    def __init__(self, directory: str | Path, *, read_only: bool = False, role: str = "ingest") -> None:
        self.directory = Path(directory).absolute()  # a reader opened after a chdir opens this store
        self.path = self.directory / DB_NAME
        self.read_only = read_only
        self._connection = connection = SQLiteConnection(self.directory, read_only=read_only, role=role,
                                                         marker=user_rows)
        self._reads = StoreReads(connection)
        self._writes = RecordWrites(connection, self._reads)
        self._turns = TurnLog(connection)
        self._evidence = EvidenceReads(connection)
        self._cache = ArrayCache(connection)
        self._jobs = JobRows(connection)
        self._versions = StoreVersions(connection)
        self._purge = Purge(connection)
        self._meta = StoreMeta(connection)

    # -- the handle ------------------------------------------------------------------------------

    @property
    def location(self) -> str:
        """The database file (what the store's errors name)."""
        return str(self.path)

    @property
    def local_files(self) -> Path | None:
        return self.directory

    def reopen(self, *, read_only: bool = False, role: str = "ingest") -> AMUStore:
        """Another handle of this store, never a new store where this one was removed."""
        if (missing := missing_store(self.directory)) is not None:
            raise StoreGone(f"{missing}: the store was removed while this process had it open")
        return AMUStore(self.directory, read_only=read_only, role=role)

    @property
    def _db(self) -> sqlite3.Connection:
        """This thread's connection (raw SQL, for SQLite-level checks)."""
        return self._connection.db

    def _transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        return self._connection.transaction()

    def tracking(self, user_id: str) -> AbstractContextManager[list[tuple[Any, Any]]]:
        return self._connection.tracking(user_id)

    @contextmanager
    def transaction(self, users: Collection[str]) -> Iterator[None]:
        with self._connection.transaction():
            yield

    @property
    def concurrent_writers(self) -> bool:
        return False  # one writer process: the store directory's writer lock

    def ingestion_lock(self, user_id: str, *, wait: bool,
                       capped: bool = False) -> AbstractContextManager[bool]:
        return nullcontext(True)

    def job_lock(self, job_id: int) -> AbstractContextManager[bool]:
        return nullcontext(True)

    def integrity_problems(self) -> list[str]:
        """What SQLite's ``PRAGMA quick_check`` finds wrong with the store file, the tables,
        indexes and triggers of the schema that are missing, and those it holds that the schema
        has not or, for a trigger or view, holds otherwise (another program's: a trigger may keep
        what a purge removes) (empty: none)."""
        try:
            rows = [row[0] for row in self._db.execute("PRAGMA quick_check").fetchall()]
            present = self._db.execute("SELECT name, type, sql FROM sqlite_master ORDER BY name").fetchall()
        except StoreFault as err:  # damage bad enough to stop the check itself
            return [str(err.__cause__)]
        names = {name for name, _, _ in present}
        missing = [f"schema object {name!r} is missing" for name in SCHEMA_OBJECTS if name not in names]
        return [row for row in rows if row != "ok"] + missing + foreign_objects(present)

    def close(self) -> None:
        """Try again the compaction a reader kept from finishing, if the last one was, then close
        every connection (the readers of all threads too) and release the writer lock."""
        try:
            if self._connection.holds_writer and self._purge.kept_by_reader:
                self.compact()
        finally:
            self._connection.close()

    def __enter__(self) -> AMUStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def foreign_objects(present: list[tuple[str, str, str | None]]) -> list[str]:
    """The objects of ``sqlite_master`` (name, type, SQL) that a new store has not (``ANALYZE``'s
    ``sqlite_stat1`` aside: row counts only; ``sqlite_stat4``, where SQLite is built with it, holds
    samples of indexed values, which no delete removes), and the triggers and views whose SQL is
    not the schema's."""
    expected = schema_objects()
    problems = []
    for name, kind, sql in present:
        if name not in expected and name != "sqlite_stat1":
            problems.append(f"{kind} {name!r} is not the store's")
        elif name in expected and kind in ("trigger", "view") and (kind, sql) != expected[name]:
            problems.append(f"{kind} {name!r} is not the schema's: its SQL was changed")
    return [problem + FOREIGN_OBJECT_HINT for problem in problems]
