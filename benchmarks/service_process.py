"""A real server for the service tests and the load test: ``python -m retrieval.serve`` in a
subprocess on a free loopback port, started and stopped by its caller."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 180.0  # importing torch and loading MiniLM on a busy 2-core machine


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def child_env() -> dict[str, str]:
    """This checkout first on the path, nothing downloaded."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false"}


def collector_pauses(url: str, metrics_key: str) -> dict[str, float]:
    """The server's full garbage collections so far and their seconds, from its ``/metrics``
    (read with a metrics key)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", headers=bearer(metrics_key), timeout=60).raise_for_status().text
    found = {family.name: family.samples[0].value for family in text_string_to_metric_families(text)
             if family.name in ("isq_gc_full_collections", "isq_gc_full_collection_seconds")}
    return {"count": found["isq_gc_full_collections"], "seconds": found["isq_gc_full_collection_seconds"]}


class Server:
    """One ``retrieval.serve`` process over ``store`` (a directory or a database URL); its output
    goes to ``server-PORT.log`` in ``logs``, by default the store directory's parent."""

    def __init__(self, store: Path | str, *extra: str, logs: Path | None = None) -> None:
        self.store, self.extra = store, extra
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (logs or Path(store).parent) / f"server-{self.port}.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> Server:
        command = [sys.executable, "-m", "retrieval.serve", "--store", str(self.store), "--port",
                   str(self.port), *self.extra]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(command, cwd=ROOT, env=child_env(), stdout=log, stderr=log)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        self.kill()
        raise RuntimeError(f"the server did not answer /healthz in {START_TIMEOUT_S} s:\n{self.log_tail()}")

    def stop(self, timeout_s: float = 120.0) -> int:
        """SIGTERM, then wait for it to drain and exit; its exit status."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL: no draining, no cleanup."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}
