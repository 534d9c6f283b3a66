"""Batch ingestion (``ingest_turns``) and the memory API (``Memory.add`` + ``flush`` per session)
are one pipeline: the same turns give the same stored turns, segments, records (ids, texts,
fingerprints, metadata) and cached vectors."""

from __future__ import annotations

import dataclasses
import zlib
from pathlib import Path
from types import SimpleNamespace

from retrieval import Memory
from retrieval.api.batch import ingest_turns
from retrieval.extract.rules import RuleExtractor
from retrieval.memory.records import Turn
from retrieval.memory.store import AMUStore
from tests.multi_route_fixtures import WordEmbedder, WordFingerprinter, words
from tests.test_ingest import conversation_turns


class SequenceFingerprinter(WordFingerprinter):
    """Word-bucket codes with a code sequence (what an AMU stores)."""

    def fingerprint(self, texts):
        prints = []
        for text in texts:
            sequence = tuple(zlib.crc32(word.encode()) % 64 for word in words(text))[:6]
            prints.append(SimpleNamespace(codes=frozenset(sequence), sequence=sequence))
        return prints


def recorded_turns() -> list[Turn]:
    """Two users; in the first one a third speaker, named in session 1, speaks from session 2 on
    (the extractor's participants are the speakers seen so far, as in the online path)."""
    first = [dataclasses.replace(turn, text=turn.text + " Cat will bring you seeds.")
             if turn.turn_id == "D1:3" else turn for turn in conversation_turns("u1")]
    first.append(Turn("u1", "s2", "D2:11", "Cat", "Here I am, Ann, with seeds for you.",
                      first[-1].session_time))
    return first + conversation_turns("u2")[:9]


def contents(store: AMUStore) -> dict[str, object]:
    users = ["u1", "u2"]
    vectors = store._db.execute("SELECT model, item, vector FROM vectors").fetchall()
    return {"amus": list(store.amus(include_archived=True)),
            "segments": [record for user in users for record in store.segments(user)],
            "turns": [turn for user in users for turn in store.turns(user)],
            "vectors": sorted(tuple(row) for row in vectors)}


def test_batch_ingestion_stores_what_the_memory_api_stores(tmp_path: Path) -> None:
    turns = recorded_turns()
    with AMUStore(tmp_path / "batch") as store:
        stats = ingest_turns(turns, store, WordEmbedder(), RuleExtractor(),
                             fingerprinter=SequenceFingerprinter(), progress=False)
        batch = contents(store)
    with Memory.open(tmp_path / "api", embedder=WordEmbedder(), fingerprinter=SequenceFingerprinter()) as mem:
        for user, session in dict.fromkeys((turn.user_id, turn.session_id) for turn in turns):
            mem.add([turn for turn in turns if (turn.user_id, turn.session_id) == (user, session)],
                    user_id=user, session_id=session)
            mem.flush(user_id=user, session_id=session)
        api = contents(mem.store)
    assert stats.amus == len(batch["amus"]) and stats.segments == len(batch["segments"]) >= 4
    assert all(amu.fingerprint for amu in batch["amus"])
    assert any("Cat" not in amu.entities and "Cat will bring Bob" in amu.text for amu in batch["amus"])
    for key in api:
        assert batch[key] == api[key], key


def test_a_segments_participants_are_the_speakers_up_to_its_last_turn_whenever_it_closes(tmp_path):
    """A third speaker, named in session 1, speaks in session 2: session 1's records (texts,
    entities) are the same whether it closed before session 2 was added or after (its open segment
    extracted while her turn was already stored), and name her as the text does, not as a
    participant. (Segment numbers follow the order segments close in, so they differ.)"""
    turns = [turn for turn in recorded_turns() if turn.user_id == "u1"]
    sessions = list(dict.fromkeys(turn.session_id for turn in turns))
    built = {}
    for name in ("each session closed before the next", "all added, then closed"):
        with Memory.open(tmp_path / name, embedder=WordEmbedder(),
                         fingerprinter=SequenceFingerprinter()) as mem:
            for session in sessions:
                mem.add([turn for turn in turns if turn.session_id == session], user_id="u1",
                        session_id=session)
                if name.startswith("each"):
                    mem.flush(user_id="u1", session_id=session)
            mem.drain(user_id="u1")
            for session in sessions:
                mem.flush(user_id="u1", session_id=session)
            built[name] = [(amu.text, amu.entities) for amu in mem.store.amus("u1")
                           if amu.source.session_id == sessions[0]]
    assert built["each session closed before the next"] == built["all added, then closed"]
    assert any("Cat will bring Bob" in text and "Cat" not in entities
               for text, entities in built["all added, then closed"])
