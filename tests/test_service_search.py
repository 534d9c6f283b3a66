"""A search's result from the retriever to the HTTP response: the memory returns the retriever's
own hits and timings, the service shows fields of them as they are, and over HTTP a search says
where its time went (``Server-Timing``: the wait in the memory call, the retrieval's encode, routes
and fusion, then serialise, queue and respond, in milliseconds) and nothing else: not another
user's data, not a phase the retrieval did not report under those names."""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

import httpx
import pytest

from benchmarks.service_process import bearer
from retrieval.api.results import MemoryItem
from retrieval.contract import Hit
from retrieval.multi_route.retriever import MultiRouteRetriever
from retrieval.service import schemas
from retrieval.service.timing import server_timing
from tests.service_thread import open_memory, served

ALICE_CANARY, BOB_CANARY = "zebracorn-alice-7731", "quokkalith-bob-5512"
PHASES = ("wait", "model_wait", "encode", "routes", "fusion", "serialise", "queue", "respond")
RETRIEVAL_S = {"model_wait": 0.0015, "encode": 0.004, "routes": 0.0025, "fusion": 0.001}
"""What the patched retriever reports: the header must carry these, in milliseconds."""
HEADER = re.compile(", ".join(rf"{name};dur=(\d+\.\d+)" for name in PHASES))


@pytest.fixture
def timed_retrieval(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every multi-route retrieval reports :data:`RETRIEVAL_S`, plus a phase of another name."""
    real = MultiRouteRetriever.retrieve

    def timed(self, *args, **kwargs):
        result = real(self, *args, **kwargs)
        return dataclasses.replace(result, timings={**RETRIEVAL_S, BOB_CANARY: 9.0})

    monkeypatch.setattr(MultiRouteRetriever, "retrieve", timed)


def add(client: httpx.Client, canary: str) -> None:
    turns = [{"speaker": ("Maria", "Jon")[n % 2], "text": f"Line {n}: {canary} talk number {n}."}
             for n in range(24)]
    response = client.post("/v1/sessions/s1/turns", json={"turns": turns})
    assert response.status_code == 200, response.text


def durations(response: httpx.Response) -> dict[str, float]:
    match = HEADER.fullmatch(response.headers["server-timing"])
    assert match, response.headers["server-timing"]
    return dict(zip(PHASES, map(float, match.groups()), strict=True))


@pytest.mark.usefixtures("timed_retrieval")
def test_a_search_reports_its_phases_and_nothing_of_another_user(tmp_path: Path) -> None:
    with served(tmp_path / "store") as server:
        alice, bob, carol = (httpx.Client(base_url=server.url, headers=bearer(server.keys.create(user)),
                                          timeout=60) for user in ("alice", "bob", "carol"))
        add(alice, ALICE_CANARY)
        add(bob, BOB_CANARY)
        for body in ({"query": BOB_CANARY, "k": 5}, {"query": f"talk {ALICE_CANARY}", "explain": True}):
            response = alice.post("/v1/search", json=body)
            assert response.status_code == 200, response.text
            hits = response.json()["hits"]
            assert hits and BOB_CANARY not in response.text
            assert all(BOB_CANARY not in value for value in response.headers.values())
            found = durations(response)
            assert [found[name] for name in RETRIEVAL_S] == [1.5, 4.0, 2.5, 1.0]
            assert found["serialise"] >= 0 and found["queue"] >= 0 and found["respond"] >= 0
            assert found["wait"] >= 0
        nothing = carol.post("/v1/search", json={"query": "talk"})  # no memories: no retrieval ran
        assert nothing.json() == {"hits": []}
        assert {name: durations(nothing)[name] for name in RETRIEVAL_S} == dict.fromkeys(RETRIEVAL_S, 0.0)
        assert "server-timing" not in alice.get("/v1/memories").headers


@pytest.mark.usefixtures("timed_retrieval")
def test_memory_search_returns_the_retrievers_hits_and_timings(tmp_path: Path) -> None:
    with open_memory(tmp_path / "store") as memory:
        turns = [{"speaker": "Maria", "text": f"{ALICE_CANARY} line {n}"} for n in range(4)]
        memory.add(turns, user_id="alice", session_id="s1")
        result = memory.search(ALICE_CANARY, user_id="alice", k=3)
    assert result.hits and all(type(hit) is Hit for hit in result.hits)
    assert result.timings == {**RETRIEVAL_S, BOB_CANARY: 9.0}


def test_the_header_holds_the_handlers_seven_parts_only() -> None:
    value = server_timing({"routes": 0.002, "other": 1.0}, call_s=0.0105, serialise_s=0.0005, queue_s=0.25)
    assert value == ("wait;dur=8.500, model_wait;dur=0.000, encode;dur=0.000, routes;dur=2.000, "
                     "fusion;dur=0.000, serialise;dur=0.500, queue;dur=250.000")
    clipped = server_timing({"encode": 0.003}, call_s=0.002, serialise_s=0.0, queue_s=0.0)
    assert clipped.startswith("wait;dur=0.000")


@pytest.mark.usefixtures("timed_retrieval")
def test_a_search_held_outside_the_retrieval_reports_the_wait(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A search that waits outside the retrieval (here: a held search-state check) reports that
    time as ``wait``, not as a retrieval phase; the parts stay within the client's total."""
    from retrieval.api.states import SearchStates

    real = SearchStates.get

    def slow(self, user):
        time.sleep(0.3)
        return real(self, user)

    with served(tmp_path / "store") as server:
        alice = httpx.Client(base_url=server.url, headers=bearer(server.keys.create("alice")), timeout=60)
        add(alice, ALICE_CANARY)
        monkeypatch.setattr(SearchStates, "get", slow)
        began = time.perf_counter()
        response = alice.post("/v1/search", json={"query": ALICE_CANARY})
        total_ms = 1000 * (time.perf_counter() - began)
    found = durations(response)
    # wait is the call's time less the phases the patched retriever reports (7.5 ms), which may be
    # more than the real retrieval took
    assert found["wait"] >= 300 - 1000 * sum(RETRIEVAL_S.values())
    assert [found[name] for name in RETRIEVAL_S] == [1.5, 4.0, 2.5, 1.0]
    assert sum(found.values()) <= total_ms


def test_the_response_models_read_fields_the_results_have() -> None:
    """The service reads each hit and item as it is: every field it shows is one of the result's."""
    assert set(schemas.Hit.model_fields) <= {field.name for field in dataclasses.fields(Hit)}
    assert set(schemas.MemoryItem.model_fields) <= {field.name for field in dataclasses.fields(MemoryItem)}
