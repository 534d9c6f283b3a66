"""The input contract of the memory, in Python and over HTTP and MCP: odd input is one typed
error naming the field (never a ValueError, OverflowError, UnicodeEncodeError or a 500), request
types are strict, unknown parameters and duplicate keys are refused, the limits are one set of
numbers, and the cursors and job ids a user sees say nothing of what other users write."""

from __future__ import annotations

import json
import logging
import sqlite3
from datetime import datetime
from pathlib import Path

import anyio
import pytest
from fastapi.testclient import TestClient

from retrieval import Memory
from retrieval.api import limits
from retrieval.api.errors import InvalidInput, MemoryAPIError, NotFound, StoreUnavailable
from retrieval.memory.records import Turn
from retrieval.memory.store import AMUStore
from retrieval.serve import main as serve_main
from retrieval.service import limits as service_limits
from retrieval.service.app import create_app
from retrieval.service.drain import WriteGate
from retrieval.service.keys import KEYS_FILE, KeyStore
from retrieval.service.mcp_tools import build_mcp, fixed_user
from tests.multi_route_fixtures import WordEmbedder, WordFingerprinter
from tests.refusals import refusal_of

EDGE_TIMES = ["9999-12-31T23:59:59-12:00", "0001-01-01T00:00:00+14:00"]
ODD_JOB_IDS = ["²", "①", "١", "1", "18446744073709551616", "9" * 40, "-1"]


def open_memory(path) -> Memory:
    return Memory.open(path, embedder=WordEmbedder(), fingerprinter=WordFingerprinter())


def chat(prefix: str, n: int) -> list[dict]:
    return [{"speaker": ("Ann", "Bob")[i % 2], "text": f"{prefix} story number {i} about gardens.",
             "time": "2023-05-08T10:00:00", "turn_id": f"{prefix}-{i}"} for i in range(n)]


@pytest.fixture
def mem(tmp_path):
    with open_memory(tmp_path / "store") as memory:
        memory.add(chat("alpha", 30), user_id="u", session_id="s1")
        memory.flush(user_id="u", session_id="s1")
        yield memory


def refused(call, kind: type[MemoryAPIError] = InvalidInput) -> MemoryAPIError:
    with pytest.raises(MemoryAPIError) as caught:
        call()
    assert type(caught.value) is kind, repr(caught.value)
    return caught.value


# -- Python ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("job_id", ODD_JOB_IDS)
def test_odd_job_ids_are_not_found(mem, job_id):
    assert refused(lambda: mem.job(job_id, user_id="u"), NotFound).field == "id"


@pytest.mark.parametrize("job_id", [None, 5, "", "x" * (limits.MAX_MEMORY_ID_CHARS + 1)])
def test_a_job_id_that_is_no_id_is_invalid_as_in_get(mem, job_id):
    for call in (mem.get, mem.job):
        error = refused(lambda: call(job_id, user_id="u"))  # noqa: B023 - called at once
        assert error.field == "id" and len(str(error)) < 200


def test_a_job_id_over_the_id_limit_is_refused_as_over_http(mem):
    """A job id has the ids' limit in Python as in ``GET /v1/jobs/{job_id}``, not a memory id's."""
    error = refused(lambda: mem.job("x" * (limits.MAX_ID_CHARS + 1), user_id="u"), InvalidInput)
    assert error.field == "id" and f"the limit is {limits.MAX_ID_CHARS}" in str(error)


@pytest.mark.parametrize(("call", "field"), [
    (lambda m: m.list(user_id="u", limit=10**20), "limit"),
    (lambda m: m.list(user_id="u", limit=limits.MAX_PAGE + 1), "limit"),
    (lambda m: m.list(user_id="u", cursor=str(2**70)), "cursor"),
    (lambda m: m.list(user_id="u", cursor=5.5), "cursor"),
    (lambda m: m.list(user_id="u", cursor="1"), "cursor"),
    (lambda m: m.search("gardens", user_id="u", k=10**20), "k"),
    (lambda m: m.search("gardens", user_id="u", k=limits.MAX_K + 1), "k"),
    (lambda m: m.search("gardens", user_id="u", explain="yes"), "explain"),
    (lambda m: m.search("q" * (limits.MAX_QUERY_CHARS + 1), user_id="u"), "query"),
    (lambda m: m.search("?!", user_id="u"), "query"),
    (lambda m: m.search("garden\ud800", user_id="u"), "query"),
    (lambda m: m.get("x\udc00", user_id="u"), "id"),
    (lambda m: m.add([{"speaker": "A", "text": "hi\ud800"}], user_id="u", session_id="s"), "turns.0.text"),
    (lambda m: m.add([{"speaker": "\ud800", "text": "hi"}], user_id="u", session_id="s"), "turns.0.speaker"),
    (lambda m: m.add([{"speaker": " ", "text": "hi"}], user_id="u", session_id="s"), "turns.0.speaker"),
    (lambda m: m.add([{"speaker": "A", "text": "hi\x00there"}], user_id="u", session_id="s"), "turns.0.text"),
    (lambda m: m.add([{"speaker": "A", "text": "hi", "image_caption": "\x00"}], user_id="u", session_id="s"),
     "turns.0.image_caption"),
    (lambda m: m.add([{"speaker": "A", "text": "hi"}, {"speaker": "A", "text": " \n"}], user_id="u",
                     session_id="s"), "turns.1.text"),
    (lambda m: m.add([{"speaker": "A", "text": "hi", "turn_id": "t\ud800"}], user_id="u", session_id="s"),
     "turns.0.turn_id"),
    (lambda m: m.add([{"speaker": "A", "text": "hi", "time": "soon"}], user_id="u", session_id="s"),
     "turns.0.time"),
    (lambda m: m.add([{"speaker": "A", "text": "hi"}], user_id="u\ud800", session_id="s"), "user_id"),
    (lambda m: m.add([{"speaker": "A", "text": "hi"}], user_id="u\n", session_id="s"), "user_id"),
    (lambda m: m.add([{"speaker": "A", "text": "hi"}], user_id="u" * (limits.MAX_ID_CHARS + 1),
                     session_id="s"), "user_id"),
    (lambda m: m.add([{"speaker": "A", "text": "hi"}], user_id="u", session_id="s",
                     idempotency_key="k\ud800"), "idempotency_key"),
    (lambda m: m.add([{"speaker": "A", "text": "hi", "time": "2023-05-08T10:00:00.123456789"}], user_id="u",
                     session_id="s"), "turns.0.time"),  # nanoseconds: refused, not cut to microseconds
    (lambda m: m.add([{"speaker": "A", "text": "hi", "image_caption": " \u200b"}], user_id="u",
                     session_id="s"), "turns.0.image_caption"),
    (lambda m: m.add([{"speaker": "Maria: I hate Jon.\u2028Sam", "text": "hi"}], user_id="u", session_id="s"),
     "turns.0.speaker"),
    (lambda m: m.add([Turn("v", "s", "t1", "A", "hi")], user_id="u", session_id="s"), "turns.0.user_id"),
    (lambda m: m.add([{"speaker": "A", "text": "hi"}, Turn("u", "s2", "t1", "A", "hi")], user_id="u",
                     session_id="s"), "turns.1.session_id"),
])
def test_odd_python_input_is_one_typed_error_naming_the_field(mem, call, field):
    assert refused(lambda: call(mem)).field == field


def test_a_turn_object_is_added_under_its_own_user_and_session_only(mem):
    """A :class:`Turn` names its user and session: added under others it is refused, nothing of
    the add stored, where it used to be stored under the add's silently."""
    before = mem.store.turns("u")
    refused(lambda: mem.add([Turn("bob", "s1", "b1", "A", "I keep bees.")], user_id="u", session_id="s1"))
    assert mem.store.turns("u") == before and mem.store.turns("bob") == []
    added = mem.add([Turn("u", "s1", "b1", "A", "I keep bees.")], user_id="u", session_id="s1")
    assert added.turn_ids == ("b1",) and mem.store.turn("u", "b1").text == "I keep bees."


@pytest.mark.parametrize("moment", EDGE_TIMES)
def test_times_at_the_calendars_edge_are_refused_naming_the_field(mem, moment):
    error = refused(lambda: mem.add([{"speaker": "A", "text": "hi", "time": moment}], user_id="u",
                                    session_id="s"))
    assert error.field == "turns.0.time" and "UTC" in str(error)


class Nanoseconds(datetime):
    """A datetime finer than microseconds, as pandas' ``Timestamp`` is."""

    nanosecond = 789


def test_a_time_finer_than_microseconds_is_refused_not_cut(mem):
    finer = Nanoseconds(2023, 5, 8, 10, 0, 0, 123456)
    error = refused(lambda: mem.add([{"speaker": "A", "text": "hi", "time": finer}], user_id="u",
                                    session_id="s"))
    assert error.field == "turns.0.time" and "6 decimals" in str(error)
    added = mem.add([{"speaker": "A", "text": "hi", "time": datetime(2023, 5, 8, 10, 0, 0, 123456)}],
                    user_id="u", session_id="s")
    assert mem.store.turn("u", added.turn_ids[0]).session_time == datetime(2023, 5, 8, 10, 0, 0, 123456)


def test_open_refuses_an_empty_path_and_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert refused(lambda: open_memory("")).field == "path"
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "notes.txt").write_text("not a store")
    assert refused(lambda: open_memory(tmp_path / "notes.txt"), StoreUnavailable).field == "path"


@pytest.mark.parametrize("name", ["embedder", "extractor", "fingerprinter", "planner", "operator",
                                  "reranker"])
@pytest.mark.parametrize("value", [None, 5])
def test_open_refuses_a_model_that_is_not_one_and_binds_the_store_to_nothing(tmp_path, name, value):
    if value is None and name in ("embedder", "fingerprinter", "planner", "reranker"):
        return  # None is their documented default or "none"
    models = {"embedder": WordEmbedder(), "fingerprinter": WordFingerprinter(), name: value}
    error = refused(lambda: Memory.open(tmp_path / "store", **models))
    assert error.field == name and type(value).__name__ in str(error)
    assert not (tmp_path / "store").exists()  # not created, so not bound to a model it cannot use
    with open_memory(tmp_path / "store") as memory:  # the defaults open it
        memory.add(chat("a", 2), user_id="u", session_id="s1")
        assert memory.flush(user_id="u", session_id="s1").amu_ids


def test_a_failed_open_of_a_directory_without_a_store_leaves_it_as_it_was(tmp_path):
    """Another directory given by mistake (here a fingerprinter's export) keeps exactly its files."""
    export = tmp_path / "export"
    export.mkdir()
    (export / "config.json").write_text("{}")
    error = refused(lambda: Memory.open(export, embedder=WordEmbedder(), fingerprinter=tmp_path / "nothing"))
    assert error.field == "fingerprinter"
    assert sorted(path.name for path in export.iterdir()) == ["config.json"]


@pytest.mark.parametrize("timeout", ["soon", -1, float("nan"), True, 1e10, 10**400])  # past TIMEOUT_MAX
def test_waits_refuse_a_timeout_that_is_not_seconds_naming_it(mem, timeout):
    mem.add(chat("a", 3), user_id="u", session_id="s1")  # turns pending, so the wait would start
    assert refused(lambda: mem.drain(user_id="u", timeout_s=timeout)).field == "timeout_s"
    assert refused(lambda: mem.consolidate(user_id="u", timeout_s=timeout)).field == "timeout_s"
    assert refused(lambda: mem.consolidate(user_id="u", wait="no")).field == "wait"


def test_a_closed_memory_refuses_every_call(tmp_path):
    memory = open_memory(tmp_path)
    memory.add(chat("a", 2), user_id="u", session_id="s1")
    memory.close()
    memory.close()  # closing twice is harmless
    for call in (lambda: memory.search("story gardens", user_id="u"), lambda: memory.list(user_id="u"),
                 lambda: memory.list(user_id="u", cursor="junk"),
                 lambda: memory.add(chat("b", 1), user_id="u", session_id="s1"),
                 lambda: memory.get("u:turn:a-0", user_id="u"), lambda: memory.users()):
        assert "closed" in str(refused(call, StoreUnavailable))


def test_a_refusal_quotes_a_huge_value_in_short(mem):
    error = refused(lambda: mem.list(user_id="u", cursor="x" * 100_000))
    assert error.field == "cursor" and len(str(error)) < 200 and "(100000 characters)" in str(error)


def test_the_last_page_has_no_cursor_and_cursors_are_the_users_own(mem):
    everything = mem.list(user_id="u", limit=limits.MAX_PAGE)
    count = len(everything.items)
    assert 3 <= count < limits.MAX_PAGE and everything.next_cursor is None
    assert mem.list(user_id="u", limit=count).next_cursor is None
    first = mem.list(user_id="u", limit=count - 2)
    rest = mem.list(user_id="u", limit=2, cursor=first.next_cursor)
    assert [i.id for i in first.items + rest.items] == [i.id for i in everything.items]
    assert rest.next_cursor is None
    mem.add(chat("vee", 30), user_id="v", session_id="s1")
    mem.flush(user_id="v", session_id="s1")
    assert refused(lambda: mem.list(user_id="v", cursor=first.next_cursor)).field == "cursor"


def test_cursors_and_job_ids_do_not_count_other_users_writes(tmp_path):
    """Two stores in which u writes the same; in one, others write between u's writes: what u sees
    (cursors, job ids) has the same shape and no number that grows with the others' writes."""
    seen = []
    for others in (0, 3):
        with open_memory(tmp_path / f"store{others}") as memory:
            for n in range(others):
                memory.add(chat(f"other{n}", 30), user_id=f"o{n}", session_id="s1")
                memory.flush(user_id=f"o{n}", session_id="s1")
                memory.consolidate(user_id=f"o{n}", wait=True)
            memory.add(chat("u", 30), user_id="u", session_id="s1")
            memory.flush(user_id="u", session_id="s1")
            cursor = memory.list(user_id="u", limit=1).next_cursor
            job = memory.consolidate(user_id="u", wait=True).id
            seen.append((cursor, job))
            assert memory.job(job, user_id="u").state == "done"
            stranger = "o0" if others else "x"
            assert refused(lambda: memory.job(job, user_id=stranger), NotFound)  # noqa: B023
    for cursor, job in seen:
        assert len(cursor) == len(job) == 32 and not cursor.isdigit() and not job.isdigit()
    with AMUStore(tmp_path / "store3", read_only=True) as store:  # u's job is the store's fourth
        assert [row.user_id for row in map(store.job_row, range(1, 5))] == ["o0", "o1", "o2", "u"]


def test_ids_of_the_longest_kind_are_accepted_and_their_memory_ids_readable(mem):
    user, turn_id = "u" * limits.MAX_ID_CHARS, "t" * limits.MAX_TURN_ID_CHARS
    mem.add([{"speaker": "S" * limits.MAX_ID_CHARS, "text": "hi", "turn_id": turn_id}], user_id=user,
            session_id="s" * limits.MAX_ID_CHARS, idempotency_key="k" * limits.MAX_ID_CHARS)
    assert mem.get(f"{user}:turn:{turn_id}", user_id=user).text == "S" * limits.MAX_ID_CHARS + ": hi"
    assert refused(lambda: mem.add([{**TURN, "turn_id": "t" * (limits.MAX_TURN_ID_CHARS + 1)}],
                                   user_id=user, session_id="s")).field == "turns.0.turn_id"


def test_a_turn_id_the_memory_numbered_in_the_longest_session_is_taken_back(mem, http):
    """The memory numbers a turn given without an id ``<session id>:<n>``, past the limit of the
    session id itself: passed back, as a retry of the same turn does, it adds nothing (it was
    refused, 422, as too long)."""
    session = "s" * limits.MAX_ID_CHARS
    (numbered,) = mem.add([TURN], user_id="u", session_id=session).turn_ids
    assert len(numbered) > limits.MAX_ID_CHARS
    assert mem.add([{**TURN, "turn_id": numbered}], user_id="u", session_id=session).turn_ids == ()
    answer = http.post(f"/v1/sessions/{session}/turns", json={"turns": [{**TURN, "turn_id": numbered}]})
    assert answer.status_code == 200 and answer.json()["turn_ids"] == [], answer.text


@pytest.mark.parametrize(("user", "session", "turn_id", "field"), [
    ("\u200b\u200b", "s", "t", "user_id"), ("alice\u200b", "s", "t", "user_id"),
    ("alice", "s\u2028", "t", "session_id"), ("alice", "s", "t\u202e", "turns.0.turn_id"),
    ("alice", "s", "\u200dt", "turns.0.turn_id"), ("alice\ufe0f", "s", "t", "user_id"),
    (" alice", "s", "t", "user_id"), ("\u3164", "s", "t", "user_id"),
    ("alice", "s\u034f", "t", "session_id"), ("cafe\u0301", "s", "t", "user_id"),
    ("alice", "s", "Zoe\u0308", "turns.0.turn_id")])
def test_a_new_id_holds_no_invisible_character_yet_one_stored_before_is_read_and_forgotten(
        mem, user, session, turn_id, field):
    """A blank-looking id, or one that looks like another, is refused where a write would store it;
    an id an earlier version stored that way is still read, listed by search and forgotten."""
    turn = {"speaker": "Ann", "text": "I keep bees.", "turn_id": turn_id}
    assert refused(lambda: mem.add([turn], user_id=user, session_id=session)).field == field
    assert not mem.store.has_user(user)
    mem.store.append_turns(user, [Turn(user, session, turn_id, "Ann", "I keep bees.")])
    assert mem.get(f"{user}:turn:{turn_id}", user_id=user).text == "Ann: I keep bees."
    mem.forget(user_id=user, session_id=session)
    assert not mem.store.has_user(user)


@pytest.mark.parametrize("emoji", ["\U0001f468\u200d\U0001f469\u200d\U0001f467",  # a family
                                   "\U0001f3f3\ufe0f\u200d\U0001f308",  # a rainbow flag
                                   "\U0001f469\U0001f3fd\u200d\U0001f4bb",  # a skin tone
                                   "\U0001f3f4\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f"])
def test_an_emoji_of_joined_symbols_is_an_id(mem, emoji):
    mem.add([{"speaker": "Ann", "text": "We went camping.", "turn_id": f"{emoji}-1"}], user_id="alice",
            session_id=emoji)
    assert mem.get(f"alice:turn:{emoji}-1", user_id="alice").session_id == emoji


def test_http_and_python_share_one_set_of_limits():
    for name in ("MAX_ID_CHARS", "MAX_MEMORY_ID_CHARS", "MAX_QUERY_CHARS", "MAX_K", "DEFAULT_K", "MAX_PAGE",
                 "DEFAULT_PAGE", "MAX_TEXT_CHARS", "ID_PATTERN", "MAX_TURNS"):
        assert getattr(service_limits, name) == getattr(limits, name)
    import inspect

    assert inspect.signature(Memory.list).parameters["limit"].default == limits.DEFAULT_PAGE
    assert inspect.signature(Memory.search).parameters["k"].default == limits.DEFAULT_K


# -- HTTP -----------------------------------------------------------------------------------------

@pytest.fixture
def http(mem):
    keys = KeyStore(mem.store.directory)
    key = keys.create("u")
    app = create_app(mem, keys, mem.store.directory)
    with TestClient(app, headers={"Authorization": f"Bearer {key}"}) as client:
        client.key = key
        yield client
    keys.close()


TURN = {"speaker": "Ann", "text": "I keep bees."}
HTTP_CASES = [
    ("whitespace text", "post", "/v1/sessions/s1/turns", {"turns": [{"speaker": "A", "text": "   "}]}, 422,
     "body.turns.0.text"),
    ("whitespace speaker", "post", "/v1/sessions/s1/turns", {"turns": [{"speaker": "  ", "text": "hi"}]},
     422, "body.turns.0.speaker"),
    ("zero-width text", "post", "/v1/sessions/s1/turns",
     {"turns": [{"speaker": "A", "text": "\u200b\ufeff"}]}, 422, "body.turns.0.text"),
    ("control-only text", "post", "/v1/sessions/s1/turns",
     {"turns": [{"speaker": "A", "text": "\u0000\u0001"}]}, 422, "body.turns.0.text"),
    ("NUL in a text", "post", "/v1/sessions/s1/turns",
     {"turns": [{"speaker": "A", "text": "hi\u0000there"}]}, 422, "body.turns.0.text"),
    ("unparsable time", "post", "/v1/sessions/s1/turns", {"turns": [{**TURN, "time": "next tuesday"}]}, 422,
     "body.turns.0.time"),
    ("edge time", "post", "/v1/sessions/s1/turns", {"turns": [{**TURN, "time": EDGE_TIMES[0]}]}, 422,
     "body.turns.0.time"),
    ("lone surrogate", "post", "/v1/sessions/s1/turns", {"turns": [{**TURN, "text": "bees \ud800"}]}, 422,
     "body.turns.0.text"),
    ("no letters", "post", "/v1/search", {"query": "?!?"}, 422, "body.query"),
    ("k string", "post", "/v1/search", {"query": "bees", "k": "5"}, 422, "body.k"),
    ("k bool", "post", "/v1/search", {"query": "bees", "k": True}, 422, "body.k"),
    ("explain string", "post", "/v1/search", {"query": "bees", "explain": "yes"}, 422, "body.explain"),
    ("bad cursor", "get", "/v1/memories?cursor=12", None, 422, "query.cursor"),
    ("huge cursor", "get", "/v1/memories?cursor=" + "9" * 30, None, 422, "query.cursor"),
    ("unknown query", "get", "/v1/memories?user_id=bob", None, 422, "query.user_id"),
    ("unknown query on post", "post", "/v1/search?user_id=bob", {"query": "bees"}, 422, "query.user_id"),
    ("repeated query", "get", "/v1/memories?limit=1&limit=50", None, 422, "query.limit"),
    ("limit with an underscore", "get", "/v1/memories?limit=1_0", None, 422, "query.limit"),
    ("limit with a sign", "get", "/v1/memories?limit=%2B5", None, 422, "query.limit"),
    ("limit with a point", "get", "/v1/memories?limit=5.000", None, 422, "query.limit"),
    ("limit with a space", "get", "/v1/memories?limit=%205", None, 422, "query.limit"),
    ("unknown body field", "post", "/v1/consolidate", {"user_id": "bob"}, 422, "body.user_id"),
    ("body on flush", "post", "/v1/sessions/s1/flush", {"user_id": "bob"}, 422, "body"),
    ("body on a session's delete", "delete", "/v1/sessions/never", {"user_id": "bob"}, 422, "body"),
    ("body on the user's delete", "delete", "/v1/user", {"user_id": "bob"}, 422, "body"),
    ("bad session path", "post", "/v1/sessions/a/b/turns", {"turns": [TURN]}, 404, "path"),
    ("no session", "delete", "/v1/sessions/", None, 404, "path"),
    ("unknown session", "delete", "/v1/sessions/never", None, 404, "path.session_id"),
    ("superscript job", "get", "/v1/jobs/²", None, 404, "path.job_id"),
    ("arabic digit job", "get", "/v1/jobs/١", None, 404, "path.job_id"),
    ("huge job", "get", "/v1/jobs/" + "9" * 30, None, 404, "path.job_id"),
    ("unknown memory", "get", "/v1/memories/nothing-here", None, 404, "path.memory_id"),
    ("delete an unknown raw turn", "delete", "/v1/memories/u:turn:nope", None, 404, "path.memory_id"),
]


@pytest.mark.parametrize(("case", "method", "path", "body", "status", "field"), HTTP_CASES,
                         ids=[c[0] for c in HTTP_CASES])
def test_every_http_refusal_names_its_field(http, case, method, path, body, status, field):
    content = None if body is None else json.dumps(body)  # escapes a lone surrogate, as JSON may
    response = http.request(method.upper(), path, content=content,
                            headers={"Content-Type": "application/json"})
    assert (response.status_code, response.json().get("field")) == (status, field), response.text
    assert set(response.json()) == {"error", "field"}


def test_http_image_captions_and_the_last_page(http):
    added = http.post("/v1/sessions/s9/turns", json={"turns": [{**TURN, "image_caption": "a hive"}]})
    assert added.status_code == 200, added.text
    turn = http.get(f"/v1/memories/u:turn:{added.json()['turn_ids'][0]}").json()
    assert "a hive" in turn["text"]
    uncaptioned = {**TURN, "text": "No image.", "image_caption": ""}
    plain = http.post("/v1/sessions/s9/turns", json={"turns": [uncaptioned]})
    assert plain.status_code == 200, plain.text  # an empty caption is none, as in Python
    turn = http.get(f"/v1/memories/u:turn:{plain.json()['turn_ids'][0]}").json()
    assert turn["text"] == "Ann: No image."
    count = len(http.get("/v1/memories", params={"limit": limits.MAX_PAGE}).json()["items"])
    assert http.get("/v1/memories", params={"limit": count}).json()["next_cursor"] is None


def test_a_store_that_fails_under_a_request_is_503_with_retry_after_not_500(http, mem, monkeypatch):
    """A database restart under a request: 503 and Retry-After, the store's details (its host) in
    the server's log only; the same when the key itself cannot be read, on /v1 and /mcp alike,
    and for an MCP tool."""
    from retrieval.memory.errors import StoreFault
    from retrieval.service.auth import STORE_FAILED
    from retrieval.service.mcp_tools import _refusals

    def fail(*args, **options):
        raise StoreFault("postgresql://db.internal:5432/memory: the database failed (server closed)")

    monkeypatch.setattr("retrieval.api.memory.run_search", fail)  # under the memory's call gate
    with pytest.raises(StoreUnavailable, match="the store failed: .*db.internal") as python:
        mem.search("bees", user_id="u")
    assert isinstance(python.value.__cause__, StoreFault)  # Python: a MemoryAPIError, the cause kept
    response = http.post("/v1/search", json={"query": "bees"})
    assert (response.status_code, response.headers.get("retry-after")) == (503, "1")
    assert response.json() == {"error": STORE_FAILED} and "db.internal" not in response.text
    monkeypatch.setattr(mem, "list", fail)  # a store error outside the gate is answered alike
    assert http.get("/v1/memories").json() == {"error": STORE_FAILED}
    for call in (fail, lambda: mem.search("bees", user_id="u")):
        with pytest.raises(Exception, match="store cannot be reached") as refused:
            _refusals(call)
        assert type(refused.value).__name__ == "Refused" and "db.internal" not in str(refused.value)
        assert refused.value.result().structured_content == {"error": STORE_FAILED, "status": 503}
    monkeypatch.setattr(http.app.state.service.keys, "user", fail)
    for method, path in (("GET", "/v1/memories"), ("POST", "/mcp")):
        body = {"jsonrpc": "2.0", "id": 1, "method": "ping"} if path == "/mcp" else None
        response = http.request(method, path, json=body)
        assert (response.status_code, response.headers.get("retry-after")) == (503, "1"), path
        assert refusal_of(response) == {"error": STORE_FAILED}


def test_a_removed_store_is_503_saying_so_without_retry_after(http, mem, monkeypatch):
    """A store file removed under the server fails every write until an operator puts it back: the
    answer says so, without ``Retry-After`` or the store's path, over /v1, /mcp's key check and MCP
    tools alike (a client told to retry in a second would loop on it)."""
    from retrieval.memory.errors import StoreGone
    from retrieval.service.auth import STORE_GONE
    from retrieval.service.mcp_tools import _refusals

    def fail(*args, **options):
        raise StoreGone("/srv/private/amus.sqlite3: the store was removed while this process had it open")

    monkeypatch.setattr("retrieval.api.memory.append_add", fail)  # under the memory's call gate
    response = http.post("/v1/sessions/s/turns", json={"turns": [{"speaker": "Ann", "text": "I keep bees."}]})
    assert (response.status_code, response.headers.get("retry-after")) == (503, None), response.text
    assert response.json() == {"error": STORE_GONE} and "/srv/private" not in response.text
    with pytest.raises(Exception, match="removed or replaced") as refused:
        _refusals(lambda: mem.add([{"speaker": "Ann", "text": "hi"}], user_id="u", session_id="s"))
    assert refused.value.result().structured_content == {"error": STORE_GONE, "status": 503}
    monkeypatch.setattr(http.app.state.service.keys, "user", fail)
    response = http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert (response.status_code, response.headers.get("retry-after")) == (503, None)
    assert refusal_of(response) == {"error": STORE_GONE}


def test_a_full_disk_under_a_write_is_507_saying_so_not_retry_shortly(http, mem, monkeypatch, tmp_path):
    """A write that fails for a full disk (SQLite's ``SQLITE_FULL``, made here by a page limit) is
    507 naming the cause, without ``Retry-After`` or the store's path: a client told to retry in a
    second (503) looped, and nothing said why, while space stayed short. MCP tools say the same."""
    from retrieval.memory.errors import StoreFault
    from retrieval.memory.faults import disk_full as disk_full_fault
    from retrieval.memory.faults import fault
    from retrieval.service.auth import DISK_FULL
    from retrieval.service.mcp_tools import _refusals

    small = sqlite3.connect(tmp_path / "small.sqlite3")
    small.execute("PRAGMA max_page_count = 2")
    with pytest.raises(sqlite3.OperationalError) as full:
        small.execute("CREATE TABLE t (x BLOB)")
        small.execute("INSERT INTO t VALUES (zeroblob(100000))")
    small.close()
    disk_full = fault(full.value, Path("/srv/private/amus.sqlite3"))
    assert disk_full is not None and "SQLITE_FULL" in str(disk_full)

    def fail(*args, **options):
        raise disk_full from full.value  # as the store's guarded connection raises it

    monkeypatch.setattr("retrieval.api.memory.append_add", fail)  # under the memory's call gate
    with pytest.raises(StoreUnavailable, match="disk is full"):
        mem.add([{"speaker": "Ann", "text": "I keep bees."}], user_id="u", session_id="s")
    response = http.post("/v1/sessions/s/turns", json={"turns": [{"speaker": "Ann", "text": "I keep bees."}]})
    assert (response.status_code, response.headers.get("retry-after")) == (507, None), response.text
    assert response.json() == {"error": DISK_FULL} and "/srv/private" not in response.text
    with pytest.raises(Exception, match="disk is full") as refused:
        _refusals(lambda: mem.add([{"speaker": "Ann", "text": "hi"}], user_id="u", session_id="s"))
    assert refused.value.result().structured_content == {"error": DISK_FULL, "status": 507}
    assert http.post("/v1/search", json={"query": "bees"}).status_code == 200  # reads answer
    psycopg = pytest.importorskip("psycopg")
    try:  # PostgreSQL's disk_full, as the store's database layer raises it
        raise StoreFault("postgresql://db/memory: failed") from psycopg.errors.DiskFull("no space")
    except StoreFault as fault_of_postgres:
        assert disk_full_fault(fault_of_postgres)
    shared_memory = psycopg.errors.DiskFull('could not resize shared memory segment "/PostgreSQL.61" to '
                                            '345376 bytes: No space left on device')  # /dev/shm: it passes
    try:
        raise StoreFault("postgresql://db/memory: failed") from shared_memory
    except StoreFault as fault_of_postgres:
        assert not disk_full_fault(fault_of_postgres)


def test_mcp_takes_posts_only_no_stream_to_hold_open(http):
    """A stateless MCP server sends nothing on a GET stream but pings: it held connections open for
    as long as a key holder liked, past the key's revocation. GET and DELETE are 405 (the protocol
    allows it); the tools answer POSTs."""
    for method in ("GET", "DELETE"):
        response = http.request(method, "/mcp", headers={"Accept": "text/event-stream"})
        assert response.status_code == 405 and response.json()["field"] == "path"


MCP_ACCEPTS = {"Accept": "application/json, text/event-stream", "Host": "127.0.0.1:80"}  # loopback


def test_mcp_refuses_a_message_it_would_not_answer_doing_nothing(http, mem):
    """The SDK reads a request whose id is neither a string nor an integer as a notification: it
    answered 202 and did nothing, and its caller waited for an answer. Such a request, and a
    batch, are refused saying why; a string id is answered."""
    def add(request_id):
        call = {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "memory_add", "arguments": {
            "session_id": "rpc", "turns": [{"speaker": "Ann", "text": f"Sent with id {request_id!r}."}]}}}
        return {**call, "id": request_id}

    for request_id in (1.5, {"a": 1}, [1], None, True):
        response = http.post("/mcp", json=add(request_id), headers=MCP_ACCEPTS)
        assert response.status_code == 400, response.text
        detail = refusal_of(response)
        assert detail["field"] == "body" and detail["error"].startswith("body: id: "), detail
    for envelope, field in (({"jsonrpc": None}, "jsonrpc"), ({"jsonrpc": "1.0"}, "jsonrpc"),
                            ({"method": None}, "method"), ({"method": 5}, "method"),
                            ({"params": "x"}, "params"),
                            ({"params": {"name": 5, "arguments": {}}}, "params.name"),
                            ({"params": {"name": "memory_list", "arguments": [1]}}, "params.arguments"),
                            ({"params": {"name": "memory_search", "arguments": {"query": "cat \ud800"}}},
                             "params.arguments.query")):
        message = {key: value for key, value in {**add(1), **envelope}.items() if value is not None}
        response = http.post("/mcp", content=json.dumps(message),  # escapes a lone surrogate, as JSON may
                             headers={**MCP_ACCEPTS, "Content-Type": "application/json"})
        assert response.status_code == 400 and "\n" not in response.text, response.text
        assert refusal_of(response)["error"].startswith(f"body: {field}: "), response.text
    response = http.post("/mcp", json=[add(1), add(2)], headers=MCP_ACCEPTS)
    assert (response.status_code, refusal_of(response)["error"]) == (
        400, "body: a batch of JSON-RPC messages; send one message per request")
    plain = {**MCP_ACCEPTS, "Content-Type": "text/plain"}  # the SDK's own check answered in plain text
    response = http.post("/mcp", content=json.dumps(add(1)), headers=plain)
    assert (response.status_code, refusal_of(response)["error"]) == (
        415, "Content-Type: an MCP message is sent as application/json, got text/plain")
    assert [turn for turn in mem.store.turns("u") if turn.session_id == "rpc"] == []
    answered = http.post("/mcp", json=add("r-1"), headers=MCP_ACCEPTS)
    assert answered.status_code == 200 and answered.json()["id"] == "r-1", answered.text
    assert [turn.text for turn in mem.store.turns("u") if turn.session_id == "rpc"] == ["Sent with id 'r-1'."]


def test_mcp_prompts_and_resources_are_refused_without_echo_or_a_logged_traceback(http, caplog):
    """The memory has tools only. Asked for a prompt, the SDK raised, and its dispatcher logged
    the caller's name (newlines and all, up to a body's size: forged log lines, about 40 MB/s of
    log from one client) with two tracebacks at ERROR."""
    forged = "x\nINFO:     10.0.0.9:4242 - \"DELETE /v1/user HTTP/1.1\" 200 OK\n" + "y" * 100_000
    for method, params, field in (("prompts/get", {"name": forged}, "name"),
                                  ("resources/read", {"uri": f"memory://{'z' * 1000}"}, "uri")):
        with caplog.at_level(logging.INFO):
            response = http.post("/mcp", json={"jsonrpc": "2.0", "id": 7, "method": method, "params": params},
                                 headers=MCP_ACCEPTS)
        assert response.status_code == 200 and len(response.text) < 300, response.text[:300]
        assert response.json()["error"]["code"] == -32602
        assert response.json()["error"]["message"].startswith(f"{field}: no ")
        assert [r for r in caplog.records if r.levelno >= logging.WARNING or "y" * 50 in r.getMessage()] == []


ROOT_LOGGING = """
import logging, sys
sys.path.insert(0, {repo!r})
from retrieval import Memory
from retrieval.service.app import create_app
from retrieval.service.connections import ConnectionTimeouts, uvicorn_config
from retrieval.service.keys import KeyStore
from tests.multi_route_fixtures import WordEmbedder
store = {store!r}
app = create_app(Memory.open(store, embedder=WordEmbedder()), KeyStore(store), store)
before = [type(h).__name__ for h in logging.getLogger().handlers]
uvicorn_config(app, "127.0.0.1", 0, ConnectionTimeouts())
root = logging.getLogger()
print(before, [type(h).__name__ for h in root.handlers], logging.getLevelName(root.level))
"""


def test_the_servers_logging_replaces_the_mcp_sdks_root_handler(tmp_path):
    """The server's logging puts uvicorn's handler at WARNING on the root logger, in place of the
    rich-text INFO handler the MCP SDK installs there (which logged tool refusals with user ids,
    and stopped the server when it could not import its traceback module, out of descriptors)."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    script = ROOT_LOGGING.format(repo=str(repo), store=str(tmp_path / "store"))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         cwd=repo).stdout.strip()
    assert out == "['RichHandler'] ['StreamHandler'] WARNING", out


def test_http_conflicts_are_409_and_identical_replays_200(http):
    body = {"turns": [{**TURN, "turn_id": "b1"}], "idempotency_key": "k1"}
    assert http.post("/v1/sessions/s5/turns", json=body).status_code == 200
    again = http.post("/v1/sessions/s5/turns", json=body)
    assert again.status_code == 200 and again.json()["replayed"] is True
    other = http.post("/v1/sessions/s5/turns", json={**body, "turns": [{**TURN, "text": "I keep wasps."}]})
    assert other.status_code == 409 and other.json()["field"] == "body.idempotency_key", other.text
    elsewhere = http.post("/v1/sessions/s6/turns", json={"turns": [{**TURN, "turn_id": "b1"}]})
    assert elsewhere.status_code == 409 and elsewhere.json()["field"] == "body.turns.0.turn_id"


DUPLICATE_KEYS = [
    ("/v1/sessions/s7/turns", '{"turns": [{"speaker": "A", "text": "I keep bees."}], '
                              '"turns": [{"speaker": "A", "text": "I keep wasps."}]}', "turns"),
    ("/v1/sessions/s7/turns", '{"turns": [{"speaker": "A", "text": "first", "text": "second"}]}', "text"),
    ("/v1/search", '{"query": "bees", "k": 1, "k": 100}', "k"),
    ("/mcp", '{"jsonrpc": "2.0", "id": 1, "method": "ping", "method": "tools/list"}', "method"),
]


@pytest.mark.parametrize(("path", "body", "key"), DUPLICATE_KEYS, ids=[c[2] for c in DUPLICATE_KEYS])
def test_a_key_given_twice_in_a_body_is_refused_naming_it(http, path, body, key):
    """A JSON object with a key twice would reach the application as the last value alone; it is
    refused before any of it is read (nothing stored), as a query parameter given twice is."""
    before = http.get("/v1/memories", params={"limit": limits.MAX_PAGE}).json()["items"]
    for content in (body.encode(), "\ufeff".encode() + body.encode()):  # with a byte order mark too
        response = http.post(path, content=content, headers={"Content-Type": "application/json"})
        assert (response.status_code, refusal_of(response)["field"]) == (422, "body"), response.text
        assert f"key {key!r} is given twice" in refusal_of(response)["error"]
    assert http.get("/v1/memories", params={"limit": limits.MAX_PAGE}).json()["items"] == before
    once = http.post("/v1/search", content='{"query": "bees", "k": 1}',
                     headers={"Content-Type": "application/json"})
    assert once.status_code == 200, once.text


@pytest.mark.parametrize(("body", "said"), [
    ('{"query": "bees", "k": ' + "9" * 5000 + "}", "body: a number of more than 4300 digits"),
    ('{"query": "bees", "k": ' + "[" * 100_000 + "]" * 100_000 + "}", "body: JSON nested too deep to read"),
    ('{"query": "bees"}'.encode("utf-16-le"), "body: not UTF-8 JSON (a zero byte at 1); send JSON in UTF-8"),
    (b"\x00\x00\x00{\x00\x00\x00", "body: not UTF-8 JSON (a zero byte at 0); send JSON in UTF-8")])
def test_json_read_no_further_is_refused_saying_why(http, body, said):
    """Well-formed JSON that the parser gives up on is refused saying why, not as a body the
    server could not parse; so is JSON in UTF-16 or UTF-32 without a byte order mark (its zero
    bytes are UTF-8 too, and the parser would guess the encoding and take it)."""
    response = http.post("/v1/search", content=body, headers={"Content-Type": "application/json"})
    assert (response.status_code, refusal_of(response)) == (422, {"error": said, "field": "body"})


@pytest.mark.parametrize("path", ["/v1/memories", "/mcp"])
def test_two_authorization_headers_are_refused(http, path):
    other = http.app.state.service.keys.create("bob")
    headers = [("Authorization", f"Bearer {http.key}"), ("Authorization", f"Bearer {other}")]
    response = http.request("GET" if path != "/mcp" else "POST", path, headers=headers,
                            json=None if path != "/mcp" else {"jsonrpc": "2.0", "id": 1, "method": "ping"})
    refused = (response.status_code, refusal_of(response)["field"])
    assert refused == (400, "header.authorization"), response.text


@pytest.mark.parametrize("path", ["/v1/memories", "/mcp"])
def test_an_unknown_key_is_refused_naming_the_header(http, path):
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    method, headers = ("GET" if path != "/mcp" else "POST"), {"Authorization": "Bearer nope"}
    response = http.request(method, path, headers=headers,
                            json=None if path != "/mcp" else ping)
    refused = (response.status_code, refusal_of(response)["field"])
    assert refused == (401, "header.authorization"), response.text


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_a_path_or_query_not_utf8_is_refused_not_read_as_another_id(http, mem, method):
    """``%FF`` would reach the route as U+FFFD: the id of a turn the caller never named."""
    mem.add([{"speaker": "Ann", "text": "I keep bees.", "turn_id": "x\ufffd"}], user_id="u", session_id="s2")
    response = http.request(method, "/v1/memories/u:turn:x%FF")
    assert (response.status_code, refusal_of(response)["field"]) == (422, "path"), response.text
    response = http.get("/v1/memories?cursor=%C3")
    assert (response.status_code, refusal_of(response)["field"]) == (422, "query"), response.text
    assert mem.get("u:turn:x\ufffd", user_id="u").text == "Ann: I keep bees."
    assert http.get("/v1/memories/u:turn:x%EF%BF%BD").status_code == 200  # the same id in UTF-8
    response = http.request(method, "/v1/memories/u:turn:x%EF%BF%BD%2Fhistory")  # not the history route
    refused_as = 422 if method == "GET" else 405  # the history route takes no DELETE: routed, not run
    assert (response.status_code, refusal_of(response)["field"]) == (refused_as, "path"), response.text


def test_mcp_arguments_are_strict(mem):
    server = build_mcp(mem, WriteGate(), fixed_user("u"))

    async def call(arguments):
        return await server.call_tool("memory_list", arguments)

    assert not anyio.run(call, {"limit": 5}).is_error
    try:
        result = anyio.run(call, {"limit": "5"})
    except Exception as err:  # noqa: BLE001 - a refused argument may be raised or returned as an error
        assert "limit" in str(err)
    else:
        assert result.is_error


def test_mcp_string_arguments_are_taken_as_given_not_decoded_as_json(mem):
    """A session id, idempotency key or cursor that reads as JSON (``"null"``, ``"[1]"``) is that
    string: ``memory_forget(session_id="null")`` forgets that session only, not the user."""
    server = build_mcp(mem, WriteGate(), fixed_user("u"))

    async def call(name, arguments):
        return await server.call_tool(name, arguments)

    for key in ("null", "null", "[1]", "true"):
        added = anyio.run(call, "memory_add", {"session_id": "null", "idempotency_key": key,
                                               "turns": [{"speaker": "Ann", "text": f"A note keyed {key}."}]})
        assert not added.is_error, added
    assert [turn.text for turn in mem.store.turns("u") if turn.session_id == "null"] == [
        "A note keyed null.", "A note keyed [1].", "A note keyed true."]  # the second "null" replayed
    found = anyio.run(call, "memory_search", {"query": "alpha note keyed", "session_id": "null", "k": 20})
    assert {hit["session_id"] for hit in found.structured_content["hits"]} == {"null"}
    assert anyio.run(call, "memory_list", {"cursor": "null"}).is_error  # no such cursor, not the first page
    assert anyio.run(call, "memory_search", {"query": "alpha", "explain": "true"}).is_error  # not a flag
    assert anyio.run(call, "memory_add", {"session_id": "t", "turns": json.dumps(
        [{"speaker": "Ann", "text": "Turns sent as JSON text."}])}).structured_content["turn_ids"]
    twice = anyio.run(call, "memory_add", {"session_id": "t", "turns": '[{"speaker": "Ann", "text": "kept", '
                                                                     '"text": "replaced"}]'})
    assert twice.is_error and twice.structured_content == {
        "error": "turns: key 'text' is given twice in one object; give each key once", "field": "turns",
        "status": 422}
    before = len(mem.list(user_id="u", limit=100).items)
    assert anyio.run(call, "memory_forget", {"session_id": "null"}).structured_content == {"deleted": True}
    assert len(mem.list(user_id="u", limit=100).items) == before > 0
    assert [turn.session_id for turn in mem.store.turns("u") if turn.session_id == "null"] == []


# -- keys -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("user", ["bob\nalice", "a" * (limits.MAX_ID_CHARS + 1), "  ", "x\ud800"])
def test_keys_create_refuses_a_user_the_memory_would_refuse(tmp_path, capsys, user):
    assert serve_main(["keys", "create", "--store", str(tmp_path), "--user", user]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_keys_list_of_a_missing_store_creates_nothing(tmp_path, capsys):
    missing = tmp_path / "missing"
    assert serve_main(["keys", "list", "--store", str(missing)]) == 2
    assert serve_main(["keys", "revoke", "--store", str(missing), "abc"]) == 2
    assert not missing.exists() and "error: " in capsys.readouterr().err
    assert serve_main(["keys", "create", "--store", str(missing), "--user", "carol"]) == 0
    assert (missing / KEYS_FILE).is_file()


def test_another_users_record_is_never_read_by_a_lookup(tmp_path, monkeypatch):
    """A get, history or delete of another user's record id looks it up with the caller's user, so
    the record is never read (a read would take measurably longer than a miss, and tell that the id
    exists); the answer is the NotFound of a missing id."""
    import retrieval.memory.reads as reads

    with open_memory(tmp_path / "store") as memory:
        memory.add(chat("bob", 30), user_id="bob", session_id="s1")
        memory.flush(user_id="bob", session_id="s1")
        bobs = memory.list(user_id="bob", limit=1).items[0].id
        decoded, decode = [], reads.amu_from_row
        monkeypatch.setattr(reads, "amu_from_row", lambda row: decoded.append(row) or decode(row))
        for call in (memory.get, memory.history, memory.delete):
            missing = refused(lambda: call(bobs.replace("bob", "nobody"), user_id="alice"), NotFound)  # noqa: B023
            theirs = refused(lambda: call(bobs, user_id="alice"), NotFound)  # noqa: B023
            assert str(theirs) == str(missing).replace("nobody", "bob")
        assert decoded == [] and memory.get(bobs, user_id="bob").id == bobs
