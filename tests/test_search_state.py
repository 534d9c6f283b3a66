"""A user's search state: scores from the user's own memories only, a reader that sees every
commit before its next search, the session filter before the cut, bounded per-user caches."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from retrieval import Memory
from tests.multi_route_fixtures import WordEmbedder, WordFingerprinter

QUERIES = ["tomatoes in the garden", "story number 3 about gardens", "gardens and tomatoes"]


def open_memory(path: Path, **options) -> Memory:
    return Memory.open(path, embedder=WordEmbedder(), fingerprinter=WordFingerprinter(), **options)


def chat(prefix: str, n: int, words: str = "gardens and tomatoes") -> list[dict]:
    speakers = ("Ann", "Bob")
    return [{"speaker": speakers[i % 2], "text": f"{prefix} story number {i} about {words}.",
             "time": "2023-05-08T10:00:00", "turn_id": f"{prefix}-{i}"} for i in range(n)]


def explained(mem: Memory, user: str) -> list[list[tuple]]:
    return [[(h.id, h.score, h.text, h.explain) for h in mem.search(q, user_id=user, k=8, explain=True).hits]
            for q in QUERIES]


def fill(mem: Memory, user: str, turns: list[dict]) -> None:
    mem.add(turns, user_id=user, session_id="s1")
    mem.flush(user_id=user, session_id="s1")


def test_lexical_scores_and_explanations_ignore_other_users(tmp_path):
    with open_memory(tmp_path / "alone") as mem:
        fill(mem, "alice", chat("alice", 12) + chat("alice-b", 6, "boats and rivers"))
        alone = explained(mem, "alice")
    with open_memory(tmp_path / "shared") as mem:
        fill(mem, "bob", chat("bob", 40, "tomatoes tomatoes gardens"))
        fill(mem, "alice", chat("alice", 12) + chat("alice-b", 6, "boats and rivers"))
        fill(mem, "carol", chat("carol", 25, "gardens"))
        shared = explained(mem, "alice")
    lexical = [d["channels"]["lexical"] for hits in alone for *_, d in hits if "lexical" in d["channels"]]
    assert lexical and all(channel["score"] > 0 for channel in lexical)
    assert shared == alone


def test_a_session_filter_applies_before_the_cut(tmp_path):
    with open_memory(tmp_path) as mem:
        for n in range(600):
            mem.add([{"speaker": "Ann", "text": f"Story {n} about gardens and tomatoes."}],
                     user_id="u", session_id=f"many{n}")
        mem.add([{"speaker": "Bob", "text": "Gardens need water."}], user_id="u", session_id="many0")
        mem.drain(user_id="u")  # many0's first turn closed into a record (MAX_OPEN_SESSIONS), its reply open
        hits = mem.search("gardens and tomatoes", user_id="u", session_id="many0", k=5).hits
        assert [(h.id, h.session_id) for h in hits] == [("u:turn:many0:2", "many0"), ("u:0:0", "many0")]
        for session in ("many0", "many599"):
            mem.flush(user_id="u", session_id=session)
        hits = mem.search("gardens and tomatoes", user_id="u", session_id="many599", k=5).hits
        assert hits and {h.session_id for h in hits} == {"many599"}
        assert len(mem.search("gardens and tomatoes", user_id="u", k=5).hits) == 5


def texts(result) -> list[str]:
    return [hit.text for hit in result.hits]


SECRET_QUERY = "secret word Zorblaxian"
SECRET_TURN = {"speaker": "Ann", "text": "My secret word is Zorblaxian.", "turn_id": "secret"}


def test_a_read_only_reader_sees_every_commit_before_its_next_search(tmp_path):
    with open_memory(tmp_path) as writer:
        writer.add(chat("alice", 6) + [SECRET_TURN], user_id="alice", session_id="s1")
        with open_memory(tmp_path, read_only=True) as reader:
            assert any("Zorblaxian" in t for t in texts(reader.search(SECRET_QUERY, user_id="alice")))
            writer.delete("alice:turn:secret", user_id="alice")
            found = texts(reader.search(SECRET_QUERY, user_id="alice", k=20))
            assert found and not any("Zorblaxian" in t for t in found)
            kayak = {"speaker": "Bob", "text": "I bought a red kayak."}
            writer.add([kayak], user_id="alice", session_id="s2")
            assert "Bob: I bought a red kayak." in texts(reader.search("red kayak", user_id="alice", k=3))
            writer.flush(user_id="alice", session_id="s1")
            writer.flush(user_id="alice", session_id="s2")
            seen = [(h.id, h.score) for q in QUERIES for h in reader.search(q, user_id="alice", k=6).hits]
    with open_memory(tmp_path, read_only=True) as fresh:
        assert seen == [(h.id, h.score) for q in QUERIES for h in fresh.search(q, user_id="alice", k=6).hits]
        assert any(h.kind == "record" for h in fresh.search("red kayak", user_id="alice", k=3).hits)


USERS = [f"user{n}" for n in range(8)]


def answers(mem: Memory, user: str) -> list[tuple]:
    return [(h.id, h.score) for q in QUERIES for h in mem.search(q, user_id=user, k=6).hits]


def test_search_states_stay_within_their_bound_and_evicted_users_search_alike(tmp_path, monkeypatch):
    from retrieval.api import states
    from retrieval.service.gauges import StoreGauges
    from retrieval.service.metrics import ServiceMetrics

    with open_memory(tmp_path) as mem:
        for user in USERS:
            fill(mem, user, chat(user, 10))
        expected = {user: answers(mem, user) for user in USERS}
        everyone = mem.cache_gauges()
    assert everyone["search_states"] == len(USERS)
    bound = 3 * everyone["search_state_bytes"] // len(USERS)
    monkeypatch.setattr(states, "SEARCH_STATE_BYTES", bound)
    with open_memory(tmp_path) as mem:
        for user in USERS + USERS[::-1]:
            assert answers(mem, user) == expected[user]
            gauges = mem.cache_gauges()
            assert 1 <= gauges["search_states"] <= 3 and gauges["search_state_bytes"] <= bound
        mem.add(chat("late", 2, "kayaks"), user_id=USERS[-1], session_id="s9")  # its state was evicted
        mem.drain(user_id=USERS[-1])  # the worker has fed the turns to the user's stream (counted below)
        after_add = answers(mem, USERS[-1])
        metrics = ServiceMetrics(StoreGauges(tmp_path, mem.cache_gauges)).render().decode()
        gauges = mem.cache_gauges()
    assert f"isq_memory_search_state_bytes {float(gauges['search_state_bytes'])}" in metrics
    assert "isq_memory_search_states " in metrics and "isq_memory_user_streams 1.0" in metrics
    with open_memory(tmp_path) as mem:
        assert answers(mem, USERS[-1]) == after_add


def test_the_open_segments_gauge_reads_only_the_users_with_turns_to_cover(tmp_path, monkeypatch):
    """A scrape reads no settled user's turns: over a large store that took seconds a scrape."""
    from retrieval.memory.delegation import StoreParts
    from retrieval.service.gauges import StoreGauges

    with open_memory(tmp_path) as mem:
        for user in USERS[:3]:
            fill(mem, user, chat(user, 6))
        mem.add(chat("late", 2, "kayaks"), user_id=USERS[0], session_id="s9")
        mem.add(chat("open", 2, "kites"), user_id=USERS[1], session_id="s8")
        mem.drain()
        read, uncovered = [], StoreParts.uncovered_turns
        monkeypatch.setattr(StoreParts, "uncovered_turns",
                            lambda store, user: read.append(user) or uncovered(store, user))
        gauges = StoreGauges(tmp_path, dict)
        try:
            assert gauges()["open_segments"] == 2
        finally:
            gauges.close()
    assert sorted(read) == USERS[:2]


WRITER = """
import sys
from retrieval import Memory
from tests.multi_route_fixtures import WordEmbedder, WordFingerprinter
with Memory.open(sys.argv[1], embedder=WordEmbedder(), fingerprinter=WordFingerprinter()) as mem:
    mem.delete("alice:turn:secret", user_id="alice")
    mem.add([{"speaker": "Bob", "text": "I bought a red kayak."}], user_id="alice", session_id="s2")
"""


def test_a_reader_sees_what_a_writer_in_another_process_committed(tmp_path):
    with open_memory(tmp_path) as writer:
        writer.add(chat("alice", 6) + [SECRET_TURN], user_id="alice", session_id="s1")
    with open_memory(tmp_path, read_only=True) as reader:
        assert any("Zorblaxian" in t for t in texts(reader.search(SECRET_QUERY, user_id="alice")))
        root = Path(__file__).resolve().parents[1]
        subprocess.run([sys.executable, "-c", WRITER, str(tmp_path)], check=True, timeout=300, cwd=root,
                       env={**os.environ, "PYTHONPATH": str(root)})
        found = texts(reader.search(SECRET_QUERY, user_id="alice", k=20))
        assert found and not any("Zorblaxian" in t for t in found)
        assert "Bob: I bought a red kayak." in texts(reader.search("red kayak", user_id="alice", k=3))


def test_a_commit_landing_while_a_state_is_built_is_in_it_once(tmp_path):
    """Another writer's turn committed after the reader read the user's rows but before it read
    the turns themselves is in the built state already; the next search must not add it again."""
    kayak = {"speaker": "Bob", "text": "I bought a red kayak.", "turn_id": "kayak"}
    with open_memory(tmp_path) as writer:
        writer.add(chat("alice", 6), user_id="alice", session_id="s1")
        with open_memory(tmp_path, read_only=True) as reader:
            build = reader._states.build

            def build_after_a_commit(user):
                writer.add([kayak], user_id="alice", session_id="s1")
                return build(user)

            reader._states.build = build_after_a_commit
            reader.search("red kayak", user_id="alice", k=3)
            reader._states.build = build
            hits = reader.search("red kayak", user_id="alice", k=8).hits
            assert [h.id for h in hits].count("alice:turn:kayak") == 1
            bank = reader._states.get("alice")
            assert sorted(turn.turn_id for turn in bank.turns) == sorted(
                [f"alice-{i}" for i in range(6)] + ["kayak"])


def test_a_turn_added_and_deleted_while_a_state_is_built_is_not_served_after(tmp_path):
    """Another writer adds a turn after the reader read the user's rows, and deletes it after the
    reader's build read it: the user's rows count as they were, but the state built holds the
    deleted turn, so it must be built again rather than kept."""
    secret = {"speaker": "Bob", "text": "My locker code is 4921 zanzibar.", "turn_id": "x"}
    with open_memory(tmp_path) as writer:
        fill(writer, "alice", chat("alice", 6))
        with open_memory(tmp_path, read_only=True) as reader:
            build, turns = reader._states.build, reader.store.turns

            def build_after_an_add(user):
                writer.add([secret], user_id="alice", session_id="s1")
                return build(user)

            def turns_then_a_delete(user):
                found = turns(user)
                writer.delete("alice:turn:x", user_id="alice")
                return found

            reader._states.build, reader.store.turns = build_after_an_add, turns_then_a_delete
            reader.search("locker code", user_id="alice", k=3)
            reader._states.build, reader.store.turns = build, turns
            for _ in range(2):
                found = texts(reader.search("locker code", user_id="alice", k=20))
                assert found and not any("zanzibar" in t for t in found)


def test_a_reader_of_read_only_media_without_the_wal_index_sees_commits_and_forgets(tmp_path, monkeypatch):
    """On read-only media a store closed cleanly has no -shm file and none can be made there, so it
    is read as immutable; another process writing the same files (through a writable mount) must
    still reach the reader: its next search reads the changed files, and a forgotten user is gone."""
    from retrieval.memory.connection import SQLiteConnection
    from retrieval.memory.errors import StoreError

    connect = SQLiteConnection._connect

    def read_only_media(self, target):
        if "mode=ro" in target and "immutable" not in target and not Path(f"{self.path}-shm").exists():
            raise StoreError(f"{self.path}: not a usable SQLite store (unable to open database file)")
        return connect(self, target)

    with open_memory(tmp_path) as writer:
        fill(writer, "alice", chat("alice", 6) + [SECRET_TURN])
    monkeypatch.setattr(SQLiteConnection, "_connect", read_only_media)
    with open_memory(tmp_path, read_only=True) as reader:
        assert reader.store._connection._snapshot is not None  # opened as immutable
        assert any("Zorblaxian" in t for t in texts(reader.search(SECRET_QUERY, user_id="alice")))
        with open_memory(tmp_path) as writer:
            writer.forget(user_id="alice")
        assert reader.users() == []  # a read that is not a search sees it too
        assert not reader.search(SECRET_QUERY, user_id="alice", k=20).hits
        with open_memory(tmp_path) as writer:
            kayak = {"speaker": "Bob", "text": "I bought a red kayak."}
            writer.add([kayak], user_id="bob", session_id="s1")
            assert "Bob: I bought a red kayak." in texts(reader.search("red kayak", user_id="bob", k=3))
