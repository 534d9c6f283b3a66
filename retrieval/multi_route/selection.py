"""Diversity-aware selection (LycheeMemory appendix C.4; docs/design.md §7.4): route coverage
first, then MMR.

Every candidate has a signature: the sets of its source session, entities, matched queries,
evidence nodes, turns and text tokens (the fields the paper lists). The similarity of two
candidates is the mean, over the fields that either of them fills, of the Jaccard index of the
two sets (this project's reading: the paper does not say how the fields combine). Selection
takes the seeds (each route's quota) in order, then repeatedly the candidate maximising
s_select = 0.75 s_rel - 0.25 s_sim, where s_rel is its final score and s_sim its greatest
similarity to an item already selected (0 before the first); ties go to the earlier candidate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from retrieval.multi_route.params import MMR_RELEVANCE, MMR_SIMILARITY

Signature = Mapping[str, frozenset[str]]
"""Field name -> set of values (session, entities, queries, nodes, turns, tokens)."""


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """|a ∩ b| / |a ∪ b| (0 for two empty sets)."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def similarity(a: Signature, b: Signature) -> float:
    """Mean Jaccard index over the fields that a or b fills (0 when neither fills any)."""
    fields = [name for name in sorted(a.keys() | b.keys()) if a.get(name) or b.get(name)]
    if not fields:
        return 0.0
    empty: frozenset[str] = frozenset()
    return sum(jaccard(a.get(name, empty), b.get(name, empty)) for name in fields) / len(fields)


class SimilarityColumns:
    """:func:`similarity` of every one of ``items`` to one of them, a column at a time (selection
    needs the columns of the items it selects, not every pair). The values of every field share
    one 0/1 matrix of which item holds which (field, value), its columns grouped by field, so a
    column's common counts per field are one small integer product; the arithmetic per field is
    :func:`similarity`'s, in the same order, so the floats are the same."""

    def __init__(self, items: Sequence[int], signatures: Mapping[int, Signature]) -> None:
        names = sorted({name for item in items for name in signatures[item]})
        empty: frozenset[str] = frozenset()
        rows, columns, fields = [], [], []
        self._sizes = np.zeros((len(items), len(names)), dtype=np.float64)
        width = 0
        for field, name in enumerate(names):
            values = [signatures[item].get(name, empty) for item in items]
            flat = [value for members in values for value in members]
            vocabulary = {value: width + number for number, value in enumerate(dict.fromkeys(flat))}
            columns.append(np.fromiter(map(vocabulary.__getitem__, flat), dtype=np.int64, count=len(flat)))
            counts = np.array([len(members) for members in values], dtype=np.int64)
            rows.append(np.repeat(np.arange(len(items)), counts))
            self._sizes[:, field] = counts
            fields.append(np.full(len(vocabulary), field, dtype=np.int64))
            width += len(vocabulary)
        self._held = np.zeros((len(items), max(width, 1)), dtype=bool)
        if names:
            self._held[np.concatenate(rows), np.concatenate(columns)] = True
        field_of = np.concatenate(fields) if names else np.zeros(0, dtype=np.int64)
        self._field_of = np.eye(len(names), dtype=np.int64)[field_of]  # (value column, field) 0/1
        self.size = len(items)

    def column(self, position: int) -> np.ndarray:
        """The similarity of each item to item ``position``: per field filled by either, the
        Jaccard index of the two sets, |a ∩ b| / (|a| + |b| - |a ∩ b|), averaged over those fields."""
        if not self._sizes.shape[1]:
            return np.zeros(self.size, dtype=np.float64)
        held = np.flatnonzero(self._held[position])
        common = (self._held[:, held].astype(np.int64) @ self._field_of[held]).astype(np.float64)
        union = self._sizes + self._sizes[position] - common
        ratios = np.divide(common, union, out=np.zeros_like(common), where=union > 0)
        total = np.add.accumulate(ratios, axis=1)[:, -1]  # field by field, as a running sum
        filled = (union > 0).sum(axis=1).astype(np.float64)
        return np.divide(total, filled, out=np.zeros_like(total), where=filled > 0)


def mmr_select(candidates: Sequence[int], relevance: Mapping[int, float], signatures: Mapping[int, Signature],
               k: int, seeds: Sequence[int] = ()) -> list[int]:
    """Up to ``k`` items: ``seeds`` first (in order, without repeats), then MMR over ``candidates``
    (in their order for ties): s_select = 0.75 relevance - 0.25 max similarity to the selected."""
    selected = list(dict.fromkeys(seeds))[:k]
    pool = [item for item in dict.fromkeys(candidates) if item not in selected]
    if not pool or len(selected) >= k:
        return selected
    columns = SimilarityColumns(selected + pool, signatures)
    start = len(selected)
    closest = np.zeros(len(pool))
    for position in range(start):
        closest = np.maximum(closest, columns.column(position)[start:])
    gains = MMR_RELEVANCE * np.array([relevance[item] for item in pool], dtype=np.float64)
    open_ = np.ones(len(pool), dtype=bool)
    while open_.any() and len(selected) < k:
        score = np.where(open_, gains - MMR_SIMILARITY * closest, -np.inf)
        best = int(np.argmax(score))  # the first of equal scores: the earlier candidate
        open_[best] = False
        selected.append(pool[best])
        closest = np.maximum(closest, columns.column(start + best)[start:])
    return selected
