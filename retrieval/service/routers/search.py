"""``POST /v1/search``: the key user's memories that best answer a query, with a ``Server-Timing``
header (:mod:`retrieval.service.timing`)."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response

from retrieval.service import operations, schemas
from retrieval.service.auth import User
from retrieval.service.state import Shared
from retrieval.service.timing import HEADER, mark_handled, queued_s, server_timing

router = APIRouter(prefix="/v1", tags=["search"])


@router.post("/search", response_model=schemas.SearchResponse)
def search(body: schemas.SearchRequest, user: User, service: Shared, request: Request) -> Response:
    """Multi-route search over the key user's memory (one session with ``session_id``)."""
    started = time.perf_counter()
    result = operations.search(service.memory, user, body)
    serialising = time.perf_counter()
    response = Response(operations.search_response(result).model_dump_json(),
                        media_type="application/json")
    response.headers[HEADER] = server_timing(result.timings, call_s=serialising - started,
                                             serialise_s=time.perf_counter() - serialising,
                                             queue_s=queued_s(request, started))
    mark_handled(request)
    return response
