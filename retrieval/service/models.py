"""Request and response bodies of the HTTP API (and the MCP tools' arguments), as pydantic models.

Request models forbid unknown fields: a body that names a ``user_id`` is refused (422), never
silently ignored, because the user is always the key's. Their limits are those of
:mod:`retrieval.service.limits`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from retrieval.service import limits

ShortText = Annotated[str, Field(min_length=1, max_length=limits.MAX_ID_CHARS)]
SessionId = Annotated[str, Field(min_length=1, max_length=limits.MAX_ID_CHARS, pattern=limits.ID_PATTERN)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TurnIn(_Request):
    """One dialogue turn; ``time`` is ISO 8601 (the memory parses it), ``turn_id`` makes a retry
    of the same turn add nothing."""

    speaker: ShortText
    text: Annotated[str, Field(min_length=1, max_length=limits.MAX_TEXT_CHARS)]
    time: ShortText | None = None
    turn_id: ShortText | None = None


class AddTurnsRequest(_Request):
    turns: Annotated[list[TurnIn], Field(min_length=1, max_length=limits.MAX_TURNS)]
    idempotency_key: ShortText | None = None


class SearchRequest(_Request):
    query: Annotated[str, Field(min_length=1, max_length=limits.MAX_QUERY_CHARS)]
    k: Annotated[int, Field(ge=1, le=limits.MAX_K)] = limits.DEFAULT_K
    session_id: SessionId | None = None
    explain: bool = False


class ConsolidateRequest(_Request):
    session_id: SessionId | None = None


class AddTurnsResponse(BaseModel):
    """What ``add`` committed: the stored turn ids and the ids of units made from them."""

    session_id: str
    turn_ids: list[str]
    memory_ids: list[str]


class Hit(BaseModel):
    id: str
    text: str
    score: float
    turns: list[dict[str, Any]]
    channels: dict[str, Any] | None = None


class SearchResponse(BaseModel):
    hits: list[Hit]


class MemoryItem(BaseModel):
    """A stored unit: its text and type, its session and time, and the turns it came from."""

    id: str
    text: str
    session_id: str | None = None
    memory_type: str | None = None
    time: str | None = None
    turns: list[dict[str, Any]] = []


class MemoryPage(BaseModel):
    items: list[MemoryItem]
    next_cursor: str | None


class History(BaseModel):
    """A unit and what consolidation merged into it (oldest first)."""

    id: str
    history: list[dict[str, Any]]


class Deleted(BaseModel):
    deleted: int


class JobAccepted(BaseModel):
    job_id: str


class Job(BaseModel):
    job_id: str
    status: str
    session_id: str | None = None
    progress: float | None = None
    error: str | None = None


class Error(BaseModel):
    """Every refusal: what is wrong, and the field it concerns when there is one."""

    error: str
    field: str | None = None
