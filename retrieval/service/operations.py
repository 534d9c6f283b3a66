"""The one implementation of each service operation, shared by the HTTP routes and the MCP tools.

Each takes the memory, the authenticated user and a validated request, and returns a response
model; the user always comes from the caller's key (HTTP) or the server's ``--user`` (stdio MCP).
Writes pass through the :class:`~retrieval.service.drain.WriteGate` so shutdown can drain them.
"""

from __future__ import annotations

from typing import Any

from retrieval.service import models
from retrieval.service.drain import WriteGate
from retrieval.service.errors import NotFound


def add_turns(memory: Any, gate: WriteGate, user_id: str, session_id: str,
              request: models.AddTurnsRequest) -> models.AddTurnsResponse:
    turns = [turn.model_dump(exclude_none=True) for turn in request.turns]
    with gate.write():
        result = memory.add(turns, user_id=user_id, session_id=session_id, idempotency_key=request.idempotency_key)
    return models.AddTurnsResponse(session_id=session_id, turn_ids=list(result.turn_ids),
                                   memory_ids=list(result.amu_ids))


def search(memory: Any, user_id: str, request: models.SearchRequest) -> models.SearchResponse:
    result = memory.search(request.query, user_id=user_id, session_id=request.session_id, k=request.k,
                           explain=request.explain)
    return models.SearchResponse(hits=[models.Hit(id=hit.id, text=hit.text, score=hit.score, turns=list(hit.turns),
                                                  channels=hit.channels if request.explain else None)
                                       for hit in result.hits])


def list_memories(memory: Any, user_id: str, session_id: str | None, limit: int,
                  cursor: str | None) -> models.MemoryPage:
    page = memory.list(user_id=user_id, session_id=session_id, limit=limit, cursor=cursor)
    return models.MemoryPage(items=[memory_item(record) for record in page.items], next_cursor=page.next_cursor)


def get_memory(memory: Any, user_id: str, memory_id: str) -> models.MemoryItem:
    return memory_item(memory.get(memory_id, user_id=user_id))


def history(memory: Any, user_id: str, memory_id: str) -> models.History:
    return models.History(id=memory_id, history=list(memory.history(memory_id, user_id=user_id)))


def delete_memory(memory: Any, gate: WriteGate, user_id: str, memory_id: str) -> models.Deleted:
    with gate.write():
        return models.Deleted(deleted=memory.delete(memory_id, user_id=user_id))


def forget(memory: Any, gate: WriteGate, user_id: str, session_id: str | None) -> models.Deleted:
    with gate.write():
        return models.Deleted(deleted=memory.forget(user_id=user_id, session_id=session_id))


def consolidate(memory: Any, gate: WriteGate, user_id: str, session_id: str | None) -> models.Job:
    with gate.write():
        return job_model(memory.consolidate(user_id=user_id, session_id=session_id, wait=False))


def job(memory: Any, user_id: str, job_id: str) -> models.Job:
    found = memory.job(job_id)
    if found is None or found.user_id != user_id:
        raise NotFound(f"no job {job_id!r}")
    return job_model(found)


def memory_item(record: Any) -> models.MemoryItem:
    return models.MemoryItem(id=record.id, text=record.text, session_id=record.session_id,
                             memory_type=record.memory_type, time=record.time, turns=list(record.turns))


def job_model(found: Any) -> models.Job:
    return models.Job(job_id=str(found.id), status=found.status, session_id=found.session_id,
                      progress=found.progress, error=found.error)


def gauges(memory: Any) -> dict[str, float]:
    return memory.stats()
