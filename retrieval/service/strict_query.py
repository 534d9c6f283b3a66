"""Unknown query parameters are refused, as unknown body fields are: ``GET /v1/memories?user_id=bob``
is a 422 naming ``query.user_id``, never a silently ignored request for someone else's data; so is
a body sent to a route that takes none (``DELETE /v1/user {"user_id": "alice"}`` would otherwise
forget the key's own user), and a parameter given twice (``?limit=1&limit=50``: which one counts
would be the framework's choice, not the caller's). A path or query string whose %-escapes are not
UTF-8 is refused too: the server would decode ``%FF`` as U+FFFD, and act on an id the caller never
named; so is an escaped slash in the path (``u:turn:t1%2Fhistory`` would be routed as the history
of ``u:turn:t1``)."""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute


def _takes_body(dependant: Dependant) -> bool:
    return bool(dependant.body_params) or any(_takes_body(sub) for sub in dependant.dependencies)


def _query_names(dependant: Dependant) -> set[str]:
    """The query parameters a route (with its dependencies) declares."""
    names = {param.alias for param in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


async def refuse_undeclared_input(request: Request) -> None:
    """A route dependency: 422 for a body the route does not take (any byte of one),
    for the first query parameter it does not declare and for the first one given twice (on the
    event loop: no I/O, so no worker thread), and for a path or query string that is not UTF-8 or a
    path holding an escaped slash."""
    for part, raw in (("path", request.scope.get("raw_path")), ("query", request.scope.get("query_string"))):
        try:
            unquote_to_bytes(raw or b"").decode("utf-8")
        except UnicodeDecodeError as err:
            raise RequestValidationError([{
                "type": "string_unicode", "loc": (part,), "input": None,
                "msg": f"not UTF-8 once its %-escapes are decoded (byte {err.start}): "
                       "%-escape each character's UTF-8 bytes"}]) from None
    if b"%2f" in (request.scope.get("raw_path") or b"").lower():  # routed as a "/": another route's id
        raise RequestValidationError([{"type": "string_pattern_mismatch", "loc": ("path",), "input": None,
                                       "msg": "an escaped slash (%2F): no id holds a slash"}])
    route = request.scope.get("route")
    # the body limit has read the body whole (retrieval.service.body_limit): an empty chunked one is none
    if isinstance(route, APIRoute) and not _takes_body(route.dependant) and await request.body():
        raise RequestValidationError([{"type": "extra_forbidden", "loc": ("body",), "input": None,
                                       "msg": "this route takes no body"}])
    known = _query_names(route.dependant) if isinstance(route, APIRoute) else set()
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        name = unknown[0]
        raise RequestValidationError([{
            "type": "extra_forbidden", "loc": ("query", name), "input": request.query_params[name],
            "msg": f"unknown query parameter (this route takes {sorted(known) or 'none'})"}])
    given = request.query_params
    repeated = sorted(name for name in set(given) if len(given.getlist(name)) > 1)
    if repeated:
        name = repeated[0]
        raise RequestValidationError([{
            "type": "extra_forbidden", "loc": ("query", name), "input": given.getlist(name),
            "msg": "given more than once (give it once)"}])
