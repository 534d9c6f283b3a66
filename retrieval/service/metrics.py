"""Prometheus metrics of one server (prometheus-client, its own registry per app).

Per route (the route's path template, so ids do not multiply the series): requests by status,
latency histogram, errors (status >= 400). At scrape time, from the memory: records (AMUs), open
segments, queued consolidation jobs and the per-user caches (search states and their estimated
bytes, user streams). From the process, where it runs the collector's freezer
(:class:`retrieval.multi_route.collector.LongLivedFreezer`): its full collections, the seconds
they held the interpreter (every request in flight waits them out) and the objects frozen.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.routing import Match, Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from retrieval.multi_route.collector import installed_freezer

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

MemoryGauges = Callable[[], Mapping[str, float]]
"""Returns the memory's current value of each of :data:`_GAUGES`."""

_GAUGES = {"amus": "records (AMUs) stored, all users",
           "open_segments": "segments still open (turns not yet extracted)",
           "unfinished_jobs": "consolidation jobs queued or running (unfinished)",
           "search_states": "users whose search state is held in memory",
           "search_state_bytes": "estimated bytes of the search states held (bounded: least recent dropped)",
           "user_streams": "users whose segmentation stream is held in memory",
           "ingest_pending_turns": "turns stored but not yet processed by the ingestion worker"}


class _MemoryCollector(Collector):
    def __init__(self, read: MemoryGauges) -> None:
        self.read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        values = self.read()
        for name, help_text in _GAUGES.items():
            yield GaugeMetricFamily(f"isq_memory_{name}", help_text, value=values[name])


class _CollectorPauses(Collector):
    def collect(self) -> Iterator[Metric]:
        freezer = installed_freezer()
        if freezer is None:
            return
        yield CounterMetricFamily("isq_gc_full_collections", "full passes of the cyclic garbage collector",
                                  value=freezer.full_collections)
        yield CounterMetricFamily("isq_gc_full_collection_seconds",
                                  "seconds the full passes held the interpreter", value=freezer.full_seconds)
        yield GaugeMetricFamily("isq_gc_frozen_objects", "objects frozen out of the collector's passes",
                                value=gc.get_freeze_count())


class _InScope:
    """A Starlette route or mount that puts itself in the scope when it matches, as FastAPI's
    routes do, so that :func:`route_label` counts its requests under its path (a mount's: one
    series whatever path under it is asked for) instead of ``not_routed`` or the path asked."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)  # type: ignore[misc]  # the Route or Mount beside it
        return match, (child if match == Match.NONE else {**child, "route": self})


class NamedRoute(_InScope, Route):
    """A plain Starlette route counted under its path."""


class NamedMount(_InScope, Mount):
    """A mount counted under its path."""


UNROUTED = "isq.unrouted"
"""The scope key a middleware answering before routing sets to the route label the request is
counted under (:data:`LEFT_WAITING`); without it such a request is ``not_routed``."""
LEFT_WAITING = "left_waiting"
"""The route label of a request whose client left while it waited for its key's turn
(:mod:`retrieval.service.key_share`): routing never ran, and it is neither a 404 nor a 413."""


def route_label(scope: Scope) -> str:
    """The matched route's template (``/v1/memories/{memory_id}``); the path of one of FastAPI's
    own pages (``/openapi.json``: a plain route of a fixed path, which routing gives an endpoint
    and no route); :data:`UNROUTED`'s label for a request answered before routing on purpose;
    ``not_routed`` for one refused before routing (413) or matching no route (404)."""
    route = scope.get("route")
    if route is not None:
        return str(route.path)
    return str(scope["path"]) if "endpoint" in scope else str(scope.get(UNROUTED, "not_routed"))


METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
"""The request methods the ``method`` label names; any other is ``other``, so that requests with
made-up methods cannot add label values (and memory) without bound."""


def method_label(scope: Scope) -> str:
    return scope["method"] if scope["method"] in METHODS else "other"


class ServiceMetrics:
    """The registry and its instruments (:class:`RequestMetrics` fills the HTTP ones)."""

    def __init__(self, memory_gauges: MemoryGauges) -> None:
        self.registry = CollectorRegistry()
        labels = ("method", "route")
        self.requests = Counter("isq_http_requests", "HTTP requests answered", (*labels, "status"),
                                registry=self.registry)
        self.latency = Histogram("isq_http_request_seconds", "time to answer, by route", labels,
                                 buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.errors = Counter("isq_http_errors", "requests answered with status >= 400", (*labels, "status"),
                              registry=self.registry)
        self.registry.register(_MemoryCollector(memory_gauges))
        self.registry.register(_CollectorPauses())

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestMetrics:
    """ASGI middleware recording every HTTP request in a :class:`ServiceMetrics`."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began, status = time.perf_counter(), 500

        async def record_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            labels = (method_label(scope), route_label(scope))
            self.metrics.latency.labels(*labels).observe(time.perf_counter() - began)
            self.metrics.requests.labels(*labels, str(status)).inc()
            if status >= 400:
                self.metrics.errors.labels(*labels, str(status)).inc()
