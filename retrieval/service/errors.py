"""Every refusal as one JSON object ``{"error", "field"?}`` with its status; never a traceback.

422 names the offending field as a dotted path (``body.turns.3.text``, ``query.limit``), and so
do the memory's own refusals (their ``field``, placed in the path, query or body it came from);
404 is the answer for anything the key's user does not own, whether or not it exists for someone
else, and for a path no route serves (``field`` "path"); 409 is an idempotency key or turn id
given again with another body.
An unexpected failure is logged here and answered 500 without internals.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from retrieval.api.errors import Conflict, InvalidInput, MemoryAPIError, NotFound
from retrieval.service.drain import ShuttingDown

log = logging.getLogger("retrieval.service")


def error_response(status: int, message: str, field: str | None = None,
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    content = {"error": message} if field is None else {"error": message, "field": field}
    return JSONResponse(content, status_code=status, headers=headers)


def _field(location: tuple | list) -> str:
    return ".".join(str(part) for part in location)


# Starlette types every handler as taking an Exception; each is registered for one class below.
async def _validation(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0]
    # a body that is not JSON has the parser's character offset as its location: the field is the body
    field = "body" if first.get("type") == "json_invalid" else _field(first.get("loc", ()))
    status = 413 if first.get("type") == "too_long" and field == "body.turns" else 422
    return error_response(status, f"{field}: {first.get('msg', 'invalid')}", field)


async def _http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    if exc.status_code in (404, 405):  # routing's answers: the routes' own refusals are the memory's
        verb = "serves" if exc.status_code == 404 else f"takes {request.method} at"
        return error_response(exc.status_code, f"no route {verb} {request.url.path} (see /docs)", "path",
                              headers=exc.headers)
    return error_response(exc.status_code, str(exc.detail), headers=exc.headers)


def located(request: Request, field: str | None) -> str | None:
    """A memory argument as the request's field: ``path.``, ``query.`` or ``body.`` before it (the
    memory's ``id`` is the route's one path parameter, e.g. ``path.memory_id``)."""
    if field is None:
        return None
    head, _, rest = field.partition(".")
    params = request.path_params
    if head == "id" and len(params) == 1:
        return "path." + next(iter(params)) + ("." + rest if rest else "")
    if head in params:
        return "path." + field
    if head in request.query_params or request.method in ("GET", "DELETE"):
        return "query." + field
    return "body." + field


def _refusal(status: int) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
    async def handler(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, MemoryAPIError)
        return error_response(status, str(exc), located(request, exc.field))
    return handler


async def _shutting_down(_: Request, exc: Exception) -> JSONResponse:
    return error_response(503, str(exc), headers={"Retry-After": "1"})


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error answering %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal error (logged by the server)")


def install(app: FastAPI) -> None:
    """Register the handlers on ``app``."""
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(HTTPException, _http)
    app.add_exception_handler(NotFound, _refusal(404))
    app.add_exception_handler(InvalidInput, _refusal(422))
    app.add_exception_handler(Conflict, _refusal(409))
    app.add_exception_handler(ShuttingDown, _shutting_down)
    app.add_exception_handler(Exception, _unexpected)
