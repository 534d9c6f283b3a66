"""A refusal as the service answers it, read the same at every path: the body
``{"error", "field"?}``, or at ``/mcp`` the ``data`` of the JSON-RPC error the body is there
(:mod:`retrieval.service.early_refusal`)."""

from __future__ import annotations

from typing import Any

from mcp.types import INTERNAL_ERROR, INVALID_REQUEST


def refusal_of(response: Any) -> dict[str, Any]:
    """The refusal ``response`` (an httpx or Starlette test client response) carries; at /mcp it
    is checked to be a JSON-RPC error of the same message and status first."""
    body = response.json()
    if response.url.path != "/mcp":
        return body
    assert (body["jsonrpc"], body["id"]) == ("2.0", None), body
    code = INTERNAL_ERROR if response.status_code >= 500 else INVALID_REQUEST
    detail = dict(body["error"]["data"])
    assert (body["error"]["code"], body["error"]["message"], detail.pop("status")) == (
        code, detail["error"], response.status_code), body
    return detail
