"""The store's array cache: embeddings and fingerprints computed once per user, model identity
and text, reused exactly, kept apart per model and per user, never written into a read-only
store; a version-5 store's cache migrated to its users."""

from __future__ import annotations

import sqlite3
from types import SimpleNamespace

import numpy as np
import pytest

from retrieval.memory.cache import CachedEmbedder, CachedFingerprinter, model_key, text_key
from retrieval.memory.schema import EARLIER_IDS_BOUND, SCHEMA_VERSION
from retrieval.memory.store import AMUStore
from tests.store_backends import SQLITE_BEFORE_VERSION_9
from tests.test_amu_store import commit, make_amu
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
        first = CachedEmbedder(inner, store, "u").encode(TEXTS)
        assert inner.calls == [TEXTS[:2]]  # a repeated text is embedded once
        again = CachedEmbedder(inner, store, "u")
        second = again.encode(TEXTS[::-1] + ["Carla sings."])
        assert inner.calls[1:] == [["Carla sings."]] and again.computed == 1
    np.testing.assert_array_equal(second[:3], first[::-1])
    np.testing.assert_array_equal(first, HashEmbedder().encode(TEXTS))


def test_each_model_has_its_own_entries(tmp_path) -> None:
    with AMUStore(tmp_path) as store:
        CachedEmbedder(CountingEmbedder("one"), store, "u").encode(TEXTS)
        other = CountingEmbedder("two")
        CachedEmbedder(other, store, "u").encode(TEXTS)
        assert other.calls == [TEXTS[:2]]
        fp_a, fp_b = CountingFingerprinter(), CountingFingerprinter("b" * 64)
        prints = CachedFingerprinter(fp_a, store, "u").fingerprint(TEXTS)
        CachedFingerprinter(fp_b, store, "u").fingerprint(TEXTS)
        assert fp_b.calls == [TEXTS[:2]] and model_key(fp_a.identity) != model_key(fp_b.identity)
        reread = CachedFingerprinter(fp_a, store, "u").fingerprint(TEXTS)
        assert len(fp_a.calls) == 1 and reread == prints
        assert prints[0].token_codes == tuple(len(w) % 16 for w in TEXTS[0].split())
        assert prints[0].codes == frozenset(prints[0].token_codes)


def test_a_read_only_store_computes_but_writes_nothing(tmp_path) -> None:
    with AMUStore(tmp_path) as store:
        CachedEmbedder(CountingEmbedder(), store, "u").encode(TEXTS[:1])
    inner = CountingEmbedder()
    with AMUStore(tmp_path, read_only=True) as store:
        vectors = CachedEmbedder(inner, store, "u").encode(TEXTS)
        assert inner.calls == [[TEXTS[1]]]
        assert vectors.shape == (3, HashEmbedder.dim)
    with AMUStore(tmp_path, read_only=True) as store:
        assert store.cached("vectors", model_key("hash"), "u", [text_key(TEXTS[1])]) == [None]
        vectors = CachedEmbedder(CountingEmbedder(), store, "u").encode([TEXTS[1]])
        assert vectors.shape == (1, HashEmbedder.dim)


def test_each_user_has_its_own_entries(tmp_path) -> None:
    inner = CountingEmbedder()
    with AMUStore(tmp_path) as store:
        shared = CachedEmbedder(inner, store)
        with pytest.raises(RuntimeError, match="not bound to a user"):
            shared.encode(TEXTS)
        first = shared.for_user("ann").encode(TEXTS)
        again = shared.for_user("bob").encode(TEXTS)  # the same texts: Bob's own, computed again
        assert inner.calls == [TEXTS[:2], TEXTS[:2]] and shared.computed == 4
        np.testing.assert_array_equal(first, again)
        store.scrub("ann", TEXTS[:1])  # Ann's purge leaves Bob's arrays as they are
        keys = [text_key(text) for text in TEXTS[:2]]
        assert [blob is None for blob in store.cached("vectors", shared.key, "ann", keys)] == [True, False]
        assert None not in store.cached("vectors", shared.key, "bob", keys)
        store.copy_cache("bob", "carl")
        copied = store.cached("vectors", shared.key, "carl", keys)
        assert copied == store.cached("vectors", shared.key, "bob", keys)


def test_several_users_texts_are_computed_in_one_call_and_cached_under_each(tmp_path) -> None:
    inner = CountingEmbedder()
    with AMUStore(tmp_path) as store:
        cached = CachedEmbedder(inner, store)
        cached.for_user("bob").encode(TEXTS[1:2])
        vectors = cached.encode_for(["ann", "bob", "ann"], TEXTS)
        assert inner.calls == [TEXTS[1:2], TEXTS[:1]]  # Bob's "Ben" was cached, Ann's two texts share one
        np.testing.assert_array_equal(vectors, HashEmbedder().encode(TEXTS))
        assert cached.for_user("ann").encode(TEXTS).shape == (3, HashEmbedder.dim)
        assert inner.calls[2:] == [TEXTS[1:2]]  # Ann had not "Ben" yet: only Bob had


def test_a_version_5_store_gives_its_cache_to_the_users_whose_texts_hold_it_keeps_purges(tmp_path) -> None:
    with AMUStore(tmp_path) as store:
        commit(store, 0, [make_amu(0, 0, "Anna went to the museum.")])
    db = sqlite3.connect(tmp_path / AMUStore.DB_NAME)
    turn = db.execute("SELECT speaker || ': ' || text FROM turns").fetchone()[0]
    old = {"Anna went to the museum.": b"a", turn: b"t", "a question nobody stored": b"q"}
    db.executescript(SQLITE_BEFORE_VERSION_9 + "DROP TABLE vectors; DROP TABLE codes;"
                     "CREATE TABLE vectors (model TEXT NOT NULL, item TEXT NOT NULL, vector BLOB NOT NULL,"
                     " PRIMARY KEY (model, item));"
                     "CREATE TABLE codes (model TEXT NOT NULL, item TEXT NOT NULL, codes BLOB NOT NULL,"
                     " PRIMARY KEY (model, item));"
                     "DROP TABLE purges;"
                     "CREATE TABLE purges (conversation_id TEXT PRIMARY KEY, count INTEGER NOT NULL);"
                     "INSERT INTO purges VALUES ('gone', 2); PRAGMA user_version=5;")
    db.executemany("INSERT INTO vectors VALUES ('m', ?, ?)", [(text_key(t), b) for t, b in old.items()])
    db.execute("INSERT INTO codes VALUES ('f', ?, x'01')", (text_key("Anna went to the museum."),))
    db.commit()
    db.close()
    with AMUStore(tmp_path) as store:
        keys = [text_key(text) for text in old]
        assert store.cached("vectors", "m", "conv-x", keys) == [b"a", b"t", None]
        assert store.cached("codes", "f", "conv-x", keys[:1]) == [b"\x01"]
        assert store.cached("vectors", "m", "someone", keys) == [None] * 3
        assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 10
        assert store.ingestion_marks("gone")[2] == 2 and store.next_seq("gone") == EARLIER_IDS_BOUND
        store.purge("gone", everything=True)
        marks = store._db.execute("SELECT * FROM purges WHERE conversation_id = 'gone'").fetchall()
        assert [tuple(row) for row in marks] == [("gone", 3, EARLIER_IDS_BOUND, EARLIER_IDS_BOUND)]
        assert store.integrity_problems() == []


def test_arrays_a_full_disk_cannot_cache_are_still_returned(tmp_path, monkeypatch):
    """A search embeds the turns added since the last one and caches their vectors: a store that
    cannot take them (a full disk) leaves them uncached, and the search still gets them."""
    from retrieval.memory.errors import StoreFault

    def disk_full(*args, **kwargs):
        raise StoreFault(f"{tmp_path}: database or disk is full (SQLITE_FULL)")

    with AMUStore(tmp_path) as store:
        embedder = CountingEmbedder()
        cached = CachedEmbedder(embedder, store, "u")
        monkeypatch.setattr(AMUStore, "cache", disk_full)
        vectors = cached.encode(TEXTS)
        assert np.array_equal(vectors, HashEmbedder().encode(TEXTS)) and cached.computed == 2
        monkeypatch.undo()
        cached.encode(TEXTS)
        assert cached.computed == 4 and len(embedder.calls) == 2  # computed again, then cached
        cached.encode(TEXTS)
        assert len(embedder.calls) == 2


def test_an_outage_while_caching_fails_the_read_at_once(tmp_path, monkeypatch):
    """A database that went away while a search cached its arrays fails that search then (a 503
    within the store's wait), not after a second wait at the search's next read."""
    from retrieval.memory.errors import StoreOutage

    def outage(*args, **kwargs):
        raise StoreOutage("postgresql://u@db/mem: the database failed (connection refused)")

    with AMUStore(tmp_path) as store:
        cached = CachedEmbedder(CountingEmbedder(), store, "u")
        monkeypatch.setattr(AMUStore, "cache", outage)
        with pytest.raises(StoreOutage, match="the database failed"):
            cached.encode(TEXTS)
