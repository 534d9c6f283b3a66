"""``GET /healthz``, no key needed; ``GET /metrics``, with a metrics key: counts over all users,
for the memory's operators (one user watching them would see what the others store)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response

from retrieval.service import schemas
from retrieval.service.auth import metrics_reader
from retrieval.service.metrics import CONTENT_TYPE
from retrieval.service.state import Shared

router = APIRouter(tags=["system"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """On the event loop, not a worker thread: it answers while every thread waits on the store."""
    return {"status": "ok"}


@router.get("/metrics", dependencies=[Depends(metrics_reader)],
            responses={status: schemas.REFUSALS[status] for status in (400, 401, 403, 422, 500, 503)})
def metrics(service: Shared) -> Response:
    """Prometheus text: requests, latency and errors per route; AMUs, open segments, queued jobs."""
    return Response(service.metrics.render(), media_type=CONTENT_TYPE)
