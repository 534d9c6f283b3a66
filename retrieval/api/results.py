"""What the memory API returns: plain frozen dataclasses with ``to_dict`` for JSON services."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from retrieval.contract import Hit
from retrieval.memory.records import AMU, Turn, raw_turn_id


class _Plain:
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]


@dataclass(frozen=True)
class AddResult(_Plain):
    """What one ``add`` or ``flush`` committed: the ids of the turns stored now (a replayed key or
    turn id adds none: ``duplicates`` lists those), and of the AMUs of the segments the call closed
    (a flush's; an add leaves segments to the ingestion worker, so it lists none)."""

    turn_ids: tuple[str, ...]
    amu_ids: tuple[str, ...] = ()
    duplicates: tuple[str, ...] = ()
    replayed: bool = False


@dataclass(frozen=True)
class SearchResult(_Plain):
    """The hits of one search, best first (:class:`retrieval.contract.Hit`: id, text, score, kind,
    session_id, turns, memory_type, time and, with ``explain``, the explanation), with the plan's
    question type, the plan itself (JSON form: routes, their queries, entities, topics and time
    range), the reranker, the wall time and the retrieval's ``timings`` (seconds per phase:
    "model_wait", "encode", "routes", "fusion"; empty when nothing was retrieved)."""

    query: str
    hits: tuple[Hit, ...]
    question_type: str = ""
    seconds: float = 0.0
    plan: dict[str, Any] | None = None
    reranker: str = ""
    timings: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class MemoryItem(_Plain):
    """A stored record or raw turn as ``get``, ``list`` and ``history`` return it."""

    id: str
    kind: str
    text: str
    session_id: str
    turns: tuple[str, ...]
    memory_type: str | None = None
    time: str | None = None
    archived: bool = False
    successor: str | None = None

    @classmethod
    def of_record(cls, amu: AMU, successor: str | None) -> MemoryItem:
        return cls(amu.id, "record", amu.text, amu.source.session_id, tuple(amu.source.turn_ids),
                   amu.memory_type, amu.t_ref or amu.observed_at, amu.archived, successor)

    @classmethod
    def of_turn(cls, turn: Turn, user: str) -> MemoryItem:
        return cls(raw_turn_id(user, turn.turn_id), "turn", turn.render(), turn.session_id,
                   (turn.turn_id,), None, turn.session_time.isoformat() if turn.session_time else None)


@dataclass(frozen=True)
class Page(_Plain):
    """One page of ``list``; pass ``next_cursor`` as the next call's ``cursor`` (None: no more)."""

    items: tuple[MemoryItem, ...]
    next_cursor: str | None = None


@dataclass(frozen=True)
class Job(_Plain):
    """A durable background job: ``state`` is queued, running, done or failed."""

    id: str
    user_id: str
    session_id: str | None
    kind: str
    state: str
    progress: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
