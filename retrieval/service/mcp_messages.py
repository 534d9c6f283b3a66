"""What the MCP endpoint answers, checked before the SDK reads a request: one JSON-RPC 2.0
message, an object, whose ``id``, if it has one, is a string or an integer, as MCP requires, and
which names its method unless it is a response. The SDK reads a message with any other id
(``1.5``, ``{"a": 1}``, ``null``, ``true``) as a notification: it answers 202 with nothing done,
and its caller waits for an answer that never comes. A batch (a JSON array, which MCP no longer
allows), a message without ``"jsonrpc": "2.0"``, a request without a method and params that are
not an object (or a tool call's name that is not a string) drew the SDK's multi-line validation
report or a message naming no field; a body not sent as JSON, its security check's plain-text
400; a string holding a lone surrogate (JSON can spell one, no store takes it), the SDK's parse
error naming no field, where the other routes name it. They are refused in one line, as every
refusal at this path is (:mod:`retrieval.service.early_refusal`); a body that is not JSON at all
is left to the SDK's parse error."""

from __future__ import annotations

from typing import Any

from retrieval.memory.records import lone_surrogate


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
    params = message.get("params")
    if params is not None and not isinstance(params, dict):
        return f"params: a message's params are an object, got {_shown(params)}"
    if message.get("method") == "tools/call":
        name, arguments = (params or {}).get("name"), (params or {}).get("arguments")
        if not isinstance(name, str):
            return f"params.name: a tool call names its tool (a string), got {_shown(name)}"
        if arguments is not None and not isinstance(arguments, dict):
            return f"params.arguments: a tool's arguments are an object, got {_shown(arguments)}"
    if (found := _lone_surrogate(message, "")) is not None:
        where, at = found
        return f"{where}: not valid Unicode (a lone surrogate at character {at})"
    return None


def _lone_surrogate(value: Any, where: str) -> tuple[str, int] | None:
    """The path of the first string (a key or a value) in ``value`` holding a lone surrogate, and
    where in it; None if none does."""
    if isinstance(value, str):
        at = lone_surrogate(value)
        return None if at is None else (where, at)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        inner = f"{where}.{key}" if where else str(key)
        if isinstance(key, str) and (at := lone_surrogate(key)) is not None:
            return inner, at
        if (found := _lone_surrogate(item, inner)) is not None:
            return found
    return None


def unsupported_type(content_type: bytes | None) -> str | None:
    """Why a POST to the MCP endpoint with this ``Content-Type`` cannot be answered, or None: a
    message travels as ``application/json`` (the SDK's own check answers any other in plain text)."""
    media = (content_type or b"").split(b";")[0].strip().lower().decode("latin-1")
    if media == "application/json":
        return None
    return f"Content-Type: an MCP message is sent as application/json, got {media or 'none'}"


def _shown(value: Any) -> str:
    """``repr(value)``, cut to 60 characters: a refusal quotes what it refused, not all of it."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
