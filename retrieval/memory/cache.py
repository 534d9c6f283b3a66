"""Derived arrays cached in the store: embeddings and fingerprint codes per model identity.

Building memory costs model forwards (segmentation and record embeddings, fingerprints of
every record and question); reading it back costs a SELECT. The store keeps each array under
(model key, SHA-256 of the text), so an evaluation rerun, ``retrieval.query`` or a run with
more conversations computes only what it has not seen, and a different model computes and
stores its own (its identity is another key). A cached array is what the first run computed,
so a rerun reproduces it exactly whatever batches the texts fall into.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from isq.fingerprint import Fingerprint
from retrieval.memory.protocols import Embedder, TextFingerprinter
from retrieval.memory.sqlite_part import SQLitePart

if TYPE_CHECKING:
    from retrieval.memory.store_contract import VectorCache


def model_identity(model: Any) -> Any:
    """What a store records of a model: its ``identity`` if it has one (fingerprinters, the
    sentence embedder), else its ``name``, else its class name."""
    return getattr(model, "identity", None) or getattr(model, "name", None) or type(model).__name__


def model_key(identity: Any) -> str:
    """A stable key for a model identity (an identity dict, a name): 16 hex digits of its SHA-256."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def text_key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class ArrayCache(SQLitePart):
    """The cache tables of the store (a part of :class:`retrieval.memory.store.AMUStore`)."""


    def cached(self, table: str, model: str, items: Sequence[str]) -> list[bytes | None]:
        """The stored blob of each of ``items`` under ``model`` in ``table`` ("vectors" or
        "codes"), in order (None where there is none): one statement for the whole list, the
        items passed as one JSON array and looked up in order (the array is the outer side of a
        LEFT JOIN, which SQLite never reorders), so a user's every vector is one read."""
        column = {"vectors": "vector", "codes": "codes"}[table]
        rows = self._db.execute(f"SELECT c.{column} FROM json_each(?) AS k LEFT JOIN {table} AS c "
                                "ON c.model = ? AND c.item = k.value", [json.dumps(list(items)), model])
        return [row[0] for row in rows]

    def cache(self, table: str, model: str, blobs: Mapping[str, bytes]) -> None:
        """Store blobs (no-op on a read-only store: the caller computed them anyway)."""
        if self.read_only or not blobs:
            return
        column = {"vectors": "vector", "codes": "codes"}[table]
        with self._transaction() as db:
            db.executemany(f"INSERT OR IGNORE INTO {table} (model, item, {column}) VALUES (?, ?, ?)",
                           [(model, item, blob) for item, blob in blobs.items()])


def read_through(store: VectorCache, table: str, model: str, texts: Sequence[str],
                 compute: Callable[[list[str]], list[bytes]]) -> tuple[list[bytes], int]:
    """The blob of each of ``texts`` in ``table`` under ``model``, in order, and how many were
    computed: the cached ones read in one statement, the others made by ``compute`` in one call
    (each distinct text once, in input order) and stored."""
    keys = [text_key(text) for text in texts]
    found = store.cached(table, model, keys)
    missing = list(dict.fromkeys(text for text, blob in zip(texts, found, strict=True) if blob is None))
    if not missing:
        return cast(list[bytes], found), 0
    new = dict(zip(map(text_key, missing), compute(missing), strict=True))
    store.cache(table, model, new)
    return [new[key] if blob is None else blob for key, blob in zip(keys, found, strict=True)], len(missing)


class CachedEmbedder:
    """An :class:`retrieval.memory.protocols.Embedder` whose vectors live in a store's cache.

    Texts not cached yet are embedded in one call, in input order, and stored.
    """

    def __init__(self, embedder: Embedder, store: VectorCache) -> None:
        self.embedder, self.store = embedder, store
        self.dim = embedder.dim
        self.identity = model_identity(embedder)
        self.key = model_key(self.identity)
        self.computed = 0

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        blobs, computed = read_through(self.store, "vectors", self.key, texts, self._embed)
        self.computed += computed
        return rows_of(blobs, self.dim)

    def _embed(self, texts: list[str]) -> list[bytes]:
        return [vector.tobytes() for vector in np.asarray(self.embedder.encode(texts), dtype=np.float32)]


def rows_of(blobs: Sequence[bytes], dim: int) -> np.ndarray:
    """The float32 vectors ``blobs`` hold, in order, as one writable (len(blobs), dim) matrix: the
    blobs joined and read as one buffer, not copied row by row."""
    return np.frombuffer(bytearray().join(blobs), dtype=np.float32).reshape(len(blobs), dim)


class CachedFingerprinter:
    """A fingerprinter whose token codes live in a store's cache (same interface for callers:
    ``fingerprint(texts)``, ``identity``, ``codebook_size``)."""

    def __init__(self, fingerprinter: TextFingerprinter, store: VectorCache) -> None:
        self.fingerprinter, self.store = fingerprinter, store
        self.identity = fingerprinter.identity
        self.codebook_size = fingerprinter.codebook_size
        self.key = model_key(self.identity)
        self.computed = 0

    def fingerprint(self, texts: Sequence[str]) -> list[Fingerprint]:
        blobs, computed = read_through(self.store, "codes", self.key, texts, self._codes)
        self.computed += computed
        return [Fingerprint.from_token_codes(np.frombuffer(blob, dtype=np.int32).astype(np.int64))
                for blob in blobs]

    def _codes(self, texts: list[str]) -> list[bytes]:
        prints = self.fingerprinter.fingerprint(texts)
        return [np.asarray(fp.token_codes, dtype=np.int32).tobytes() for fp in prints]
