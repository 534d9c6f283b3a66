"""A refusal answered before the application reads a request (the body limit, the key check, the
last-word middleware): the service's error object ``{"error", "field"?}`` (:func:`refusal`, which
every refusal of the service and its MCP tools is built from) as every route answers it, except at
the MCP endpoint, where it is the ``data`` of a JSON-RPC error. An MCP client reads
no other body at an error status: it would tell its caller only that the server answered an
error, not which, nor what to send instead."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from mcp.types import INTERNAL_ERROR, INVALID_REQUEST
from starlette.types import Scope

MCP_PATH = "/mcp"
"""Where the service answers MCP (streamable HTTP)."""


def refusal(message: str, field: str | None = None) -> dict[str, Any]:
    """The service's refusal object: ``{"error"}``, and ``"field"`` where one field is at fault."""
    return {"error": message} if field is None else {"error": message, "field": field}


def refusal_body(scope: Scope, status: int, detail: Mapping[str, Any]) -> bytes:
    """The body refusing the request of ``scope`` with ``status``: ``detail`` (its ``error`` the
    message) as JSON, or at :data:`MCP_PATH` a JSON-RPC error of that message holding ``detail``
    and the status (``id`` null: the request was not read)."""
    if scope.get("path") != MCP_PATH:
        return json.dumps(detail).encode()
    error = {"code": INTERNAL_ERROR if status >= 500 else INVALID_REQUEST, "message": detail["error"],
             "data": {**detail, "status": status}}
    return json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()
