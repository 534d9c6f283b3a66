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
meta entries (:mod:`~retrieval.memory.meta_rows`); each public method is delegated to its part.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from retrieval.memory.cache import ArrayCache
from retrieval.memory.connection import DB_NAME, SQLiteConnection
from retrieval.memory.errors import StoreFault
from retrieval.memory.indexing import EvidenceNode, EvidenceReads
from retrieval.memory.job_rows import JobRow, JobRows
from retrieval.memory.meta_rows import StoreMeta
from retrieval.memory.purge import Purge, Purged
from retrieval.memory.reads import StoreReads
from retrieval.memory.record_writes import RecordWrites
from retrieval.memory.records import AMU, SegmentRecord, Turn
from retrieval.memory.schema import SCHEMA_OBJECTS
from retrieval.memory.turn_log import TurnLog
from retrieval.memory.versions import StoreVersions, user_rows


class AMUStore:
    """Durable AMU store in ``<directory>/amus.sqlite3``; use as a context manager or call
    :meth:`close`. The methods are those of :class:`retrieval.memory.store_contract.Store`.

    Args:
        directory: the store directory (created when writable and missing).
        read_only: open without a lock and refuse writes (a missing store is an error).
        role: the writer role whose lock is held while open for writing ("ingest" by default,
            "consolidate" for the background worker).
    """

    DB_NAME = DB_NAME

    def __init__(self, directory: str | Path, *, read_only: bool = False, role: str = "ingest") -> None:
        self.directory = Path(directory)
        self.path = self.directory / DB_NAME
        self.read_only = read_only
        self._connection = connection = SQLiteConnection(self.directory, read_only=read_only, role=role,
                                                         marker=user_rows)
        self._reads = StoreReads(connection)
        self._writes = RecordWrites(connection, self._reads)
        self._turn_log = TurnLog(connection)
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
        return AMUStore(self.directory, read_only=read_only, role=role)

    @property
    def _db(self) -> sqlite3.Connection:
        """This thread's connection (raw SQL, for SQLite-level checks)."""
        return self._connection.db

    def _transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        return self._connection.transaction()

    def tracking(self, user_id: str) -> AbstractContextManager[list[tuple[Any, Any]]]:
        return self._connection.tracking(user_id)

    @property
    def concurrent_writers(self) -> bool:
        return False  # one writer process: the store directory's writer lock

    def ingestion_lock(self, user_id: str, *, wait: bool) -> AbstractContextManager[bool]:
        return nullcontext(True)

    def integrity_problems(self) -> list[str]:
        """What SQLite's ``PRAGMA quick_check`` finds wrong with the store file, and the tables,
        indexes and triggers of the schema that are missing (empty: none)."""
        try:
            rows = [row[0] for row in self._db.execute("PRAGMA quick_check").fetchall()]
            present = {row[0] for row in self._db.execute("SELECT name FROM sqlite_master")}
        except StoreFault as err:  # damage bad enough to stop the check itself
            return [str(err.__cause__)]
        missing = [f"schema object {name!r} is missing" for name in SCHEMA_OBJECTS if name not in present]
        return [row for row in rows if row != "ok"] + missing

    def close(self) -> None:
        """Close every connection (the readers of all threads too) and release the writer lock."""
        self._connection.close()

    def __enter__(self) -> AMUStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- meta and binding ------------------------------------------------------------------------

    def meta(self, key: str) -> Any:
        return self._meta.meta(key)

    def put_meta(self, key: str, value: Any) -> None:
        self._meta.put_meta(key, value)

    def bind(self, key: str, value: Any, hint: str = "use a new store") -> None:
        self._meta.bind(key, value, hint)

    # -- records and segments --------------------------------------------------------------------

    def get(self, amu_id: str) -> AMU:
        return self._reads.get(amu_id)

    def amus(self, user_id: str | None = None, *, include_archived: bool = False) -> Iterator[AMU]:
        return self._reads.amus(user_id, include_archived=include_archived)

    def successors(self, user_id: str | None = None) -> dict[str, str]:
        return self._reads.successors(user_id)

    def by_segment(self, user_id: str, seq: int) -> list[AMU]:
        return self._reads.by_segment(user_id, seq)

    def count(self, user_id: str | None = None, *, include_archived: bool = True) -> int:
        return self._reads.count(user_id, include_archived=include_archived)

    def users_with_segments(self) -> list[str]:
        return self._reads.users_with_segments()

    def segment(self, user_id: str, seq: int) -> SegmentRecord | None:
        return self._reads.segment(user_id, seq)

    def segments(self, user_id: str) -> list[SegmentRecord]:
        return self._reads.segments(user_id)

    def turn(self, user_id: str, turn_id: str) -> Turn:
        return self._reads.turn(user_id, turn_id)

    def turns(self, user_id: str) -> list[Turn]:
        return self._reads.turns(user_id)

    def source_turns(self, amu: AMU) -> list[Turn]:
        return self._reads.source_turns(amu)

    def page(self, user_id: str, *, session_id: str | None = None, after: int = 0,
             limit: int = 50) -> list[tuple[int, AMU]]:
        return self._reads.page(user_id, session_id=session_id, after=after, limit=limit)

    def successor(self, amu_id: str) -> str | None:
        return self._reads.successor(amu_id)

    def commit_segment(self, record: SegmentRecord, turns: Sequence[Turn], amus: Sequence[AMU]) -> None:
        self._writes.commit_segment(record, turns, amus)

    def commit_segments(self,
                        segments: Sequence[tuple[SegmentRecord, Sequence[Turn], Sequence[AMU]]]) -> None:
        self._writes.commit_segments(segments)

    def commit_stored_turns(self, record: SegmentRecord, amus: Sequence[AMU]) -> None:
        self._writes.commit_stored_turns(record, amus)

    def replace_extraction(self, record: SegmentRecord, amus: Sequence[AMU]) -> None:
        self._writes.replace_extraction(record, amus)

    def archive(self, amu_ids: Iterable[str]) -> None:
        self._writes.archive(amu_ids)

    def forward(self, archived_ids: Sequence[str], merged: AMU, operation: str) -> bool:
        return self._writes.forward(archived_ids, merged, operation)

    # -- the turn log ----------------------------------------------------------------------------

    def append_turns(self, user: str, turns: Sequence[Turn], key: str | None = None) -> list[Turn]:
        return self._turn_log.append_turns(user, turns, key)

    def bind_turn_ids(self, user: str, session: str, turns: Sequence[Any]) -> list[Turn]:
        return self._turn_log.bind_turn_ids(user, session, turns)

    def idempotent_turn_ids(self, user: str, key: str) -> list[str] | None:
        return self._turn_log.idempotent_turn_ids(user, key)

    def stored_turn_ids(self, user: str, turn_ids: Sequence[str]) -> set[str]:
        return self._turn_log.stored_turn_ids(user, turn_ids)

    def session_turn_count(self, user: str, session_id: str) -> int:
        return self._turn_log.session_turn_count(user, session_id)

    def uncovered_turns(self, user: str) -> list[Turn]:
        return self._turn_log.uncovered_turns(user)

    def backlog(self, user: str, after: int | None = None) -> tuple[list[Turn], int]:
        return self._turn_log.backlog(user, after)

    def backlog_users(self) -> list[str]:
        return self._turn_log.backlog_users()

    def next_seq(self, user: str) -> int:
        return self._turn_log.next_seq(user)

    def users(self) -> list[str]:
        return self._turn_log.users()

    def has_user(self, user: str) -> bool:
        return self._turn_log.has_user(user)

    def has_session(self, user: str, session_id: str) -> bool:
        return self._turn_log.has_session(user, session_id)

    def speakers(self, user: str) -> tuple[str, ...]:
        return self._turn_log.speakers(user)

    # -- evidence, cache, jobs, versions, purge --------------------------------------------------

    def evidence_nodes(self, user_id: str, node_type: str | None = None) -> list[EvidenceNode]:
        return self._evidence.evidence_nodes(user_id, node_type)

    def node_links(self, amu_ids: Sequence[str]) -> list[tuple[EvidenceNode, str]]:
        return self._evidence.node_links(amu_ids)

    def cached(self, table: str, model: str, items: Iterable[str]) -> dict[str, bytes]:
        return self._cache.cached(table, model, items)

    def cache(self, table: str, model: str, blobs: Mapping[str, bytes]) -> None:
        self._cache.cache(table, model, blobs)

    def create_job(self, user: str, session_id: str | None, kind: str) -> tuple[JobRow, bool]:
        return self._jobs.create_job(user, session_id, kind)

    def update_job(self, job_id: int, state: str, progress: dict[str, Any] | None = None,
                   error: str | None = None) -> None:
        self._jobs.update_job(job_id, state, progress, error)

    def job_row(self, job_id: int) -> JobRow | None:
        return self._jobs.job_row(job_id)

    def unfinished(self) -> list[JobRow]:
        return self._jobs.unfinished()

    def data_version(self) -> int:
        return self._versions.data_version()

    def user_version(self, user_id: str) -> tuple[int, ...]:
        return self._versions.user_version(user_id)

    def purge(self, user: str, *, session_id: str | None = None, amu_ids: Sequence[str] = (),
              turn_ids: Sequence[str] = (), everything: bool = False) -> Purged:
        return self._purge.purge(user, session_id=session_id, amu_ids=amu_ids, turn_ids=turn_ids,
                                 everything=everything)

    def scrub(self, texts: Iterable[str]) -> None:
        self._purge.scrub(texts)

    def compact(self) -> None:
        self._purge.compact()
