"""``GET /healthz`` and ``GET /metrics``: no key needed, nothing of any user in them."""

from __future__ import annotations

from fastapi import APIRouter, Response

from retrieval.service.metrics import CONTENT_TYPE
from retrieval.service.state import Shared

router = APIRouter(tags=["system"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/metrics")
def metrics(service: Shared) -> Response:
    """Prometheus text: requests, latency and errors per route; AMUs, open segments, queued jobs."""
    return Response(service.metrics.render(), media_type=CONTENT_TYPE)
