"""The service inside the test process: ``create_app`` over a model-free memory (the crc32 word
embedder), served by uvicorn with the server's own settings
(:func:`retrieval.service.connections.uvicorn_config`) in a thread on a free loopback port. uvicorn
leaves logging alone here, so every record reaches pytest's ``caplog``."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from benchmarks.service_process import free_port
from retrieval.api.memory import Memory
from retrieval.service.app import create_app
from retrieval.service.connections import ConnectionTimeouts, uvicorn_config
from retrieval.service.keys import KeyStore
from tests.multi_route_fixtures import WordEmbedder

START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Served:
    url: str
    port: int
    keys: KeyStore
    memory: Memory


def open_memory(store: Path | str, read_only: bool = False) -> Memory:
    return Memory.open(store, embedder=WordEmbedder(), read_only=read_only)


@contextmanager
def served(store: Path | str, timeouts: ConnectionTimeouts | None = None, *,
           read_only: bool = False) -> Iterator[Served]:
    """The app over ``store`` until the block ends (then drained and closed, like the server);
    ``timeouts`` are the server's unless given; ``read_only`` as ``retrieval.serve --read-only``."""
    memory, keys = open_memory(store, read_only), KeyStore(store, create=not read_only, read_only=read_only)
    port = free_port()
    config = uvicorn_config(create_app(memory, keys, store), "127.0.0.1", port,
                            timeouts or ConnectionTimeouts(), log_config=None)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        yield Served(f"http://127.0.0.1:{port}", port, keys, memory)
    finally:
        server.should_exit = True
        thread.join(START_TIMEOUT_S)
        memory.close()
        keys.close()
