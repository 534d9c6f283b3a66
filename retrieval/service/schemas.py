"""Request and response bodies of the HTTP API (and the MCP tools' arguments), as pydantic schemas.

Request schemas forbid unknown fields: a body that names a ``user_id`` is refused (422), never
silently ignored, because the user is always the key's. They are strict: a number is a JSON
number and a flag a JSON boolean (``"k": "5"``, ``"k": true`` and ``"explain": "yes"`` are
refused). Their limits are the memory's (:mod:`retrieval.api.limits`).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict

from retrieval.service import limits

ShortText = Annotated[str, Field(min_length=1, max_length=limits.MAX_ID_CHARS)]
PathId = Annotated[str, Field(min_length=1, max_length=limits.MAX_ID_CHARS, pattern=limits.ID_PATTERN)]
"""An id that appears in URLs (:data:`retrieval.api.limits.ID_PATTERN`): a session id, or a turn id
which memory ids of the turn (``<user>:turn:<turn id>``) and of its records carry."""
SessionId = PathId
TurnId = Annotated[str, Field(min_length=1, max_length=limits.MAX_TURN_ID_CHARS, pattern=limits.ID_PATTERN)]
"""A turn id: a :data:`PathId` with room for one the memory numbers itself (``<session id>:<n>``)."""
MemoryId = Annotated[str, Field(min_length=1, max_length=limits.MAX_MEMORY_ID_CHARS)]
K = Annotated[int, Strict(), Field(ge=1, le=limits.MAX_K)]
Flag = Annotated[bool, Strict()]
"""A JSON boolean: ``"yes"``, ``"true"`` and ``1`` are refused, not read as true."""
PageSize = Annotated[int, Strict(), Field(ge=1, le=limits.MAX_PAGE)]


def _decimal_digits(value: Any) -> Any:
    if isinstance(value, str) and not (value.isascii() and value.isdigit()):
        raise ValueError("must be a whole number in decimal digits alone, such as 20")
    return value


QueryPageSize = Annotated[int, BeforeValidator(_decimal_digits), Field(ge=1, le=limits.MAX_PAGE)]
"""A page size given in a query string: decimal digits alone. The lax parse of a query string
would also take ``1_0``, ``+5``, `` 5`` and ``5.000``, spellings a strict body refuses."""
Text = Annotated[str, Field(min_length=1, max_length=limits.MAX_TEXT_CHARS)]
Query = Annotated[str, Field(min_length=1, max_length=limits.MAX_QUERY_CHARS)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TurnIn(_Request):
    """One dialogue turn; ``time`` is ISO 8601 (the memory parses it), ``turn_id`` makes a retry
    of the same turn add nothing, ``image_caption`` describes an image the speaker shared (an empty
    one is none, as in Python and the JSONL stream)."""

    speaker: ShortText
    text: Text
    time: ShortText | None = None
    turn_id: TurnId | None = None
    image_caption: Annotated[str, Field(max_length=limits.MAX_TEXT_CHARS)] | None = None


class AddTurnsRequest(_Request):
    turns: Annotated[list[TurnIn], Field(min_length=1, max_length=limits.MAX_TURNS)]
    idempotency_key: ShortText | None = None


class SearchRequest(_Request):
    query: Query
    k: K = limits.DEFAULT_K
    session_id: SessionId | None = None
    explain: Flag = False


class ConsolidateRequest(_Request):
    session_id: SessionId | None = None


class AddTurnsResponse(BaseModel):
    """What ``add`` committed: the turns stored now, the records (AMUs) of every segment that closed;
    a replayed idempotency key or turn id adds nothing (``replayed``, ``duplicates``); one given
    again with another body is refused (409)."""

    session_id: str
    turn_ids: list[str]
    memory_ids: list[str]
    duplicates: list[str] = []
    replayed: bool = False


class Flushed(BaseModel):
    """What closing a session's open segment committed: the records (AMUs) of the session's segments
    this call closed (none when the session had no open segment; the user's other sessions'
    segments that the call's processing of the backlog closed are stored, not listed)."""

    session_id: str
    memory_ids: list[str]


class _FromResult(BaseModel):
    """A response read from the memory's result of the same name, attribute by attribute
    (``model_validate(result)``): the fields it declares are what the response shows of it."""

    model_config = ConfigDict(from_attributes=True)


class Hit(_FromResult):  # read from retrieval.contract.Hit; its docstring is the OpenAPI description
    """One search result: a stored record (``kind`` "record") or a raw turn (``kind`` "turn"), with
    the ids of the turns it came from; ``explain`` (when the request asked for it) gives each
    channel's rank and score, the routes that found it and the codes shared with the query."""

    id: str
    text: str
    score: float
    turns: list[str]
    kind: str
    session_id: str
    memory_type: str | None = None
    time: str | None = None
    explain: dict[str, Any] | None = None


class SearchResponse(_FromResult):
    hits: list[Hit]


class MemoryItem(_FromResult):
    """A stored record or raw turn: its text, session, type and time, and the turns it came from;
    ``successor`` names the record consolidation merged an archived one into."""

    id: str
    kind: str
    text: str
    session_id: str
    turns: list[str]
    memory_type: str | None = None
    time: str | None = None
    archived: bool = False
    successor: str | None = None


class MemoryPage(BaseModel):
    items: list[MemoryItem]
    next_cursor: str | None


class History(BaseModel):
    """A record and what consolidation merged into it."""

    id: str
    history: list[MemoryItem]


class Deleted(BaseModel):
    deleted: bool = True


class JobAccepted(BaseModel):
    job_id: str


class Job(BaseModel):
    """A consolidation job: ``status`` is queued, running, done or failed."""

    job_id: str
    status: str
    session_id: str | None = None
    progress: dict[str, Any] = Field(default={}, description=(
        "running: `stage`; done: the run's counts (`records_before`, `records_active_after`, `archived`, "
        "`created`, `clusters`, `operations`, `refused`, `unanswered`, `lost_turns`, ...: the "
        "consolidation report's counts, its AMUs called records) and `resumed`, or `resumed` and "
        "`purged_meanwhile` when the user's data was deleted under it"))
    error: str | None = None


class Error(BaseModel):
    """Every refusal: what is wrong, and the field it concerns when there is one; an unexpected
    failure (500) carries the request id the server logged it under instead."""

    model_config = ConfigDict(extra="forbid")

    error: str
    field: str | None = None
    request_id: str | None = None


REFUSALS: dict[int | str, dict[str, Any]] = {
    status: {"model": Error, "description": what} for status, what in (
    (400, "more than one Authorization header"),
    (401, "no live API key"),
    (403, "a metrics key, a key of a user id no URL can name, or a write to a server started read-only"),
    (404, "not the key user's, or nothing there"),
    (409, "an idempotency key or turn id given again with another body"),
    (413, "a body over the size limit or too many turns"),
    (422, "a field that does not validate (named in `field`)"),
    (500, "an unexpected failure, logged under `request_id`"),
    (503, "the server is stopping; retry"),
    )}
"""The error responses every ``/v1`` route documents (one shape for all, so the OpenAPI schema
describes what a client receives, FastAPI's default 422 body included)."""
