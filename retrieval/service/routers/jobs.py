"""``POST /v1/consolidate`` (202 with a job id) and ``GET /v1/jobs/{job_id}``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Path

from retrieval.service import limits, operations, schemas
from retrieval.service.auth import User
from retrieval.service.state import Shared

router = APIRouter(prefix="/v1", tags=["jobs"])


@router.post("/consolidate", status_code=202, response_model=schemas.JobAccepted)
def consolidate(user: User, service: Shared,
                body: Annotated[schemas.ConsolidateRequest | None, Body()] = None) -> schemas.JobAccepted:
    """Queue a consolidation of the key user's memory (one session with ``session_id``); at most one
    job runs per (user, session), so asking again while one is unfinished returns that job."""
    request = body or schemas.ConsolidateRequest()
    job = operations.consolidate(service.memory, service.gate, user, request.session_id)
    return schemas.JobAccepted(job_id=job.job_id)


@router.get("/jobs/{job_id}", response_model=schemas.Job)
def job(job_id: Annotated[str, Path(max_length=limits.MAX_ID_CHARS)], user: User,
        service: Shared) -> schemas.Job:
    return operations.job(service.memory, user, job_id)
