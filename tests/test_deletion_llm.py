"""Deletion where an LLM works for the memory: the extractor's disambiguation notes carried past a
deleted turn go with it, a purge drops the user's cached LLM answers (all of them, quoted or
restated) and no other user's."""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from retrieval import Memory
from retrieval.api.purge import drop_llm_answers
from retrieval.extract.llm_extractor import LLMExtractor
from retrieval.llm_client import user_answers
from retrieval.memory.cache import text_key
from tests.fake_chat import FakeChatServer, Reply, completion_body
from tests.multi_route_fixtures import WordEmbedder, WordFingerprinter

SECRET = "Quenfrithal"
WHEN = "2023-05-08T10:00:00"


def extracting(body: dict[str, Any]) -> Reply:
    """An extractor's endpoint: a record per turn, and a note that keeps the previous note and adds
    each long capitalised name with the word before it (restating a turn, as notes do)."""
    prompt = body["messages"][-1]["content"]
    previous = re.search(r"Disambiguation state:\n(.*?)(?:\n\n|$)", prompt, re.S)
    notes = [previous.group(1).strip()] if previous else []
    records = []
    for turn_id, speaker, text in re.findall(r"\[([^\]]+)\] (\w+): (.*)", prompt):
        records.append({"text": f"{speaker}: {text}", "memory_type": "fact", "entities": [], "tags": [],
                        "timestamps": [], "turn_ids": [turn_id]})
        notes += [f"{name} = {speaker}'s {text.split(name)[0].split()[-1]}"
                  for name in re.findall(r"\b[A-Z][a-z]{5,}\b", text)]
    answer = {"records": records, "disambiguation": "; ".join(notes)}
    return 200, completion_body(json.dumps(answer), 10, 10), 0.0


def planning(body: dict[str, Any]) -> Reply:
    question = body["messages"][-1]["content"].split("Question: ")[-1]
    plan = {"question_type": "single", "routes": [{"goal": "find it", "queries": [question],
                                                   "entities": [], "topics": [], "time": None}]}
    return 200, completion_body(json.dumps(plan), 10, 10), 0.0


@pytest.fixture
def endpoint(monkeypatch) -> Iterator[FakeChatServer]:
    def respond(body: dict[str, Any]) -> Reply:
        return (planning if "Question: " in body["messages"][-1]["content"] else extracting)(body)

    with FakeChatServer(respond) as server:
        monkeypatch.setenv("ISQ_LLM_BASE_URL", server.base_url)
        monkeypatch.setenv("ISQ_LLM_MODEL", "fake")
        yield server


def open_memory(path: Path, **roles: str) -> Memory:
    return Memory.open(path, embedder=WordEmbedder(), fingerprinter=WordFingerprinter(), **roles)


def add_one(memory: Memory, user: str, speaker: str, text: str, turn_id: str) -> None:
    memory.add([{"speaker": speaker, "text": text, "turn_id": turn_id, "time": WHEN}], user_id=user,
               session_id="s1")
    memory.flush(user_id=user, session_id="s1")


def cached_texts(store: Path) -> str:
    return "".join(path.read_text() for path in (store / "llm_cache").rglob("*.json"))


def test_notes_carried_past_a_deleted_turn_go_with_it(tmp_path: Path, endpoint: FakeChatServer) -> None:
    store = tmp_path / "store"
    with open_memory(store, extractor="llm") as memory:
        add_one(memory, "alice", "Ann", f"My neighbour {SECRET} repairs old violins.", "secret")
        add_one(memory, "alice", "Bob", "We planted tomatoes in the garden.", "t2")
        assert SECRET in json.dumps(endpoint.requests[-1])  # the second segment's note carried it
        assert SECRET in cached_texts(store)
        memory.delete("alice:turn:secret", user_id="alice")
        asked = len(endpoint.requests)
        add_one(memory, "alice", "Bob", "The cucumbers are growing well.", "t3")
        later = json.dumps(endpoint.requests[asked:])
        texts = [item.text for item in memory.list(user_id="alice").items]
    assert later and SECRET not in later
    assert texts and not [text for text in texts if SECRET in text]
    db = sqlite3.connect(store / "amus.sqlite3")
    assert [state for (state,) in db.execute("SELECT state FROM segments") if SECRET in state] == []
    db.close()
    assert SECRET not in cached_texts(store)
    assert not [path for path in store.glob("amus.sqlite3*") if SECRET.encode() in path.read_bytes()]


def test_a_purge_drops_the_users_answers_and_no_other_users(tmp_path: Path, endpoint: FakeChatServer) -> None:
    store = tmp_path / "store"
    question = "When did Bob visit Lisbon?"
    with open_memory(store, planner="llm") as memory:
        add_one(memory, "alice", "Ann", "I flew to Lisbon for a conference.", "a1")
        add_one(memory, "bob", "Bob", "I visited Lisbon and Porto with my sister.", "b1")
        memory.search("Where did Ann fly?", user_id="alice")
        first = [(hit.id, hit.score) for hit in memory.search(question, user_id="bob").hits]
        bobs = sorted(user_answers(store / "llm_cache", "bob").glob("*.json"))
        assert bobs and list(user_answers(store / "llm_cache", "alice").glob("*.json"))
        memory.delete("alice:turn:a1", user_id="alice")
        asked = len(endpoint.requests)
        again = [(hit.id, hit.score) for hit in memory.search(question, user_id="bob").hits]
    assert len(endpoint.requests) == asked and again == first  # bob's plan still cached, nothing changed
    assert sorted(user_answers(store / "llm_cache", "bob").glob("*.json")) == bobs
    assert not user_answers(store / "llm_cache", "alice").exists()


def test_a_memory_opened_by_a_relative_path_purges_its_own_cache_after_a_chdir(
        tmp_path: Path, endpoint: FakeChatServer, monkeypatch) -> None:
    """A notebook's ``%cd`` between the search and the forget: the forget read the cache's relative
    path against the new directory and left the cached plan, which quotes the question, on disk."""
    monkeypatch.chdir(tmp_path)
    with open_memory(Path("store"), planner="llm") as memory:
        add_one(memory, "alice", "Ann", f"My neighbour {SECRET} repairs old violins.", "a1")
        memory.search(f"Who is {SECRET}?", user_id="alice")
        assert SECRET in cached_texts(tmp_path / "store")
        (tmp_path / "elsewhere").mkdir()
        monkeypatch.chdir(tmp_path / "elsewhere")
        memory.forget(user_id="alice")
    assert SECRET not in cached_texts(tmp_path / "store")
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_an_answer_cached_while_the_purge_commits_goes_with_it(tmp_path: Path, monkeypatch) -> None:
    """A consolidation's operator may answer between the purge's drop of the user's answers and its
    commit, and its check of the purge count come before the commit: that answer is dropped too."""
    from retrieval.api import purge

    store, dropped = tmp_path / "store", purge.drop_llm_answers

    def an_answer_arrives_meanwhile(cache: Path, user: str, texts) -> None:
        dropped(cache, user, texts)
        user_answers(cache, user).mkdir(parents=True, exist_ok=True)
        (user_answers(cache, user) / "late.json").write_text(json.dumps({"merged": f"{SECRET} again"}))

    monkeypatch.setattr(purge, "drop_llm_answers", an_answer_arrives_meanwhile)
    with open_memory(store) as memory:
        add_one(memory, "alice", "Ann", f"My neighbour {SECRET} repairs old violins.", "secret")
        memory.delete("alice:turn:secret", user_id="alice")
    assert not user_answers(store / "llm_cache", "alice").exists()


def test_a_forget_reaches_answers_cached_outside_the_store(tmp_path: Path, endpoint: FakeChatServer) -> None:
    """An extractor given as an object with a cache directory of its own: a forget drops the
    user's answers there too, not only in the store's."""
    elsewhere = tmp_path / "elsewhere"
    with Memory.open(tmp_path / "store", embedder=WordEmbedder(), fingerprinter=WordFingerprinter(),
                     extractor=LLMExtractor(cache_dir=elsewhere)) as memory:
        add_one(memory, "alice", "Ann", f"My neighbour {SECRET} repairs old violins.", "a1")
        add_one(memory, "bob", "Bob", "We planted tomatoes in the garden.", "b1")
        assert list(user_answers(elsewhere, "alice").glob("*.json"))
        memory.forget(user_id="alice")
    assert not user_answers(elsewhere, "alice").exists()
    assert list(user_answers(elsewhere, "bob").glob("*.json"))
    assert SECRET not in "".join(path.read_text() for path in elsewhere.rglob("*.json"))


def test_a_reader_with_the_llm_planner_writes_nothing_into_the_store(tmp_path: Path,
                                                                     endpoint: FakeChatServer) -> None:
    store = tmp_path / "store"
    with open_memory(store) as memory:
        add_one(memory, "alice", "Ann", "I flew to Lisbon for a conference.", "a1")
    with Memory.open(store, embedder=WordEmbedder(), fingerprinter=WordFingerprinter(), planner="llm",
                     read_only=True) as reader:
        assert reader.search("Where did Ann fly?", user_id="alice").hits
    assert any("Question: " in json.dumps(request) for request in endpoint.requests)
    assert not (store / "llm_cache").exists()


@pytest.mark.parametrize("text", ['My neighbour is called "Quenfrithal" and repairs violins.',
                                  "A path C:\\Quenfrithal\\violins, caf\u00e9 owner."])
def test_an_entry_kept_for_no_user_that_quotes_a_purged_text_goes(tmp_path: Path, text: str) -> None:
    """Entries cached before answers were kept per user: a model's JSON answer is a string inside
    the response's JSON, so a quote or backslash of the text is escaped twice there."""
    cache = tmp_path / "llm_cache"
    cache.mkdir()
    for name, record in (("quoting", f"Ann: {text}"), ("other", "Ann: tomatoes")):
        content = json.dumps({"records": [{"text": record, "turn_ids": ["t1"]}]})
        (cache / f"{name}.json").write_text(json.dumps(completion_body(content, 1, 1)))
    user_answers(cache, "alice").mkdir(parents=True)
    (user_answers(cache, "alice") / "plan.json").write_text("{}")
    (user_answers(cache, "bob").mkdir(parents=True))
    (user_answers(cache, "bob") / "plan.json").write_text("{}")
    drop_llm_answers(cache, "alice", [text])
    assert sorted(path.relative_to(cache) for path in cache.rglob("*.json")) == \
        [Path("other.json"), user_answers(cache, "bob").relative_to(cache) / "plan.json"]


def test_a_deleted_merge_of_an_llm_takes_the_vector_of_its_unprefixed_statement(tmp_path: Path) -> None:
    """Consolidation embeds each record's statement without its time prefix; where an LLM wrote
    the merged statement, that text is no member's, and deleting the merge must take its vector
    too (it stayed in the cache, and a copy of the user carried it on)."""
    summary = f"Ann enjoys {SECRET} tea, as she said on several occasions."

    def aggregating(body: dict[str, Any]) -> Reply:
        answer = {"operation": "AGGREGATE", "text": summary, "memory_type": "preference",
                  "entities": ["Ann"], "tags": ["tea"], "timestamps": []}
        return 200, completion_body(json.dumps(answer), 10, 10), 0.0

    store = tmp_path / "store"
    with FakeChatServer(aggregating) as server, pytest.MonkeyPatch.context() as patch:
        patch.setenv("ISQ_LLM_BASE_URL", server.base_url)
        patch.setenv("ISQ_LLM_MODEL", "fake")
        with open_memory(store, operator="llm") as memory:
            for session, day, more in (("s1", "08", ""), ("s2", "20", " indeed")):  # a prefixed merge
                memory.add([{"speaker": "Ann", "text": f"I love {SECRET} tea very much{more}.",
                             "time": f"2023-05-{day}T10:00:00", "turn_id": f"{session}-t"},
                             {"speaker": "Bob", "text": "Good for you.", "time": f"2023-05-{day}T10:00:00",
                              "turn_id": f"{session}-u"}], user_id="alice", session_id=session)
                memory.flush(user_id="alice", session_id=session)
            assert memory.consolidate(user_id="alice", wait=True, timeout_s=120).state == "done"
            [merged] = [item for item in memory.list(user_id="alice").items if summary in item.text]
            assert merged.text.startswith("[2023-05-08 to 2023-05-20] ")
            stripped = merged.text.removeprefix("[2023-05-08 to 2023-05-20] ")
            memory.delete(merged.id, user_id="alice")
    db = sqlite3.connect(store / "amus.sqlite3")
    try:
        items = {row[0] for row in db.execute("SELECT item FROM vectors WHERE conversation_id = 'alice'")}
    finally:
        db.close()
    assert text_key(stripped) not in items and text_key(merged.text) not in items
