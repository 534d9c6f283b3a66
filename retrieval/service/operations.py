"""The one implementation of each service operation, shared by the HTTP routes and the MCP tools.

Each takes the memory, the authenticated user and validated arguments, and returns a response
model; the user always comes from the caller's key (HTTP) or the server's ``--user`` (stdio MCP).
Writes pass through the :class:`~retrieval.service.drain.WriteGate` so shutdown can drain them.
The memory's own refusals (:mod:`retrieval.api.errors`) pass through unchanged: the app and the
MCP tools turn them into 404 / 422 answers. The memory serialises its calls with its own lock.
"""

from __future__ import annotations

from typing import Any

from retrieval.service import models
from retrieval.service.drain import WriteGate


def add_turns(memory: Any, gate: WriteGate, user_id: str, session_id: str,
              request: models.AddTurnsRequest) -> models.AddTurnsResponse:
    turns = [turn.model_dump(exclude_none=True) for turn in request.turns]
    with gate.write():
        result = memory.add(turns, user_id=user_id, session_id=session_id,
                            idempotency_key=request.idempotency_key)
    return models.AddTurnsResponse(session_id=session_id, turn_ids=list(result.turn_ids),
                                   memory_ids=list(result.amu_ids), duplicates=list(result.duplicates),
                                   replayed=result.replayed)


def search(memory: Any, user_id: str, request: models.SearchRequest) -> models.SearchResponse:
    result = memory.search(request.query, user_id=user_id, session_id=request.session_id, k=request.k,
                           explain=request.explain)
    hits = []
    for hit in result.hits:
        fields = hit.to_dict()
        fields["channels"] = fields.pop("explain")
        hits.append(models.Hit(**fields))
    return models.SearchResponse(hits=hits)


def list_memories(memory: Any, user_id: str, session_id: str | None, limit: int,
                  cursor: str | None) -> models.MemoryPage:
    page = memory.list(user_id=user_id, session_id=session_id, limit=limit, cursor=cursor)
    return models.MemoryPage(items=[models.MemoryItem(**item.to_dict()) for item in page.items],
                             next_cursor=page.cursor)


def get_memory(memory: Any, user_id: str, memory_id: str) -> models.MemoryItem:
    return models.MemoryItem(**memory.get(memory_id, user_id=user_id).to_dict())


def history(memory: Any, user_id: str, memory_id: str) -> models.History:
    merged = memory.history(memory_id, user_id=user_id)
    return models.History(id=memory_id, history=[models.MemoryItem(**item.to_dict()) for item in merged])


def delete_memory(memory: Any, gate: WriteGate, user_id: str, memory_id: str) -> models.Deleted:
    with gate.write():
        memory.delete(memory_id, user_id=user_id)
    return models.Deleted()


def forget(memory: Any, gate: WriteGate, user_id: str, session_id: str | None) -> models.Deleted:
    with gate.write():
        memory.forget(user_id=user_id, session_id=session_id)
    return models.Deleted()


def consolidate(memory: Any, gate: WriteGate, user_id: str, session_id: str | None) -> models.Job:
    with gate.write():
        return _job(memory.consolidate(user_id=user_id, session_id=session_id, wait=False))


def job(memory: Any, user_id: str, job_id: str) -> models.Job:
    """A job of the key's user; another user's job is not found, exactly like a missing one."""
    return _job(memory.job(job_id, user_id=user_id))


def _job(found: Any) -> models.Job:
    return models.Job(job_id=str(found.id), status=found.state, session_id=found.session_id,
                      progress=found.progress, error=found.error)
