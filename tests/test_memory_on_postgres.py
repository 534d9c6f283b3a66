"""The memory API end to end with its store in PostgreSQL (``Memory.open(URL)``): add, flush,
search, list, delete, forget, and a reopened memory finding what was committed."""

from __future__ import annotations

import pytest

from retrieval import Memory
from retrieval.api.errors import NotFound
from tests.multi_route_fixtures import WordEmbedder, WordFingerprinter

SECRET = "Quenfrithal"


def open_memory(url: str) -> Memory:
    return Memory.open(url, embedder=WordEmbedder(), fingerprinter=WordFingerprinter())


def chat(prefix: str, n: int) -> list[dict]:
    return [{"speaker": ("Ann", "Bob")[i % 2],
             "text": f"{prefix} story number {i} about gardens and tomatoes.",
             "time": "2023-05-08T10:00:00", "turn_id": f"{prefix}-{i}"} for i in range(n)]


def test_the_memory_api_on_postgresql(postgres_url):
    secret = {"speaker": "Ann", "text": f"My neighbour {SECRET} repairs old violins in Lisbon.",
              "time": "2023-05-08T10:00:00", "turn_id": "secret"}
    with open_memory(postgres_url) as mem:
        mem.add(chat("u", 6) + [secret] + chat("v", 6), user_id="alice", session_id="s")
        mem.add(chat("b", 8), user_id="bob", session_id="s")
        mem.flush(user_id="alice", session_id="s")
        mem.flush(user_id="bob", session_id="s")
        hits = mem.search(f"{SECRET} violins Lisbon", user_id="alice", k=5).hits
        assert any(SECRET in hit.text for hit in hits)
        found = mem.search(f"{SECRET} violins", user_id="bob", k=20).hits
        assert not any(SECRET in hit.text for hit in found)
        [record] = [item for item in mem.list(user_id="alice", limit=100).items if SECRET in item.text]
        mem.delete(record.id, user_id="alice")
        with pytest.raises(NotFound):
            mem.get(record.id, user_id="alice")
        found = mem.search(f"{SECRET} violins", user_id="alice", k=20).hits
        assert not any(SECRET in hit.text for hit in found)
        assert mem.search("story number 3 gardens", user_id="alice", k=3).hits
        kept = [item.id for item in mem.list(user_id="bob", limit=100).items]
        assert kept
    with open_memory(postgres_url) as mem:  # reopened: what was committed is there
        assert [item.id for item in mem.list(user_id="bob", limit=100).items] == kept
        mem.forget(user_id="alice")
        assert not mem.list(user_id="alice").items and not mem.search("gardens", user_id="alice", k=5).hits
        assert [item.id for item in mem.list(user_id="bob", limit=100).items] == kept
        assert mem.store.users() == ["bob"]


def test_consolidation_and_deleting_one_turn_of_a_merged_record_on_postgresql(postgres_url):
    hike = "I love hiking in the Alps every summer."
    hikes = [{"speaker": "Ann", "text": hike, "time": "2023-05-08T10:00:00", "turn_id": f"c{n}"}
             for n in range(1, 4)]
    turns = chat("u", 4) + hikes + chat("w", 4)
    with open_memory(postgres_url) as mem:
        mem.add(turns, user_id="u", session_id="s")
        mem.flush(user_id="u", session_id="s")
        assert mem.consolidate(user_id="u", wait=True, timeout_s=120).state == "done"
        items = mem.list(user_id="u", limit=100).items
        [merged] = [item for item in items if mem.history(item.id, user_id="u")]
        assert merged.turns == ("c1", "c2", "c3")
        mem.delete("u:turn:c1", user_id="u")
        restored = [item.turns for item in mem.list(user_id="u", limit=100).items if "hiking" in item.text]
        assert restored == [("c2",), ("c3",)]
