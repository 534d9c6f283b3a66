"""What the MCP endpoint answers, checked before the SDK reads a request: one JSON-RPC 2.0
message, an object, whose ``id``, if it has one, is a string or an integer, as MCP requires, and
which names its method unless it is a response. The SDK reads a message with any other id
(``1.5``, ``{"a": 1}``, ``null``, ``true``) as a notification: it answers 202 with nothing done,
and its caller waits for an answer that never comes. A batch (a JSON array, which MCP no longer
allows), a message without ``"jsonrpc": "2.0"`` and a request without a method drew the SDK's
multi-line validation report. They are refused in one line, as every refusal at this path is
(:mod:`retrieval.service.early_refusal`); a body that is not JSON at all is left to the SDK's
parse error."""

from __future__ import annotations

from typing import Any


def unanswerable(message: Any) -> str | None:
    """Why the parsed body ``message`` of a POST to the MCP endpoint cannot be answered, or None."""
    if isinstance(message, list):
        return "a batch of JSON-RPC messages; send one message per request"
    if not isinstance(message, dict):
        return f"not a JSON-RPC message (an object), got {type(message).__name__}"
    if message.get("jsonrpc") != "2.0":
        return f"jsonrpc: a JSON-RPC message says \"jsonrpc\": \"2.0\", got {message.get('jsonrpc')!r}"
    if "id" in message:
        given = message["id"]
        if isinstance(given, bool) or not isinstance(given, str | int):
            return f"id: a request's id is a string or an integer, got {given!r}"
    if not ({"result", "error"} & set(message) or isinstance(message.get("method"), str)):
        return f"method: a request or notification names its method (a string), got {message.get('method')!r}"
    return None
