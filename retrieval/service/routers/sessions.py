"""``POST /v1/sessions/{session_id}/turns``, ``POST /v1/sessions/{session_id}/flush`` and
``DELETE /v1/sessions/{session_id}``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from retrieval.service import limits, operations, schemas
from retrieval.service.auth import User
from retrieval.service.state import Shared

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])
SessionPath = Annotated[str, Path(min_length=1, max_length=limits.MAX_ID_CHARS, pattern=limits.ID_PATTERN)]


@router.post("/{session_id}/turns", response_model=schemas.AddTurnsResponse)
def add_turns(session_id: SessionPath, body: schemas.AddTurnsRequest, user: User,
              service: Shared) -> schemas.AddTurnsResponse:
    """Add turns to one of the key user's sessions; they are stored (and searchable) when this answers 200."""
    return operations.add_turns(service.memory, service.gate, user, session_id, body)


@router.post("/{session_id}/flush", response_model=schemas.Flushed)
def flush_session(session_id: SessionPath, user: User, service: Shared) -> schemas.Flushed:
    """Close the session's open segment now, after the key user's turns stored before it are
    processed: its records are extracted, fingerprinted and indexed when this answers 200 (call it
    when a conversation ends; until then its last turns are found as turns, not yet as records)."""
    return operations.flush(service.memory, service.gate, user, session_id)


@router.delete("/{session_id}", response_model=schemas.Deleted)
def delete_session(session_id: SessionPath, user: User, service: Shared) -> schemas.Deleted:
    """Forget one session of the key's user completely."""
    return operations.forget(service.memory, service.gate, user, session_id)
