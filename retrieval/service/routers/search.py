"""``POST /v1/search``: the key user's memories that best answer a query."""

from __future__ import annotations

from fastapi import APIRouter

from retrieval.service import operations, schemas
from retrieval.service.auth import User
from retrieval.service.state import Shared

router = APIRouter(prefix="/v1", tags=["search"])


@router.post("/search", response_model=schemas.SearchResponse, response_model_exclude_none=True)
def search(body: schemas.SearchRequest, user: User, service: Shared) -> schemas.SearchResponse:
    """Multi-route search over the key user's memory (one session with ``session_id``)."""
    return operations.search(service.memory, user, body)
