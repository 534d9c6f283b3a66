"""Path B's walks over an inverted index (docs/design.md §3.3): the exact top-K of S_amu without
scanning the bank.

Every walk returns the same list as scoring the whole bank and keeping the K best
(:func:`isq.topk.top_k_of_scores`): :func:`max_walk` for ``aggregate="max"``, :func:`sum_walk`
(MaxScore pruning) for ``aggregate="sum"``.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import scipy.sparse as sp

from isq.topk import as_exclude_array, empty_result, select_top_k, top_k_of_scores


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


_EPS = float(np.finfo(np.float64).eps)


def _inflation(terms: int) -> float:
    """Factor lifting a float sum of at most ``terms`` positive terms, added in any order, above
    the float left-to-right sum of at most ``terms`` terms whose positive part it bounds."""
    return 1.0 + 4.0 * max(terms, 1) * _EPS


def window_bounds(ordered: np.ndarray, width: int, inflation: float) -> np.ndarray:
    """bound[j] >= the float score of any AMU of at most ``width`` codes, all from ``ordered[j:]``.

    ``ordered`` holds positive activations, non-increasing, so the ``width`` largest after j are
    the next ``width``. Sums are multiplied by ``inflation`` (:func:`_inflation` of the longest
    row) and made non-increasing (a bound for j also bounds every later j); bound[-1] = 0.
    """
    width = max(1, min(width, ordered.size))
    padded = np.concatenate((ordered, np.zeros(width)))
    sums = np.lib.stride_tricks.sliding_window_view(padded, width)[: ordered.size + 1].sum(axis=1)
    return np.minimum.accumulate(sums * inflation)


ROW_COST = 32
"""About how many posting entries (or passes over one met AMU) cost as much as scoring one AMU
exactly from its bank row: the walk's measure of when tightening bounds beats scoring."""


def sum_walk(activation: np.ndarray, bank: sp.csr_matrix, postings: sp.csc_matrix, k: int,
             exclude: Iterable[int] = (), scan_share: float = 0.25,
             scan_below: int = 1 << 19) -> tuple[np.ndarray, np.ndarray]:
    """Top-k AMUs under S_amu(u) = sum_{b in U_fp(u)} A(b) (= ``bank @ activation``), exactly.

    MaxScore over the inverted index, term at a time. Codes are walked in decreasing
    activation, each AMU met accumulating the activation and the number of its walked codes.
    After j codes, an AMU not met has all its codes (at most as many as the bank's longest
    row) among the rest, so it scores at most ``window_bounds(...)[j]``; an AMU met, m of its n
    codes walked with activation p, scores at most p + the n - m largest later activations.
    AMUs are scored exactly from their bank rows: the same sparse product as the full scan, row
    by row in the same order, hence bitwise the same sums. Theta, the k-th best exact eligible
    score among the AMUs with the most walked activation, only grows.

    The walk reads enough lists for k AMUs, takes theta from them and jumps to the first j
    where the bound of unseen AMUs is strictly below theta (an unseen AMU tying theta could
    still enter through the index tie-break). There, the met AMUs whose bound cannot reach
    theta are dropped, theta is raised from the rest, and the ones whose bound reaches it are
    scored exactly and ranked, after walking one list more at a time while that tightens the
    bounds more cheaply than scoring (:data:`ROW_COST`). One jump rather than a prefix grown
    step by step reads more entries but saves passes over the met AMUs, which measured dearer.

    The full product is used instead (same result) when the walk would read more than
    ``scan_share`` of the bank's entries, or when the bank holds fewer than ``scan_below``
    entries, where the walk's fixed cost (about a millisecond) exceeds a scan. Non-positive
    activations are never walked (an AMU made only of them scores <= 0) but count in exact
    scores, so any activation works.
    """
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    num_units = bank.shape[0]
    if k == 0 or num_units == 0:
        return empty_result()
    excluded = as_exclude_array(exclude)
    if bank.nnz < scan_below:
        return top_k_of_scores(bank @ activation, k, excluded)
    order = np.argsort(-activation, kind="stable")
    order = order[activation[order] > 0]
    if order.size == 0:
        return empty_result()
    ordered = activation[order]
    longest = int(np.diff(bank.indptr).max())
    inflation = _inflation(longest)  # an exact score adds up to `longest` terms
    width = min(longest, order.size)
    unseen = window_bounds(ordered, width, inflation)
    starts = postings.indptr[order]
    sizes = postings.indptr[order + 1] - starts
    ends = np.cumsum(sizes)
    walked = np.zeros(num_units, dtype=np.complex128)  # real: activation walked, imag: codes walked
    met = np.zeros(num_units, dtype=bool)
    prefix, theta = 0, 0.0
    while True:
        if prefix == 0:  # enough entries for k eligible AMUs
            step = int(np.searchsorted(ends, k + excluded.size)) + 1
        elif theta > 0 and unseen[prefix] >= theta:  # straight to where the bound beats theta
            step = int(np.searchsorted(-unseen, -theta, side="right"))
        elif unseen[prefix] >= theta:  # no theta yet (fewer than k eligible met): double the entries
            step = int(np.searchsorted(ends, 2 * ends[prefix - 1])) + 1
        else:  # one list more, to tighten the bounds of the met AMUs
            step = prefix + 1
        step = min(max(step, prefix + 1), order.size)
        if ends[step - 1] > scan_share * bank.nnz:
            return top_k_of_scores(bank @ activation, k, excluded)
        units = _posting_entries(postings, starts[prefix:step], sizes[prefix:step])
        np.add.at(walked, units, np.repeat(ordered[prefix:step] + 1j, sizes[prefix:step]))
        met[units] = True
        lists, prefix = step - prefix, step
        if prefix < order.size and unseen[prefix] >= theta:  # raise theta from the AMUs just met
            theta = max(theta, _kth_score(activation, bank, units, walked.real[units], lists, k, excluded))
            if unseen[prefix] >= theta:
                continue
        later = np.zeros(width + 1)  # later[r]: the r largest activations after the walked ones
        tail = ordered[prefix : prefix + width]
        np.cumsum(tail, out=later[1 : tail.size + 1])
        later[tail.size + 1 :] = later[tail.size]
        candidates = np.flatnonzero(met)
        met_count = candidates.size
        sums = walked[candidates]
        keep = (sums.real + later[width]) * inflation >= theta  # a bound over every n - m: cheap first cut
        candidates, sums = candidates[keep], sums[keep]
        theta = max(theta, _kth_score(activation, bank, candidates, sums.real, 1, k, excluded))
        lengths = bank.indptr[candidates + 1] - bank.indptr[candidates]
        rest = np.minimum(lengths - sums.imag.astype(np.int64), width)
        survivors = candidates[(sums.real + later[rest]) * inflation >= theta]
        if prefix == order.size or survivors.size * ROW_COST <= sizes[prefix] + met_count:
            break
    survivors = survivors[~np.isin(survivors, excluded)]
    scores = bank[survivors] @ activation
    eligible = scores > 0
    return select_top_k(survivors[eligible], scores[eligible], k)


def _posting_entries(postings: sp.csc_matrix, starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The AMUs of the posting lists [starts, starts + sizes), concatenated."""
    ends = np.cumsum(sizes)
    owner = np.repeat(np.arange(starts.size), sizes)
    entries: np.ndarray = postings.indices[np.arange(int(ends[-1])) + (starts - (ends - sizes))[owner]]
    return entries


def _kth_score(activation: np.ndarray, bank: sp.csr_matrix, units: np.ndarray, walked: np.ndarray,
               repeats: int, k: int, excluded: np.ndarray) -> float:
    """The k-th best exact eligible score among the ``units`` (each listed at most ``repeats``
    times) with the most walked activation; 0 when fewer than k of those are eligible. Any k
    eligible AMUs give a lower bound of the bank's k-th score."""
    pick = min(units.size, (k + excluded.size) * repeats)
    best = np.unique(units[np.argpartition(-walked, pick - 1)[:pick]])
    best = best[~np.isin(best, excluded)]
    scores = bank[best] @ activation
    scores = scores[scores > 0]
    return float(np.partition(scores, -k)[-k]) if scores.size >= k else 0.0
