"""What one request may ask of the server. The body size is the server's own; every other limit
is the memory's (:mod:`retrieval.api.limits`, defined there once and re-exported here for the
request models and the MCP tools).

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
    MAX_TURNS,
)

__all__ = ["DEFAULT_K", "DEFAULT_PAGE", "ID_PATTERN", "MAX_BODY_BYTES", "MAX_ID_CHARS", "MAX_K",
           "MAX_MEMORY_ID_CHARS", "MAX_PAGE",
           "MAX_QUERY_CHARS", "MAX_TEXT_CHARS", "MAX_TURNS"]

MAX_BODY_BYTES = 1_048_576
"""A request body larger than this (declared or streamed) is refused with 413."""
