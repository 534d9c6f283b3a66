"""Derived arrays cached in the store: embeddings and fingerprint codes per user and model identity.

Building memory costs model forwards (segmentation and record embeddings, fingerprints of
every record and question); reading it back costs a SELECT. The store keeps each array under
(user, model key, SHA-256 of the text), so an evaluation rerun, ``retrieval.query`` or a run with
more conversations computes only what it has not seen, and a different model computes and
stores its own (its identity is another key). A cached array is what the first run computed,
so a rerun reproduces it exactly whatever batches the texts fall into. Each user's arrays are
its own: computed from its texts, read, copied and purged with it, never another user's copy
of the same text (which would show, in how fast a text is taken in, that someone else said it).
A model bound to a user (``for_user``) notes the user's purge count, and what it computes is
cached only while that count holds: arrays of texts read before another writer's purge of them
are not written back after it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self, cast

import numpy as np

from isq.codes import Fingerprint
from retrieval.memory.errors import StoreFault, StoreOutage
from retrieval.memory.faults import passing
from retrieval.memory.meta_keys import bound_alike
from retrieval.memory.protocols import Embedder, TextFingerprinter
from retrieval.memory.sqlite_part import SQLitePart

if TYPE_CHECKING:
    from retrieval.memory.store_contract import VectorCache


logger = logging.getLogger(__name__)


def model_identity(model: Any) -> Any:
    """What a store records of a model: its ``identity`` if it has one (fingerprinters, the
    sentence embedder), else its ``name``, else its class name."""
    return getattr(model, "identity", None) or getattr(model, "name", None) or type(model).__name__


def model_key(identity: Any) -> str:
    """A stable key for a model identity (an identity dict, a name): 16 hex digits of its SHA-256."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


_COLUMNS = {"vectors": "vector", "codes": "codes"}


def embedder_key(store: VectorCache, identity: Any) -> str:
    """The model key an embedder's vectors are cached under in ``store``: its identity's, or, where
    the store recorded the embedder before identities named its pipeline and takes this one
    (:func:`retrieval.memory.meta_keys.bound_alike`), that record's: such a store goes on finding
    the vectors it cached, and stays as older code reads it."""
    recorded = store.meta("embedder")
    return model_key(recorded if bound_alike("embedder", recorded, identity) else identity)


def text_key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class ArrayCache(SQLitePart):
    """The cache tables of the store (a part of :class:`retrieval.memory.store.AMUStore`), keyed
    by user, model and text (:mod:`retrieval.memory.schema`, version 6)."""

    def cached(self, table: str, model: str, user: str, items: Sequence[str]) -> list[bytes | None]:
        """The user's stored blob of each of ``items`` under ``model`` in ``table`` ("vectors" or
        "codes"), in order (None where there is none): one statement for the whole list, the
        items passed as one JSON array and looked up in order (the array is the outer side of a
        LEFT JOIN, which SQLite never reorders), so a user's every vector is one read."""
        column = _COLUMNS[table]
        rows = self._db.execute(f"SELECT c.{column} FROM json_each(?) AS k LEFT JOIN {table} AS c "
                                "ON c.conversation_id = ? AND c.model = ? AND c.item = k.value",
                                [json.dumps(list(items)), user, model])
        return [row[0] for row in rows]

    def cache(self, table: str, model: str, user: str, blobs: Mapping[str, bytes],
              purges: int | None = None) -> None:
        """Store the user's blobs (no-op on a read-only store: the caller computed them anyway);
        with ``purges``, only while the user's purge count is still that (:func:`read_through`)."""
        if self.read_only or not blobs:
            return
        column = _COLUMNS[table]
        with self._transaction() as db:
            if purges is not None and _purges(db, user) != purges:
                return
            db.executemany(f"INSERT OR IGNORE INTO {table} (conversation_id, model, item, {column}) "
                           "VALUES (?, ?, ?, ?)", [(user, model, item, blob) for item, blob in blobs.items()])

    def purge_count(self, user: str) -> int:
        """How many purges the user has had (the store's ``purges`` row, which only grows)."""
        return _purges(self._db, user)

    def copy_cache(self, source: str, target: str) -> None:
        """Give ``target`` a copy of every array ``source`` has cached (a copied user's texts are
        the source's)."""
        if self.read_only:
            return
        with self._transaction() as db:
            for table, column in _COLUMNS.items():
                db.execute(f"INSERT OR IGNORE INTO {table} (conversation_id, model, item, {column}) "
                           f"SELECT ?, model, item, {column} FROM {table} WHERE conversation_id = ?",
                           (target, source))


def _purges(db: Any, user: str) -> int:
    row = db.execute("SELECT count FROM purges WHERE conversation_id = ?", (user,)).fetchone()
    return 0 if row is None else int(row[0])


def read_through(store: VectorCache, table: str, model: str, owners: Sequence[str], texts: Sequence[str],
                 compute: Callable[[list[str]], list[bytes]],
                 purges: Mapping[str, int] | None = None) -> tuple[list[bytes], int]:
    """The blob of each of ``texts`` in ``table`` under ``model``, cached under its owner (the user
    at the same place in ``owners``), in order, and how many texts were computed: each owner's
    cached ones read in one statement, the others made by ``compute`` in one call (each distinct
    text once, in input order) and stored under every owner that lacked them. An owner in
    ``purges`` gets them stored only while its purge count is still the one given, read before its
    texts were: a purge committed meanwhile (another server's forget, say) may have removed those
    texts, and their arrays must not come back. A store that cannot take them now (a full disk)
    leaves them uncached: the read that computed them still gets them."""
    keys = [text_key(text) for text in texts]
    found = _cached(store, table, model, owners, keys)
    missing = [i for i, blob in enumerate(found) if blob is None]
    if not missing:
        return cast(list[bytes], found), 0
    distinct = list(dict.fromkeys(texts[i] for i in missing))
    made = dict(zip(distinct, compute(distinct), strict=True))
    new: dict[str, dict[str, bytes]] = {}
    for i in missing:
        found[i] = new.setdefault(owners[i], {})[keys[i]] = made[texts[i]]
    for owner, blobs in new.items():
        try:
            store.cache(table, model, owner, blobs, (purges or {}).get(owner))
        except StoreFault as err:  # a cache: what was computed is returned, and computed again next time
            if isinstance(err, StoreOutage) or not passing(err):  # an outage fails the read's next step too
                raise
            logger.warning("arrays computed for %s were not cached (%s)", owner, err)
    return cast(list[bytes], found), len(distinct)


def _cached(store: VectorCache, table: str, model: str, owners: Sequence[str],
            keys: Sequence[str]) -> list[bytes | None]:
    """Each key's blob under its owner (None where there is none), one read per owner."""
    if owners and owners.count(owners[0]) == len(owners):  # one user's: no grouping
        return store.cached(table, model, owners[0], keys)
    places: dict[str, list[int]] = {}
    for i, owner in enumerate(owners):
        places.setdefault(owner, []).append(i)
    found: list[bytes | None] = [None] * len(keys)
    for owner, where in places.items():
        for i, blob in zip(where, store.cached(table, model, owner, [keys[i] for i in where]), strict=True):
            found[i] = blob
    return found


class _Counter:
    """How many arrays a cached model and its per-user views computed (one count for all)."""

    def __init__(self) -> None:
        self.computed = 0


class _UserCached(ABC):
    """What a model caching in a store keeps: the store, the model's identity and the key its arrays
    are cached under, the user it caches under (None: bound to none, it refuses to compute until
    :meth:`for_user` binds a copy) and the count of arrays computed, shared with its copies."""

    table: str

    def __init__(self, store: VectorCache, identity: Any, key: str, user: str | None) -> None:
        self.store, self.identity, self.key, self.user = store, identity, key, user
        self._counter = _Counter()
        self._purges = None if user is None else store.purge_count(user)

    @property
    def computed(self) -> int:
        """Arrays computed (not found cached) by this model and its other users' copies."""
        return self._counter.computed

    def for_user(self, user: str, purges: int | None = None) -> Self:
        """The same model and store (and count), caching under ``user`` what it computes from texts
        read after this call, or after the user's purge count was ``purges``: while the user has
        no purge meanwhile (:func:`read_through`)."""
        if user == self.user and purges in (None, self._purges):
            return self
        bound = copy.copy(self)
        bound.user, bound._purges = user, self.store.purge_count(user) if purges is None else purges
        return bound

    def _owners(self, texts: Sequence[str]) -> list[str]:
        """The bound user once per text; a model bound to no user refuses (its caller would
        otherwise mix users' arrays)."""
        if self.user is None:
            raise RuntimeError(f"{type(self).__name__} is not bound to a user: use .for_user(user_id)")
        return [self.user] * len(texts)

    def _read(self, users: Sequence[str], texts: Sequence[str]) -> list[bytes]:
        purges = None if self.user is None or self._purges is None else {self.user: self._purges}
        blobs, computed = read_through(self.store, self.table, self.key, users, texts, self._compute, purges)
        self._counter.computed += computed
        return blobs

    @abstractmethod
    def _compute(self, texts: list[str]) -> list[bytes]:
        """The arrays of ``texts`` as the model computes them, in order."""


class CachedEmbedder(_UserCached):
    """An :class:`retrieval.memory.protocols.Embedder` whose vectors live in a store's cache,
    under one user's key (:meth:`for_user` gives the same model under another user's; one made
    without a user only makes those).

    Texts not cached yet are embedded in one call, in input order, and stored.
    """

    table = "vectors"

    def __init__(self, embedder: Embedder, store: VectorCache, user: str | None = None) -> None:
        identity = model_identity(embedder)
        super().__init__(store, identity, embedder_key(store, identity), user)
        self.embedder, self.dim = embedder, embedder.dim

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return self.encode_for(self._owners(texts), texts)

    def encode_for(self, users: Sequence[str], texts: Sequence[str]) -> np.ndarray:
        """The vector of each of ``texts``, cached under the user at its place in ``users``
        (several users' texts computed in one call)."""
        return rows_of(self._read(users, texts), self.dim)

    def _compute(self, texts: list[str]) -> list[bytes]:
        return [vector.tobytes() for vector in np.asarray(self.embedder.encode(texts), dtype=np.float32)]


def for_user(model: Any, user: str, purges: int | None = None) -> Any:
    """``model`` caching under ``user`` (from texts read after the user's purge count was
    ``purges``, else after this call) where it caches in a store (:class:`CachedEmbedder`,
    :class:`CachedFingerprinter`), else ``model`` itself."""
    bind = getattr(model, "for_user", None)
    return model if bind is None else bind(user, purges)


def rows_of(blobs: Sequence[bytes], dim: int) -> np.ndarray:
    """The float32 vectors ``blobs`` hold, in order, as one writable (len(blobs), dim) matrix: the
    blobs joined and read as one buffer, not copied row by row."""
    return np.frombuffer(bytearray().join(blobs), dtype=np.float32).reshape(len(blobs), dim)


class CachedFingerprinter(_UserCached):
    """A fingerprinter whose token codes live in a store's cache, under one user's key (same
    interface for callers: ``fingerprint(texts)``, ``identity``, ``codebook_size``); like
    :class:`CachedEmbedder`, bound to a user by :meth:`for_user`."""

    table = "codes"

    def __init__(self, fingerprinter: TextFingerprinter, store: VectorCache,
                 user: str | None = None) -> None:
        super().__init__(store, fingerprinter.identity, model_key(fingerprinter.identity), user)
        self.fingerprinter, self.codebook_size = fingerprinter, fingerprinter.codebook_size

    def fingerprint(self, texts: Sequence[str]) -> list[Fingerprint]:
        return self.fingerprint_for(self._owners(texts), texts)

    def fingerprint_for(self, users: Sequence[str], texts: Sequence[str]) -> list[Fingerprint]:
        """The fingerprint of each of ``texts``, cached under the user at its place in ``users``."""
        return [Fingerprint.from_token_codes(np.frombuffer(blob, dtype=np.int32).astype(np.int64))
                for blob in self._read(users, texts)]

    def _compute(self, texts: list[str]) -> list[bytes]:
        prints = self.fingerprinter.fingerprint(texts)
        return [np.asarray(fp.token_codes, dtype=np.int32).tobytes() for fp in prints]
