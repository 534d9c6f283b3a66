"""A copied user is a user of its own: the source's turns, segments and records under the target's
id (searched alike, scores equal), isolated from the source afterwards (adds and purges of one
never show in the other), written all or none; a user that is not settled, or a target that holds
or held something, is refused naming the argument."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from retrieval import Memory
from retrieval.api.errors import InvalidInput, NotFound
from retrieval.api.user_copy import copy_user
from retrieval.memory import record_writes
from tests.multi_route_fixtures import WordEmbedder, WordFingerprinter


def chat(prefix: str, n: int) -> list[dict]:
    return [{"speaker": ("Ann", "Bob")[i % 2], "turn_id": f"{prefix}-{i}",
             "text": f"{prefix} story {i} about gardens, tomatoes and the {('red', 'blue')[i % 2]} boat."}
            for i in range(n)]


@pytest.fixture
def memory(tmp_path: Path):
    mem = Memory.open(tmp_path / "store", embedder=WordEmbedder(), fingerprinter=WordFingerprinter())
    for session in ("s1", "s2"):
        mem.add(chat(f"a{session}", 14), user_id="a", session_id=session)
        mem.flush(user_id="a", session_id=session)
    mem.drain()
    yield mem
    mem.close()


def hits(mem: Memory, query: str, user: str) -> list[tuple[str, str, float]]:
    return [(hit.id, hit.text, round(hit.score, 9)) for hit in mem.search(query, user_id=user, k=8).hits]


def test_the_copy_holds_the_sources_memory_under_its_own_ids(memory: Memory) -> None:
    copied = copy_user(memory, "a", "b")
    store = memory.store
    assert copied == store.count("a") > 0 and store.count("b") == copied
    assert [t.turn_id for t in store.turns("b")] == [t.turn_id for t in store.turns("a")]
    assert [(s.seq, s.turn_ids, s.state) for s in store.segments("b")] == \
        [(s.seq, s.turn_ids, s.state) for s in store.segments("a")]
    source, target = list(store.amus("a")), list(store.amus("b"))
    assert [amu.id for amu in target] == [amu.id.replace("a:", "b:", 1) for amu in source]
    assert all(amu.source.user_id == "b" for amu in target)
    assert [(amu.text, amu.fingerprint, amu.entities) for amu in target] == \
        [(amu.text, amu.fingerprint, amu.entities) for amu in source]
    for query in ("as1 story 3 tomatoes", "the blue boat", "as2 story 11 gardens"):
        mine, theirs = hits(memory, query, "a"), hits(memory, query, "b")
        assert theirs == [(hit_id.replace("a:", "b:", 1), text, score) for hit_id, text, score in mine]
        assert all(hit_id.startswith("a:") for hit_id, _, _ in mine)
    assert memory.get(target[0].id, user_id="b").text == source[0].text
    with pytest.raises(NotFound):
        memory.get(target[0].id, user_id="a")


def test_after_the_copy_each_user_changes_alone(memory: Memory) -> None:
    copy_user(memory, "a", "b")
    before = hits(memory, "as1 story 3 tomatoes", "a")
    memory.add([{"speaker": "Ann", "text": "canary zebra42 lives only in b", "turn_id": "z"}],
               user_id="b", session_id="s3")
    memory.flush(user_id="b", session_id="s3")
    assert memory.get("b:turn:z", user_id="b").text.endswith("canary zebra42 lives only in b")
    with pytest.raises(NotFound):
        memory.get("a:turn:z", user_id="a")
    assert memory.store.count("b") == memory.store.count("a") + 1
    assert hits(memory, "as1 story 3 tomatoes", "a") == before
    memory.forget(user_id="b")
    assert memory.store.count("b") == 0 and not memory.store.has_user("b")
    assert hits(memory, "as1 story 3 tomatoes", "a") == before
    with pytest.raises(InvalidInput) as forgotten:  # b's old ids (b:0:0, b:turn:as1-0) would name the copy
        copy_user(memory, "a", "b")
    assert forgotten.value.field == "target_user_id" and memory.store.count("b") == 0
    with pytest.raises(NotFound):
        memory.get(f"b:{before[0][0].split(':', 1)[1]}", user_id="b")
    assert copy_user(memory, "a", "c") == memory.store.count("a")


def test_refusals_name_the_argument(memory: Memory) -> None:
    with pytest.raises(NotFound) as missing:
        copy_user(memory, "nobody", "b")
    assert missing.value.field == "source_user_id"
    with pytest.raises(InvalidInput) as same:
        copy_user(memory, "a", "a")
    assert same.value.field == "target_user_id"
    with pytest.raises(InvalidInput) as bad_id:
        copy_user(memory, "a", "  ")
    assert bad_id.value.field == "target_user_id"
    memory.add(chat("c", 3), user_id="c", session_id="s")
    with pytest.raises(InvalidInput) as taken:
        copy_user(memory, "a", "c")
    assert taken.value.field == "target_user_id"
    memory.drain()  # the worker is done, but c's open segment holds its last turns
    with pytest.raises(InvalidInput) as open_segment:
        copy_user(memory, "c", "d")
    assert open_segment.value.field == "source_user_id" and not memory.store.has_user("d")


def test_a_consolidated_user_is_refused(tmp_path: Path) -> None:
    with Memory.open(tmp_path / "store", embedder=WordEmbedder()) as mem:
        same = [{"speaker": "Ann", "text": "I love hiking in the Alps every summer."} for _ in range(6)]
        mem.add(same, user_id="a", session_id="s")
        mem.flush(user_id="a", session_id="s")
        assert mem.consolidate(user_id="a", wait=True, timeout_s=60).progress["created"] >= 1
        with pytest.raises(InvalidInput) as refused:
            copy_user(mem, "a", "b")
        assert refused.value.field == "source_user_id"


def test_a_copy_is_written_all_or_none(memory: Memory, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def failing_insert(db, amu, position=None):
        calls.append(amu.id)
        if len(calls) > 3:
            raise RuntimeError("disk full")
        return original(db, amu, position)

    original = record_writes.insert_amu
    monkeypatch.setattr(record_writes, "insert_amu", failing_insert)
    with pytest.raises(RuntimeError):
        copy_user(memory, "a", "b")
    monkeypatch.undo()
    assert not memory.store.has_user("b") and memory.store.count("b") == 0
    assert copy_user(memory, "a", "b") == memory.store.count("a")


def test_a_delete_of_the_source_waits_for_the_copy(memory: Memory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A delete of the source in this process, asked while the copy has read the source and not yet
    written the target, runs after the copy (the copy holds both users' writes): it never commits
    between the read and the write, where the target would be given what the source no longer has."""
    deleting: list[threading.Thread] = []
    commit = memory.store.commit_segments

    def commit_after_a_delete_is_asked(segments):
        thread = threading.Thread(target=memory.delete, args=("a:turn:as1-0",), kwargs={"user_id": "a"})
        thread.start()
        deleting.append(thread)
        thread.join(timeout=1.0)
        assert thread.is_alive(), "the delete ran inside the copy"
        return commit(segments)

    monkeypatch.setattr(memory.store, "commit_segments", commit_after_a_delete_is_asked)
    copy_user(memory, "a", "b")
    deleting[0].join(timeout=120)
    assert not memory.store.stored_turn_ids("a", ["as1-0"]) and memory.store.stored_turn_ids("b", ["as1-0"])


def _blocked_by_the_copy(call) -> threading.Thread:
    """``call`` in a thread that is still waiting a second later (for the copy's transaction)."""
    thread = threading.Thread(target=call)
    thread.start()
    thread.join(timeout=1.0)
    assert thread.is_alive(), "another writer committed inside the copy"
    return thread


def test_another_nodes_delete_and_add_during_the_copy_wait_for_it(postgres_url) -> None:
    """Two nodes on one database: while the copy reads the source, the other node's delete of a
    source turn and add to the target wait for the copy's transaction, so the copy is of one state
    (the turn, deleted after it) and the target is not written between its check and the copy."""
    copier, other = (Memory.open(postgres_url, embedder=WordEmbedder(), fingerprinter=WordFingerprinter())
                     for _ in range(2))
    try:
        copier.add(chat("as1", 6), user_id="a", session_id="s1")
        copier.flush(user_id="a", session_id="s1")
        copier.drain()
        waiting: list[threading.Thread] = []
        turns = copier.store.turns

        def turns_while_the_other_node_writes(user):
            found = turns(user)
            waiting.append(_blocked_by_the_copy(lambda: other.delete("a:turn:as1-0", user_id="a")))
            waiting.append(_blocked_by_the_copy(lambda: other.add(
                [{"speaker": "Bob", "text": "zebra42 arrives after the copy", "turn_id": "late"}],
                user_id="b", session_id="s9")))
            return found

        copier.store.turns = turns_while_the_other_node_writes  # type: ignore[method-assign]
        assert copy_user(copier, "a", "b") == 6
        for thread in waiting:
            thread.join(timeout=120)
        assert not copier.store.stored_turn_ids("a", ["as1-0"])
        assert copier.store.stored_turn_ids("b", ["as1-0", "late"]) == {"as1-0", "late"}
    finally:
        copier.close()
        other.close()


def test_a_consolidation_asked_while_the_copy_reads_waits_for_it(tmp_path: Path) -> None:
    """A consolidation job is not held by the copy's guards of this process: asked while the copy
    reads the records, it commits only after the copy, which is of the records before it (nothing
    archived); the source alone is consolidated."""
    with Memory.open(tmp_path / "store", embedder=WordEmbedder()) as mem:
        same = [{"speaker": "Ann", "text": "I love hiking in the Alps every summer."} for _ in range(6)]
        mem.add(same, user_id="a", session_id="s")
        mem.flush(user_id="a", session_id="s")
        active, turns, done = mem.store.count("a"), mem.store.turns, []

        def turns_while_consolidating(user):
            found = turns(user)
            done.append(_blocked_by_the_copy(
                lambda: done.append(mem.consolidate(user_id="a", wait=True, timeout_s=120))))
            return found

        mem.store.turns = turns_while_consolidating  # type: ignore[method-assign]
        assert copy_user(mem, "a", "b") == active
        done[0].join(timeout=120)
        assert done[1].state == "done" and done[1].progress["created"] >= 1
        assert mem.store.count("a", include_archived=True) > mem.store.count("a", include_archived=False)
        copied = mem.store.count("b", include_archived=True)
        assert copied == mem.store.count("b", include_archived=False) == active
