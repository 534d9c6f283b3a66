"""The FastAPI application: the ``/v1`` routers, ``/healthz``, ``/metrics`` and MCP at ``/mcp``.

:func:`create_app` takes an open memory and the key store; it owns neither (the caller closes
them after the server stops). Its lifespan runs the MCP session manager and, on shutdown, drains
writes (:mod:`retrieval.service.drain`) before the caller may close the memory. OpenAPI is at
``/docs``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
from fastapi import Depends, FastAPI
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp

from retrieval.service import errors, limits, schemas
from retrieval.service.auth import KeyGuard
from retrieval.service.body_limit import BodyLimit
from retrieval.service.docs_page import add_docs_page
from retrieval.service.drain import WriteGate
from retrieval.service.early_refusal import MCP_PATH
from retrieval.service.gauges import StoreGauges
from retrieval.service.key_share import KeyShare
from retrieval.service.keys import KeyStore
from retrieval.service.mcp_tools import build_mcp, key_user
from retrieval.service.metrics import NamedRoute, RequestMetrics, ServiceMetrics
from retrieval.service.routers import jobs, memories, search, sessions, system, user
from retrieval.service.state import Service
from retrieval.service.strict_query import refuse_undeclared_input
from retrieval.service.timing import StampArrival

if TYPE_CHECKING:  # for types only: the app is handed an open memory, never builds one
    from retrieval.api.memory import Memory


def create_app(memory: Memory, keys: KeyStore, store: str | Path, *, host: str = "127.0.0.1") -> FastAPI:
    """The HTTP + MCP application over ``memory`` (open on ``store``, a directory or a URL); ``host``
    is the address served (MCP's DNS-rebinding protection accepts only it and loopback names)."""
    gate, gauges = WriteGate(), StoreGauges(store, memory.cache_gauges)
    service = Service(memory, keys, gate, ServiceMetrics(gauges))
    mcp = build_mcp(memory, gate, key_user)
    mcp.streamable_http_app(streamable_http_path=MCP_PATH, stateless_http=True, json_response=True, host=host)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with mcp.session_manager.run():
            yield
        await anyio.to_thread.run_sync(gate.close, limits.WRITE_DRAIN_S)
        gauges.close()

    app = FastAPI(title="isq-memory", version="1", lifespan=lifespan, redirect_slashes=False,
                  docs_url=None, redoc_url=None,  # add_docs_page serves /docs without a CDN
                  description="Long-term memory for agents: every /v1 call acts for the user of its API key.")
    add_docs_page(app)
    app.state.service = service
    errors.install(app)
    for module in (sessions, search, memories, user, jobs):
        app.include_router(module.router, dependencies=[Depends(refuse_undeclared_input)],
                           responses=schemas.REFUSALS)
    app.include_router(system.router, dependencies=[Depends(refuse_undeclared_input)])
    app.state.routes = [route for module in (sessions, search, memories, user, jobs, system)
                        for route in module.router.routes]  # a 405's Allow (errors._allowed)
    # POST only: a stateless server sends nothing on a GET stream but pings, which held a connection
    # open for as long as the client liked, past its key's revocation (the protocol allows 405)
    app.router.routes.append(NamedRoute(MCP_PATH, KeyGuard(StreamableHTTPASGIApp(mcp.session_manager), keys),
                                        methods=["POST"]))
    app.add_middleware(KeyShare)  # inside the body limit: a waiting request has read its body
    app.add_middleware(BodyLimit)
    app.add_middleware(errors.UnexpectedErrors)  # inside the metrics: they count its 500s
    app.add_middleware(RequestMetrics, metrics=service.metrics)
    app.add_middleware(StampArrival)  # outermost: a search's queue time starts at its arrival
    return app
