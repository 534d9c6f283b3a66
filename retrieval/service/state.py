"""What the routes share: the memory, the key store, the write gate and the metrics of one app."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request

from retrieval.service.drain import WriteGate
from retrieval.service.keys import KeyStore
from retrieval.service.metrics import ServiceMetrics

if TYPE_CHECKING:  # for types only: the app is handed an open memory, never builds one
    from retrieval.api.memory import Memory


@dataclass(frozen=True)
class Service:
    memory: Memory
    keys: KeyStore
    gate: WriteGate
    metrics: ServiceMetrics


async def service(request: Request) -> Service:
    """On the event loop: a plain read, no worker thread."""
    return request.app.state.service


Shared = Annotated[Service, Depends(service)]
