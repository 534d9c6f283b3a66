"""The array cache of an evaluation of a store opened read-only (``--store``): what the store
cannot take is kept in this process for the run.

The evaluation embeds and fingerprints every question's route queries in one batch before the
timed retrievals (:func:`retrieval.eval.multi.prepare_queries`), and every configuration and
recall curve reads them back from the cache. A read-only store writes nothing, so without this
each timed retrieval would compute its queries again, one query at a time: a run many times as
long as a rerun, whose multi-route latencies measure model forwards. Kept here, they are computed
once per run; nothing reaches the store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from retrieval.memory.store_contract import VectorCache


class KeptArrays:
    """A :class:`~retrieval.memory.store_contract.VectorCache` over a read-only store: reads from
    the store, then from what this run computed; writes kept in memory, keyed as the store keys
    them (table, model, user, text)."""

    def __init__(self, store: VectorCache) -> None:
        self.store = store
        self._kept: dict[tuple[str, str, str, str], bytes] = {}

    @property
    def read_only(self) -> bool:
        return self.store.read_only

    def cached(self, table: str, model: str, user: str, items: Sequence[str]) -> list[bytes | None]:
        stored = self.store.cached(table, model, user, items)
        return [self._kept.get((table, model, user, item)) if blob is None else blob
                for item, blob in zip(items, stored, strict=True)]

    def cache(self, table: str, model: str, user: str, blobs: Mapping[str, bytes],
              purges: int | None = None) -> None:
        self._kept.update({(table, model, user, item): blob for item, blob in blobs.items()})

    def purge_count(self, user: str) -> int:
        return self.store.purge_count(user)

    def copy_cache(self, source: str, target: str) -> None:
        raise NotImplementedError("an evaluation copies no user")

    def meta(self, key: str) -> Any:
        return self.store.meta(key)


def run_cache(store: VectorCache) -> VectorCache:
    """The cache an evaluation's models read through: the store's own, or, where the store is
    read-only, :class:`KeptArrays` over it."""
    return KeptArrays(store) if store.read_only else store
