"""A user's open sessions are bounded: a turn that would make more than
:data:`retrieval.api.limits.MAX_OPEN_SESSIONS` hold turns first closes the sessions whose latest
turn came earliest, as a flush would, so a user that starts a session per conversation and never
flushes holds a bounded number in memory, and its old tails become records. Where they close
depends on the turn log alone: not on how the worker's steps split it, nor on a reload or a
restart in between."""

from __future__ import annotations

import random

import pytest

from retrieval import Memory
from retrieval.api import backlog, limits, worker_users
from retrieval.ingestion.segmenter import SESSION_FLUSH, SegmenterConfig
from tests.multi_route_fixtures import WordEmbedder, WordFingerprinter

BOUND = 2


@pytest.fixture(autouse=True)
def bounded(monkeypatch):
    monkeypatch.setattr(limits, "MAX_OPEN_SESSIONS", BOUND)


def one_turn(session: str, n: int, speaker: str = "Ann") -> list[dict]:
    return [{"speaker": speaker, "turn_id": f"{session}-{n}", "text": f"{session} note {n} about tomatoes"}]


def open_sessions(memory: Memory, user: str) -> list[str]:
    """The sessions of the user with turns no committed segment covers, in the log's order."""
    return list(dict.fromkeys(turn.session_id for turn in memory.store.uncovered_turns(user)))


def test_sessions_beyond_the_bound_close_least_recently_fed_first_as_a_flush(tmp_path):
    with Memory.open(tmp_path, embedder=WordEmbedder(), fingerprinter=WordFingerprinter()) as memory:
        for n, session in enumerate(["s0", "s1", "s2", "s3", "s4"]):
            memory.add(one_turn(session, n), user_id="u", session_id=session)
            memory.drain(user_id="u")
            assert len(open_sessions(memory, "u")) == min(n + 1, BOUND)
        assert open_sessions(memory, "u") == ["s3", "s4"]
        closed = memory.store.segments("u")
        assert [(s.session_id, s.reason, s.flushed_after) for s in closed] == [
            ("s0", SESSION_FLUSH, "s1-1"), ("s1", SESSION_FLUSH, "s2-2"), ("s2", SESSION_FLUSH, "s3-3")]
        assert {item.text for item in memory.list(user_id="u").items} == {
            f"Ann: s{n} note {n} about tomatoes" for n in range(3)}
        # s3 fed again is now the most recent: a new session closes s4, not s3
        memory.add(one_turn("s3", 5, "Bob"), user_id="u", session_id="s3")
        memory.add(one_turn("s5", 6), user_id="u", session_id="s5")
        memory.drain(user_id="u")
        assert open_sessions(memory, "u") == ["s3", "s5"]
        assert memory.store.segments("u")[-1].session_id == "s4"
        stream = memory._backlog._users["u"].stream
        assert stream is not None and set(stream.sessions) == {"s3", "s5"}  # nothing else held
        # the closed sessions may go on: their next turns open a new segment
        memory.add(one_turn("s0", 7), user_id="u", session_id="s0")
        memory.drain(user_id="u")
        assert open_sessions(memory, "u") == ["s5", "s0"]
        hits = memory.search("s0 note 0 tomatoes", user_id="u", k=3).hits
        assert hits[0].kind == "record" and hits[0].text == "Ann: s0 note 0 about tomatoes"


def operations(seed: int, rounds: int) -> list[tuple[str, str, list[dict]]]:
    """Two users adding one to three turns at a time to five sessions, in a random order."""
    rng = random.Random(seed)
    topics = [["garden", "tomatoes", "soil"], ["marathon", "running", "shoes"], ["guitar", "song", "band"]]
    ops = []
    for round_ in range(rounds):
        for user in ("a", "b"):
            session, words = f"s{rng.randrange(5)}", rng.choice(topics)
            turns = [{"speaker": ("Ann", "Bob")[i % 2], "turn_id": f"{session}-{round_}-{i}",
                      "text": " ".join(rng.sample(words, 3))} for i in range(rng.randrange(1, 4))]
            ops.append((user, session, turns))
    return ops


def open_memory(path):
    # segments of at most three exchanges, so that sessions also hold nothing after one filled up
    return Memory.open(path, embedder=WordEmbedder(), fingerprinter=WordFingerprinter(),
                       segmenter=SegmenterConfig(max_exchanges=3))


def cuts(memory: Memory) -> dict[str, list[tuple]]:
    return {user: [(s.session_id, s.turn_ids, s.reason, s.flushed_after) for s in memory.store.segments(user)]
            for user in ("a", "b")}


@pytest.mark.parametrize("seed", [1, 2])
def test_where_sessions_close_depends_on_the_log_alone(tmp_path, monkeypatch, seed):
    """The same adds, processed a step after each add with every stream held, as one backlog fed
    in chunks of three turns, with each user's stream reloaded at every step (room for one), and
    stored by a memory closed before it fed them then processed after a restart: the same
    segments, each flush at the same place."""
    ops = operations(seed, 16)

    def step_each_add(path):
        with open_memory(path) as memory:
            for user, session, turns in ops:
                memory.add(turns, user_id=user, session_id=session)
                memory.drain(user_id=user)
                assert len(open_sessions(memory, user)) <= BOUND
            return cuts(memory)

    held = step_each_add(tmp_path / "held")
    assert all(sum(reason == SESSION_FLUSH for _, _, reason, _ in cut) >= 3 for cut in held.values())
    monkeypatch.setattr(worker_users, "STREAMS_HELD", 1)
    assert step_each_add(tmp_path / "reloaded") == held
    monkeypatch.setattr(backlog, "STEP_TURNS", 3)
    with open_memory(tmp_path / "chunked") as memory:
        for user in ("a", "b"):
            with memory._backlog.guards.of(user).stream:  # the worker waits: one backlog per user
                for added_by, session, turns in ops:
                    if added_by == user:
                        memory.add(turns, user_id=user, session_id=session)
        memory.drain()
        assert cuts(memory) == held
    monkeypatch.setattr(backlog.Backlog, "start", lambda self: None)  # stored, never fed: killed
    with open_memory(tmp_path / "restarted") as memory:
        for user, session, turns in ops[:len(ops) // 2]:
            memory.add(turns, user_id=user, session_id=session)
    monkeypatch.undo()
    monkeypatch.setattr(limits, "MAX_OPEN_SESSIONS", BOUND)
    monkeypatch.setattr(backlog, "STEP_TURNS", 3)
    with open_memory(tmp_path / "restarted") as memory:
        memory.drain()
        for user, session, turns in ops[len(ops) // 2:]:
            memory.add(turns, user_id=user, session_id=session)
        memory.drain()
        assert cuts(memory) == held
