"""The ``Server-Timing`` header of a search over HTTP: where its time went, in milliseconds.

``encode``, ``routes`` and ``fusion`` are the retrieval's own phases (``SearchResult.timings``;
0 for a phase the search did not run, as for a user with nothing stored), ``serialise`` is the
building of the response body, ``queue`` the time from the request's arrival at the app
(:class:`StampArrival`) to the start of the search handler: reading and validating the body, the
key check and the waits for a worker thread. The header holds these five names and numbers only,
the request's own figures: nothing of what the memory holds, for this user or another.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

HEADER = "Server-Timing"
RETRIEVAL_PHASES = ("encode", "routes", "fusion")
_ARRIVED = "arrived_s"


class StampArrival:
    """ASGI middleware, the app's outermost: the ``time.perf_counter()`` of each HTTP request's
    arrival, kept in the request's state."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope.setdefault("state", {})[_ARRIVED] = time.perf_counter()
        await self.app(scope, receive, send)


def queued_s(request: Request, started: float) -> float:
    """Seconds from the request's arrival to ``started`` (a ``time.perf_counter()``)."""
    return started - float(getattr(request.state, _ARRIVED))


def server_timing(timings: Mapping[str, float], *, serialise_s: float, queue_s: float) -> str:
    """The header's value: the retrieval's phases from ``timings`` (seconds), then ``serialise``
    and ``queue``; any other key of ``timings`` is left out."""
    phases = {name: timings.get(name, 0.0) for name in RETRIEVAL_PHASES}
    phases.update(serialise=serialise_s, queue=queue_s)
    return ", ".join(f"{name};dur={1000 * seconds:.3f}" for name, seconds in phases.items())
