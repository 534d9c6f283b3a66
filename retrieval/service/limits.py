"""What one request may ask of the server. The body size is the server's own; every other limit
is the memory's (:mod:`retrieval.api.limits`, defined there once and re-exported here for the
request schemas and the MCP tools).

Body size is checked before the body is parsed (413); the others are request-model constraints
(422 naming the field).
"""

from __future__ import annotations

from retrieval.api.limits import (
    DEFAULT_K,
    DEFAULT_PAGE,
    ID_PATTERN,
    MAX_ID_CHARS,
    MAX_K,
    MAX_MEMORY_ID_CHARS,
    MAX_PAGE,
    MAX_QUERY_CHARS,
    MAX_TEXT_CHARS,
    MAX_TURN_ID_CHARS,
    MAX_TURNS,
)

__all__ = ["DEFAULT_K", "DEFAULT_PAGE", "DISCARD_BYTES", "ID_PATTERN", "MAX_BODY_BYTES", "MAX_ID_CHARS",
           "MAX_K", "MAX_MEMORY_ID_CHARS", "MAX_PAGE", "MAX_QUERY_CHARS", "MAX_TEXT_CHARS",
           "MAX_TURN_ID_CHARS", "MAX_TURNS"]

MAX_BODY_BYTES = 1_048_576
"""A request body larger than this (declared or streamed) is refused with 413."""
DISCARD_BYTES = 4 * MAX_BODY_BYTES
"""How much of a refused body the server reads and throws away before it answers 413: a
connection closed with bytes unread is reset, and a client still sending would lose the answer.
A body declared longer than this gets the 413 at once."""

INLINE_JSON_BYTES = 4_096
"""A body up to this long is parsed on the event loop (a millisecond at worst); a longer one on a
worker thread of its own few (:data:`JSON_PARSERS`): a megabyte of nested empty objects takes
0.1-0.4 s to parse on the 2-core machine (idle to busy), and on the loop it would hold every
request, a keyless one's included (the key is checked after the body is read), ``/healthz`` too."""
JSON_PARSERS = 2
"""Threads that parse long bodies at once: junk bodies cannot take the pool the routes run on."""

KEY_CALLS = 4
"""Requests of one API key in the application at a time (:mod:`retrieval.service.key_share`): the
others wait at the door, holding no worker thread."""

# How long the server waits on a connection (:mod:`retrieval.service.connections`) and on shutdown.
KEEP_ALIVE_S = 5.0
"""An idle keep-alive connection is closed after this long without a new request."""
HEADER_TIMEOUT_S = 10.0
"""A request head (request line and headers) must arrive whole within this long of the connection
opening or of the previous response: a client trickling headers is disconnected."""
BODY_TIMEOUT_S = 20.0
"""A request body (declared or chunked) must arrive whole within this long of its head."""
DRAIN_S = 20.0
"""After SIGTERM, how long requests already received may run; then they are cancelled (answered 503)."""
WRITE_DRAIN_S = 60.0
"""Then, how long shutdown waits for writes still running in worker threads (an add that closes a
segment runs extraction) before the memory closes."""
