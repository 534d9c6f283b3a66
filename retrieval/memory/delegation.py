"""The store contract's data methods, delegated to a backend's parts: both backends
(:class:`retrieval.memory.store.AMUStore`, :class:`retrieval.memory.postgres.store.PostgresStore`)
build their parts over their own connection and inherit these methods, so the contract's public
surface is written once; each backend adds only its handle (where it is, transactions, locks,
integrity, closing)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from retrieval.memory.store_contract import (
    Evidence,
    Jobs,
    Meta,
    Purging,
    RecordReads,
    RecordWrites,
    Turns,
    Versions,
)

if TYPE_CHECKING:
    from retrieval.memory.indexing import EvidenceNode
    from retrieval.memory.job_rows import JobRow
    from retrieval.memory.purge import Purged
    from retrieval.memory.records import AMU, BacklogRead, SegmentRecord, Turn


class CacheRows(Protocol):
    """A backend's part holding the cached arrays (the store itself says whether it is read-only)."""

    def cached(self, table: str, model: str, user: str, items: Sequence[str]) -> list[bytes | None]: ...
    def cache(self, table: str, model: str, user: str, blobs: Mapping[str, bytes],
              purges: int | None = None) -> None: ...
    def purge_count(self, user: str) -> int: ...
    def copy_cache(self, source: str, target: str) -> None: ...


class StoreParts:
    """The parts a backend sets in its constructor, and the contract's methods over them."""

    _reads: RecordReads
    _writes: RecordWrites
    _turns: Turns
    _evidence: Evidence
    _cache: CacheRows
    _jobs: Jobs
    _versions: Versions
    _purge: Purging
    _meta: Meta

    # -- meta and binding ------------------------------------------------------------------------

    def meta(self, key: str) -> Any:
        return self._meta.meta(key)

    def put_meta(self, key: str, value: Any) -> None:
        self._meta.put_meta(key, value)

    def bind(self, key: str, value: Any, hint: str = "use a new store") -> None:
        self._meta.bind(key, value, hint)

    # -- records and segments --------------------------------------------------------------------

    def get(self, amu_id: str, user_id: str | None = None) -> AMU:
        return self._reads.get(amu_id, user_id)

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
             limit: int) -> list[tuple[int, AMU]]:
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

    def append_turns(self, user: str, turns: Sequence[Turn], key: str | None = None,
                     known: Collection[str] | None = None, generated: Collection[str] = ()) -> list[Turn]:
        return self._turns.append_turns(user, turns, key, known, generated)

    def bind_turn_ids(self, user: str, session: str, turns: Sequence[Any]) -> list[Turn]:
        return self._turns.bind_turn_ids(user, session, turns)

    def idempotent_turn_ids(self, user: str, key: str) -> list[str] | None:
        return self._turns.idempotent_turn_ids(user, key)

    def stored_turn_ids(self, user: str, turn_ids: Sequence[str]) -> set[str]:
        return self._turns.stored_turn_ids(user, turn_ids)

    def last_turn_number(self, user: str, session_id: str) -> int:
        return self._turns.last_turn_number(user, session_id)

    def uncovered_turns(self, user: str) -> list[Turn]:
        return self._turns.uncovered_turns(user)

    def uncovered_turn_ids(self, user: str) -> set[str]:
        return self._turns.uncovered_turn_ids(user)

    def backlog(self, user: str, after: int | None = None, limit: int | None = None) -> BacklogRead:
        return self._turns.backlog(user, after, limit)

    def backlog_users(self) -> list[str]:
        return self._turns.backlog_users()

    def next_seq(self, user: str) -> int:
        return self._turns.next_seq(user)

    def users(self) -> list[str]:
        return self._turns.users()

    def has_user(self, user: str) -> bool:
        return self._turns.has_user(user)

    def holds_turns(self) -> bool:
        return self._turns.holds_turns()

    def has_session(self, user: str, session_id: str) -> bool:
        return self._turns.has_session(user, session_id)

    def speakers(self, user: str, through: str | None = None) -> tuple[str, ...]:
        return self._turns.speakers(user, through)

    # -- evidence, cache, jobs, versions, purge --------------------------------------------------

    def evidence_nodes(self, user_id: str, node_type: str | None = None) -> list[EvidenceNode]:
        return self._evidence.evidence_nodes(user_id, node_type)

    def node_links(self, amu_ids: Sequence[str]) -> list[tuple[EvidenceNode, str]]:
        return self._evidence.node_links(amu_ids)

    def cached(self, table: str, model: str, user: str, items: Sequence[str]) -> list[bytes | None]:
        return self._cache.cached(table, model, user, items)

    def cache(self, table: str, model: str, user: str, blobs: Mapping[str, bytes],
              purges: int | None = None) -> None:
        self._cache.cache(table, model, user, blobs, purges)

    def purge_count(self, user: str) -> int:
        return self._cache.purge_count(user)

    def copy_cache(self, source: str, target: str) -> None:
        self._cache.copy_cache(source, target)

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

    def user_versions(self, users: Sequence[str]) -> dict[str, tuple[int, ...]]:
        return self._versions.user_versions(users)

    def ingestion_marks(self, user_id: str) -> tuple[int, ...]:
        return self._versions.ingestion_marks(user_id)

    def purge(self, user: str, *, session_id: str | None = None, amu_ids: Sequence[str] = (),
              turn_ids: Sequence[str] = (), everything: bool = False,
              derived: Callable[[Purged], Iterable[str]] | None = None) -> Purged:
        return self._purge.purge(user, session_id=session_id, amu_ids=amu_ids, turn_ids=turn_ids,
                                 everything=everything, derived=derived)

    def compact_owed(self) -> bool:
        return self._purge.compact_owed()

    def scrub(self, user: str, texts: Iterable[str]) -> None:
        self._purge.scrub(user, texts)

    def compact(self) -> bool:
        return self._purge.compact()
