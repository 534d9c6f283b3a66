"""Every refusal as one JSON object ``{"error", "field"?}`` with its status; never a traceback.

422 names the offending field as a dotted path (``body.turns.3.text``, ``query.limit``), and so
do the memory's own refusals (their ``field``, placed in the path, query or body it came from);
404 is the answer for anything the key's user does not own, whether or not it exists for someone
else, and for a path no route serves (``field`` "path"); 409 is an idempotency key or turn id
given again with another body; 403 without a field is a write to a server started read-only.
An unexpected failure (:class:`UnexpectedErrors`) is one log record and a 500 without internals,
both carrying a request id; the connection stays usable.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from retrieval.api.errors import (
    Conflict,
    IngestFailed,
    InvalidInput,
    MemoryAPIError,
    MemoryBusy,
    NotFound,
    ReadOnly,
    StoreUnavailable,
)
from retrieval.memory.errors import StoreError
from retrieval.service.auth import INGEST_FAILED, KEY_FIELD, TWO_KEYS, store_failed
from retrieval.service.drain import ShuttingDown

log = logging.getLogger("retrieval.service")


def error_response(status: int, message: str, field: str | None = None,
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    content = {"error": message} if field is None else {"error": message, "field": field}
    return JSONResponse(content, status_code=status, headers=headers)


def _field(location: tuple | list) -> str:
    return ".".join(str(part) for part in location)


# Starlette types every handler as taking an Exception; each is registered for one class below.
async def _validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0]
    # a body that is not JSON has the parser's character offset as its location: the field is the body
    field = "body" if first.get("type") == "json_invalid" else _field(first.get("loc", ()))
    status = 413 if first.get("type") == "too_long" and field == "body.turns" else 422
    message = first.get("msg", "invalid")
    if field == "body" and not _sent_as_json(request):  # FastAPI read it as a form, or not at all
        message = "send the body as JSON, with the header Content-Type: application/json"
    return error_response(status, f"{field}: {message}", field)


def _sent_as_json(request: Request) -> bool:
    """Whether FastAPI read the body as JSON: only one declared so."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return media_type == "application/json" or media_type.endswith("+json")


async def _http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    if exc.status_code in (404, 405):  # routing's answers: the routes' own refusals are the memory's
        verb = "serves" if exc.status_code == 404 else f"takes {request.method} at"
        return error_response(exc.status_code, f"no route {verb} {request.url.path} (see /docs)", "path",
                              headers=exc.headers)
    if exc.status_code == 400 and exc.detail != TWO_KEYS:  # FastAPI could not read the body
        return error_response(422, f"body: {exc.detail} (not JSON in UTF-8, or nested too deep)", "body")
    field = KEY_FIELD if exc.status_code in (400, 401, 403) else None  # the key checks' refusals
    return error_response(exc.status_code, str(exc.detail), field, headers=exc.headers)


def located(request: Request, field: str | None) -> str | None:
    """A memory argument as the request's field: ``path.``, ``query.`` or ``body.`` before it (the
    memory's ``id`` is the route's one path parameter, e.g. ``path.memory_id``). Its ``user_id`` is
    the key's user, which the request cannot get wrong (a refused key is refused before): a refusal
    about the user itself ("no records to consolidate") names no field, as over MCP."""
    if field is None:
        return None
    head, _, rest = field.partition(".")
    if head == "user_id":
        return None
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


async def _retry_later(_: Request, exc: Exception) -> JSONResponse:
    """A call that may succeed if retried: an add that other servers kept changing the user under
    (nothing stored)."""
    return error_response(503, str(exc), headers={"Retry-After": "1"})


async def _ingest_failed(_: Request, __: Exception) -> JSONResponse:
    return error_response(503, INGEST_FAILED, headers={"Retry-After": "1"})


async def _shutting_down(_: Request, exc: Exception) -> JSONResponse:
    return error_response(503, str(exc), headers={"Retry-After": "1"})


async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
    """The memory cannot serve the call: closed (its own message), or its store failed under the
    call (:func:`_store_failed`, the cause kept out of the answer)."""
    if isinstance(exc.__cause__, StoreError):
        return await _store_failed(request, exc.__cause__)
    return await _retry_later(request, exc)


async def _store_failed(request: Request, exc: Exception) -> JSONResponse:
    """The store failed under the request: 503 with ``Retry-After``, not an unexpected 500 (nothing
    of a failed write was committed; an add retried with its idempotency key or turn ids is safe)."""
    message = store_failed(f"answering {request.method} {request.url.path}", exc)
    return error_response(503, message, headers={"Retry-After": "1"})


class UnexpectedErrors:
    """ASGI middleware, the last word on a request that raised: a handler's unexpected exception is
    logged once (with a request id) and answered 500 ``{"error", "request_id"}``; a request cut off
    by the shutdown bound (:data:`~retrieval.service.limits.DRAIN_S`) is one warning and a 503.

    Starlette's own handler for ``Exception`` re-raises after answering, so uvicorn logs the
    traceback a second time and closes the connection; nothing is re-raised here. A client that
    left mid-request has nobody to answer and is not an error.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except ClientDisconnect:
            return
        except asyncio.CancelledError:  # uvicorn cancels what still runs when the drain bound is reached
            request_id = uuid.uuid4().hex
            log.warning("%s %s cancelled: the server stopped before it finished (request id %s)",
                        scope["method"], scope["path"], request_id)
            if not started:
                await _answer(send, 503, "the server stopped before this request finished; retry it",
                              request_id)
        except Exception as exc:
            request_id = uuid.uuid4().hex
            log.error("unexpected error answering %s %s (request id %s)", scope["method"], scope["path"],
                      request_id, exc_info=exc)
            if not started:  # else uvicorn closes the connection: the response is cut short
                await _answer(send, 500, f"internal error (logged by the server as request {request_id})",
                              request_id)


async def _answer(send: Send, status: int, message: str, request_id: str) -> None:
    body = json.dumps({"error": message, "request_id": request_id}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"x-request-id", request_id.encode()),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def install(app: FastAPI) -> None:
    """Register the handlers of refusals on ``app`` (:class:`UnexpectedErrors` is a middleware)."""
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(HTTPException, _http)
    app.add_exception_handler(NotFound, _refusal(404))
    app.add_exception_handler(InvalidInput, _refusal(422))
    app.add_exception_handler(Conflict, _refusal(409))
    app.add_exception_handler(IngestFailed, _ingest_failed)
    app.add_exception_handler(MemoryBusy, _retry_later)
    app.add_exception_handler(ShuttingDown, _shutting_down)
    app.add_exception_handler(StoreUnavailable, _unavailable)
    app.add_exception_handler(ReadOnly, _refusal(403))  # a write to a read-only server: not to retry
    app.add_exception_handler(StoreError, _store_failed)
