"""Diversity-aware selection (LycheeMemory appendix C.4): route coverage first, then MMR.

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
import scipy.sparse as sp

from retrieval.multi_route.params import MMR_RELEVANCE, MMR_SIMILARITY

Signature = Mapping[str, frozenset[str]]
"""Field name -> set of values (session, entities, queries, nodes, turns, tokens)."""


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """|a ∩ b| / |a ∪ b| (0 for two empty sets)."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def similarity(a: Signature, b: Signature) -> float:
    """Mean Jaccard index over the fields that a or b fills (0 when neither fills any)."""
    fields = [name for name in set(a) | set(b) if a.get(name) or b.get(name)]
    if not fields:
        return 0.0
    empty: frozenset[str] = frozenset()
    return sum(jaccard(a.get(name, empty), b.get(name, empty)) for name in fields) / len(fields)


def similarity_matrix(items: Sequence[int], signatures: Mapping[int, Signature]) -> np.ndarray:
    """:func:`similarity` of every pair of ``items`` at once (one incidence matrix per field)."""
    fields = sorted({name for item in items for name in signatures[item]})
    total = np.zeros((len(items), len(items)), dtype=np.float64)
    filled = np.zeros_like(total)
    for name in fields:
        values = [signatures[item].get(name, frozenset()) for item in items]
        vocabulary: dict[str, int] = {}
        rows = [row for row, members in enumerate(values) for _ in members]
        columns = [vocabulary.setdefault(value, len(vocabulary)) for members in values for value in members]
        incidence = sp.csr_matrix((np.ones(len(rows)), (rows, columns)),
                                  shape=(len(items), max(len(vocabulary), 1)))
        sizes = np.array([len(members) for members in values], dtype=np.float64)
        common = (incidence @ incidence.T).toarray()
        union = sizes[:, None] + sizes[None, :] - common
        total += np.divide(common, union, out=np.zeros_like(common), where=union > 0)
        filled += union > 0
    return np.divide(total, filled, out=np.zeros_like(total), where=filled > 0)


def mmr_select(candidates: Sequence[int], relevance: Mapping[int, float], signatures: Mapping[int, Signature],
               k: int, seeds: Sequence[int] = ()) -> list[int]:
    """Up to ``k`` items: ``seeds`` first (in order, without repeats), then MMR over ``candidates``
    (in their order for ties): s_select = 0.75 relevance - 0.25 max similarity to the selected."""
    selected = list(dict.fromkeys(seeds))[:k]
    pool = [item for item in dict.fromkeys(candidates) if item not in selected]
    if not pool or len(selected) >= k:
        return selected
    items = selected + pool
    sims = similarity_matrix(items, signatures)
    start = len(selected)
    closest = sims[start:, :start].max(axis=1) if start else np.zeros(len(pool))
    gains = MMR_RELEVANCE * np.array([relevance[item] for item in pool], dtype=np.float64)
    open_ = np.ones(len(pool), dtype=bool)
    while open_.any() and len(selected) < k:
        score = np.where(open_, gains - MMR_SIMILARITY * closest, -np.inf)
        best = int(np.argmax(score))  # the first of equal scores: the earlier candidate
        open_[best] = False
        selected.append(pool[best])
        closest = np.maximum(closest, sims[start:, start + best])
    return selected
