"""The server under failure and misuse: an MCP tool's bad argument is a reason, not a traceback."""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import pytest
from mcp import Client

from retrieval.api.memory import Memory
from retrieval.service.drain import WriteGate
from retrieval.service.mcp_tools import build_mcp, fixed_user
from tests.routes_fixtures import WordEmbedder


def open_memory(store: Path) -> Memory:
    return Memory.open(store, embedder=WordEmbedder())


BAD_ARGUMENTS = [("memory_search", {"query": "cat", "k": 0}, "k"),
                 ("memory_search", {"query": "cat", "k": 10**6}, "k"),
                 ("memory_search", {"query": ""}, "query"),
                 ("memory_search", {"query": "cat", "session_id": "a b"}, "session_id"),
                 ("memory_add", {"session_id": "s", "turns": [{"speaker": "a", "text": ""}]}, "text"),
                 ("memory_list", {"limit": 0}, "limit"),
                 ("memory_list", {"cursor": "not-a-cursor"}, "cursor")]


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
    assert result.is_error and named in message.removeprefix(f"Error executing tool {tool}"), message
    assert not [record for record in caplog.records if record.exc_info or record.levelno >= logging.ERROR]
