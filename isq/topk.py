"""Exact top-K selection over scored AMUs, and Path B's walk over an inverted index.

Every Path B search returns the same list as scoring the whole bank and keeping the K best by
(score descending, AMU index ascending), zero scores and excluded AMUs never listed; the
functions here are the ways to get it without scanning the bank.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import scipy.sparse as sp


def select_top_k(indices: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best (index, score) pairs, ordered by score descending then index ascending.

    ``indices`` must be sorted ascending: among entries tied at the k-th score, the first ones
    in that order (the smallest indices) are kept, which makes the selection deterministic.
    """
    if indices.size > k:
        cut = indices.size - k
        kth = np.partition(scores, cut)[cut]
        keep = scores > kth
        tied = np.flatnonzero(scores == kth)[: k - int(keep.sum())]
        keep[tied] = True
        indices, scores = indices[keep], scores[keep]
    order = np.lexsort((indices, -scores))[:k]
    return indices[order], scores[order]


def as_exclude_array(exclude: Iterable[int]) -> np.ndarray:
    return np.unique(np.fromiter(exclude, dtype=np.int64))


def empty_result() -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)


def top_k_of_scores(scores: np.ndarray, k: int, exclude: Iterable[int] = ()) -> tuple[np.ndarray, np.ndarray]:
    """The reference: the k best positive scores of the whole bank, excluded AMUs left out."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if k == 0 or scores.size == 0:
        return empty_result()
    eligible = scores > 0
    excluded = as_exclude_array(exclude)
    eligible[excluded[(excluded >= 0) & (excluded < scores.size)]] = False
    indices = np.flatnonzero(eligible)
    return select_top_k(indices, scores[indices], k)


def max_walk(activation: np.ndarray, postings: sp.csc_matrix, k: int,
             exclude: Iterable[int] = ()) -> tuple[np.ndarray, np.ndarray]:
    """Top-k AMUs under S_amu(u) = max_{b in U_fp(u)} A(b), without scanning the bank.

    Codes are walked in decreasing activation over the inverted index (``postings``: column b
    lists the AMUs containing code b, ascending); an AMU's score is the activation of the first
    code reached that it contains. Walking stops at the end of a group of equally activated
    codes once k AMUs are collected, since later codes have strictly lower activation and can
    neither beat nor tie into the top k. Only the first k + |exclude| AMUs of each posting list
    can matter: if a list holds more, this group alone completes the top k with its smallest new
    indices, and at most (already collected + excluded) of those first entries are not new. The
    cost per query is thus O(N_c (k + |exclude|)) whatever the bank size. The walk is vectorised
    over growing prefixes of the code order (doubling), deduplicating with ``np.unique``.
    """
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if k == 0 or postings.shape[0] == 0:
        return empty_result()
    excluded = as_exclude_array(exclude)
    order = np.argsort(-activation, kind="stable")
    order = order[activation[order] > 0]  # zero activation never makes a hit
    if order.size == 0:
        return empty_result()
    ordered_act = activation[order]
    starts = postings.indptr[order]
    lengths = np.minimum(postings.indptr[order + 1] - starts, k + excluded.size)
    ends = np.cumsum(lengths)
    target = k + excluded.size
    while True:
        prefix = min(int(np.searchsorted(ends, target)) + 1, order.size)
        # extend to the end of the last code's tie group (ordered_act is non-increasing)
        prefix = int(np.searchsorted(-ordered_act, -ordered_act[prefix - 1], side="right"))
        total = int(ends[prefix - 1])
        owner = np.repeat(np.arange(prefix), lengths[:prefix])
        positions = np.arange(total) + (starts[:prefix] - (ends[:prefix] - lengths[:prefix]))[owner]
        units, first = np.unique(postings.indices[positions], return_index=True)
        scores = ordered_act[owner[first]]
        keep = ~np.isin(units, excluded)
        if int(keep.sum()) >= k or prefix == order.size:
            break
        target = max(2 * target, total + 1)
    return select_top_k(units[keep].astype(np.int64), scores[keep], k)
