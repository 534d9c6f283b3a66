"""The ``Server-Timing`` header of a search over HTTP: where its time went, in milliseconds.

The parts add up to the request's time in the app, from its arrival (:class:`StampArrival`, the
app's outermost middleware) to the start of its response:

* ``queue``: arrival to the start of the search handler: reading and validating the body, the
  key check, and the waits for worker threads;
* ``wait``: the memory's call outside the retrieval's phases: waiting for the user's guard
  (the user's add, segment commit or other search), making sure the user's search state is the
  store's latest (and building it when it is not);
* ``model_wait``, ``encode``, ``routes``, ``fusion``: the retrieval's own phases
  (``SearchResult.timings``; 0 for a phase the search did not run, as for a user with nothing
  stored): ``model_wait`` is the query's wait for the model (behind other requests' forwards,
  background work and anything else on the model thread; 0 where the memory's models share no
  batcher), ``encode`` the rest of encoding it;
* ``serialise``: building the response body;
* ``respond``: the handler's end to the response's start (the event loop taking the result back
  from the worker thread, the middlewares).

What a client measures beyond their sum is outside the app: the connection, uvicorn's parsing
and the client itself. The header holds these eight names and numbers only, the request's own
figures: nothing of what the memory holds, for this user or another. ``model_wait`` says how busy
the model was when the query came (about 0: idle): that someone's request or ingestion was using
it, not whose or what.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = "Server-Timing"
RETRIEVAL_PHASES = ("model_wait", "encode", "routes", "fusion")
SERVICE_PARTS = ("wait", "serialise", "queue", "respond")
"""The header's parts that are the service's, after :data:`RETRIEVAL_PHASES`."""
_ARRIVED, _HANDLED = "arrived_s", "handled_s"
_HEADER_NAME = HEADER.lower().encode()


class StampArrival:
    """ASGI middleware, the app's outermost: the ``time.perf_counter()`` of each HTTP request's
    arrival, kept in the request's state; a response that carries a ``Server-Timing`` header and
    whose handler marked its end (:func:`mark_handled`) gets its ``respond`` part at its start."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        state[_ARRIVED] = time.perf_counter()

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start" and _HANDLED in state:
                respond = f", respond;dur={1000 * (time.perf_counter() - state[_HANDLED]):.3f}".encode()
                message["headers"] = [(name, value + respond if name.lower() == _HEADER_NAME else value)
                                      for name, value in message.get("headers", [])]
            await send(message)

        await self.app(scope, receive, stamped)


def queued_s(request: Request, started: float) -> float:
    """Seconds from the request's arrival to ``started`` (a ``time.perf_counter()``)."""
    return started - float(getattr(request.state, _ARRIVED))


def mark_handled(request: Request) -> None:
    """The handler is done: the ``respond`` part counts from now."""
    setattr(request.state, _HANDLED, time.perf_counter())


def server_timing(timings: Mapping[str, float], *, call_s: float, serialise_s: float, queue_s: float) -> str:
    """The header's value as the handler sets it: ``wait`` (the memory call's ``call_s`` less the
    retrieval's phases), the retrieval's phases from ``timings`` (seconds), then ``serialise`` and
    ``queue``; any other key of ``timings`` is left out (``respond`` is appended at the start of
    the response)."""
    phases = {name: timings.get(name, 0.0) for name in RETRIEVAL_PHASES}
    parts = {"wait": max(0.0, call_s - sum(phases.values())), **phases, "serialise": serialise_s,
             "queue": queue_s}
    return ", ".join(f"{name};dur={1000 * seconds:.3f}" for name, seconds in parts.items())
