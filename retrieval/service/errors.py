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
import logging
import uuid
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match
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
from retrieval.service.auth import INGEST_FAILED, KEY_FIELD, STORE_FAILED, TWO_KEYS, store_failed
from retrieval.service.drain import ShuttingDown
from retrieval.service.early_refusal import refusal, refusal_body

log = logging.getLogger("retrieval.service")

INVALID = 422
"""The status of a malformed argument or field (FastAPI's for a request it cannot validate)."""

REFUSAL_STATUS: tuple[tuple[type[Exception], int], ...] = (
    (ReadOnly, 403), (NotFound, 404), (Conflict, 409), (InvalidInput, INVALID), (IngestFailed, 503),
    (MemoryBusy, 503), (ShuttingDown, 503), (StoreUnavailable, 503), (StoreError, 503))
"""Each refusal's status, the most specific class first (a :class:`ReadOnly` is a
:class:`StoreUnavailable`): an HTTP answer's status code, and the ``status`` of an MCP tool's
error (:mod:`retrieval.service.mcp_tools`). 503 is worth retrying (but for a removed store, which
says so and has no ``Retry-After``); the others are not, as they are."""


def status_of(refusal: Exception) -> int:
    """The status of a refusal (:data:`REFUSAL_STATUS`)."""
    return next(status for kind, status in REFUSAL_STATUS if isinstance(refusal, kind))


def invalid_status(error: Mapping[str, Any]) -> int:
    """The status of arguments their schema refused, by its first ``error`` (pydantic's): 413 for
    more turns than one add takes (too large a request, in the unit that limit counts), else
    :data:`INVALID`."""
    too_many_turns = error.get("type") == "too_long" and tuple(error.get("loc", ()))[-1:] == ("turns",)
    return 413 if too_many_turns else INVALID


def error_response(status: int, message: str, field: str | None = None,
                   headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse(refusal(message, field), status_code=status, headers=headers)


def _field(location: tuple | list) -> str:
    return ".".join(str(part) for part in location)


# Starlette types every handler as taking an Exception; each is registered for one class below.
async def _validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0]
    # a body that is not JSON has the parser's character offset as its location: the field is the body
    field = "body" if first.get("type") == "json_invalid" else _field(first.get("loc", ()))
    status = invalid_status(first)
    message = first.get("msg", "invalid")
    if field == "body" and first.get("type") != "extra_forbidden" and not _sent_as_json(request):
        # FastAPI read it as a form, or not at all (a body the route takes none of stays refused so)
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
        headers = dict(exc.headers or {})
        if exc.status_code == 405 and (allowed := _allowed(request)):
            headers["Allow"] = ", ".join(allowed)
        return error_response(exc.status_code, f"no route {verb} {request.url.path} (see /docs)", "path",
                              headers=headers)
    if exc.status_code == 400 and exc.detail != TWO_KEYS:  # FastAPI could not read the body
        return error_response(INVALID, f"body: {exc.detail} (not JSON in UTF-8, or nested too deep)", "body")
    field = KEY_FIELD if exc.status_code in (400, 401, 403) else None  # the key checks' refusals
    return error_response(exc.status_code, str(exc.detail), field, headers=exc.headers)


def _allowed(request: Request) -> list[str]:
    """The methods of every route of the request's path, the app's own (``/mcp``, ``/docs``) and
    its routers' (``app.state.routes``): Starlette's ``Allow`` names only those of the first route
    it matched (``GET`` of ``/v1/memories/{memory_id}``, not its ``DELETE``)."""
    methods: set[str] = set()
    for route in (*request.app.router.routes, *request.app.state.routes):
        if route.matches(request.scope)[0] != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())  # an included router has none
    return sorted(methods)


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


async def _refusal(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, MemoryAPIError)
    return error_response(status_of(exc), str(exc), located(request, exc.field))


async def _retry_later(_: Request, exc: Exception) -> JSONResponse:
    """A call that may succeed if retried: an add that other servers kept changing the user under
    (nothing stored), a call arriving while the server shuts down."""
    return error_response(status_of(exc), str(exc), headers={"Retry-After": "1"})


async def _ingest_failed(_: Request, exc: Exception) -> JSONResponse:
    return error_response(status_of(exc), INGEST_FAILED, headers={"Retry-After": "1"})


async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
    """The memory cannot serve the call: closed (its own message), or its store failed under the
    call (:func:`_store_failed`, the cause kept out of the answer)."""
    if isinstance(exc.__cause__, StoreError):
        return await _store_failed(request, exc.__cause__)
    return await _retry_later(request, exc)


async def _store_failed(request: Request, exc: Exception) -> JSONResponse:
    """The store failed under the request: 503 with ``Retry-After``, or without it for a removed store,
    or 507 for a full disk, not an unexpected 500 (nothing of a failed write was committed; an add
    retried with its idempotency key or turn ids is safe)."""
    status, message = store_failed(f"answering {request.method} {request.url.path}", exc)
    return error_response(status, message, headers={"Retry-After": "1"} if message == STORE_FAILED else None)


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
                await _answer(scope, send, 503, "the server stopped before this request finished; retry it",
                              request_id)
        except Exception as exc:
            request_id = logged_failure(f"answering {scope['method']} {scope['path']}", exc)
            if not started:  # else uvicorn closes the connection: the response is cut short
                await _answer(scope, send, 500, internal_error(request_id), request_id)


def logged_failure(what: str, exc: BaseException) -> str:
    """Log an unexpected failure once, with its traceback and a new request id; returns the id."""
    request_id = uuid.uuid4().hex
    log.error("unexpected error %s (request id %s)", what, request_id, exc_info=exc)
    return request_id


def internal_error(request_id: str) -> str:
    """The message of an unexpected failure, which names only its request id."""
    return f"internal error (logged by the server as request {request_id})"


async def _answer(scope: Scope, send: Send, status: int, message: str, request_id: str) -> None:
    body = refusal_body(scope, status, {"error": message, "request_id": request_id})
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"x-request-id", request_id.encode()),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def install(app: FastAPI) -> None:
    """Register the handlers of refusals on ``app`` (:class:`UnexpectedErrors` is a middleware)."""
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(HTTPException, _http)
    for refused in (NotFound, InvalidInput, Conflict, ReadOnly):
        app.add_exception_handler(refused, _refusal)
    app.add_exception_handler(IngestFailed, _ingest_failed)
    app.add_exception_handler(MemoryBusy, _retry_later)
    app.add_exception_handler(ShuttingDown, _retry_later)
    app.add_exception_handler(StoreUnavailable, _unavailable)
    app.add_exception_handler(StoreError, _store_failed)
