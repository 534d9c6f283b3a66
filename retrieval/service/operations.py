"""The one implementation of each service operation, shared by the HTTP routes and the MCP tools.

Each takes the memory, the authenticated user and validated arguments, and returns a response
model read from the memory's result as it is (a search returns the result itself, whose timings
the HTTP route reports, and :func:`search_response` reads its body); the user always comes from the
caller's key (HTTP) or the server's ``--user`` (stdio MCP). Writes pass through the
:class:`~retrieval.service.drain.WriteGate` so shutdown can drain them. The memory's own refusals
(:mod:`retrieval.api.errors`) pass through unchanged: the app and the MCP tools turn them into
404 / 422 answers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from retrieval.service import schemas
from retrieval.service.drain import WriteGate

if TYPE_CHECKING:  # for types only: the service is handed an open memory, never builds one
    from retrieval.api.memory import Memory
    from retrieval.api.results import Job, SearchResult


def add_turns(memory: Memory, gate: WriteGate, user_id: str, session_id: str,
              request: schemas.AddTurnsRequest) -> schemas.AddTurnsResponse:
    turns = [turn.model_dump(exclude_none=True) for turn in request.turns]
    with gate.write():
        result = memory.add(turns, user_id=user_id, session_id=session_id,
                            idempotency_key=request.idempotency_key)
    return schemas.AddTurnsResponse(session_id=session_id, turn_ids=list(result.turn_ids),
                                   memory_ids=list(result.amu_ids), duplicates=list(result.duplicates),
                                   replayed=result.replayed)


def search(memory: Memory, user_id: str, request: schemas.SearchRequest) -> SearchResult:
    """The memory's result; :func:`search_response` is its response body."""
    return memory.search(request.query, user_id=user_id, session_id=request.session_id, k=request.k,
                         explain=request.explain)


def search_response(result: SearchResult) -> schemas.SearchResponse:
    """The response body of a search: its hits, read as they are (no copy through a dict)."""
    return schemas.SearchResponse.model_validate(result)


def list_memories(memory: Memory, user_id: str, session_id: str | None, limit: int,
                  cursor: str | None) -> schemas.MemoryPage:
    page = memory.list(user_id=user_id, session_id=session_id, limit=limit, cursor=cursor)
    return schemas.MemoryPage(items=[schemas.MemoryItem.model_validate(item) for item in page.items],
                             next_cursor=page.next_cursor)


def get_memory(memory: Memory, user_id: str, memory_id: str) -> schemas.MemoryItem:
    return schemas.MemoryItem.model_validate(memory.get(memory_id, user_id=user_id))


def history(memory: Memory, user_id: str, memory_id: str) -> schemas.History:
    merged = memory.history(memory_id, user_id=user_id)
    return schemas.History(id=memory_id, history=[schemas.MemoryItem.model_validate(item) for item in merged])


def delete_memory(memory: Memory, gate: WriteGate, user_id: str, memory_id: str) -> schemas.Deleted:
    with gate.write():
        memory.delete(memory_id, user_id=user_id)
    return schemas.Deleted()


def flush(memory: Memory, gate: WriteGate, user_id: str, session_id: str) -> schemas.Flushed:
    with gate.write():
        result = memory.flush(user_id=user_id, session_id=session_id)
    return schemas.Flushed(session_id=session_id, memory_ids=list(result.amu_ids))


def forget(memory: Memory, gate: WriteGate, user_id: str, session_id: str | None) -> schemas.Deleted:
    with gate.write():
        memory.forget(user_id=user_id, session_id=session_id)
    return schemas.Deleted()


def consolidate(memory: Memory, gate: WriteGate, user_id: str, session_id: str | None) -> schemas.Job:
    with gate.write():
        return _job(memory.consolidate(user_id=user_id, session_id=session_id, wait=False))


def job(memory: Memory, user_id: str, job_id: str) -> schemas.Job:
    """A job of the key's user; another user's job is not found, exactly like a missing one."""
    return _job(memory.job(job_id, user_id=user_id))


def _job(found: Job) -> schemas.Job:
    return schemas.Job(job_id=str(found.id), status=found.state, session_id=found.session_id,
                      progress=_progress(found.progress), error=found.error)


PROGRESS_ALIASES = {"amus_before": "records_before", "amus_active_after": "records_active_after"}
"""A job's progress in the service's words: the memory's counts of AMUs are of records."""


def _progress(progress: dict[str, Any]) -> dict[str, Any]:
    """A job's progress as HTTP and MCP answer it: the user left out (the key's, never a field)
    and the AMU counts named for records (:data:`PROGRESS_ALIASES`)."""
    return {PROGRESS_ALIASES.get(name, name): value for name, value in progress.items() if name != "user_id"}
