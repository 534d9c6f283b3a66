"""413 for a request body over :data:`~retrieval.service.limits.MAX_BODY_BYTES`, and 422 for one
that is not UTF-8 or whose JSON gives one object a key twice, nests past the parser's depth or
holds an integer too long to read, before the application parses it.

A declared ``Content-Length`` over the limit is refused after the body is read and thrown away
(up to :data:`~retrieval.service.limits.DISCARD_BYTES`, so that the client, done sending, reads
the 413 instead of a reset connection), and so is a body found too long; a client that asked to
be told first (``Expect: 100-continue``, as curl does) is refused before it sends the body.
Whatever the headers declare, the body is read up to the limit and replayed to the application,
or refused once it passes it: the bytes received are counted, since a request may declare a small
``Content-Length`` and send a longer chunked body, which the server reads by its
``Transfer-Encoding``. Every body the service reads is JSON, which travels in UTF-8 (RFC 8259):
the JSON parser would otherwise guess UTF-16 or UTF-32 from a body's first bytes and take it, so
a body holding a zero byte is refused too (no JSON in UTF-8 holds one, while ASCII text in UTF-16
is valid UTF-8 for its zero bytes).
A UTF-8 byte order mark is allowed (the parser skips it, as the RFC lets it). A key given twice
in one object (``{"k": 1, "k": 100}``) would reach the application as its last value alone, the
others dropped unseen (RFC 8259 leaves such objects' meaning open): it is refused naming the key,
as a query parameter given twice is (:mod:`retrieval.service.strict_query`); the depth and the
integer are refused saying which, where the application would say only that it could not parse
the body (:mod:`retrieval.memory.strict_json`). A body that is not
JSON at all goes on to the application, which refuses it in its own words. The check runs before
the key's (every request's body is read first), so a long body is parsed on a worker thread
(:data:`~retrieval.service.limits.INLINE_JSON_BYTES`): junk sent without a key holds no other
request. At the MCP endpoint a
refusal is a JSON-RPC error (:mod:`retrieval.service.early_refusal`), and a message the SDK would
not answer is refused there too (:mod:`retrieval.service.mcp_messages`).
"""

from __future__ import annotations

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from retrieval.memory import strict_json
from retrieval.service.early_refusal import MCP_PATH, refusal, refusal_body
from retrieval.service.limits import DISCARD_BYTES, INLINE_JSON_BYTES, JSON_PARSERS, MAX_BODY_BYTES
from retrieval.service.mcp_messages import unanswerable, unsupported_type


async def _refuse(scope: Scope, send: Send, status: int, message: str) -> None:
    body = refusal_body(scope, status, refusal(message, "body"))
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """ASGI middleware enforcing the body limit on every HTTP request (the MCP endpoint included)."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY_BYTES) -> None:
        self.app, self.limit = app, limit
        self._parsers = anyio.CapacityLimiter(JSON_PARSERS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length")
        too_long = f"request body over {self.limit} bytes"
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            waiting = headers.get(b"expect", b"").lower() == b"100-continue"  # sends nothing until answered
            if not waiting and declared.isdigit() and int(declared) <= DISCARD_BYTES:
                await _read_within(receive, DISCARD_BYTES)
            await _refuse(scope, send, 413, too_long)
            return
        body, ended = await _read_within(receive, self.limit)
        if body is None:
            if not ended:
                await _read_within(receive, DISCARD_BYTES)  # the rest, if it ends soon enough
            await _refuse(scope, send, 413, too_long)
            return
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as err:
            await _refuse(scope, send, 422, f"body: not UTF-8 (byte {err.start}); send JSON in UTF-8")
            return
        if b"\x00" in body:  # no JSON in UTF-8 holds one: UTF-16 or -32 text, which the parser would take
            await _refuse(scope, send, 422, f"body: not UTF-8 JSON (a zero byte at {body.index(0)}); "
                                            "send JSON in UTF-8")
            return
        mcp = scope.get("path") == MCP_PATH
        posted = mcp and scope.get("method") == "POST"  # other methods are 405 (the route takes POST only)
        if posted and (why := unsupported_type(headers.get(b"content-type"))) is not None:
            await _refuse(scope, send, 415, why)
            return
        try:
            message = await self._parsed(body)
        except strict_json.JSONRefused as refused:
            await _refuse(scope, send, 422, f"body: {refused}")
            return
        except ValueError:
            pass  # not JSON: the application refuses it in its own words
        else:
            if mcp and (why := unanswerable(message)) is not None:
                await _refuse(scope, send, 400, f"body: {why}")
                return
        await self.app(scope, _replay(body, receive), send)

    async def _parsed(self, body: bytes) -> object:
        """:func:`strict_json.loads` of ``body``: on the event loop up to :data:`INLINE_JSON_BYTES`,
        past it on one of :data:`JSON_PARSERS` worker threads."""
        if len(body) <= INLINE_JSON_BYTES:
            return strict_json.loads(body)
        return await anyio.to_thread.run_sync(strict_json.loads, body, limiter=self._parsers)


async def _read_within(receive: Receive, limit: int) -> tuple[bytes | None, bool]:
    """The request's body, or None once more than ``limit`` bytes of it have arrived; and whether
    the whole body has arrived (or the client has gone)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), True
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        more = message.get("more_body", False)
        if size > limit:
            return None, not more
        if not more:
            return b"".join(chunks), True


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}
    return replay
