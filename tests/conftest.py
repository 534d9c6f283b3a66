"""Shared fixtures: tiny random model configs, nothing downloaded."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from isq.config import ISQConfig  # noqa: E402
from isq.encoder import MINILM_ALIAS  # noqa: E402
from isq.export import CONFIG_KEY, config_checksum  # noqa: E402


@pytest.fixture(autouse=True)
def _environment_kept() -> Iterator[None]:
    """Each test ends with the process environment it started with: a seed Lightning exported
    (``PL_GLOBAL_SEED``, which a later run records as its own) or a thread setting a server put
    there is not read by the tests after it, and the SIGTERM handler a benchmark's ``main`` installs
    when called in-process does not turn the test worker's own termination into a ``SystemExit``."""
    before = dict(os.environ)
    on_sigterm = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, on_sigterm)
    if os.environ != before:
        os.environ.clear()
        os.environ.update(before)


def run_together(target, count: int) -> None:
    """Start ``count`` threads running ``target`` and wait for them all."""
    threads = [threading.Thread(target=target) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def write_config(directory: Path, meta: dict) -> None:
    """An export's ``config.json`` written as an edited but consistent export would hold it: its
    checksum of its own fields (where it has one) recorded again, so that the checks behind that
    one are those a test tries."""
    if CONFIG_KEY in meta:
        meta = {**meta, CONFIG_KEY: config_checksum(meta)}
    (Path(directory) / "config.json").write_text(json.dumps(meta))


def tiny_config(**overrides) -> ISQConfig:
    """A random 2-layer T5 encoder (d_model 32) + 1-layer decoder, with MiniLM's offline tokenizer."""
    values = dict(
        encoder="tiny-random-t5",
        tokenizer=MINILM_ALIAS,
        encoder_config=dict(model_type="t5", vocab_size=30522, d_model=32, d_ff=64, num_layers=2,
                            num_heads=2, d_kv=16, dropout_rate=0.0),
        code_dim=16,
        num_codes=64,
        decoder=dict(d_model=32, d_ff=64, num_decoder_layers=1, num_heads=2, d_kv=16, dropout_rate=0.0),
        max_length=64,
    )
    values.update(overrides)
    return ISQConfig(**values)


@pytest.fixture
def tiny() -> ISQConfig:
    return tiny_config()


@pytest.fixture(scope="session")
def postgres_server():
    """A PostgreSQL server for this test session (:mod:`tests.postgres_server`), stopped at its
    end; the tests that use it are skipped, with the reason, where PostgreSQL is not installed."""
    from tests.postgres_server import PostgresServer, missing_binaries

    reason = missing_binaries()
    if reason is not None:
        pytest.skip(reason)
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server) -> str:
    """The URL of a new, empty database on the session's server."""
    return postgres_server.database()


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request, tmp_path):
    """Each store backend in turn (:mod:`tests.store_backends`): a new SQLite store directory, then a
    new PostgreSQL database; the contract tests run the same assertions against both."""
    from tests.store_backends import postgres_backend, sqlite_backend

    if request.param == "sqlite":
        return sqlite_backend(tmp_path / "store")
    return postgres_backend(request.getfixturevalue("postgres_url"))
