"""``python -m retrieval.mcp`` with a real MCP client session over stdio: every tool, its refusals,
and the user fixed by ``--user`` (another user's memory is neither found nor touched)."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from benchmarks.service_process import ROOT, child_env

pytestmark = pytest.mark.slow
TOOLS = {"memory_add", "memory_search", "memory_list", "memory_get", "memory_history", "memory_flush",
         "memory_delete", "memory_forget", "memory_consolidate", "memory_job"}


def params(store: Path, user: str, cwd: Path = ROOT) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, cwd=str(cwd), env=child_env(),
                                 args=["-m", "retrieval.mcp", "--store", str(store), "--user", user])


def content(result) -> dict:
    assert not result.is_error, result.content
    return result.structured_content


async def _session(store: Path, user: str, calls, errlog=sys.stderr, cwd: Path = ROOT) -> list:
    async with stdio_client(params(store, user, cwd), errlog=errlog) as (read, write), \
            ClientSession(read, write) as session:
        started = await session.initialize()
        assert started.server_info.version == metadata.version("isq-memory")  # not the SDK's ""
        return [await calls(session)]


async def _records(session: ClientSession) -> dict:
    """The user's records once the ingestion worker has closed a segment of the add (bounded)."""
    for _ in range(600):
        listed = content(await session.call_tool("memory_list", {"limit": 50}))
        if listed["items"]:
            return listed
        await anyio.sleep(0.05)
    raise AssertionError("no record 30 s after the add")


async def _every_tool(session: ClientSession) -> dict:
    tools = {tool.name for tool in (await session.list_tools()).tools}
    chat = [{"speaker": ("Jon", "Maria")[n % 2], "text": f"Small talk line {n} about the weather."}
            for n in range(24)]
    pickle = {"speaker": "Maria", "text": "I adopted a cat called Pickle.", "time": "2023-05-08T10:00:00"}
    turns = [pickle, *chat]
    added = content(await session.call_tool("memory_add", {"session_id": "s1", "turns": turns,
                                                           "idempotency_key": "k1"}))
    replay = content(await session.call_tool("memory_add", {"session_id": "s1", "turns": turns,
                                                            "idempotency_key": "k1"}))
    found = content(await session.call_tool("memory_search", {"query": "What pet does Maria have?", "k": 5}))
    flushed = content(await session.call_tool("memory_flush", {"session_id": "s1"}))
    listed = await _records(session)
    job = content(await session.call_tool("memory_consolidate", {"session_id": "s1"}))
    polled = content(await session.call_tool("memory_job", {"job_id": job["job_id"]}))
    first = listed["items"][0]["id"]
    deleted = content(await session.call_tool("memory_delete", {"memory_id": first}))
    again = await session.call_tool("memory_delete", {"memory_id": first})
    bad = await session.call_tool("memory_add", {"session_id": "s1", "turns": [{"speaker": "a", "text": ""}]})
    bad_time = await session.call_tool("memory_add", {"session_id": "s1", "turns": [
        {"speaker": "a", "text": "b", "time": "yesterday-ish"}]})
    forgot = content(await session.call_tool("memory_forget", {}))
    after = content(await session.call_tool("memory_list", {}))
    return {"tools": tools, "added": added, "flushed": flushed, "replay": replay, "found": found,
            "listed": listed, "job": job, "polled": polled, "deleted": deleted, "again": again, "bad": bad,
            "bad_time": bad_time, "forgot": forgot, "after": after}


def test_every_tool_over_stdio(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with open(tmp_path / "started.txt", "w") as errlog:  # as a client starts it: its own directory
        bob = anyio.run(_session, Path("store"), "bob", lambda s: s.call_tool("memory_add", {
            "session_id": "s1", "turns": [{"speaker": "Rex", "text": "Bob's secret word is quokkalith."}]}),
            errlog, tmp_path)
    assert not bob[0].is_error
    started = (tmp_path / "started.txt").read_text()
    assert f"serving {store} (a new store: nothing was there) to user 'bob'" in started, started
    with open(tmp_path / "stderr.txt", "w") as errlog:
        [seen] = anyio.run(_session, store, "alice", _every_tool, errlog)
    logged = (tmp_path / "stderr.txt").read_text()
    assert f"serving {store} to user 'alice' over stdio" in logged
    assert "no record" not in logged and "yesterday-ish" not in logged, logged  # refusals are the caller's
    assert seen["tools"] == TOOLS
    assert (len(seen["added"]["turn_ids"]) == 25 and seen["added"]["memory_ids"] == []  # records come later
            and seen["replay"]["replayed"] and not seen["replay"]["turn_ids"])
    assert any("Pickle" in hit["text"] for hit in seen["found"]["hits"])
    assert seen["flushed"]["session_id"] == "s1" and set(seen["flushed"]["memory_ids"]) <= {
        item["id"] for item in seen["listed"]["items"]}
    assert "quokkalith" not in json.dumps(seen["found"]) + json.dumps(seen["listed"])
    assert seen["job"]["status"] in ("queued", "running", "done") and seen["deleted"] == {"deleted": True}
    assert seen["polled"]["job_id"] == seen["job"]["job_id"] and seen["polled"]["status"] in (
        "queued", "running", "done")
    for refused in ("again", "bad", "bad_time"):
        assert seen[refused].is_error, refused
    assert "text" in seen["bad"].content[0].text and "time" in seen["bad_time"].content[0].text
    assert seen["again"].structured_content == {"error": seen["again"].content[0].text, "field": "memory_id",
                                                "status": 404}  # typed as over HTTP: the record is gone
    assert seen["forgot"] == {"deleted": True} and seen["after"]["items"] == []
    [bobs] = anyio.run(_session, store, "bob",
                       lambda s: s.call_tool("memory_search", {"query": "secret word"}))
    assert "quokkalith" in json.dumps(content(bobs))  # alice's forget left bob's memory alone
    [alices_job] = anyio.run(_session, store, "bob",
                             lambda s: s.call_tool("memory_job", {"job_id": seen["job"]["job_id"]}))
    assert alices_job.is_error and "job_id" in alices_job.content[0].text  # another user's job is not found


def test_bad_arguments_exit_2_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    for args, said in ((["--store", str(tmp_path / "file"), "--user", "alice"], "file"),
                       (["--store", str(tmp_path), "--user", " "], "--user is required"),
                       (["--store", str(tmp_path), "--user", "u" * 130], "--user has 130 characters"),
                       (["--store", str(tmp_path), "--user", " alice"], "must start with a letter or digit")):
        result = subprocess.run([sys.executable, "-m", "retrieval.mcp", *args], cwd=ROOT, env=child_env(),
                                capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
        assert said in result.stderr
