"""A read-only server (``retrieval.serve --read-only``) beside the memory that writes the store: it
answers reads from the store's last commit, new turns and deletions included, refuses every write
with one 403 that changes nothing, and its MCP endpoint lists only the tools that read."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import anyio
import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from benchmarks.service_process import bearer, free_port
from retrieval.api.errors import ReadOnly
from retrieval.serve import main as serve_main
from retrieval.service.keys import KeyStore
from retrieval.service.mcp_tools import WRITE_TOOLS
from tests.service_thread import open_memory, served

READ_TOOLS = {"memory_search", "memory_list", "memory_get", "memory_history", "memory_job"}


def found(client: httpx.Client, query: str) -> str:
    response = client.post("/v1/search", json={"query": query, "k": 20})
    assert response.status_code == 200, response.text
    return " ".join(hit["text"] for hit in response.json()["hits"])


async def _mcp_tools(url: str, key: str) -> tuple[set[str], str, object, list[object]]:
    """The tools listed, the instructions, a search's answer, and the errors of a write tool's
    call and of an unknown tool's."""
    async with httpx2.AsyncClient(headers=bearer(key), timeout=60) as http, \
            streamable_http_client(f"{url}/mcp", http_client=http) as streams, \
            ClientSession(streams[0], streams[1]) as session:
        started = await session.initialize()
        tools = {tool.name for tool in (await session.list_tools()).tools}
        search = await session.call_tool("memory_search", {"query": "kayak"})
        refused = [await session.call_tool("memory_forget", {}), await session.call_tool("memory_drop", {})]
        return tools, started.instructions or "", search.structured_content, [
            result.structured_content for result in refused if result.is_error]


def test_a_read_only_server_reads_beside_the_writer_and_refuses_every_write(tmp_path: Path) -> None:
    store = tmp_path / "store"
    writer, keys = open_memory(store), KeyStore(store)
    key = keys.create("alice")
    try:
        writer.add([{"speaker": "Maria", "text": "Maria bought a red kayak.", "turn_id": "t1"},
                    {"speaker": "Ann", "text": "Ann planted purple tulips.", "turn_id": "t2"}],
                   user_id="alice", session_id="s1")
        writer.flush(user_id="alice", session_id="s1")
        with served(store, read_only=True) as server, \
                httpx.Client(base_url=server.url, headers=bearer(key), timeout=60) as alice:
            assert "kayak" in found(alice, "red kayak")
            listed = alice.get("/v1/memories").json()["items"]
            assert {item["text"] for item in listed} >= {"Maria bought a red kayak."}, listed
            writer.add([{"speaker": "Maria", "text": "Maria adopted a grey parrot.", "turn_id": "t3"}],
                       user_id="alice", session_id="s2")
            assert "parrot" in found(alice, "grey parrot")  # the writer's newest turn, at the next search
            stored = writer.store.count("alice"), len(writer.store.turns("alice"))
            writes = [("POST", "/v1/sessions/s1/turns", {"turns": [{"speaker": "x", "text": "a new turn"}]}),
                      ("POST", "/v1/sessions/s1/flush", None), ("POST", "/v1/consolidate", {}),
                      ("DELETE", f"/v1/memories/{listed[0]['id']}", None),
                      ("DELETE", "/v1/sessions/s1", None), ("DELETE", "/v1/user", None)]
            for method, path, body in writes:
                refused = alice.request(method, path, json=body)
                assert refused.status_code == 403, (path, refused.text)
                assert refused.json() == {"error": str(ReadOnly())}, refused.text
            assert (writer.store.count("alice"), len(writer.store.turns("alice"))) == stored
            tools, instructions, searched, refused = anyio.run(_mcp_tools, server.url, key)
            assert tools == READ_TOOLS and not set(WRITE_TOOLS) & tools and "read-only" in instructions
            assert "kayak" in str(searched)
            assert refused[0] == {"error": str(ReadOnly()), "status": 403}, refused  # as over HTTP
            assert refused[1]["field"] == "name" and refused[1]["status"] == 404, refused
            assert (writer.store.count("alice"), len(writer.store.turns("alice"))) == stored
            writer.delete("alice:turn:t1", user_id="alice")
            assert "kayak" not in found(alice, "red kayak")  # deleted by the writer: gone here too
    finally:
        keys.close()
        writer.close()


def test_a_read_only_server_over_a_database_takes_no_write_not_even_the_schemas(postgres_url: str) -> None:
    """A replica's connection refuses every write: the reader's memory and its keys open all the
    same, and it serves them."""
    writer, keys = open_memory(postgres_url), KeyStore(postgres_url)
    key = keys.create("alice")
    try:
        writer.add([{"speaker": "Maria", "text": "Maria bought a red kayak.", "turn_id": "t1"}],
                   user_id="alice", session_id="s1")
        replica = postgres_url + "?options=" + quote("-c default_transaction_read_only=on")
        with served(replica, read_only=True) as server, \
                httpx.Client(base_url=server.url, headers=bearer(key), timeout=60) as alice:
            assert "kayak" in found(alice, "red kayak")
            refused = alice.post("/v1/sessions/s1/turns", json={"turns": [{"speaker": "x", "text": "hi"}]})
            assert refused.status_code == 403, refused.text
    finally:
        keys.close()  # its pool, left to the collector, was dropped on one of its own threads
        writer.close()


def test_a_read_only_server_makes_no_store(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Nothing is made for a reader: a store that is not there is one error line."""
    missing = tmp_path / "none"
    assert serve_main(["--store", str(missing), "--read-only", "--port", str(free_port())]) == 2
    assert "no store at" in capsys.readouterr().err and not missing.exists()
