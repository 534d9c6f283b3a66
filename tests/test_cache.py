"""The store's array cache: embeddings and fingerprints computed once per model identity and
text, reused exactly, kept apart per model, never written into a read-only store."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from retrieval.memory.cache import CachedEmbedder, CachedFingerprinter, model_key, text_key
from retrieval.memory.store import AMUStore
from tests.test_ingest import HashEmbedder

TEXTS = ["Anna went to the museum.", "Ben bought a red bike.", "Anna went to the museum."]


class CountingEmbedder(HashEmbedder):
    def __init__(self, name: str = "hash") -> None:
        self.name, self.calls = name, []

    def encode(self, texts):
        self.calls.append(list(texts))
        return super().encode(texts)


class CountingFingerprinter:
    codebook_size = 16

    def __init__(self, sha: str = "a" * 64) -> None:
        self.identity = {"codebook_size": 16, "codebook_sha256": sha}
        self.calls: list[list[str]] = []

    def fingerprint(self, texts):
        self.calls.append(list(texts))
        return [SimpleNamespace(token_codes=tuple(len(w) % 16 for w in t.split())) for t in texts]


def test_embeddings_are_computed_once_and_reused_exactly(tmp_path) -> None:
    inner = CountingEmbedder()
    with AMUStore(tmp_path) as store:
        first = CachedEmbedder(inner, store).encode(TEXTS)
        assert inner.calls == [TEXTS[:2]]  # a repeated text is embedded once
        again = CachedEmbedder(inner, store)
        second = again.encode(TEXTS[::-1] + ["Carla sings."])
        assert inner.calls[1:] == [["Carla sings."]] and again.computed == 1
    np.testing.assert_array_equal(second[:3], first[::-1])
    np.testing.assert_array_equal(first, HashEmbedder().encode(TEXTS))


def test_each_model_has_its_own_entries(tmp_path) -> None:
    with AMUStore(tmp_path) as store:
        CachedEmbedder(CountingEmbedder("one"), store).encode(TEXTS)
        other = CountingEmbedder("two")
        CachedEmbedder(other, store).encode(TEXTS)
        assert other.calls == [TEXTS[:2]]
        fp_a, fp_b = CountingFingerprinter(), CountingFingerprinter("b" * 64)
        prints = CachedFingerprinter(fp_a, store).fingerprint(TEXTS)
        CachedFingerprinter(fp_b, store).fingerprint(TEXTS)
        assert fp_b.calls == [TEXTS[:2]] and model_key(fp_a.identity) != model_key(fp_b.identity)
        reread = CachedFingerprinter(fp_a, store).fingerprint(TEXTS)
        assert len(fp_a.calls) == 1 and reread == prints
        assert prints[0].token_codes == tuple(len(w) % 16 for w in TEXTS[0].split())
        assert prints[0].codes == frozenset(prints[0].token_codes)


def test_a_read_only_store_computes_but_writes_nothing(tmp_path) -> None:
    with AMUStore(tmp_path) as store:
        CachedEmbedder(CountingEmbedder(), store).encode(TEXTS[:1])
    inner = CountingEmbedder()
    with AMUStore(tmp_path, read_only=True) as store:
        vectors = CachedEmbedder(inner, store).encode(TEXTS)
        assert inner.calls == [[TEXTS[1]]]
        assert vectors.shape == (3, HashEmbedder.dim)
    with AMUStore(tmp_path, read_only=True) as store:
        assert store.cached("vectors", model_key("hash"), [text_key(TEXTS[1])]) == [None]
        assert CachedEmbedder(CountingEmbedder(), store).encode([TEXTS[1]]).shape == (1, HashEmbedder.dim)
