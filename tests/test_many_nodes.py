"""Two ``retrieval.serve`` processes over one PostgreSQL database (a database per module on the
session's server): a write through one is read through the other, keys live in the database,
a forget through one is honoured by the other, users stay apart through every route of both
nodes, and the segments of their turns are closed exactly once whichever node closed them.
A node killed mid-segment leaves its backlog to a live node (a memory in this process)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from benchmarks.service_process import ROOT, Server, bearer, child_env, free_port
from retrieval.api.errors import Conflict, StoreUnavailable
from retrieval.api.memory import Memory
from retrieval.api.states import SearchStates
from retrieval.index.model_thread import calling_thread
from retrieval.memory.backends import open_store
from retrieval.service import limits
from tests.multi_route_fixtures import WordEmbedder, WordFingerprinter
from tests.test_service_http import conversation, processed
from tests.test_write_behind import KILLED

pytestmark = pytest.mark.slow
ALICE_CANARY, BOB_CANARY = "zebracorn-alice-4411", "quokkalith-bob-9032"
WAIT_S = 300.0


class Node(Server):
    """One ``python -m retrieval.serve --store URL`` process, its log in ``logs``."""

    def __init__(self, url: str, logs: Path) -> None:
        self.store, self.extra = url, ()  # type: ignore[assignment]  # a URL, passed on as text
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = logs / f"node-{self.port}.log"
        self.process = None


def keys_command(database: str, *args: str) -> str:
    """``python -m retrieval.serve keys ARGS --store URL``; its output."""
    done = subprocess.run([sys.executable, "-m", "retrieval.serve", "keys", *args, "--store", database],
                          cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode == 0, done.stderr
    return done.stdout


def new_key(database: str, user: str) -> str:
    return keys_command(database, "create", "--user", user).splitlines()[-1]


@dataclass
class Cluster:
    database: str
    a: Node
    b: Node

    def client(self, node: Node, key: str) -> httpx.Client:
        return httpx.Client(base_url=node.url, headers=bearer(key), timeout=120)


def add(client: httpx.Client, session: str, *texts: str) -> httpx.Response:
    turns = [{"speaker": ("Maria", "Jon")[n % 2], "text": text, "time": "2023-05-08T10:00:00"}
             for n, text in enumerate(texts)]
    response = client.post(f"/v1/sessions/{session}/turns", json={"turns": turns})
    assert response.status_code == 200, response.text
    return response


def texts_of(response: httpx.Response) -> str:
    return json.dumps(response.json())


def covered_once(database: str, user: str, *, flushed: bool = True) -> None:
    """Every stored turn of the user in exactly one committed segment (unless not ``flushed``:
    then at most one, those of the open segment in none), every record once."""
    with open_store(database, read_only=True) as reader:
        stored = [turn.turn_id for turn in reader.turns(user)]
        covered = [turn_id for segment in reader.segments(user) for turn_id in segment.turn_ids]
        records = list(reader.amus(user, include_archived=True))
        counts = Counter(amu.source.segment for amu in records)
        assert {s.seq: s.amu_count for s in reader.segments(user)} == {s: counts[s] for s in counts}
        seqs = [s.seq for s in reader.segments(user)]  # consecutive (a forget's numbers are not reused)
        assert not seqs or seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert stored and len(stored) == len(set(stored)) and len(covered) == len(set(covered))
    assert set(covered) == set(stored) if flushed else set(covered) <= set(stored) and covered
    assert len(records) == len({amu.id for amu in records})


@pytest.fixture(scope="module")
def cluster(postgres_server, tmp_path_factory) -> Iterator[Cluster]:
    database = postgres_server.database()
    logs = tmp_path_factory.mktemp("nodes")
    a, b = Node(database, logs), Node(database, logs)
    try:
        a.start()
        b.start()
        yield Cluster(database, a, b)
    finally:
        a.kill()
        b.kill()


def test_a_turn_added_through_one_node_is_found_through_the_other(cluster: Cluster) -> None:
    key = new_key(cluster.database, "dana")
    with cluster.client(cluster.a, key) as a, cluster.client(cluster.b, key) as b:
        assert b.post("/v1/search", json={"query": "anything at all"}).json() == {"hits": []}  # b holds dana
        added = add(a, "s1", "Dana rebuilt a harpsichord named Clementine.").json()
        found = b.post("/v1/search", json={"query": "harpsichord Clementine"}).json()["hits"]
        assert [hit["id"] for hit in found] == [f"dana:turn:{added['turn_ids'][0]}"]
        back = add(b, "s1", "Dana tuned the harpsichord in mean-tone temperament.").json()
        found = a.post("/v1/search", json={"query": "mean-tone temperament", "k": 1}).json()["hits"]
        assert [hit["id"] for hit in found] == [f"dana:turn:{back['turn_ids'][0]}"]


def test_keys_live_in_the_database_and_a_revoked_key_is_refused_by_every_node(cluster: Cluster) -> None:
    key = new_key(cluster.database, "erin")  # created by neither node: the database holds it
    key_id = key.split("_")[1]
    assert f"{key_id}  user=erin" in keys_command(cluster.database, "list", "--user", "erin")
    for node in (cluster.a, cluster.b):
        assert httpx.get(f"{node.url}/v1/memories", headers=bearer(key)).status_code == 200
    assert "revoked" in keys_command(cluster.database, "revoke", key_id)
    for node in (cluster.a, cluster.b):
        assert httpx.get(f"{node.url}/v1/memories", headers=bearer(key)).status_code == 401


def test_a_forget_through_one_node_is_honoured_by_the_other(cluster: Cluster) -> None:
    key = new_key(cluster.database, "carol")
    with cluster.client(cluster.a, key) as a, cluster.client(cluster.b, key) as b:
        add(a, "c1", "Carol keeps bees behind the old mill.", "The bees make heather honey.")
        assert "heather honey" in texts_of(b.post("/v1/search", json={"query": "bees heather honey"}))
        assert a.delete("/v1/user").status_code == 200
        assert b.post("/v1/search", json={"query": "bees heather honey"}).json() == {"hits": []}
        assert b.get("/v1/memories").json() == {"items": [], "next_cursor": None}
        assert b.delete("/v1/sessions/c1").status_code == 404


def test_users_stay_apart_through_every_route_of_both_nodes(cluster: Cluster) -> None:
    alice_key, bob_key = new_key(cluster.database, "alice"), new_key(cluster.database, "bob")
    clients = {(user, name): cluster.client(node, key)
               for user, key in (("alice", alice_key), ("bob", bob_key))
               for name, node in (("a", cluster.a), ("b", cluster.b))}
    add(clients["alice", "a"], "s1", "I adopted a cat called Pickle.", *conversation("the cat", ALICE_CANARY))
    bob_turns = add(clients["bob", "b"], "s1", "I adopted a dog called Rex.",
                    *conversation("the dog", BOB_CANARY)).json()["turn_ids"]
    metrics_key = keys_command(cluster.database, "create", "--metrics").splitlines()[-1]
    for node in (cluster.a, cluster.b):
        with cluster.client(node, metrics_key) as operator:
            processed(operator)
    covered_once(cluster.database, "alice", flushed=False)  # no flush over HTTP: a segment stays open
    covered_once(cluster.database, "bob", flushed=False)
    page = clients["bob", "a"].get("/v1/memories", params={"limit": limits.MAX_PAGE}).json()
    assert page["items"] and page == clients["bob", "b"].get("/v1/memories",
                                                             params={"limit": limits.MAX_PAGE}).json()
    bob_ids = [item["id"] for item in page["items"]] + [f"bob:turn:{turn}" for turn in bob_turns]
    for node in ("a", "b"):
        alice = clients["alice", node]
        for memory_id in bob_ids:
            for method, path in (("GET", f"/v1/memories/{memory_id}"),
                                 ("GET", f"/v1/memories/{memory_id}/history"),
                                 ("DELETE", f"/v1/memories/{memory_id}")):
                response = alice.request(method, path)
                assert response.status_code == 404 and BOB_CANARY not in response.text, (node, method, path)
        for query in (BOB_CANARY, "dog called Rex"):
            found = alice.post("/v1/search", json={"query": query, "k": limits.MAX_K})
            assert found.status_code == 200 and BOB_CANARY not in texts_of(found)
            assert not set(bob_ids) & {hit["id"] for hit in found.json()["hits"]}
        listed = alice.get("/v1/memories", params={"session_id": "s1", "limit": limits.MAX_PAGE})
        assert listed.json()["items"] and BOB_CANARY not in texts_of(listed)
        assert alice.delete("/v1/sessions/nobody-s1").status_code == 404
        assert BOB_CANARY in texts_of(clients["bob", node].post("/v1/search", json={"query": BOB_CANARY}))
        one = clients["bob", node].get(f"/v1/memories/{bob_ids[0]}")
        assert one.status_code == 200 and clients["bob", node].get(
            f"/v1/memories/{bob_ids[0]}/history").status_code == 200
    assert clients["bob", "a"].get("/v1/memories", params={"limit": limits.MAX_PAGE}).json() == page
    for client in clients.values():
        client.close()


def test_a_node_killed_mid_segment_leaves_its_backlog_to_a_live_node(postgres_url) -> None:
    process = subprocess.Popen([sys.executable, "-c", KILLED.format(repo=str(ROOT), store=postgres_url)],
                               cwd=ROOT, stdout=subprocess.PIPE, text=True, env=child_env())
    assert process.stdout is not None
    said = ""
    for line in process.stdout:  # the worker's "held" and the main thread's "added" may share a line
        said += line
        if "held" in said and "added" in said:
            break
    live = Memory.open(postgres_url, embedder=WordEmbedder(), fingerprinter=WordFingerprinter())
    try:
        with open_store(postgres_url, read_only=True) as reader:
            before = {amu.id: amu.text for amu in reader.amus("u")}
            assert len(reader.turns("u")) == 90 and len(reader.segments("u")) == 2  # the third is held
        assert live.pending(user_id="u") > 0  # the killed node's backlog, found at open
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        live.drain(user_id="u", timeout_s=WAIT_S)  # the dead node's lock died with it
        for session in ("s0", "s1"):
            live.flush(user_id="u", session_id=session)
        after = {item.id: item.text for item in live.list(user_id="u", limit=100).items}
    finally:
        live.close()
        if process.poll() is None:
            process.kill()
    assert before.items() <= after.items() and len(after) == 90
    covered_once(postgres_url, "u")


def test_two_nodes_adding_to_one_user_close_each_segment_once(postgres_url) -> None:
    nodes = [Memory.open(postgres_url, embedder=WordEmbedder(), fingerprinter=WordFingerprinter())
             for _ in range(2)]
    try:
        for i in range(80):  # adds alternate between the nodes; both workers take the user's turns
            nodes[i % 2].add([{"speaker": "AB"[i % 2], "text": f"turn {i} talks about gardens number {i % 7}",
                               "turn_id": f"t{i}"}], user_id="u", session_id="s0")
        for node in nodes:
            node.drain(user_id="u", timeout_s=WAIT_S)
        for node in nodes:
            node.flush(user_id="u", session_id="s0")
        listed = [{item.id for item in node.list(user_id="u", limit=100).items} for node in nodes]
    finally:
        for node in nodes:
            node.close()
    assert listed[0] == listed[1] and len(listed[0]) == 80
    covered_once(postgres_url, "u")


def test_a_forget_through_one_node_leaves_another_nodes_stream_nothing_to_commit(postgres_url) -> None:
    a, b = (Memory.open(postgres_url, embedder=WordEmbedder(), fingerprinter=WordFingerprinter())
            for _ in range(2))
    try:
        for i in range(30):  # b's worker closes segments and holds the open one's turns
            b.add([{"speaker": "AB"[i % 2], "text": f"secret {i} about moorland number {i % 5}"}],
                  user_id="u", session_id="s0")
        b.drain(user_id="u", timeout_s=WAIT_S)
        assert b.list(user_id="u", limit=100).items
        a.forget(user_id="u")
        for i in range(6):
            b.add([{"speaker": "AB"[i % 2], "text": f"fresh {i} about harbours"}],
                  user_id="u", session_id="s0")  # the session b's stream held open before the forget
        b.drain(user_id="u", timeout_s=WAIT_S)
        b.flush(user_id="u", session_id="s0")
        texts = [item.text for item in b.list(user_id="u", limit=100).items]
    finally:
        a.close()
        b.close()
    assert len(texts) == 6 and not [text for text in texts if "secret" in text]
    covered_once(postgres_url, "u")


@pytest.mark.parametrize("how", ["forget", "delete"])
def test_a_purge_of_an_open_segment_through_one_node_is_seen_by_another_nodes_stream(postgres_url,
                                                                                      how) -> None:
    """No segment of the user closed yet and the purge leaves its segment number and record count
    as they were: the other node's stream must still see that its open segment lost turns."""
    a, b = (Memory.open(postgres_url, embedder=WordEmbedder(), fingerprinter=WordFingerprinter())
            for _ in range(2))
    try:
        b.add([{"speaker": "AB"[i % 2], "text": f"secret {i} about moorland", "turn_id": f"old{i}"}
               for i in range(3)], user_id="u", session_id="s0")
        b.drain(user_id="u", timeout_s=WAIT_S)  # b's stream holds the three turns, open
        assert not b.list(user_id="u").items
        if how == "forget":
            a.forget(user_id="u")
        else:
            for i in range(3):
                a.delete(f"u:turn:old{i}", user_id="u")
        b.add([{"speaker": "AB"[i % 2], "text": f"fresh {i} about harbours"} for i in range(4)],
              user_id="u", session_id="s0")
        b.drain(user_id="u", timeout_s=WAIT_S)
        b.flush(user_id="u", session_id="s0")
        texts = [item.text for item in b.list(user_id="u", limit=100).items]
        found = [hit.text for hit in b.search("secret moorland", user_id="u", k=20).hits]
    finally:
        a.close()
        b.close()
    assert texts and not [text for text in texts + found if "secret" in text]
    covered_once(postgres_url, "u")


def test_a_node_catches_its_search_state_up_with_another_nodes_appends(postgres_url) -> None:
    """Another node's adds and segments join this node's state of the user without a rebuild, and
    it then answers as a state built from the store does, score for score; a purge rebuilds it."""
    a, b = (Memory.open(postgres_url, embedder=WordEmbedder(), fingerprinter=WordFingerprinter())
            for _ in range(2))
    builds: list[str] = []
    build = b._states.build
    b._states.build = lambda user: builds.append(user) or build(user)  # type: ignore[method-assign]
    queries = ("gardens number 3", "moorland walks", "turn 11")
    try:
        a.add([{"speaker": "AB"[i % 2], "text": f"turn {i} talks about gardens number {i % 7}"}
               for i in range(12)], user_id="u", session_id="s0")
        b.search(queries[0], user_id="u")
        a.add([{"speaker": "AB"[i % 2], "text": f"later {i} about moorland walks"} for i in range(12)],
              user_id="u", session_id="s0")
        a.drain(user_id="u")  # the segments its boundaries closed are committed; the last stays open
        answers = []
        for close in (lambda: None, lambda: a.flush(user_id="u", session_id="s0")):
            close()
            seen = [[(h.id, h.score) for h in b.search(q, user_id="u", k=8).hits] for q in queries]
            with Memory.open(postgres_url, embedder=WordEmbedder(), fingerprinter=WordFingerprinter(),
                             read_only=True) as fresh:  # its open turns are the store's
                assert seen == [[(h.id, h.score) for h in fresh.search(q, user_id="u", k=8).hits]
                                for q in queries]
            answers.append(seen)
        assert builds == ["u"] and answers[0] != answers[1]
        open_turns = b._states.get("u").open_turns
        assert not open_turns.any() and len(open_turns) == 24  # the other node's flush closed them all
        a.forget(user_id="u", session_id="s0")
        assert not b.search(queries[0], user_id="u").hits and builds == ["u", "u"]
    finally:
        a.close()
        b.close()


@contextmanager
def _behind_another_node(url: str, monkeypatch) -> Iterator[tuple[Memory, Memory, list[str]]]:
    """Two nodes, STEP_TURNS six: ``a``, whose embedder records the texts it computes while a
    worker catches a search state up (the list yielded), and ``b``, whose worker is held until the
    end, so that b's turns have no vectors cached."""
    monkeypatch.setattr("retrieval.api.backlog.STEP_TURNS", 6)
    inside: list[str] = []
    refreshing: set[int] = set()
    refresh = SearchStates.refresh

    def traced(self, user, *bound):
        refreshing.add(threading.get_ident())
        try:
            return refresh(self, user, *bound)
        finally:
            refreshing.discard(threading.get_ident())

    class Recording(WordEmbedder):
        def encode(self, texts):
            if calling_thread().ident in refreshing:
                inside.extend(texts)
            return super().encode(texts)

    monkeypatch.setattr(SearchStates, "refresh", traced)
    a = Memory.open(url, embedder=Recording(), fingerprinter=WordFingerprinter())
    b = Memory.open(url, embedder=WordEmbedder(), fingerprinter=WordFingerprinter())
    held, take = threading.Event(), b._backlog._take
    b._backlog._take = lambda user: held.wait(WAIT_S) and take(user)  # type: ignore[method-assign]
    try:
        yield a, b, inside
    finally:
        held.set()
        a.close()
        b.close()


def _talk(prefix: str, n: int, text: str = "{prefix} turn {i} about kites") -> list[dict]:
    return [{"speaker": "AB"[i % 2], "turn_id": f"{prefix}-{i}", "text": text.format(prefix=prefix, i=i)}
            for i in range(n)]


def _fresh_hits(url: str, query: str) -> list[tuple[str, float]]:
    """The user u's hits for ``query`` from a memory opened afresh on the store."""
    with Memory.open(url, embedder=WordEmbedder(), fingerprinter=WordFingerprinter(),
                     read_only=True) as fresh:
        return [(h.id, h.score) for h in fresh.search(query, user_id="u", k=8).hits]


def test_a_nodes_worker_leaves_another_nodes_bulk_to_the_users_search(postgres_url, monkeypatch) -> None:
    """Where another node added more turns than a step computes, and their vectors are not cached
    yet (that node's worker has not come to them), this node's worker does not catch its search
    state of the user up with them (it would compute them all in one call, under the user's guard,
    every user behind waiting): the user's next search does, finding what a fresh memory finds."""
    bulk_turns = _talk("b", 60, "bulk {i} about kites")
    with _behind_another_node(postgres_url, monkeypatch) as (a, b, inside):
        a.add(_talk("a", 4, "turn {i} about gardens"), user_id="u", session_id="s1")
        a.drain(user_id="u", timeout_s=WAIT_S)
        a.search("warm", user_id="u")  # the node holds the user's state
        b.add(bulk_turns, user_id="u", session_id="s2")
        a.add(_talk("a-more", 2, "turn {i} about gardens"), user_id="u", session_id="s1")  # refused
        a.drain(user_id="u", timeout_s=WAIT_S)
        bulk = {f"{turn['speaker']}: {turn['text']}" for turn in bulk_turns}
        assert not bulk.intersection(inside)
        query = "bulk 59 about kites"
        found = a.search(query, user_id="u", k=8).hits
        assert [(h.id, h.score) for h in found] == _fresh_hits(postgres_url, query)
        assert "bulk 59 about kites" in found[0].text


def test_a_nodes_own_turns_another_node_forgot_do_not_hide_its_bulk_from_the_bound(postgres_url,
                                                                                   monkeypatch) -> None:
    """This node's own turns that its state left behind (another node's turns came between) do not
    count against the bound on the other writers' turns the worker's catch-up takes in, even once
    another node forgot them: another node's bulk without vectors is still left to the search."""
    with _behind_another_node(postgres_url, monkeypatch) as (a, b, inside):
        a.add(_talk("first", 4), user_id="u", session_id="s1")
        a.drain(user_id="u", timeout_s=WAIT_S)
        a.search("warm", user_id="u")  # the node holds the user's state
        b.add(_talk("small", 7), user_id="u", session_id="s3")
        a.add(_talk("own", 30), user_id="u", session_id="s2")  # refused: b's turns came between
        a.drain(user_id="u", timeout_s=WAIT_S)
        b.forget(user_id="u", session_id="s2")
        b.add(_talk("bulk", 29), user_id="u", session_id="s3")  # b's worker holds: no vectors
        a.add(_talk("last", 1), user_id="u", session_id="s1")
        a.drain(user_id="u", timeout_s=WAIT_S)
        assert not [text for text in inside if "bulk turn" in text]
        query = "bulk turn 28 about kites"
        found = [(h.id, h.score) for h in a.search(query, user_id="u", k=8).hits]
        assert found == _fresh_hits(postgres_url, query)


def test_a_segment_without_records_closes_its_turns_on_every_node(postgres_url) -> None:
    """Small talk makes a segment with no records: committed by another node, or by this node
    after another node's add, its turns stop standing in for records on this node too, as in a
    state built from the store."""
    a, b = _nodes(postgres_url)
    try:
        a.add([{"speaker": "Ann", "text": "Ann planted tomatoes in the garden."}], user_id="u",
              session_id="s1")
        a.flush(user_id="u", session_id="s1")
        a.search("tomatoes", user_id="u")  # a holds the user's state from here on
        b.add([{"speaker": "Bob", "text": "Okay!"}, {"speaker": "Ann", "text": "Yes."}], user_id="u",
              session_id="s2")
        b.flush(user_id="u", session_id="s2")
        a.search("okay yes", user_id="u")
        b.add([{"speaker": "Bob", "text": "Bob fixed the old bicycle."}], user_id="u", session_id="s3")
        a.add([{"speaker": "Ann", "text": "Thanks!"}], user_id="u", session_id="s4")
        a.flush(user_id="u", session_id="s4")
        a.search("bicycle", user_id="u")
        bank = a._states.get("u")
        opened = {turn.turn_id: bool(flag) for turn, flag in zip(bank.turns, bank.open_turns, strict=True)}
        assert len(b.list(user_id="u", session_id="s2").items) == 0  # no records: the case at hand
        assert opened == {turn_id: turn_id == "s3:1" for turn_id in ("s1:1", "s2:1", "s2:2", "s3:1", "s4:1")}
    finally:
        a.close()
        b.close()


def test_an_empty_database_another_node_serves_keeps_its_models(postgres_url) -> None:
    """An empty SQLite store takes the models of its one writer; a database several nodes may serve
    keeps the first node's, even before any turn (the other node may be adding one)."""
    first = Memory.open(postgres_url, embedder=WordEmbedder(), fingerprinter=WordFingerprinter())
    try:
        with pytest.raises(StoreUnavailable, match="built with fingerprinter"):
            Memory.open(postgres_url, embedder=WordEmbedder())
    finally:
        first.close()


def _nodes(url: str) -> tuple[Memory, Memory]:
    a, b = (Memory.open(url, embedder=WordEmbedder(), fingerprinter=WordFingerprinter()) for _ in range(2))
    return a, b


def _add_after_the_other_node(a: Memory, b: Memory, mine: dict, key: str | None = None, *, theirs: dict,
                              their_key: str | None = None, before: str = "append_turns") -> object:
    """b's add of ``mine``, with a's add of ``theirs`` landing after b bound its turns, just
    before b's store call ``before`` (its check of which ids are stored, or its transaction): the
    moments another server's add can come between."""
    call = getattr(b.store, before)

    def after_a(user, turns, *args):
        setattr(b.store, before, call)
        a.add([theirs], user_id="u", session_id="s0", idempotency_key=their_key)
        return call(user, turns, *args)

    setattr(b.store, before, after_a)
    try:
        return b.add([mine], user_id="u", session_id="s0", idempotency_key=key)
    except Exception as error:  # the refusal is the result
        return error


@pytest.mark.parametrize("before", ["append_turns", "stored_turn_ids"])
def test_two_nodes_adding_to_one_session_at_once_keep_both_turns(postgres_url, before) -> None:
    """The other node's turn takes the id b generated: b binds again, whether that happened before
    b's transaction or before b read which of its ids were stored (a generated id is never a
    'duplicate')."""
    a, b = _nodes(postgres_url)
    try:
        ann, bob = {"speaker": "Ann", "text": "Ann's turn through node a."}, {
            "speaker": "Bob", "text": "Bob's turn through node b."}
        result = _add_after_the_other_node(a, b, bob, theirs=ann, before=before)
        stored = {turn.turn_id: turn.text for turn in a.store.turns("u")}
    finally:
        a.close()
        b.close()
    assert stored == {"s0:1": ann["text"], "s0:2": bob["text"]}, (result, stored)
    assert result.turn_ids == ("s0:2",) and not result.duplicates  # type: ignore[attr-defined]


def test_a_turn_id_or_key_given_on_two_nodes_at_once_is_one_conflict_or_one_replay(postgres_url) -> None:
    a, b = _nodes(postgres_url)
    try:
        first = {"speaker": "Ann", "text": "The first body.", "turn_id": "t1"}
        conflict = _add_after_the_other_node(a, b, {**first, "text": "Another body."}, theirs=first)
        keyed = {"speaker": "Ann", "text": "Keyed turn.", "turn_id": "t2"}
        replay = _add_after_the_other_node(a, b, keyed, "k1", theirs=keyed, their_key="k1")
        stored = {turn.turn_id: turn.text for turn in a.store.turns("u")}
    finally:
        a.close()
        b.close()
    assert isinstance(conflict, Conflict) and conflict.field == "turns.0.turn_id", conflict
    assert replay.replayed and replay.duplicates == ("t2",), replay  # type: ignore[attr-defined]
    assert stored == {"t1": "The first body.", "t2": "Keyed turn."}


def test_a_forget_through_one_node_during_another_nodes_build_leaves_no_cached_arrays(postgres_url) -> None:
    """b reads the user's records to build its search state, a forgets the user, then b embeds the
    texts it read: their vectors must not be cached again under the forgotten user."""
    a, b = _nodes(postgres_url)
    try:
        a.add([{"speaker": "AB"[i % 2], "text": f"secret {i} about moorland number {i}"} for i in range(12)],
              user_id="u", session_id="s0")
        a.flush(user_id="u", session_id="s0")
        amus = b.store.amus

        def amus_then_forget(user, **options):
            found = list(amus(user, **options))
            b.store.amus = amus  # type: ignore[method-assign]
            a.forget(user_id="u")
            return iter(found)

        b.store.amus = amus_then_forget  # type: ignore[method-assign]
        b.search("moorland", user_id="u")
        assert b.store.amus == amus  # the forget ran mid-build
        left = {table: a.store.db.value(f"SELECT count(*) FROM {table} WHERE user_id = %s", ("u",))
                for table in ("turns", "vectors", "codes")}
        assert not b.search("moorland", user_id="u").hits
    finally:
        a.close()
        b.close()
    assert left == {"turns": 0, "vectors": 0, "codes": 0}, left


def test_a_forget_right_after_another_nodes_add_leaves_no_cached_arrays(postgres_url) -> None:
    """b's add commits and a forgets the user before b's worker (or b's next search) embeds the added
    turns: their vectors must not be cached under the forgotten user."""
    a, b = _nodes(postgres_url)
    added = b._backlog.added

    def forget_then_added(*args):
        b._backlog.added = added  # type: ignore[method-assign]
        a.forget(user_id="u")
        return added(*args)

    b._backlog.added = forget_then_added  # type: ignore[method-assign]
    try:
        b.add([{"speaker": "AB"[i % 2], "text": f"secret {i} about moorland"} for i in range(3)],
              user_id="u", session_id="s0")
        assert b._backlog.added == added  # the forget ran between the add's commit and its worker
        b.drain(user_id="u", timeout_s=WAIT_S)
        assert not b.search("secret moorland", user_id="u").hits
        left = {table: a.store.db.value(f"SELECT count(*) FROM {table} WHERE user_id = %s", ("u",))
                for table in ("turns", "vectors", "codes")}
    finally:
        a.close()
        b.close()
    assert left == {"turns": 0, "vectors": 0, "codes": 0}, left


def test_a_job_runs_on_one_node_and_another_nodes_waiter_sees_it_end(postgres_url) -> None:
    """Node c opens while a runs the user's consolidation (held in its operator): c must not run
    the job too (it queues every unfinished job at open), its waiter sees the job running while a
    holds it, and done once a ends it."""
    from retrieval.consolidation.operations import OfflineOperator
    from tests.test_write_behind import HeldOperator

    class Counting(OfflineOperator):
        calls = 0

        def decide(self, cluster):
            Counting.calls += 1
            return super().decide(cluster)

    held = HeldOperator()
    a = Memory.open(postgres_url, embedder=WordEmbedder(), fingerprinter=WordFingerprinter(), operator=held)
    c = None
    try:
        statements = ["I love hiking in the Alps.", "My sister bakes bread on Sundays."]
        a.add([{"speaker": "Ann", "text": statements[i % 2]} for i in range(12)], user_id="u", session_id="s")
        a.flush(user_id="u", session_id="s")
        job = a.consolidate(user_id="u")
        assert held.hold.entered.wait(WAIT_S)
        c = Memory.open(postgres_url, embedder=WordEmbedder(), fingerprinter=WordFingerprinter(),
                        operator=Counting())
        meanwhile = c.consolidate(user_id="u", wait=True, timeout_s=5.0)  # a still holds it
        held.hold.released.set()
        ended = c.consolidate(user_id="u", wait=True, timeout_s=WAIT_S)
    finally:
        held.hold.released.set()
        a.close()
        if c is not None:
            c.close()
    assert (meanwhile.id, meanwhile.state, Counting.calls) == (job.id, "running", 0)
    assert (ended.id, ended.state) == (job.id, "done")


def test_a_job_a_dead_node_left_running_is_run_by_a_live_node(postgres_url) -> None:
    """The job row says running, but no node holds its lock (its node died): a node that was open
    before the job was made finds it at its next idle poll and runs it."""
    from retrieval.memory.job_rows import RUNNING

    a = Memory.open(postgres_url, embedder=WordEmbedder(), fingerprinter=WordFingerprinter())
    try:
        a.add([{"speaker": "Ann", "text": f"I love hiking in the Alps, day {i % 2}."} for i in range(8)],
              user_id="u", session_id="s")
        a.flush(user_id="u", session_id="s")
        with open_store(postgres_url) as dead_node:
            row, _ = dead_node.create_job("u", None, "consolidate")
            dead_node.update_job(row.id, RUNNING, {"stage": "consolidating"})
        ended = a._jobs.wait(a.store, row.id, timeout_s=WAIT_S)
    finally:
        a.close()
    assert ended.state == "done"


def test_what_a_node_holds_of_a_user_another_node_forgot_leaves_it_without_the_users_next_call(
        postgres_url) -> None:
    """b holds u's search state and a stream with an open segment; a forgets u. b's worker finds
    the purge at its next scan of the store and drops both (the stream is loaded again: empty),
    though u never calls b again."""
    a, b = _nodes(postgres_url)
    try:
        b.add([{"speaker": "AB"[i % 2], "text": f"my secret pin is {4700 + i}"} for i in range(3)],
              user_id="u", session_id="s0")
        b.drain()
        assert b.search("secret pin", user_id="u").hits and b.cache_gauges()["search_states"] == 1
        assert b._backlog._users["u"].stream.sessions  # the open segment's turns
        a.forget(user_id="u")

        def open_segment() -> bool:  # a stream dropped (None) is loaded again from the store: empty
            stream = b._backlog._users["u"].stream
            return stream is not None and bool(stream.sessions)

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (b.cache_gauges()["search_states"] or open_segment()):
            time.sleep(0.1)
        assert b.cache_gauges()["search_states"] == 0
        assert not open_segment()
    finally:
        a.close()
        b.close()
