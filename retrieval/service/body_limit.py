"""413 for a request body over :data:`~retrieval.service.limits.MAX_BODY_BYTES`, before it is parsed.

A declared ``Content-Length`` over the limit is refused without reading the body. Whatever the
headers declare, the body is read up to the limit and replayed to the application, or refused once
it passes it: the bytes received are counted, since a request may declare a small
``Content-Length`` and send a longer chunked body, which the server reads by its
``Transfer-Encoding``.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from retrieval.service.limits import MAX_BODY_BYTES


async def _refuse(send: Send, limit: int) -> None:
    body = json.dumps({"error": f"request body over {limit} bytes", "field": "body"}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """ASGI middleware enforcing the body limit on every HTTP request (the MCP endpoint included)."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await _refuse(send, self.limit)
            return
        body = await _read_within(receive, self.limit)
        if body is None:
            await _refuse(send, self.limit)
            return
        await self.app(scope, _replay(body, receive), send)


async def _read_within(receive: Receive, limit: int) -> bytes | None:
    """The request's body, or None once more than ``limit`` bytes of it have arrived."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > limit:
            return None
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}
    return replay
