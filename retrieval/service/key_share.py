"""At most :data:`~retrieval.service.limits.KEY_CALLS` requests of one API key inside the
application at a time; the key's other requests wait their turn at the door, in arrival order,
holding no thread.

The routes and the MCP tools run on one pool of worker threads shared by every user (AnyIO's, 40
threads). A user's writes wait on the user's own locks (its adds, flushes, deletes and forgets
run one at a time), so a client sending many of them at once would fill the pool with threads
waiting on each other, and every other user's request would wait for a thread behind them (45
concurrent flushes of one user held another user's search for 114.7 s). Waiting here,
a key's extra requests cost the event loop a waiter each and leave the pool to the other keys.

A request whose client left while it waited is not run (a client that times out and sends again
would otherwise queue dead work ahead of its own retries): it is recorded with
:data:`CLIENT_GONE` under the route label :data:`retrieval.service.metrics.LEFT_WAITING`, and
nothing reaches the client.

A request without one bearer key passes (the key check refuses it at once); requests are grouped
by the key as the key check reads it (:func:`retrieval.service.auth.bearer_key`: "bearer" in any
case, spaces around the key), by its SHA-256, so no secret is held beyond the request.
"""

from __future__ import annotations

import hashlib

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from retrieval.service.auth import authorization_headers, bearer_key
from retrieval.service.limits import KEY_CALLS
from retrieval.service.metrics import LEFT_WAITING, UNROUTED

CLIENT_GONE = 499
"""The status a request whose client left before its turn is recorded with (nginx's "client
closed request"); the server sends nothing on a closed connection."""


class _Slots:
    """The calls of one key inside the application, and the requests that hold or wait for them."""

    def __init__(self, calls: int) -> None:
        self.limiter, self.requests = anyio.Semaphore(calls), 0


class KeyShare:
    """ASGI middleware (see the module docstring)."""

    def __init__(self, app: ASGIApp, calls: int = KEY_CALLS) -> None:
        self.app, self.calls = app, calls
        self._keys: dict[bytes, _Slots] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        given = authorization_headers(scope)
        bearer = bearer_key(given[0]) if len(given) == 1 else None
        if scope["type"] != "http" or bearer is None:
            await self.app(scope, receive, send)
            return
        key = hashlib.sha256(bearer.encode("latin-1")).digest()
        slots = self._keys.setdefault(key, _Slots(self.calls))
        slots.requests += 1
        try:
            async with slots.limiter:
                waiting = await _unless_gone(receive)
                if waiting is None:
                    scope[UNROUTED] = LEFT_WAITING
                    await send({"type": "http.response.start", "status": CLIENT_GONE, "headers": []})
                    await send({"type": "http.response.body", "body": b""})
                    return
                await self.app(scope, waiting, send)
        finally:
            slots.requests -= 1
            if not slots.requests:
                del self._keys[key]


async def _unless_gone(receive: Receive) -> Receive | None:
    """None when the client has left; else ``receive``, giving first what this look read. The
    messages already there are read without waiting (the body a request arrived with, then a
    disconnect if the client left), as Starlette's ``Request.is_disconnected`` looks."""
    read: list[Message] = []
    with anyio.CancelScope() as look:
        look.cancel()  # a receive that would wait ends the look at once
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            read.append(message)

    async def replayed() -> Message:
        return read.pop(0) if read else await receive()
    return replayed
