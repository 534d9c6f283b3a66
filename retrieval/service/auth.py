"""Who is asking: the user of the request's API key (``Authorization: Bearer KEY``).

The user is never read from a body, path or query: routes get it only from :func:`current_user`.
No key, or a key that is malformed, unknown or revoked, is 401; two ``Authorization`` headers
are 400 (which one counts is a guess a proxy and the server may make differently); a live key of
a user id the server cannot serve (:class:`retrieval.service.keys.UnservableKey`, from a key file
older than the check at ``keys create``) is 403, saying to revoke it; a key that cannot be read
(the store failed: a database restart) is 503 with ``Retry-After``. The MCP
endpoint is guarded by :class:`KeyGuard`, which puts the user in the ASGI scope's state for the
tools to read. ``/metrics`` takes a metrics key only (:func:`metrics_reader`): a user's key there
is 403, and a metrics key anywhere else.
"""

from __future__ import annotations

import logging
from typing import Annotated, Literal, cast

import anyio
from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import ASGIApp, Receive, Scope, Send

from retrieval.memory.errors import StoreError, StoreGone
from retrieval.memory.faults import disk_full
from retrieval.service.early_refusal import refusal, refusal_body
from retrieval.service.keys import METRICS, KeyStore, UnservableKey

log = logging.getLogger("retrieval.service")

_bearer = HTTPBearer(auto_error=False, description="an API key from `python -m retrieval.serve keys create`")
UNAUTHORIZED = "a valid API key is required: Authorization: Bearer KEY"
TWO_KEYS = "send one Authorization header, not several"
METRICS_ONLY = ("/metrics takes a metrics key (python -m retrieval.serve keys create --metrics), not a "
                "user's: its counts over all users are for the memory's operators")
STORE_FAILED = "the memory's store cannot be reached right now (the server logged why); retry shortly"
"""What a client is told when the store failed under its request (a database restart, a lost
connection): the details, which name the store's host, stay in the server's log."""
STORE_GONE = ("the memory's store was removed or replaced while the server had it open: nothing can be "
              "stored until its operator puts it back and restarts the server (the server logged where)")
"""What a client is told when the store's file was removed under the server, which no retry mends
(:class:`~retrieval.memory.errors.StoreGone`)."""
DISK_FULL = ("the server's disk is full: nothing can be stored until its operator frees space (the server "
             "logged where); reads still answer")
"""What a client is told when a write failed for a full disk, which retrying a second later does
not mend (the store's path stays in the server's log)."""
INGEST_FAILED = ("processing this user's stored turns into memories failed (the server logged why); they "
                 "stay stored and searchable, and the next flush or add tries them again")
"""What a client is told of an :class:`~retrieval.api.errors.IngestFailed`: its message names the
extractor's error (an endpoint, a file of the server), which the worker logged."""
KEY_FIELD = "header.authorization"
"""The field a refusal of the key names: the request's Authorization header."""


def store_failed(during: str, error: BaseException) -> tuple[int, str]:
    """Log why the store failed ``during`` a request (one warning); the answer's status and
    message: 507 for a full disk (:data:`DISK_FULL`), 503 for a removed store (:data:`STORE_GONE`),
    else 503 worth retrying (:data:`STORE_FAILED`, the one answer sent with ``Retry-After``)."""
    log.warning("the store failed %s: %s", during, error)
    if disk_full(error):
        return 507, DISK_FULL
    return 503, STORE_GONE if isinstance(error, StoreGone) else STORE_FAILED


def authorization_headers(scope: Scope) -> list[str]:
    """The ``Authorization`` headers of an ASGI request, as sent."""
    return [value.decode("latin-1") for name, value in scope.get("headers", ())
            if name.lower() == b"authorization"]


def bearer_key(authorization: str | None) -> str | None:
    """The key of an ``Authorization`` header, ``Bearer KEY`` (the scheme in any case, the key's
    surrounding spaces dropped), or None."""
    scheme, _, key = (authorization or "").partition(" ")
    return key.strip() if scheme.lower() == "bearer" and key.strip() else None


async def user_of_header(keys: KeyStore, authorization: str | None) -> str | None:
    """The user of an ``Authorization`` header's bearer key, or None."""
    key = bearer_key(authorization)
    return None if key is None else await user_of_key(keys, key)


Lookup = Literal["user", "holder"]
"""The :class:`KeyStore` method that reads a key: :meth:`KeyStore.user` or :meth:`KeyStore.holder`."""


async def _looked_up(keys: KeyStore, lookup: Lookup, key: str) -> str | None:
    """``keys.<lookup>(key)`` on the event loop when the keys are in a local file (one indexed read
    and one SHA-256, tens of microseconds: a worker thread would cost each request a hand-off to
    the pool and back), else on a worker thread: a database that stalls or restarts must not hold
    the loop, and with it every other request, ``/healthz`` included."""
    read = getattr(keys, lookup)
    if keys.local:
        return cast(str | None, read(key))
    return cast(str | None, await anyio.to_thread.run_sync(read, key))


async def user_of_key(keys: KeyStore, key: str) -> str | None:
    """:meth:`KeyStore.user`, read by :func:`_looked_up`."""
    return await _looked_up(keys, "user", key)


Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


async def _required(request: Request, credentials: Credentials, lookup: Lookup) -> str:
    """What the request's one live key reads as (:func:`_looked_up`); 400 with more than one
    Authorization header, 401 without a live key, 403 for an :class:`UnservableKey`."""
    if len(request.headers.getlist("authorization")) > 1:
        raise HTTPException(400, TWO_KEYS)
    keys = request.app.state.service.keys
    try:
        found = None if credentials is None else await _looked_up(keys, lookup, credentials.credentials)
    except UnservableKey as err:
        raise HTTPException(403, str(err)) from None
    if found is None:
        raise HTTPException(401, UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})
    return found


async def metrics_reader(request: Request, credentials: Credentials) -> None:
    """Let a live metrics key through (:meth:`KeyStore.holder`); 403 with a user's key, otherwise
    as :func:`_required` refuses."""
    if await _required(request, credentials, "holder") != METRICS:
        raise HTTPException(403, METRICS_ONLY)


async def current_user(request: Request, credentials: Credentials) -> str:
    """The key's user (:meth:`KeyStore.user`), refused as :func:`_required` refuses."""
    return await _required(request, credentials, "user")


User = Annotated[str, Depends(current_user)]


class KeyGuard:
    """ASGI wrapper: 401 without a live key (403 for an unservable one, 503 when the key could not
    be read), else ``scope["state"]["user_id"]`` is the key's user."""

    def __init__(self, app: ASGIApp, keys: KeyStore) -> None:
        self.app, self.keys = app, keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = authorization_headers(scope)
        try:
            user = await user_of_header(self.keys, given[0]) if len(given) == 1 else None
        except UnservableKey as err:
            user, answer = None, (403, str(err))
        except StoreError as err:  # the key could not be read: the store failed (a database restart)
            user, answer = None, store_failed(f"reading a key for {scope['path']}", err)
        else:
            answer = (400, TWO_KEYS) if len(given) > 1 else (401, UNAUTHORIZED)
        if user is None:
            status, message = answer
            failed = status in (503, 507)  # the store failed, not the key
            headers = [(b"content-type", b"application/json")]
            if message == STORE_FAILED:
                headers.append((b"retry-after", b"1"))
            elif not failed:
                headers.append((b"www-authenticate", b"Bearer"))
            await send({"type": "http.response.start", "status": status, "headers": headers})
            detail = refusal(message, None if failed else KEY_FIELD)
            await send({"type": "http.response.body", "body": refusal_body(scope, status, detail)})
            return
        scope.setdefault("state", {})["user_id"] = user
        await self.app(scope, receive, send)
