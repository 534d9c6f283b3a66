"""The HTTP API under schemathesis: requests generated from its own OpenAPI schema (valid and
invalid ones), sent with alice's key to a real server that also holds bob's memories. Every answer
is no 5xx, matches the schema, and never carries bob's text or ids, even when the generated path
names one of bob's memories or jobs. Bounded: a few examples per operation, derandomized."""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import response_schema_conformance

from benchmarks.service_process import bearer
from tests.service_thread import Served, served

pytestmark = pytest.mark.slow
ALICE_CANARY, BOB_CANARY = "zebracorn-alice-7731", "quokkalith-bob-5512"
EXAMPLES = 8
"""Examples per operation and generation mode (valid, invalid): about 200 requests in all."""


class World:
    """The server, alice's key, and bob's ids and canary text that alice must never see."""

    def __init__(self, server: Served) -> None:
        self.server = server
        self.alice, bob = server.keys.create("alice"), server.keys.create("bob")
        with httpx.Client(base_url=server.url, timeout=60) as http:
            for key, canary in ((self.alice, ALICE_CANARY), (bob, BOB_CANARY)):
                turns = [{"speaker": ("Maria", "Jon")[n % 2], "text": f"Line {n}: {canary} talk number {n}."}
                         for n in range(24)]
                added = http.post("/v1/sessions/s1/turns", json={"turns": turns}, headers=bearer(key))
                assert added.status_code == 200, added.text
            server.memory.drain(timeout_s=120)  # the segments the adds closed are processed
            page = http.get("/v1/memories", params={"limit": 100}, headers=bearer(bob)).json()
            job = http.post("/v1/consolidate", headers=bearer(bob)).json()["job_id"]
        self.bob_memories = [item["id"] for item in page["items"]] + [
            f"bob:turn:{turn_id}" for turn_id in added.json()["turn_ids"]]
        self.bob_job = job
        self.bob_key = bob


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with served(tmp_path_factory.mktemp("schemathesis") / "store") as server:
        yield World(server)


def aim_at_bob(case, world: World) -> None:
    """Half of the generated memory and job ids become bob's (chosen by the generated value, so
    runs repeat): alice's key must find them exactly as absent as made-up ones."""
    parameters = case.path_parameters or {}
    for name, bobs in (("memory_id", world.bob_memories), ("job_id", [world.bob_job])):
        value = parameters.get(name)
        if isinstance(value, str) and zlib.crc32(value.encode()) % 2 == 0:
            parameters[name] = bobs[zlib.crc32(value.encode()) // 2 % len(bobs)]


def check(case, world: World) -> None:
    aim_at_bob(case, world)
    response = case.call(headers=bearer(world.alice), timeout=60)
    case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])
    assert BOB_CANARY not in response.text, (case.method, case.formatted_path, response.text)
    asked = set((case.path_parameters or {}).values())  # a refusal may name the id it was asked for
    named = set(re.findall(r"[\w.:@-]+", response.text))
    leaked = [bobs for bobs in [*world.bob_memories, world.bob_job] if bobs in named - asked]
    assert not leaked, (case.method, case.formatted_path, response.text)


def describe(failure: BaseException) -> str:
    """The failure with its reproducing request (schemathesis puts the curl line in the message)."""
    parts = [f"{type(failure).__name__}: {failure}"]
    parts += [str(inner) for inner in getattr(failure, "exceptions", ())]
    return "\n".join(parts)


def run_operation(operation, mode: GenerationMode, world: World) -> str | None:
    """The failure of ``operation``'s generated requests in ``mode``, or None."""

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              report_multiple_bugs=False, phases=(Phase.explicit, Phase.generate),
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def generated(case) -> None:
        check(case, world)

    try:
        generated()
    except Unsatisfiable:  # an operation without parameters has no invalid request to generate
        assert mode is GenerationMode.NEGATIVE and not operation.path_parameters, operation.label
    except (Exception, FailureGroup) as failure:  # FailureGroup is a BaseExceptionGroup
        return f"{mode.value} {operation.label}: {describe(failure)}"
    return None


def test_the_api_answers_every_generated_request_within_its_schema_and_alices_data(world: World) -> None:
    schema = schemathesis.openapi.from_url(f"{world.server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10
    failures = [failure for operation in operations for mode in GenerationMode
                if (failure := run_operation(operation, mode, world)) is not None]
    assert not failures, "\n\n".join(failures)


def test_bobs_memories_survived_alices_generated_requests(world: World) -> None:
    with httpx.Client(base_url=world.server.url, headers=bearer(world.bob_key), timeout=60) as http:
        page = http.get("/v1/memories", params={"limit": 100}).json()
        assert [item["id"] for item in page["items"]] == [
            memory_id for memory_id in world.bob_memories if ":turn:" not in memory_id]
        assert BOB_CANARY in http.post("/v1/search", json={"query": BOB_CANARY}).text

