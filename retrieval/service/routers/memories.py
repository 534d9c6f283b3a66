"""``/v1/memories``: list, get, history and delete the key user's stored memories."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from retrieval.service import limits, operations, schemas
from retrieval.service.auth import User
from retrieval.service.state import Shared

router = APIRouter(prefix="/v1/memories", tags=["memories"])
MemoryId = Annotated[str, Path(min_length=1, max_length=limits.MAX_MEMORY_ID_CHARS)]


@router.get("", response_model=schemas.MemoryPage)
def list_memories(user: User, service: Shared,
                  session_id: Annotated[str | None, Query(max_length=limits.MAX_ID_CHARS,
                                                          pattern=limits.ID_PATTERN)] = None,
                  limit: Annotated[schemas.QueryPageSize, Query()] = limits.DEFAULT_PAGE,
                  cursor: Annotated[str | None,
                                    Query(max_length=limits.MAX_ID_CHARS)] = None) -> schemas.MemoryPage:
    """One page of the key user's records (extracted memories; raw turns not yet in a closed
    segment are found by search and get, not listed), oldest first; ``next_cursor`` is null on the
    last page."""
    return operations.list_memories(service.memory, user, session_id, limit, cursor)


@router.get("/{memory_id}", response_model=schemas.MemoryItem)
def get_memory(memory_id: MemoryId, user: User, service: Shared) -> schemas.MemoryItem:
    return operations.get_memory(service.memory, user, memory_id)


@router.get("/{memory_id}/history", response_model=schemas.History)
def memory_history(memory_id: MemoryId, user: User, service: Shared) -> schemas.History:
    """What consolidation merged into this memory."""
    return operations.history(service.memory, user, memory_id)


@router.delete("/{memory_id}", response_model=schemas.Deleted)
def delete_memory(memory_id: MemoryId, user: User, service: Shared) -> schemas.Deleted:
    """Delete one memory completely: a record goes with the turns it names and everything derived
    from them (records of other turns stay); a raw turn with what derives from it. A hard purge: no
    read returns it once this answers, and no copy stays in the store's files after the compaction
    that follows it (seconds to about a minute on a large store)."""
    return operations.delete_memory(service.memory, service.gate, user, memory_id)
