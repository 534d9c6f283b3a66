"""What one request may ask of the server: the documented defaults, defined once.

Body size is checked before the body is parsed (413); the others are request-model constraints
(422 naming the field). The text limit is the store's own (:data:`MAX_TURN_CHARS`), so a turn
the server accepts is a turn the memory accepts. The MCP tools take the same models.
"""

from __future__ import annotations

from retrieval.memory.records import MAX_TURN_CHARS

MAX_BODY_BYTES = 1_048_576
"""A request body larger than this (declared or streamed) is refused with 413."""
MAX_TURNS = 100
"""Turns in one ``POST /v1/sessions/{session_id}/turns``."""
MAX_TEXT_CHARS = MAX_TURN_CHARS
"""Characters in one turn's text."""
MAX_QUERY_CHARS = 2_000
"""Characters in one search query."""
MAX_K = 100
"""Hits one search may return."""
DEFAULT_K = 10
MAX_PAGE = 100
"""Items in one ``GET /v1/memories`` page."""
DEFAULT_PAGE = 20
MAX_ID_CHARS = 128
"""Characters in a session id, memory id, turn id, speaker, time or idempotency key."""
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$"
"""What a session id may look like: it appears in URLs and store keys, so no slashes or spaces."""

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
