"""``DELETE /v1/user``: forget everything of the key's user."""

from __future__ import annotations

from fastapi import APIRouter

from retrieval.service import operations, schemas
from retrieval.service.auth import User
from retrieval.service.state import Shared

router = APIRouter(prefix="/v1", tags=["user"])


@router.delete("/user", response_model=schemas.Deleted)
def forget_user(user: User, service: Shared) -> schemas.Deleted:
    """Every memory, turn and job of the key's user, gone (the key itself stays valid)."""
    return operations.forget(service.memory, service.gate, user, None)
