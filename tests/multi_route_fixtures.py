"""A small synthetic store with known answers for the multi-route tests (no model: a crc32
bag-of-words embedder and fingerprinter)."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from retrieval.memory.cache import CachedEmbedder
from retrieval.memory.records import AMU, SegmentRecord, SourcePointer, Turn, amu_id
from retrieval.memory.store import AMUStore
from retrieval.multi_route.bank import MemoryBank

CID = "conv-s"
MAY, JUNE = datetime(2023, 5, 8, 10, 0), datetime(2023, 6, 20, 18, 0)
IDENTITY = {"codebook_size": 64, "codebook_sha256": "d" * 64}

TURNS = [  # (session, turn id, speaker, text, time)
    ("session_1", "D1:1", "Ann", "I signed up for a pottery class yesterday.", MAY),
    ("session_1", "D1:2", "Bob", "I ran a charity race for mental health last Saturday.", MAY),
    ("session_1", "D1:3", "Ann", "Cool, wow.", MAY),
    ("session_2", "D2:1", "Bob", "My dog Biscuit learned to sit.", JUNE),
    ("session_2", "D2:2", "Ann", "I painted a sunset over the lake.", JUNE),
    ("session_2", "D2:3", "Bob", "Shall we go camping in July?", JUNE),
    ("session_2", "D2:4", "Ann", "Yes, Yosemite would be perfect.", JUNE),
]
RECORDS = [  # (segment, text, entities, tags, t_ref, turn ids)
    (0, "Ann signed up for a pottery class on 7 May 2023.", ["Ann"], ["pottery", "class"], "2023-05-07",
     ["D1:1"]),
    (0, "Bob ran a charity race for mental health on 6 May 2023.", ["Bob"], ["charity", "race"], "2023-05-06",
     ["D1:2"]),
    (1, "Bob's dog Biscuit learned to sit.", ["Bob", "Biscuit"], ["dog"], "2023-06-20", ["D2:1"]),
    (1, "Ann painted a sunset over the lake.", ["Ann"], ["sunset", "lake"], "2023-06-20", ["D2:2"]),
    (1, "Ann and Bob plan a camping trip to Yosemite in July 2023.", ["Ann", "Bob", "Yosemite"], ["camping"],
     "2023-07", ["D2:3", "D2:4"]),
    (1, "Ann hates pottery and archived records.", ["Ann"], ["pottery"], "2023-05-07", ["D2:2"]),
]
ARCHIVED = f"{CID}:1:3"
"""The last record: archived after ingestion, so no channel may ever return it."""


def words(text: str) -> list[str]:
    return [w.strip(".,!?'s") for w in text.lower().split() if w.strip(".,!?'s")]


class WordEmbedder:
    """crc32 bag of words (``tokenize``) in ``dim`` dimensions, L2-normalised."""

    name = "word-hash"

    def __init__(self, dim: int = 64, tokenize: Callable[[str], list[str]] = words) -> None:
        self.dim, self.tokenize = dim, tokenize

    def encode(self, texts):
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in self.tokenize(text):
                out[row, zlib.crc32(word.encode()) % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms > 0, norms, 1.0)


class WordFingerprinter:
    """Codes = crc32 buckets of the words (a stand-in for ISQ fingerprints)."""

    identity = IDENTITY
    codebook_size = 64

    def fingerprint(self, texts):
        return [SimpleNamespace(codes=frozenset(zlib.crc32(w.encode()) % 64 for w in words(t)),
                                sequence=()) for t in texts]


def build_store(path: Path) -> None:
    with AMUStore(path) as store:
        for seq, session in enumerate(("session_1", "session_2")):
            turns = [Turn(CID, s, tid, who, text, when) for s, tid, who, text, when in TURNS if s == session]
            amus = [AMU(amu_id(CID, seq, i), text, "fact",
                        SourcePointer(CID, session, tuple(ids), ("Ann",), seq),
                        observed_at=turns[0].session_time
                        .isoformat(), entities=tuple(entities), tags=tuple(tags), t_ref=t_ref)
                    for i, (segment, text, entities, tags, t_ref, ids) in enumerate(
                        [r for r in RECORDS if r[0] == seq])]
            store.commit_segment(SegmentRecord(CID, seq, session, tuple(t.turn_id for t in turns),
                                               "session_flush"),
                                 turns, amus)
        store.archive([ARCHIVED])


def open_bank(store: AMUStore, *, codes: bool = True) -> MemoryBank:
    return MemoryBank.build(store, CID, CachedEmbedder(WordEmbedder(), store, CID),
                           fingerprinter=WordFingerprinter() if codes else None)


def query_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A built store bound to :class:`WordEmbedder`, with ``retrieval.query`` loading that embedder:
    what the query command-line tests read."""
    import retrieval.query as query_module  # imported here: the other fixtures need no command line

    build_store(tmp_path / "store")
    with AMUStore(tmp_path / "store") as store:
        store.bind("embedder", WordEmbedder.name)
    monkeypatch.setattr(query_module, "SentenceEmbedder", lambda name: WordEmbedder())
    return tmp_path / "store"
