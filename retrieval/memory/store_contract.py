"""The store contract: what every backend of the durable store provides, part by part.

A **store** keeps one memory's users durably: their raw turns, records and segments, evidence
indexes, cached vectors and codes, jobs and meta entries. A **backend** is one implementation of
it: SQLite in a directory (:class:`retrieval.memory.store.AMUStore`) or PostgreSQL at a URL;
:func:`retrieval.memory.backends.open_store` chooses it from what the user typed. Everything above
the data floor (the memory API, ingestion, consolidation, the evaluation, the service, the
benchmarks) is typed against :class:`Store` and sees no difference between them: the same
methods, arguments, results, errors (:mod:`retrieval.memory.errors`, ``KeyError``,
``ValueError``) and messages.

The store is made of parts, one protocol each: :class:`Turns` (the turn log and the ingestion
backlog), :class:`RecordReads` and :class:`RecordWrites` (records and segments),
:class:`Evidence` (evidence nodes), :class:`VectorCache` (cached arrays per model),
:class:`Jobs`, :class:`Versions` (change markers), :class:`Purging` (hard deletion),
:class:`Meta` (meta entries and model binding) and :class:`Handle` (where the store is, opening
another handle, transactions tracked per user, integrity, closing). Each backend builds its parts
as separate objects over one shared connection (SQLite: :mod:`retrieval.memory.connection`;
PostgreSQL: :mod:`retrieval.memory.postgres.database`) and inherits the data methods, delegated to
them, from :class:`retrieval.memory.delegation.StoreParts`; it writes only its :class:`Handle`.

Schema versions, one rule for every backend. A backend records the version of its schema in the
database itself (SQLite: ``PRAGMA user_version``; PostgreSQL: a one-row ``schema_version``
table), 0 for an empty database. Opening a store reads it and applies :func:`needs_migration`:
a version above the code's is refused (the code that wrote it must read it), the code's version
is used as it is, an older one (or 0) is brought to the code's version by that backend's
migrations in one transaction when the store is opened for writing (so a half-migrated schema
is never left behind), and refused when it is opened read-only. Each backend numbers its own
schema (SQLite: :data:`retrieval.memory.schema.SCHEMA_VERSION`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from retrieval.memory.errors import StoreError

if TYPE_CHECKING:
    from retrieval.memory.indexing import EvidenceNode
    from retrieval.memory.job_rows import JobRow
    from retrieval.memory.purge import Purged
    from retrieval.memory.records import AMU, BacklogRead, SegmentRecord, Turn


def needs_migration(found: int, current: int, *, where: str, read_only: bool) -> bool:
    """Whether a store whose schema is at version ``found`` must be migrated to ``current`` (the
    code's) before use; a version it cannot use is a :class:`StoreError` naming ``where``."""
    if found not in range(current + 1):
        raise StoreError(f"{where}: store schema version {found} is unknown to this code "
                         f"(it reads versions 1 to {current}); use the code that wrote it")
    if found == current:
        return False
    if read_only:
        raise StoreError(f"{where}: schema version {found} needs a migration to {current}; open "
                         "the store for writing once (python -m retrieval.store compact --store ... does)")
    return True


class Turns(Protocol):
    """Raw turns stored at add with their idempotency key; the ingestion backlog (turns no
    committed segment covers); who and what the user has stored."""

    def append_turns(self, user: str, turns: Sequence[Turn], key: str | None = None,
                     known: Collection[str] | None = None, generated: Collection[str] = ()) -> list[Turn]: ...
    def bind_turn_ids(self, user: str, session: str, turns: Sequence[Any]) -> list[Turn]: ...
    def idempotent_turn_ids(self, user: str, key: str) -> list[str] | None: ...
    def stored_turn_ids(self, user: str, turn_ids: Sequence[str]) -> set[str]: ...
    def last_turn_number(self, user: str, session_id: str) -> int: ...
    def uncovered_turns(self, user: str) -> list[Turn]: ...
    def uncovered_turn_ids(self, user: str) -> set[str]: ...
    def backlog(self, user: str, after: int | None = None, limit: int | None = None) -> BacklogRead: ...
    def backlog_users(self) -> list[str]: ...
    def next_seq(self, user: str) -> int: ...
    def users(self) -> list[str]: ...
    def has_user(self, user: str) -> bool: ...
    def holds_turns(self) -> bool: ...
    def has_session(self, user: str, session_id: str) -> bool: ...
    def speakers(self, user: str, through: str | None = None) -> tuple[str, ...]: ...


class RecordReads(Protocol):
    """Records, segments and stored turns read back, in insertion order."""

    def get(self, amu_id: str, user_id: str | None = None) -> AMU: ...
    def amus(self, user_id: str | None = None, *, include_archived: bool = False) -> Iterator[AMU]: ...
    def successors(self, user_id: str | None = None) -> dict[str, str]: ...
    def by_segment(self, user_id: str, seq: int) -> list[AMU]: ...
    def count(self, user_id: str | None = None, *, include_archived: bool = True) -> int: ...
    def users_with_segments(self) -> list[str]: ...
    def segment(self, user_id: str, seq: int) -> SegmentRecord | None: ...
    def segments(self, user_id: str) -> list[SegmentRecord]: ...
    def turn(self, user_id: str, turn_id: str) -> Turn: ...
    def turns(self, user_id: str) -> list[Turn]: ...
    def source_turns(self, amu: AMU) -> list[Turn]: ...
    def page(self, user_id: str, *, session_id: str | None = None, after: int = 0,
             limit: int) -> list[tuple[int, AMU]]: ...
    def successor(self, amu_id: str) -> str | None: ...


class RecordWrites(Protocol):
    """Segments committed with their records (one transaction each), retried extractions,
    archiving and consolidation's pointer forwarding."""

    def commit_segment(self, record: SegmentRecord, turns: Sequence[Turn], amus: Sequence[AMU]) -> None: ...
    def commit_segments(self,
                        segments: Sequence[tuple[SegmentRecord, Sequence[Turn], Sequence[AMU]]]) -> None: ...
    def commit_stored_turns(self, record: SegmentRecord, amus: Sequence[AMU]) -> None: ...
    def replace_extraction(self, record: SegmentRecord, amus: Sequence[AMU]) -> None: ...
    def archive(self, amu_ids: Iterable[str]) -> None: ...
    def forward(self, archived_ids: Sequence[str], merged: AMU, operation: str) -> bool: ...


class Evidence(Protocol):
    """The evidence nodes of a user's active records."""

    def evidence_nodes(self, user_id: str, node_type: str | None = None) -> list[EvidenceNode]: ...
    def node_links(self, amu_ids: Sequence[str]) -> list[tuple[EvidenceNode, str]]: ...


class VectorCache(Protocol):
    """Arrays (``"vectors"``, ``"codes"``) cached per user, model key and text key."""

    @property
    def read_only(self) -> bool: ...
    def cached(self, table: str, model: str, user: str, items: Sequence[str]) -> list[bytes | None]: ...
    def cache(self, table: str, model: str, user: str, blobs: Mapping[str, bytes],
              purges: int | None = None) -> None: ...
    def purge_count(self, user: str) -> int: ...
    def copy_cache(self, source: str, target: str) -> None: ...
    def meta(self, key: str) -> Any: ...  # the models it recorded: see cache.embedder_key


class Jobs(Protocol):
    """Durable background jobs."""

    def create_job(self, user: str, session_id: str | None, kind: str) -> tuple[JobRow, bool]: ...
    def update_job(self, job_id: int, state: str, progress: dict[str, Any] | None = None,
                   error: str | None = None) -> None: ...
    def job_row(self, job_id: int) -> JobRow | None: ...
    def unfinished(self) -> list[JobRow]: ...


class Versions(Protocol):
    """Change markers: whether anything was committed since (``data_version``), a user's rows in
    short (``user_version``), and what changes them other than an add of turns
    (``ingestion_marks``: the next segment number, records and purges): equal values mean nothing
    changed in between."""

    def data_version(self) -> int: ...
    def user_version(self, user_id: str) -> tuple[int, ...]: ...
    def user_versions(self, users: Sequence[str]) -> dict[str, tuple[int, ...]]:
        """``user_version`` of each of ``users`` (read together where the backend can)."""
    def ingestion_marks(self, user_id: str) -> tuple[int, ...]: ...


class Purging(Protocol):
    """Hard deletion of a selection and what derives from it, then no trace of it left."""

    def purge(self, user: str, *, session_id: str | None = None, amu_ids: Sequence[str] = (),
              turn_ids: Sequence[str] = (), everything: bool = False,
              derived: Callable[[Purged], Iterable[str]] | None = None) -> Purged:
        """Remove the selection and what derives from it; ``derived(purged)``, called inside the
        same transaction, names the texts derived from what went, whose cached arrays go with it."""
    def scrub(self, user: str, texts: Iterable[str]) -> None: ...
    def compact_owed(self) -> bool:
        """Leave no trace in the files of what a purge removed, if a purge left any (SQLite: the
        compaction it owes; PostgreSQL: nothing, VACUUM FULL being ``retrieval.store compact``);
        whether none is owed afterwards (False: a reader kept it from finishing)."""
    def compact(self) -> bool:
        """Leave no trace of deleted data in the store's files (``retrieval.store compact``);
        False when a reader kept it from finishing (it stays owed)."""


class Meta(Protocol):
    """Meta entries (JSON values by key) and the models a store is bound to."""

    def meta(self, key: str) -> Any: ...
    def put_meta(self, key: str, value: Any) -> None: ...
    def bind(self, key: str, value: Any, hint: str = "use a new store") -> None: ...


class Handle(Protocol):
    """One open handle on a store."""

    @property
    def read_only(self) -> bool: ...

    @property
    def location(self) -> str:
        """Where the store is, for messages (SQLite: its database file; a URL without its password)."""
        ...

    @property
    def local_files(self) -> Path | None:
        """The directory on this machine holding the store's own files beside its data (the LLM
        answer cache, the API keys), or None where the store has none (a database server)."""
        ...

    def reopen(self, *, read_only: bool = False, role: str = "ingest") -> Store:
        """Another handle on the same store (a background worker's, in its own writer role)."""
        ...

    def tracking(self, user_id: str) -> AbstractContextManager[list[tuple[Any, Any]]]:
        """Record, for each transaction this thread commits inside the block, the user's
        :meth:`Versions.user_version` at its start and at its end (nothing else changed the user
        between them): a reader extending its copy of the user checks that the first start is the
        version it holds (:mod:`retrieval.api.states`)."""
        ...

    def transaction(self, users: Collection[str]) -> AbstractContextManager[None]:
        """One write transaction for the block, holding the write locks of ``users`` across every
        process over the store; the store's writes on this thread inside the block join it, so
        they commit together at its end, or none of them on an error, and another process's write
        of those users waits for the block (where one process writes, SQLite, the writer itself is
        the lock). What the block reads of those users no other process changes meanwhile."""
        ...

    @property
    def concurrent_writers(self) -> bool:
        """Whether other processes may write the store's users while this handle is open (a
        database server's store, served by several nodes), so what a process holds of a user
        must be checked against the store; False where one process writes (SQLite)."""
        ...

    def ingestion_lock(self, user_id: str, *, wait: bool,
                       capped: bool = False) -> AbstractContextManager[bool]:
        """Hold the right to close the user's segments (feed its turn log to its segmentation and
        commit what closes) for the block, across every process over the store; yields whether
        it is held (``wait=False`` does not wait for another holder; ``capped``: the caller may
        hold it long, and many callers at once, as flushes do through their extractions, so a
        backend whose holders each take a connection lets a bounded number hold such locks at a
        time and the others wait for a turn). A holder that dies releases
        it. Where one process writes (SQLite), the caller's own per-user guard orders the work
        and this always yields True."""
        ...

    def job_lock(self, job_id: int) -> AbstractContextManager[bool]:
        """Hold the right to run a consolidation job for the block, across every process over the
        store; yields whether it is held (never waits: another process runs the job). A holder
        that dies releases it. Where one process writes (SQLite) this always yields True."""
        ...

    def integrity_problems(self) -> list[str]: ...
    def close(self) -> None: ...
    def __enter__(self) -> Store: ...
    def __exit__(self, *exc: object) -> None: ...


class Store(Turns, RecordReads, RecordWrites, Evidence, VectorCache, Jobs, Versions, Purging, Meta, Handle,
            Protocol):
    """The whole store, as the layers above the data floor use it."""
