"""The HTTP API against a real server (uvicorn on a free loopback port, one per module): routes,
the auth matrix (the user is always the key's), every limit, metrics, OpenAPI and MCP at /mcp."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from benchmarks.service_process import Server, bearer, collector_pauses
from retrieval.service import keys as key_module
from retrieval.service import limits
from retrieval.service.keys import KeyStore
from tests.refusals import refusal_of

pytestmark = pytest.mark.slow
ALICE_CANARY, BOB_CANARY = "zebracorn-alice-7731", "quokkalith-bob-5512"


class Api:
    """The server plus keys and clients for alice and bob."""

    def __init__(self, server: Server, keys: KeyStore) -> None:
        self.server, self.keys = server, keys
        self.alice_key, self.bob_key = keys.create("alice"), keys.create("bob")
        self.alice = httpx.Client(base_url=server.url, headers=bearer(self.alice_key), timeout=120)
        self.bob = httpx.Client(base_url=server.url, headers=bearer(self.bob_key), timeout=120)
        self.anonymous = httpx.Client(base_url=server.url, timeout=120)
        self.metrics_key = keys.create_metrics()
        self.metrics = httpx.Client(base_url=server.url, headers=bearer(self.metrics_key), timeout=120)

    def add(self, client: httpx.Client, session: str, *texts: str, **extra) -> httpx.Response:
        """Turns alternating between two speakers (exchanges), so that enough of them close a segment."""
        turns = [{"speaker": ("Maria", "Jon")[n % 2], "text": text, "time": "2023-05-08T10:00:00"}
                 for n, text in enumerate(texts)]
        return client.post(f"/v1/sessions/{session}/turns", json={"turns": turns, **extra})


def conversation(topic: str, canary: str) -> list[str]:
    """Enough turns for the segmenter to close segments (it closes one at 10 exchanges at most)."""
    return [f"Turn {n} about {topic}: {canary} number {n}." for n in range(30)]


@pytest.fixture(scope="module")
def api(tmp_path_factory) -> Iterator[Api]:
    store = tmp_path_factory.mktemp("service") / "store"
    keys = KeyStore(store)
    server = Server(store).start()
    api = Api(server, keys)
    try:
        alice = api.add(api.alice, "s1", "I adopted a cat called Pickle.",
                        *conversation("the cat", ALICE_CANARY))
        bob = api.add(api.bob, "s1", "I adopted a dog called Rex.", *conversation("the dog", BOB_CANARY))
        assert alice.status_code == bob.status_code == 200, bob.text
        processed(api.metrics)
        api.bob_turns = [f"bob:turn:{turn_id}" for turn_id in bob.json()["turn_ids"]]
        yield api
    finally:
        server.kill()
        keys.close()


def processed(client: httpx.Client) -> None:
    """Until the server's ingestion worker has processed every stored turn (bounded)."""
    for _ in range(2400):  # at most 120 s
        if "isq_memory_ingest_pending_turns 0.0" in client.get("/metrics").text:
            return
        time.sleep(0.05)
    raise AssertionError("the ingestion backlog was not processed")


def texts_of(response: httpx.Response) -> str:
    return json.dumps(response.json())


def bob_ids(api: Api) -> list[str]:
    """Bob's records (from the list) and raw turns (from the add)."""
    page = api.bob.get("/v1/memories", params={"limit": limits.MAX_PAGE}).json()
    assert page["items"], page
    return [item["id"] for item in page["items"]] + api.bob_turns


def test_health_docs_and_openapi_need_no_key(api: Api) -> None:
    assert api.anonymous.get("/healthz").json() == {"status": "ok"}
    assert api.anonymous.get("/docs").status_code == 200
    paths = set(api.anonymous.get("/openapi.json").json()["paths"])
    assert {"/v1/sessions/{session_id}/turns", "/v1/search", "/v1/memories", "/v1/memories/{memory_id}",
            "/v1/memories/{memory_id}/history", "/v1/sessions/{session_id}", "/v1/user", "/v1/consolidate",
            "/v1/jobs/{job_id}", "/healthz", "/metrics"} <= paths


def test_a_turn_is_found_by_the_next_search(api: Api) -> None:
    added = api.add(api.alice, "s2", "Maria's sister Lena moved to Lisbon in March.")
    assert added.status_code == 200 and added.json()["session_id"] == "s2" and added.json()["turn_ids"]
    found = api.alice.post("/v1/search", json={"query": "Where did Lena move?", "k": 20})
    assert found.status_code == 200
    hits = found.json()["hits"]
    assert any("Lisbon" in hit["text"] for hit in hits), hits
    assert all({"id", "text", "score", "turns"} <= set(hit) and hit["explain"] is None for hit in hits)
    explained = api.alice.post("/v1/search", json={"query": "Where did Lena move?", "k": 5, "explain": True})
    assert all(hit["explain"]["channels"] for hit in explained.json()["hits"])


ROUTES = [("POST", "/v1/sessions/s1/turns", {"turns": [{"speaker": "a", "text": "b"}]}),
          ("POST", "/v1/search", {"query": "cat"}), ("GET", "/v1/memories", None),
          ("GET", "/v1/memories/x", None), ("GET", "/v1/memories/x/history", None),
          ("DELETE", "/v1/memories/x", None), ("DELETE", "/v1/sessions/s1", None),
          ("DELETE", "/v1/user", None), ("POST", "/v1/consolidate", None), ("GET", "/v1/jobs/1", None)]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
@pytest.mark.parametrize("header", [None, "Bearer", "Bearer nonsense", "Basic abc",
                                    "Bearer isqm_0123456789abcdef_notthesecret"])
def test_no_or_unknown_key_is_401(api: Api, method: str, path: str, body, header: str | None) -> None:
    headers = {} if header is None else {"Authorization": header}
    response = api.anonymous.request(method, path, json=body, headers=headers)
    assert response.status_code == 401 and "API key" in response.json()["error"]


def test_a_revoked_key_is_refused_at_once(api: Api) -> None:
    key = api.keys.create("alice")
    assert api.anonymous.get("/v1/memories", headers=bearer(key)).status_code == 200
    api.keys.revoke(key)
    assert api.anonymous.get("/v1/memories", headers=bearer(key)).status_code == 401
    forged = key[:-2] + ("AA" if not key.endswith("AA") else "BB")
    assert api.anonymous.get("/v1/memories", headers=bearer(forged)).status_code == 401


def test_an_old_key_of_a_user_id_no_url_can_name_is_refused_saying_to_revoke_it(api: Api) -> None:
    """A key file made before ``keys create`` checked the ids' pattern may hold a key for
    ``team/alice``: that user could add and search but never name its memories in a URL (a delete
    by id was a 404). Such a key is 403 on every route, MCP included, naming the key to revoke."""
    salt, secret = b"0" * 16, "legacy-secret"
    api.keys.rows.add_key("00legacy", "team/alice", salt, key_module._digest(salt, secret), key_module._now())
    key = f"{key_module.PREFIX}_00legacy_{secret}"
    for method, path, body in [("GET", "/v1/memories", None), ("POST", "/v1/search", {"query": "cat"}),
                               ("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})]:
        response = api.anonymous.request(method, path, json=body, headers=bearer(key))
        assert response.status_code == 403, (path, response.text)
        refusal = refusal_of(response)
        assert refusal["field"] == "header.authorization" and "keys revoke 00legacy" in refusal["error"]
        assert "must start with a letter or digit" in refusal["error"]
    api.keys.revoke("00legacy")
    assert api.anonymous.get("/v1/memories", headers=bearer(key)).status_code == 401


def test_metrics_take_a_metrics_key_and_a_metrics_key_reads_nothing_else(api: Api) -> None:
    """/metrics counts every user's records, segments and backlog: a user watching them would see
    what the others store. No key is 401, a user's key 403; a metrics key reads them and no user's
    memory (403 on /v1 and /mcp, naming the key), and once revoked, nothing."""
    assert api.anonymous.get("/metrics").status_code == 401
    refused = api.alice.get("/metrics")
    assert refused.status_code == 403 and refused.json()["field"] == "header.authorization"
    assert "keys create --metrics" in refused.json()["error"] and "isq_memory" not in refused.text
    metrics = api.metrics.get("/metrics")
    assert metrics.status_code == 200 and "isq_memory_amus" in metrics.text
    for method, path, body in [("GET", "/v1/memories", None), ("POST", "/v1/search", {"query": "cat"}),
                               ("DELETE", "/v1/user", None),
                               ("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"})]:
        response = api.metrics.request(method, path, json=body)
        assert response.status_code == 403 and "metrics key" in refusal_of(response)["error"], response.text
    key = api.keys.create_metrics()
    assert api.anonymous.get("/metrics", headers=bearer(key)).status_code == 200
    api.keys.revoke(key)
    assert api.anonymous.get("/metrics", headers=bearer(key)).status_code == 401
    assert api.alice.get("/v1/memories").status_code == 200  # alice's memory is still all there


def test_alice_cannot_see_or_touch_bobs_memories(api: Api) -> None:
    ids = bob_ids(api)
    for memory_id in ids:
        for method, path in (("GET", f"/v1/memories/{memory_id}"),
                             ("GET", f"/v1/memories/{memory_id}/history"),
                             ("DELETE", f"/v1/memories/{memory_id}")):
            response = api.alice.request(method, path)
            assert response.status_code == 404, (method, path, response.text)
            assert BOB_CANARY not in response.text
    for query in (BOB_CANARY, "dog called Rex", "What pet does Maria have?"):
        for session in (None, "s1"):
            found = api.alice.post("/v1/search",
                                   json={"query": query, "k": limits.MAX_K, "session_id": session})
            assert found.status_code == 200 and BOB_CANARY not in texts_of(found)
            assert not set(ids) & {hit["id"] for hit in found.json()["hits"]}
    listed = api.alice.get("/v1/memories", params={"session_id": "s1", "limit": limits.MAX_PAGE})
    assert BOB_CANARY not in texts_of(listed)
    assert bob_ids(api) == ids  # nothing of bob's was touched
    assert BOB_CANARY in texts_of(api.bob.post("/v1/search", json={"query": BOB_CANARY}))


def test_no_body_field_can_name_another_user(api: Api) -> None:
    for path, body in (("/v1/search", {"query": BOB_CANARY, "user_id": "bob"}),
                       ("/v1/sessions/s1/turns",
                        {"turns": [{"speaker": "a", "text": "b"}], "user_id": "bob"}),
                       ("/v1/consolidate", {"user_id": "bob"})):
        response = api.alice.post(path, json=body)
        assert response.status_code == 422 and response.json()["field"] == "body.user_id"
    response = api.alice.get("/v1/memories", params={"user_id": "bob"})
    assert BOB_CANARY not in response.text


def test_jobs_are_the_users_own(api: Api) -> None:
    accepted = api.bob.post("/v1/consolidate", json={"session_id": "s1"})
    assert accepted.status_code == 202
    job_id = accepted.json()["job_id"]
    job = api.bob.get(f"/v1/jobs/{job_id}")
    assert job.status_code == 200 and job.json()["status"] in ("queued", "running", "done")
    for _ in range(600):
        if (job := api.bob.get(f"/v1/jobs/{job_id}").json())["status"] in ("done", "failed"):
            break
        time.sleep(0.1)
    progress = job["progress"]  # in the service's words: records, and no user field
    assert job["status"] == "done" and progress["records_before"] >= progress["records_active_after"] >= 1
    assert not [name for name in progress if "amu" in name or "user" in name]
    assert api.alice.get(f"/v1/jobs/{job_id}").status_code == 404
    assert api.alice.get("/v1/jobs/999999").status_code == 404
    assert api.alice.post("/v1/consolidate").status_code == 202  # no body: the whole user
    assert api.alice.post("/v1/consolidate", json={"session_id": "never"}).status_code == 404
    empty = httpx.Client(base_url=api.server.url, headers=bearer(api.keys.create("erin")), timeout=120)
    nothing = empty.post("/v1/consolidate")  # the key names the user: no field to blame, the key is good
    refusal = "user 'erin' has no records to consolidate"
    assert (nothing.status_code, nothing.json()) == (404, {"error": refusal}), nothing.text
    (answer,) = anyio.run(_mcp_answers, api.server.url, api.keys.create("erin"), [("memory_consolidate", {})])
    assert answer.is_error and answer.content[0].text == refusal
    assert answer.structured_content == {"error": refusal, "status": 404}  # as over HTTP: no field


def test_pages_and_cursor(api: Api) -> None:
    seen, cursor = [], None
    while True:
        page = api.alice.get("/v1/memories", params={"session_id": "s1", "limit": 2,
                                                     **({"cursor": cursor} if cursor else {})}).json()
        assert len(page["items"]) <= 2
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    everything = api.alice.get("/v1/memories", params={"session_id": "s1", "limit": limits.MAX_PAGE}).json()
    assert seen == [item["id"] for item in everything["items"]] and len(seen) >= 3
    one = api.alice.get(f"/v1/memories/{seen[0]}").json()
    assert one["id"] == seen[0] and one["kind"] == "record" and one["text"] and one["turns"]
    assert api.alice.get(f"/v1/memories/{seen[0]}/history").json() == {"id": seen[0], "history": []}
    assert api.alice.get("/v1/memories", params={"cursor": "not-a-cursor"}).status_code == 422


def test_delete_and_forget_remove_only_the_users_data(api: Api) -> None:
    added = api.add(api.alice, "gone", "The gone session mentions a lighthouse keeper named Ortwin.").json()
    turn = f"alice:turn:{added['turn_ids'][0]}"
    assert api.alice.get(f"/v1/memories/{turn}").json()["kind"] == "turn"
    assert api.alice.delete(f"/v1/memories/{turn}").status_code == 200
    assert api.alice.get(f"/v1/memories/{turn}").status_code == 404
    assert api.alice.delete(f"/v1/memories/{turn}").status_code == 404
    api.add(api.alice, "gone", "Ortwin the lighthouse keeper again.")
    assert "Ortwin" in texts_of(api.alice.post("/v1/search", json={"query": "lighthouse keeper Ortwin"}))
    assert api.alice.delete("/v1/sessions/gone").status_code == 200
    assert api.alice.delete("/v1/sessions/gone").status_code == 404
    assert "Ortwin" not in texts_of(api.alice.post("/v1/search", json={"query": "lighthouse keeper Ortwin"}))
    before = bob_ids(api)
    carol = httpx.Client(base_url=api.server.url, headers=bearer(api.keys.create("carol")), timeout=120)
    api.add(carol, "c1", "Carol keeps bees.")
    assert carol.delete("/v1/user").status_code == 200
    assert carol.get("/v1/memories").json() == {"items": [], "next_cursor": None}
    assert bob_ids(api) == before


LIMIT_CASES = [
    ("too many turns", "/v1/sessions/s1/turns",
     {"turns": [{"speaker": "a", "text": "b"}] * (limits.MAX_TURNS + 1)}, 413, "body.turns"),
    ("text too long", "/v1/sessions/s1/turns",
     {"turns": [{"speaker": "a", "text": "x" * (limits.MAX_TEXT_CHARS + 1)}]}, 422, "body.turns.0.text"),
    ("empty text", "/v1/sessions/s1/turns", {"turns": [{"speaker": "a", "text": ""}]}, 422,
     "body.turns.0.text"),
    ("no turns", "/v1/sessions/s1/turns", {"turns": []}, 422, "body.turns"),
    ("missing speaker", "/v1/sessions/s1/turns", {"turns": [{"text": "b"}]}, 422, "body.turns.0.speaker"),
    ("bad session id", "/v1/sessions/a%20b/turns", {"turns": [{"speaker": "a", "text": "b"}]}, 422,
     "path.session_id"),
    ("long session id", f"/v1/sessions/{'s' * (limits.MAX_ID_CHARS + 1)}/turns",
     {"turns": [{"speaker": "a", "text": "b"}]}, 422, "path.session_id"),
    ("turn id with a slash", "/v1/sessions/s1/turns",
     {"turns": [{"speaker": "a", "text": "b", "turn_id": "x/history"}]}, 422, "body.turns.0.turn_id"),
    ("k too large", "/v1/search", {"query": "cat", "k": limits.MAX_K + 1}, 422, "body.k"),
    ("k zero", "/v1/search", {"query": "cat", "k": 0}, 422, "body.k"),
    ("k not a number", "/v1/search", {"query": "cat", "k": "many"}, 422, "body.k"),
    ("query too long", "/v1/search", {"query": "q" * (limits.MAX_QUERY_CHARS + 1)}, 422, "body.query"),
    ("empty query", "/v1/search", {"query": ""}, 422, "body.query"),
    ("unknown field", "/v1/search", {"query": "cat", "limit": 3}, 422, "body.limit"),
]


@pytest.mark.parametrize(("case", "path", "body", "status", "field"), LIMIT_CASES,
                         ids=[c[0] for c in LIMIT_CASES])
def test_limits_name_the_field(api: Api, case: str, path: str, body, status: int, field: str) -> None:
    response = api.alice.post(path, json=body)
    assert (response.status_code, response.json()["field"]) == (status, field), response.text


def test_oversized_and_malformed_bodies(api: Api) -> None:
    big = json.dumps({"query": "x" * limits.MAX_BODY_BYTES}).encode()
    declared = api.alice.post("/v1/search", content=big, headers={"Content-Type": "application/json"})
    assert declared.status_code == 413 and declared.json()["field"] == "body"
    chunked = api.alice.post("/v1/search", content=iter([big[:1000], big[1000:]]),
                             headers={"Content-Type": "application/json"})
    assert chunked.status_code == 413
    for content in (b"{not json", b"[1, 2]", b""):
        response = api.alice.post("/v1/search", content=content, headers={"Content-Type": "application/json"})
        assert response.status_code == 422 and response.json()["field"].startswith("body"), response.text
    query = '{"query": "caf\u00e9"}'  # JSON's parser would take UTF-16 and UTF-32, guessed from the bytes
    for encoding in ("latin-1", "utf-16", "utf-16-le", "utf-32"):
        response = api.alice.post("/v1/search", content=query.encode(encoding),
                                  headers={"Content-Type": "application/json"})
        assert (response.status_code, response.json()["field"]) == (422, "body"), (encoding, response.text)
    turns = json.dumps({"turns": [{"speaker": "M", "text": "A cat."}]}).encode("utf-16")
    added = api.alice.post("/v1/sessions/s1/turns", content=turns,
                           headers={"Content-Type": "application/json"})
    assert added.status_code == 422 and "UTF-8" in added.json()["error"]
    for encoding in ("utf-8", "utf-8-sig"):  # a byte order mark is allowed
        response = api.alice.post("/v1/search", content=query.encode(encoding),
                                  headers={"Content-Type": "application/json"})
        assert response.status_code == 200, (encoding, response.text)
    assert (api.alice.get("/v1/memories", params={"limit": limits.MAX_PAGE + 1}).json()["field"]
            == "query.limit")
    body = b'{"query": "A cat?", "k": 5}'
    for declared_as in ("application/x-www-form-urlencoded", "text/plain", None):  # curl -d without -H
        response = api.alice.post("/v1/search", content=body,
                                  headers={} if declared_as is None else {"Content-Type": declared_as})
        assert (response.status_code, response.json()) == (422, {
            "error": "body: send the body as JSON, with the header Content-Type: application/json",
            "field": "body"}), declared_as


def test_a_flush_turns_a_sessions_last_turns_into_records_now(api: Api) -> None:
    added = api.add(api.alice, "ending", "I repainted my bike green today.", "Green suits it.")
    assert added.status_code == 200 and added.json()["memory_ids"] == []
    flushed = api.alice.post("/v1/sessions/ending/flush")
    assert flushed.status_code == 200 and flushed.json()["session_id"] == "ending", flushed.text
    made = flushed.json()["memory_ids"]
    assert made and all(memory_id.startswith("alice:") for memory_id in made)
    listed = api.alice.get("/v1/memories", params={"session_id": "ending"}).json()["items"]
    assert [item["id"] for item in listed] == made and any("green" in item["text"] for item in listed)
    assert api.alice.post("/v1/sessions/ending/flush").json()["memory_ids"] == []  # nothing open now
    refused = api.bob.post("/v1/sessions/ending/flush")  # bob has no session of that name
    assert (refused.status_code, refused.json()["field"]) == (404, "path.session_id"), refused.text


def test_an_oversized_body_is_read_before_its_413_so_the_client_gets_the_answer(api: Api) -> None:
    """A connection closed with bytes unread is reset, and a client still sending its body would
    lose the answer: the server reads (and throws away) a refused body first. Nothing comes back
    before the body is sent; then the 413, on a connection the client can read to its end."""
    body = b"x" * (limits.MAX_BODY_BYTES + 1)
    with socket.create_connection(("127.0.0.1", api.server.port), timeout=60) as connection:
        connection.sendall(b"POST /v1/search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n" % len(body))
        connection.settimeout(0.5)
        with pytest.raises(TimeoutError):
            connection.recv(1)  # no answer while the body has not arrived
        connection.settimeout(60)
        connection.sendall(body)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413") and b'"field":"body"' in answer.replace(b" ", b"")
    with socket.create_connection(("127.0.0.1", api.server.port), timeout=60) as connection:
        connection.sendall(b"POST /v1/search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
        assert connection.recv(12) == b"HTTP/1.1 413"  # told at once, not asked for the body


def test_a_small_declared_length_does_not_let_a_longer_chunked_body_past_the_limit(api: Api) -> None:
    body = json.dumps({"turns": [{"speaker": "Z", "text": "padding " * 1800}] * 80}).encode()
    assert len(body) > limits.MAX_BODY_BYTES
    chunks = b"".join(b"%x\r\n" % len(body[i:i + 65536]) + body[i:i + 65536] + b"\r\n"
                      for i in range(0, len(body), 65536)) + b"0\r\n\r\n"
    with socket.create_connection(("127.0.0.1", api.server.port), timeout=60) as connection:
        connection.sendall(b"POST /v1/sessions/big/turns HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                           + api.alice_key.encode() + b"\r\nContent-Type: application/json\r\n"
                           b"Content-Length: 10\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks)
        status = connection.recv(200).split(b"\r\n")[0]
    assert status.split()[1] in (b"400", b"413"), status
    assert api.alice.get("/v1/memories", params={"session_id": "big"}).json().get("items") in (None, [])


@pytest.mark.parametrize("content", [b'{"q":' * 5000 + b"1" + b"}" * 5000, b'{"query": "cat \xff"}'],
                         ids=["nested too deep", "not UTF-8"])
def test_a_body_that_cannot_be_read_is_422_naming_the_body(api: Api, content: bytes) -> None:
    response = api.alice.post("/v1/search", content=content, headers={"Content-Type": "application/json"})
    assert (response.status_code, response.json()["field"]) == (422, "body"), response.text


def test_a_body_sent_to_a_route_that_takes_none_is_told_so_whatever_its_type(api: Api) -> None:
    """Not "send the body as JSON", which the route would refuse next; and an empty chunked body
    is no body (a client that always streams can still flush and delete)."""
    for content_type in ("text/plain", "application/json"):
        response = api.alice.post("/v1/sessions/s9/flush", content=b"{}",
                                  headers={"Content-Type": content_type})
        assert (response.status_code, response.json()) == (422, {"error": "body: this route takes no body",
                                                                   "field": "body"}), response.text
    empty_stream = api.alice.request("DELETE", "/v1/memories/alice:absent:0", content=iter([b""]))
    assert empty_stream.request.headers.get("transfer-encoding") == "chunked"
    assert empty_stream.status_code == 404, empty_stream.text


def test_a_405_allows_every_method_its_path_takes(api: Api) -> None:
    response = api.alice.post("/v1/memories/alice:absent:0", json={})
    assert response.status_code == 405
    assert set(response.headers["allow"].split(", ")) == {"GET", "DELETE"}
    assert api.alice.get("/mcp").headers["allow"] == "POST"
    assert set(api.alice.post("/openapi.json").headers["allow"].split(", ")) == {"GET", "HEAD"}


def test_the_schema_documents_every_refusal_a_route_can_give(api: Api) -> None:
    paths = api.anonymous.get("/openapi.json").json()["paths"]
    assert {"401", "403"} <= set(paths["/metrics"]["get"]["responses"])
    assert all("403" in operation["responses"] for path, item in paths.items() if path.startswith("/v1/")
               for operation in item.values())


@pytest.mark.parametrize("path", ["/v1/memories/", "/v1/search/", "/v1/nothing"])
def test_a_path_with_a_trailing_slash_is_unknown_not_redirected(api: Api, path: str) -> None:
    """One URL per route, as README lists them: a near miss is 404 naming the path, not a 307."""
    response = api.alice.get(path, follow_redirects=False)
    assert (response.status_code, response.json()["field"]) == (404, "path"), response.text


def test_made_up_methods_share_one_metrics_label(api: Api) -> None:
    for n in range(5):
        api.anonymous.request(f"X{n}", "/nowhere")
    text = api.metrics.get("/metrics").text
    assert 'method="X0"' not in text and 'method="other",route="not_routed"' in text


def test_the_openapi_pages_are_counted_under_their_paths(api: Api) -> None:
    pages = ("/openapi.json", "/docs")
    for path in pages:
        assert api.anonymous.get(path).status_code == 200
    text = api.metrics.get("/metrics").text
    assert all(f'method="GET",route="{path}",status="200"' in text for path in pages), text


def test_the_docs_page_is_served_with_its_own_files_and_counted_as_one_route(api: Api) -> None:
    """/docs works without internet: its script and style come from this server, not a CDN; every
    request for its files is one route in /metrics, a missing file's too (no series per path)."""
    page = api.anonymous.get("/docs").text
    assert "/docs/assets/swagger-ui-bundle.js" in page and "/docs/assets/swagger-ui.css" in page
    assert "cdn" not in page.lower() and "/openapi.json" in page
    script = api.anonymous.get("/docs/assets/swagger-ui-bundle.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert len(script.content) > 100_000  # the Swagger UI bundle itself
    assert api.anonymous.get("/docs/assets/swagger-ui.css").status_code == 200
    assert api.anonymous.get("/docs/assets/no-such-file-1.js").status_code == 404
    text = api.metrics.get("/metrics").text
    assert 'route="/docs/assets",status="200"' in text and 'route="/docs/assets",status="404"' in text
    assert "no-such-file" not in text and "swagger-ui-bundle.js" not in text


def test_the_memorys_refusals_are_422(api: Api) -> None:
    response = api.alice.post("/v1/sessions/s1/turns",
                              json={"turns": [{"speaker": "a", "text": "b", "time": "not a time"}]})
    assert response.status_code == 422 and "time" in response.json()["error"], response.text


async def _mcp_calls(url: str, key: str) -> tuple[dict[str, Any], dict, dict, dict, dict, Any]:
    async with httpx2.AsyncClient(headers=bearer(key), timeout=120) as http, \
            streamable_http_client(f"{url}/mcp", http_client=http) as streams, \
            ClientSession(streams[0], streams[1]) as session:
        await session.initialize()
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        added = await session.call_tool("memory_add", {"session_id": "mcp", "turns": [
            {"speaker": "Maria", "text": "Over MCP: Maria bought a red kayak."}]})
        found = await session.call_tool("memory_search", {"query": "What did Maria buy?", "k": limits.MAX_K,
                                                           "explain": True})
        plain = await session.call_tool("memory_search", {"query": "What did Maria buy?", "k": 5})
        first = plain.structured_content["hits"][0]["id"]
        got = await session.call_tool("memory_get", {"memory_id": first})
        merged = await session.call_tool("memory_history", {"memory_id": first})
        return (tools, added.structured_content, found.structured_content, plain.structured_content,
                got.structured_content, merged)


def test_mcp_over_http_takes_the_user_from_the_key(api: Api) -> None:
    tools, added, found, plain, got, merged = anyio.run(_mcp_calls, api.server.url, api.alice_key)
    assert {"memory_add", "memory_search", "memory_list", "memory_get", "memory_history", "memory_flush",
            "memory_delete", "memory_forget", "memory_consolidate", "memory_job"} == set(tools)
    query = tools["memory_search"].input_schema["properties"]["query"]  # what a client validates against
    assert (query["minLength"], query["maxLength"]) == (1, limits.MAX_QUERY_CHARS), query
    assert all(tool.input_schema["additionalProperties"] is False for tool in tools.values())
    assert tools["memory_forget"].annotations.destructive_hint
    assert tools["memory_search"].annotations.read_only_hint
    assert f"{limits.MAX_BODY_BYTES:,} bytes" in tools["memory_add"].description
    described = [tool.description for tool in tools.values()]
    json.loads(json.dumps([(t.input_schema, t.output_schema) for t in tools.values()]),  # the schemas' too
               object_hook=lambda node: described.append(node.get("description", "")) or node)
    assert all("  " not in text and "\n" not in text and "``" not in text for text in described)
    assert len([text for text in described if text]) > 2 * len(tools)
    assert "(`explain`: how each was found)" in tools["memory_search"].description
    assert added["turn_ids"] and "kayak" in json.dumps(found) and BOB_CANARY not in json.dumps(found)
    assert all(hit["explain"]["channels"] for hit in found["hits"]), found  # as over HTTP
    over_http = api.alice.post("/v1/search", json={"query": "What did Maria buy?", "k": 5}).json()
    assert plain == over_http, (plain, over_http)  # one answer, the same fields, nulls included
    assert got == api.alice.get(f"/v1/memories/{plain['hits'][0]['id']}").json()
    history = api.alice.get(f"/v1/memories/{plain['hits'][0]['id']}/history")  # a raw turn's: none
    assert history.status_code == 404 and merged.is_error
    assert merged.content[0].text == f"memory_id: {history.json()['error']}"
    assert "kayak" not in texts_of(api.bob.post("/v1/search", json={"query": "red kayak"}))
    assert (api.anonymous.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).status_code
            == 401)
    metrics = api.metrics.get("/metrics").text  # MCP traffic is counted under its route
    assert 'route="/mcp",status="401"' in metrics and 'route="/mcp",status="200"' in metrics


async def _mcp_answers(url: str, key: str, calls: list[tuple[str, dict]]) -> list:
    async with httpx2.AsyncClient(headers=bearer(key), timeout=120) as http, \
            streamable_http_client(f"{url}/mcp", http_client=http) as streams, \
            ClientSession(streams[0], streams[1]) as session:
        await session.initialize()
        return [await session.call_tool(*call) for call in calls]


async def _mcp_refusals(url: str, key: str) -> dict[str, dict]:
    turn = {"speaker": "a", "text": "b"}
    calls = {"another user": ("memory_search", {"query": "cat", "user_id": "bob"}),
             "a misspelt argument": ("memory_search", {"query": "cat", "limit": 3}),
             "k zero": ("memory_search", {"query": "cat", "k": 0}),
             "explain as text": ("memory_search", {"query": "cat", "explain": "yes"}),
             "explain as a number": ("memory_search", {"query": "cat", "explain": 1}),
             "a long cursor": ("memory_list", {"cursor": "a" * 200_000}),
             "an unknown session": ("memory_list", {"session_id": "nosuch"}),
             "too many turns": ("memory_add", {"session_id": "s1", "turns": [turn] * (limits.MAX_TURNS + 1)})}
    answers = dict(zip(calls, await _mcp_answers(url, key, list(calls.values())), strict=True))
    assert all(answer.is_error and answer.content[0].text == answer.structured_content["error"]
               for answer in answers.values()), answers
    return {case: answer.structured_content for case, answer in answers.items()}


def test_mcp_refuses_what_http_refuses_naming_the_argument(api: Api) -> None:
    """Each refusal's text is its structured content's ``error``, which also names the argument
    and gives the status HTTP answers the same refusal with."""
    typed = anyio.run(_mcp_refusals, api.server.url, api.alice_key)
    refused = {case: detail["error"] for case, detail in typed.items()}
    assert typed["k zero"] == {"error": refused["k zero"], "field": "k", "status": 422}
    assert typed["another user"] == {"error": refused["another user"], "field": "user_id", "status": 422}
    assert typed["an unknown session"] == {"error": refused["an unknown session"], "field": "session_id",
                                           "status": 404}
    assert (typed["too many turns"]["field"], typed["too many turns"]["status"]) == ("turns", 413)
    assert refused["another user"] == "user_id: Extra inputs are not permitted"
    assert refused["a misspelt argument"] == "limit: Extra inputs are not permitted"
    assert refused["k zero"] == "k: Input should be greater than or equal to 1"
    assert refused["explain as text"] == refused["explain as a number"]
    assert refused["explain as text"] == "explain: Input should be a valid boolean"
    over_http = api.alice.post("/v1/search", json={"query": "cat", "explain": 1})
    assert (over_http.status_code, over_http.json()["field"]) == (422, "body.explain"), over_http.text
    assert refused["a long cursor"].startswith("cursor: String should have at most")
    assert len(refused["a long cursor"]) < 200 and "nosuch" in refused["an unknown session"]
    listed = api.alice.get("/v1/memories", params={"session_id": "nosuch"})
    assert (listed.status_code, listed.json()["field"]) == (404, "query.session_id"), listed.text


async def _mcp_failure(url: str, key: str, call: tuple[str, dict]) -> str:
    """What the SDK's client raises (its message) when ``call`` is refused before any tool runs."""
    try:
        await _mcp_answers(url, key, [call])
    except Exception as err:  # noqa: BLE001 - whichever the client raises, its words are the test
        while isinstance(err, BaseExceptionGroup) and len(err.exceptions) == 1:
            err = err.exceptions[0]
        return str(err)
    raise AssertionError(f"{call} was not refused")


def test_an_mcp_client_is_told_why_the_server_refused_before_the_tools(api: Api) -> None:
    """The body limit and the key check answer /mcp before MCP does: in a JSON-RPC error, whose
    message the client shows, not "Server returned an error response"."""
    over = limits.MAX_BODY_BYTES // limits.MAX_TEXT_CHARS + 1  # turns of the longest text
    longest = {"speaker": "Ann", "text": "x" * limits.MAX_TEXT_CHARS}
    add = ("memory_add", {"session_id": "s1", "turns": [longest] * over})
    told = anyio.run(_mcp_failure, api.server.url, api.alice_key, add)
    assert f"request body over {limits.MAX_BODY_BYTES} bytes" in told, told
    told = anyio.run(_mcp_failure, api.server.url, "isqm_0123456789abcdef_notthesecret", ("memory_list", {}))
    assert "a valid API key is required" in told, told


def test_metrics_count_routes_and_no_request_failed_with_500(api: Api) -> None:
    api.alice.post("/v1/search", json={"query": "cat"})
    assert api.alice.get("/v1/memories/alice:999:0").status_code == 404  # counted as an error, not a 500
    text = api.metrics.get("/metrics").text
    assert 'isq_http_requests_total{method="POST",route="/v1/search",status="200"}' in text
    assert 'isq_http_request_seconds_bucket{le="0.1",method="POST",route="/v1/search"}' in text
    assert 'isq_http_errors_total{method="GET",route="/v1/memories/{memory_id}",status="404"}' in text
    for gauge in ("isq_memory_amus", "isq_memory_open_segments", "isq_memory_unfinished_jobs",
                  "isq_gc_full_collections_total", "isq_gc_full_collection_seconds_total",
                  "isq_gc_frozen_objects"):  # the server process runs the collector's freezer
        assert f"\n{gauge} " in text, gauge
    assert 'status="500"' not in text, "a request got a 500:\n" + api.server.log_tail()
    assert "Traceback" not in api.server.log_tail(100_000)
    frozen = float(text.split("\nisq_gc_frozen_objects ")[1].split()[0])
    pauses = collector_pauses(api.server.url, api.metrics_key)  # what bench_service reads around its load
    assert pauses["count"] >= 1 and pauses["seconds"] > 0 and frozen > 0  # the models' start left a full pass
