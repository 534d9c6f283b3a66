"""The server under failure and misuse: an unexpected exception is one log record and a clean 500
on a connection that stays usable; an MCP tool's bad argument is a reason, not a traceback; slow
clients are disconnected; SIGTERM with a stalled client and a stuck request exits within its
bound, without tracebacks, and a second signal ends it at once."""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import Client

from benchmarks.service_process import ROOT, bearer, child_env, free_port
from retrieval.extract.rules import RuleExtractor
from retrieval.service import operations
from retrieval.service.auth import INGEST_FAILED
from retrieval.service.connections import ConnectionTimeouts
from retrieval.service.drain import WriteGate
from retrieval.service.limits import KEY_CALLS
from retrieval.service.mcp_tools import build_mcp, fixed_user
from tests.service_thread import open_memory, served

SHORT = ConnectionTimeouts(keep_alive_s=30.0, header_s=0.5, body_s=0.5)
"""Deadlines short enough for a test; keep-alive long, so that only the deadlines close connections."""
WAIT_S = 30.0
"""How long a test waits for something that should happen within a second (never on success)."""


def local_address(response: httpx.Response) -> tuple[str, int]:
    """The client's end of the connection that carried ``response``."""
    return response.extensions["network_stream"].get_extra_info("client_addr")


def test_an_unexpected_error_is_one_record_and_a_500_on_a_connection_that_stays_usable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    real, calls = operations.list_memories, []

    def fails_once(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise RuntimeError("injected failure")
        return real(*args, **kwargs)

    monkeypatch.setattr(operations, "list_memories", fails_once)
    caplog.set_level(logging.INFO)
    with served(tmp_path / "store") as server:
        with httpx.Client(base_url=server.url, headers=bearer(server.keys.create("alice")),
                          timeout=WAIT_S) as client:
            failed = client.get("/v1/memories")
            first_connection = local_address(failed)
            answered = client.get("/v1/memories")
            assert local_address(answered) == first_connection, "the second request needed a new connection"
    assert failed.status_code == 500, failed.text
    request_id = failed.json()["request_id"]
    assert failed.headers["x-request-id"] == request_id and "injected" not in failed.text
    assert set(failed.json()) == {"error", "request_id"}
    assert answered.status_code == 200 and answered.json() == {"items": [], "next_cursor": None}
    errors = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert len(errors) == 1, [record.getMessage() for record in errors]
    assert request_id in errors[0].getMessage() and errors[0].exc_info is not None
    assert sum(record.exc_info is not None for record in caplog.records) == 1


def test_an_unexpected_error_in_an_mcp_tool_is_one_record_and_an_error_naming_its_request_id(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def fails(*args, **kwargs):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(operations, "list_memories", fails)
    caplog.set_level(logging.INFO)
    memory = open_memory(tmp_path / "store")

    async def call():
        async with Client(build_mcp(memory, WriteGate(), fixed_user("alice"))) as client:
            return await client.call_tool("memory_list", {}), await client.call_tool("memory_search",
                                                                                      {"query": "tea"})

    try:
        failed, answered = anyio.run(call)
    finally:
        memory.close()
    typed = failed.structured_content
    assert failed.is_error and set(typed) == {"error", "request_id", "status"} and typed["status"] == 500
    assert typed["error"] == failed.content[0].text and typed["request_id"] in typed["error"]
    assert "injected" not in str(failed) and not answered.is_error
    errors = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert len(errors) == 1 and typed["request_id"] in errors[0].getMessage(), errors
    assert errors[0].exc_info is not None
    assert sum(record.exc_info is not None for record in caplog.records) == 1


BAD_ARGUMENTS = [("memory_search", {"query": "cat", "k": 0}, "k"),
                 ("memory_search", {"query": "cat", "k": 10**6}, "k"),
                 ("memory_search", {"query": ""}, "query"),
                 ("memory_search", {"query": "cat", "session_id": "a b"}, "session_id"),
                 ("memory_add", {"session_id": "s", "turns": [{"speaker": "a", "text": ""}]}, "text"),
                 ("memory_list", {"limit": 0}, "limit"),
                 ("memory_list", {"cursor": "not-a-cursor"}, "cursor"),
                 ("memory_delete", {"memory_id": "nope"}, "memory_id"),
                 ("memory_forget", {"session_id": "never"}, "session_id"),
                 ("memory_flush", {"session_id": "never"}, "session_id")]


@pytest.mark.parametrize(("tool", "arguments", "named"), BAD_ARGUMENTS,
                         ids=[f"{tool}-{named}" for tool, _, named in BAD_ARGUMENTS])
def test_an_mcp_tools_bad_argument_is_named_and_logs_no_traceback(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, tool: str, arguments: dict, named: str) -> None:
    memory = open_memory(tmp_path / "store")
    caplog.set_level(logging.INFO)

    async def call():
        async with Client(build_mcp(memory, WriteGate(), fixed_user("alice"))) as client:
            return await client.call_tool(tool, arguments)

    try:
        result = anyio.run(call)
    finally:
        memory.close()
    message = result.content[0].text
    assert result.is_error and message.split(":")[0].endswith(named), message  # the argument first
    typed = result.structured_content
    assert (typed["error"], typed["field"].split(".")[-1]) == (message, named), typed
    assert typed["status"] in (404, 422), typed
    assert not [record for record in caplog.records if record.exc_info or record.levelno >= logging.ERROR]


SECRET = "/srv/isq/secrets/llm-token.json"


def test_a_failed_segment_tells_the_client_to_retry_and_only_the_log_why(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """The extractor's error names what the server holds (an endpoint, a file): HTTP and MCP say
    the turns are kept and tried again, and the server's log says why."""
    def failing(self, segment, context):
        raise PermissionError(f"[Errno 13] Permission denied: '{SECRET}'")

    monkeypatch.setattr(RuleExtractor, "extract", failing)
    with served(tmp_path / "store") as server:
        key = server.keys.create("alice")
        with httpx.Client(base_url=server.url, headers=bearer(key), timeout=WAIT_S) as alice:
            added = alice.post("/v1/sessions/s1/turns",
                               json={"turns": [{"speaker": "Ann", "text": "I like tea."}]})
            assert added.status_code == 200, added.text
            flushed = alice.post("/v1/sessions/s1/flush")
            assert (flushed.status_code, flushed.headers["retry-after"]) == (503, "1"), flushed.text
            assert flushed.json() == {"error": INGEST_FAILED}

            async def flush_over_mcp():
                async with Client(build_mcp(server.memory, WriteGate(), fixed_user("alice"))) as client:
                    return await client.call_tool("memory_flush", {"session_id": "s1"})

            over_mcp = anyio.run(flush_over_mcp)
            assert over_mcp.is_error and over_mcp.content[0].text == INGEST_FAILED
            assert over_mcp.structured_content == {"error": INGEST_FAILED, "status": 503}  # worth retrying
            assert "tea" in alice.post("/v1/search", json={"query": "tea"}).text  # still stored and found
    assert SECRET in caplog.text and "processing the turns of user 'alice' failed" in caplog.text


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``sock`` (end of stream or reset) within ``seconds``, reading
    whatever it sends meanwhile."""
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return True


SLOW_REQUESTS = {
    "nothing sent": b"",
    "half a request head": b"GET /healthz HTTP/1.1\r\nHost: x\r\nUser-Agen",
    "a declared body cut short": (b"POST /v1/search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                  b"Content-Length: 100\r\n\r\n{\"query\": "),
    "a stalled chunked body": (b"POST /v1/search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                               b"Transfer-Encoding: chunked\r\n\r\n9\r\n{\"query\":\r\n"),
    "a second request head trickling on a kept-alive connection": (
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHo"),
}


def test_slow_clients_are_disconnected(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    still_open = []
    with served(tmp_path / "store", SHORT) as server:
        for case, sent in SLOW_REQUESTS.items():
            with socket.create_connection(("127.0.0.1", server.port)) as sock:
                sock.sendall(sent)
                if not closed_within(sock, WAIT_S):
                    still_open.append(case)
        with httpx.Client(base_url=server.url, timeout=WAIT_S) as client:  # a prompt client is served
            assert [client.get("/healthz").status_code for _ in range(3)] == [200, 200, 200]
    assert not still_open
    assert not [record for record in caplog.records if record.exc_info or record.levelno >= logging.ERROR]


def test_healthz_answers_while_every_worker_thread_waits_on_the_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests held by the store (a lock another node keeps) fill the worker threads; the health
    check still answers, so a load balancer does not take a node that serves others' out. (Each
    key has KEY_CALLS requests inside at a time: the requests come from as many keys as fill it.)"""
    real, release, waiting = operations.list_memories, threading.Event(), threading.Semaphore(0)

    def held(*args, **kwargs):
        waiting.release()
        release.wait(WAIT_S)
        return real(*args, **kwargs)

    monkeypatch.setattr(operations, "list_memories", held)
    async def worker_threads() -> float:  # anyio's default limit, which the server's sync routes share
        return anyio.to_thread.current_default_thread_limiter().total_tokens

    held_requests = int(anyio.run(worker_threads)) + 8
    with served(tmp_path / "store") as server:
        keys = [server.keys.create(f"user{n}") for n in range(held_requests // KEY_CALLS + 1)]

        def list_memories(key: str) -> None:
            with httpx.Client(base_url=server.url, headers=bearer(key), timeout=WAIT_S) as client:
                client.get("/v1/memories")

        callers = [threading.Thread(target=list_memories, args=(keys[n // KEY_CALLS],))
                   for n in range(held_requests)]
        for caller in callers:
            caller.start()
        try:
            for _ in range(held_requests - 8):  # every worker thread is taken
                assert waiting.acquire(timeout=WAIT_S)
            with httpx.Client(base_url=server.url, timeout=5.0) as client:
                assert client.get("/healthz").json() == {"status": "ok"}
        finally:
            release.set()
            for caller in callers:
                caller.join(WAIT_S)


SERVER = """
import asyncio, sys
from pathlib import Path
from retrieval.serve import run
from retrieval.service.app import create_app
from retrieval.service.connections import ConnectionTimeouts
from retrieval.service.keys import KeyStore
from tests.service_thread import open_memory

store, port = Path(sys.argv[1]), int(sys.argv[2])
memory, keys = open_memory(store), KeyStore(store)
app = create_app(memory, keys, store)

@app.get("/stuck")
async def stuck() -> None:
    print("stuck request running", flush=True)
    await asyncio.Event().wait()

try:
    run(app, "127.0.0.1", port, ConnectionTimeouts(header_s=300, body_s=300, drain_s=1))
finally:
    memory.close()
    keys.close()
"""
"""``retrieval.serve.run`` with a route that never finishes, long read deadlines and a 1 s drain."""


def wait_for(predicate, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.05)


@pytest.mark.slow
def test_sigterm_with_a_stalled_client_and_a_stuck_request_exits_within_the_drain(tmp_path: Path) -> None:
    store, port, log = tmp_path / "store", free_port(), tmp_path / "server.log"
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as output:
        process = subprocess.Popen([sys.executable, "-c", SERVER, str(store), str(port)], cwd=ROOT,
                                   env=child_env(), stdout=output, stderr=subprocess.STDOUT)
    answers: list[httpx.Response] = []
    try:
        def healthy() -> bool:
            assert process.poll() is None, log.read_text()
            try:
                return httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(healthy, "server")
        stalled = socket.create_connection(("127.0.0.1", port))
        stalled.sendall(b"POST /v1/search HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"query\"")
        asker = threading.Thread(target=lambda: answers.append(httpx.get(f"{url}/stuck", timeout=WAIT_S)))
        asker.start()
        wait_for(lambda: "stuck request running" in log.read_text(), "stuck request")
        process.send_signal(signal.SIGTERM)
        assert process.wait(120) == 0
        asker.join(WAIT_S)
        assert closed_within(stalled, WAIT_S)
        stalled.close()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
    text = log.read_text()
    assert "Traceback" not in text and "CancelledError" not in text, text
    assert [answer.status_code for answer in answers] == [503], text
    assert answers[0].json()["request_id"] in text


STUCK = """
import asyncio, sys, time
from retrieval.serve import listening, run
from retrieval.service.connections import ConnectionTimeouts

async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while (message := await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    print("request running", flush=True)
    await asyncio.Event().wait()  # stands for a write waiting on the store

port = int(sys.argv[1])
run(app, "127.0.0.1", port, ConnectionTimeouts(drain_s=300), listener=listening("127.0.0.1", port))
time.sleep(300)  # stands for closing a memory whose running step waits on a stuck LLM call
"""
"""``retrieval.serve.run`` whose requests never end, with a five-minute drain, and whose caller then
waits five minutes."""


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("phase", ["requests drain", "memory closes"])
def test_a_second_signal_stops_the_server_at_once(tmp_path: Path, phase: str, second: signal.Signals) -> None:
    """After the first SIGTERM the server waits for running requests (up to its drain), then, once
    it has stopped serving, for the memory's running ingestion step, which an extractor's LLM call
    can hold for minutes: a further SIGTERM or SIGINT ends the process then, by that signal, without
    a traceback (uvicorn ignored a second SIGTERM while requests ran, and answered a second SIGINT by
    cancelling them, a traceback each, skipping the write drain; both were ignored while the memory
    closed)."""
    port, log = free_port(), tmp_path / "server.log"
    with log.open("wb") as output:
        process = subprocess.Popen([sys.executable, "-c", STUCK, str(port)], cwd=ROOT,
                                   env=child_env(), stdout=output, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: b"Application startup complete" in log.read_bytes(), "server")
        if phase == "requests drain":
            def ask() -> None:
                with contextlib.suppress(httpx.TransportError):  # the server dies under it
                    httpx.get(f"http://127.0.0.1:{port}/", timeout=WAIT_S)

            threading.Thread(target=ask, daemon=True).start()
            wait_for(lambda: "request running" in log.read_text(), "request")
        process.send_signal(signal.SIGTERM)
        waited = "Waiting for connections to close" if phase == "requests drain" else "stopped serving"
        wait_for(lambda: waited in log.read_text(), waited)
        process.send_signal(second)
        assert process.wait(WAIT_S) == -second, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
    assert "Traceback" not in log.read_text(), log.read_text()


def test_an_interrupt_while_the_models_load_is_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    """Ctrl-C before anything is served ends the command with one line and status 130."""
    import retrieval.serve as serve_module

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(serve_module, "open_memory", interrupted)
    for process_wide in ("idle_threads_sleep", "bounded_allocator"):  # this test process's own settings
        monkeypatch.setattr(serve_module, process_wide, lambda: None)
    try:
        code = serve_module.main(["--store", str(tmp_path / "store"), "--port", str(free_port())])
    except KeyboardInterrupt:  # escaped as a traceback would, which would also end this test session
        pytest.fail("the interrupt escaped retrieval.serve.main")
    assert code == 130
    assert capsys.readouterr().err == "interrupted\n"


FREED_BLOCKS = """
import sys
from retrieval.service.launch import bounded_allocator
applied = bounded_allocator() if sys.argv[1] == "bounded" else []
import numpy as np
def rss_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
first = np.ones(300_000)
del first  # glibc's threshold rises past a freed 2.4 MB block: later 200 KB blocks come from the heap
blocks = [np.ones(25_000) for _ in range(1000)]
before = rss_mib()
del blocks[::2]
print(",".join(applied), round(before - rss_mib()))
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads the resident size from /proc")
def test_a_serving_processs_allocator_returns_freed_blocks_to_the_system() -> None:
    """Half of a thousand 200 KB arrays freed after a larger one: with glibc's defaults the
    process keeps their pages; with the serving commands' allocator settings (two arenas, a fixed
    128 KiB mmap threshold) it returns about 100 MiB. A setting the environment gives is left as
    it is."""
    import ctypes
    import ctypes.util

    if not hasattr(ctypes.CDLL(ctypes.util.find_library("c")), "gnu_get_libc_version"):
        pytest.skip("the settings are glibc's")
    env = {name: value for name, value in child_env().items() if not name.startswith("MALLOC_")}

    def freed(mode: str, **extra: str) -> tuple[str, int]:
        out = subprocess.run([sys.executable, "-c", FREED_BLOCKS, mode], cwd=ROOT, env={**env, **extra},
                             capture_output=True, text=True, timeout=120, check=True).stdout.split()
        return (out[0], int(out[1])) if len(out) == 2 else ("", int(out[0]))

    assert freed("default")[1] < 20
    applied, returned = freed("bounded")
    assert applied == "MALLOC_ARENA_MAX,MALLOC_MMAP_THRESHOLD_" and returned > 60
    assert freed("bounded", MALLOC_ARENA_MAX="4")[0] == "MALLOC_MMAP_THRESHOLD_"
