"""A user's open sessions are bounded: beyond :data:`retrieval.api.limits.MAX_OPEN_SESSIONS` the
ingestion worker closes the least recently fed, as a flush would, so a user that starts a session
per conversation and never flushes holds a bounded number in memory, and its old tails become
records; a stream reloaded at every step closes the same ones."""

from __future__ import annotations

import random

import pytest

from retrieval import Memory
from retrieval.api import backlog, worker_users
from retrieval.ingestion.segmenter import SESSION_FLUSH
from tests.multi_route_fixtures import WordEmbedder, WordFingerprinter

BOUND = 2


@pytest.fixture(autouse=True)
def bounded(monkeypatch):
    monkeypatch.setattr(backlog, "MAX_OPEN_SESSIONS", BOUND)


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
        assert [(s.session_id, s.reason) for s in closed] == [(f"s{n}", SESSION_FLUSH) for n in range(3)]
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


def test_a_stream_reloaded_at_every_step_closes_the_sessions_a_held_one_closes(tmp_path, monkeypatch):
    """Two users adding to five sessions in a random order, a step each add: with room for one
    held stream each user's stream is reloaded from the store at every step, and every user's
    segments are those of a memory that kept both streams."""
    rng = random.Random(5)
    topics = [["garden", "tomatoes", "soil"], ["marathon", "running", "shoes"], ["guitar", "song", "band"]]
    ops = []
    for round_ in range(24):
        for user in ("a", "b"):
            session = f"s{rng.randrange(5)}"
            words = rng.choice(topics)
            turns = [{"speaker": ("Ann", "Bob")[i % 2], "turn_id": f"{session}-{round_}-{i}",
                      "text": " ".join(rng.sample(words, 3))} for i in range(rng.randrange(1, 4))]
            ops.append((user, session, turns))

    def segments(path, held):
        monkeypatch.setattr(worker_users, "STREAMS_HELD", held)
        with Memory.open(path, embedder=WordEmbedder(), fingerprinter=WordFingerprinter()) as memory:
            for user, session, turns in ops:
                memory.add(turns, user_id=user, session_id=session)
                memory.drain(user_id=user)
                assert len(open_sessions(memory, user)) <= BOUND
            return {user: [(s.session_id, s.turn_ids, s.reason, s.flushed_after)
                           for s in memory.store.segments(user)] for user in ("a", "b")}

    kept = segments(tmp_path / "kept", 100)
    assert all(sum(reason == SESSION_FLUSH for _, _, reason, _ in cut) >= 3 for cut in kept.values())
    assert segments(tmp_path / "reloaded", 1) == kept
