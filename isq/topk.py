"""Exact top-K selection over scored items: the K best by (score descending, index ascending),
zero scores and excluded items never listed. Path B's walks (:mod:`isq.walks`) and every
retrieval channel select through these."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


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


def check_k(k: object) -> None:
    """ValueError unless ``k`` is an integer >= 0."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
        raise ValueError(f"k must be an integer >= 0, got {k!r}")


def code_array(codes: Sequence[int] | np.ndarray) -> np.ndarray:
    """Codes (or indices) as int64; a non-integral value is refused, not truncated."""
    values = np.asarray(codes)
    if values.size and values.dtype.kind not in "iu":
        raise ValueError(f"codes must be integers, got {values.dtype} values")
    return values.astype(np.int64, copy=False)


def as_exclude_array(exclude: Iterable[int]) -> np.ndarray:
    """The excluded indices, sorted and distinct (nothing to sort in the usual empty case)."""
    values = np.fromiter(exclude, dtype=np.int64)
    return np.unique(values) if values.size else values


def empty_result() -> tuple[np.ndarray, np.ndarray]:
    return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)


def top_k_of_scores(scores: np.ndarray, k: int, exclude: Iterable[int] = ()) -> tuple[np.ndarray, np.ndarray]:
    """The reference: the k best positive scores of the whole bank, excluded AMUs left out."""
    check_k(k)
    if k == 0 or scores.size == 0:
        return empty_result()
    eligible = scores > 0
    excluded = as_exclude_array(exclude)
    if excluded.size:
        eligible[excluded[(excluded >= 0) & (excluded < scores.size)]] = False
    indices = np.flatnonzero(eligible)
    return select_top_k(indices, scores[indices], k)
