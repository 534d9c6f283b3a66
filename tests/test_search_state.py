"""A user's search state: scores from the user's own memories only, a reader that sees every
commit before its next search, the session filter before the cut, bounded per-user caches."""

from __future__ import annotations

from pathlib import Path

from retrieval import Memory
from tests.routes_fixtures import WordEmbedder, WordFingerprinter

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
        hits = mem.search("gardens and tomatoes", user_id="u", session_id="many0", k=5).hits
        assert [(h.id, h.session_id) for h in hits] == [("u:turn:many0:1", "many0"),
                                                        ("u:turn:many0:2", "many0")]
        for session in ("many0", "many599"):
            mem.flush(user_id="u", session_id=session)
        hits = mem.search("gardens and tomatoes", user_id="u", session_id="many599", k=5).hits
        assert hits and {h.session_id for h in hits} == {"many599"}
        assert len(mem.search("gardens and tomatoes", user_id="u", k=5).hits) == 5
