"""The memory's store on PostgreSQL: :class:`PostgresStore`, the SQLite store's API (same methods,
signatures, results, orderings and errors) over one database that any number of processes share.

It is composed of parts, one module each under :mod:`retrieval.memory.postgres`, mirroring the
SQLite store's: the turn log (``turn_log``), record reads (``reads``) and writes (``writes``),
evidence nodes (``evidence``), the array cache (``cache``), jobs (``jobs``), API keys (``keys``),
change markers (``versions``), the purge (``purge``) and the ``meta`` bindings (``meta``), over one
:class:`~retrieval.memory.postgres.database.Database` (the pool, write transactions and per-user
locks) and a schema brought up to date on open (``schema``).

Differences from the SQLite store: no writer lock file (``role`` is accepted and names nothing to
hold: several processes write, PostgreSQL serialises each user's writers); ``location`` is the URL
without its password and ``local_files`` is None (no directory on this machine); ``scrub`` cannot
rewrite the table files, :meth:`PostgresStore.compact` does (:mod:`retrieval.memory.postgres.purge`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from retrieval.memory.indexing import EvidenceNode
from retrieval.memory.job_rows import JobRow
from retrieval.memory.postgres.cache import ArrayCache
from retrieval.memory.postgres.database import Database
from retrieval.memory.postgres.evidence import Evidence
from retrieval.memory.postgres.jobs import Jobs
from retrieval.memory.postgres.keys import KeyRow, Keys
from retrieval.memory.postgres.meta import Meta
from retrieval.memory.postgres.purge import Purge
from retrieval.memory.postgres.reads import Reads
from retrieval.memory.postgres.schema import SCHEMA_OBJECTS, prepare
from retrieval.memory.postgres.turn_log import TurnLog
from retrieval.memory.postgres.versions import Versions
from retrieval.memory.postgres.writes import Writes
from retrieval.memory.purge import Purged
from retrieval.memory.records import AMU, SegmentRecord, Turn


class PostgresStore:
    """The store in the PostgreSQL database at ``url`` (``postgresql://USER[:PASSWORD]@HOST[:PORT]/DB``).

    Args:
        url: the database; its schema is created or migrated when opened for writing.
        read_only: refuse every write (a database without the schema is an error).
        role: the writer's role ("ingest", "consolidate"); kept for the SQLite store's signature.
    """

    def __init__(self, url: str, *, read_only: bool = False, role: str = "ingest") -> None:
        self.read_only, self.role, self._url = read_only, role, url
        self.db = Database(url, read_only=read_only)
        try:
            prepare(self.db)
        except BaseException:
            self.db.close()
            raise
        self._reads = Reads(self.db)
        self._turns = TurnLog(self.db)
        self._writes = Writes(self.db, self._reads)
        self._evidence = Evidence(self.db)
        self._cache = ArrayCache(self.db)
        self._jobs = Jobs(self.db)
        self._versions = Versions(self.db)
        self._purge = Purge(self.db)
        self._meta = Meta(self.db)
        self._keys = Keys(self.db)

    @property
    def location(self) -> str:
        """The URL without its password (what messages name)."""
        return self.db.where

    @property
    def local_files(self) -> Path | None:
        """None: the store keeps no files on this machine."""
        return None

    def reopen(self, *, read_only: bool = False, role: str = "ingest") -> PostgresStore:
        """Another handle (its own pool) on the same database."""
        return PostgresStore(self._url, read_only=read_only, role=role)

    def compact(self) -> None:
        """Rewrite every table of the store (``VACUUM FULL``), then ``CHECKPOINT``: afterwards no
        table file under the server's data directory holds a deleted row (the write-ahead log
        still may, until the server recycles it)."""
        self._purge.compact()

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def integrity_problems(self) -> list[str]:
        """The tables, indexes and triggers of the schema that are missing (empty: none)."""
        present = {row["name"] for row in self.db.rows(
            "SELECT relname AS name FROM pg_class WHERE relnamespace = current_schema()::regnamespace "
            "UNION SELECT tgname FROM pg_trigger WHERE NOT tgisinternal")}
        return [f"schema object {name!r} is missing" for name in SCHEMA_OBJECTS if name not in present]

    def tracking(self, user_id: str) -> AbstractContextManager[list[tuple[Any, Any]]]:
        return self.db.tracking(user_id)

    @property
    def concurrent_writers(self) -> bool:
        return True  # any number of server processes over one database

    def ingestion_lock(self, user_id: str, *, wait: bool) -> AbstractContextManager[bool]:
        return self.db.ingestion_lock(user_id, wait=wait)

    def data_version(self) -> int:
        return self._versions.data_version()

    def user_version(self, user_id: str) -> tuple[int, ...]:
        return self._versions.user_version(user_id)

    # -- meta ------------------------------------------------------------------------------------

    def meta(self, key: str) -> Any:
        return self._meta.meta(key)

    def put_meta(self, key: str, value: Any) -> None:
        self._meta.put_meta(key, value)

    def bind(self, key: str, value: Any, hint: str = "use a new store") -> None:
        self._meta.bind(key, value, hint)

    # -- writes ----------------------------------------------------------------------------------

    def commit_segment(self, record: SegmentRecord, turns: Sequence[Turn], amus: Sequence[AMU]) -> None:
        self._writes.commit_segments([(record, turns, amus)])

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

    # -- record reads ----------------------------------------------------------------------------

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

    # -- evidence nodes --------------------------------------------------------------------------

    def evidence_nodes(self, user_id: str, node_type: str | None = None) -> list[EvidenceNode]:
        return self._evidence.evidence_nodes(user_id, node_type)

    def node_links(self, amu_ids: Sequence[str]) -> list[tuple[EvidenceNode, str]]:
        return self._evidence.node_links(amu_ids)

    # -- the turn log ----------------------------------------------------------------------------

    def append_turns(self, user: str, turns: Sequence[Turn], key: str | None = None) -> list[Turn]:
        return self._turns.append_turns(user, turns, key)

    def bind_turn_ids(self, user: str, session: str, turns: Sequence[Any]) -> list[Turn]:
        return self._turns.bind_turn_ids(user, session, turns)

    def idempotent_turn_ids(self, user: str, key: str) -> list[str] | None:
        return self._turns.idempotent_turn_ids(user, key)

    def stored_turn_ids(self, user: str, turn_ids: Sequence[str]) -> set[str]:
        return self._turns.stored_turn_ids(user, turn_ids)

    def session_turn_count(self, user: str, session_id: str) -> int:
        return self._turns.session_turn_count(user, session_id)

    def uncovered_turns(self, user: str) -> list[Turn]:
        return self._turns.uncovered_turns(user)

    def backlog(self, user: str, after: int | None = None) -> tuple[list[Turn], int]:
        return self._turns.backlog(user, after)

    def backlog_users(self) -> list[str]:
        return self._turns.backlog_users()

    def next_seq(self, user: str) -> int:
        return self._turns.next_seq(user)

    def users(self) -> list[str]:
        return self._turns.users()

    def has_user(self, user: str) -> bool:
        return self._turns.has_user(user)

    def has_session(self, user: str, session_id: str) -> bool:
        return self._turns.has_session(user, session_id)

    def speakers(self, user: str) -> tuple[str, ...]:
        return self._turns.speakers(user)

    # -- the array cache, jobs, the purge --------------------------------------------------------

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

    def add_key(self, key_id: str, user_id: str, salt: bytes, digest: bytes, created: str) -> None:
        self._keys.add_key(key_id, user_id, salt, digest, created)

    def live_key(self, key_id: str) -> tuple[str, bytes, bytes] | None:
        return self._keys.live_key(key_id)

    def key_rows(self, user_id: str | None = None) -> list[KeyRow]:
        return self._keys.key_rows(user_id)

    def revoke_key(self, key_id: str, when: str) -> KeyRow | None:
        return self._keys.revoke_key(key_id, when)

    def purge(self, user: str, *, session_id: str | None = None, amu_ids: Sequence[str] = (),
              turn_ids: Sequence[str] = (), everything: bool = False) -> Purged:
        return self._purge.purge(user, session_id=session_id, amu_ids=amu_ids, turn_ids=turn_ids,
                                 everything=everything)

    def scrub(self, texts: Iterable[str]) -> None:
        self._purge.scrub(texts)

