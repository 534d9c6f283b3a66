"""Reciprocal-rank fusion and the final score (LycheeMemory eq. 9 and appendix C.4; docs/design.md §7.4).

Inside a route the channels' lists fuse by weighted RRF into the route-level list L_i; across
routes the lists L_1..L_m fuse by RRF, RRF(d) = sum_j 1 / (κ + rank_j(d)) with κ = 60 and
1-based ranks. The final score of a candidate is s_final = 0.82 s_best + 0.18 s_route, where
(the paper names the two terms without defining them; these are this project's readings)
s_best = max_j (κ + 1) / (κ + rank_j(d)), its best route-level rank as a reciprocal rank scaled
to 1 at rank 1, and s_route = RRF(d) / max_d' RRF(d'), its fused support across routes scaled to
1. Both lie in (0, 1], so s_final does too, and an item missing from a route adds nothing there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from retrieval.multi_route.params import RRF_KAPPA, S_BEST, S_ROUTE


def rrf(lists: Sequence[Sequence[int]], weights: Sequence[float] | None = None,
        kappa: float = RRF_KAPPA) -> dict[int, float]:
    """Σ_j w_j / (κ + rank_j(d)) over the lists containing d (rank 1 = first; an item repeated in
    one list counts at its first rank); w_j = 1 without ``weights``."""
    weights = [1.0] * len(lists) if weights is None else list(weights)
    if len(weights) != len(lists):
        raise ValueError(f"{len(weights)} weights for {len(lists)} lists")
    fused: dict[int, float] = {}
    for items, weight in zip(lists, weights, strict=True):
        seen: set[int] = set()
        for rank, item in enumerate(items, start=1):
            if item in seen:
                continue
            seen.add(item)
            fused[item] = fused.get(item, 0.0) + weight / (kappa + rank)
    return fused


def stand_in(fused: dict[int, float], turns: Sequence[int], weight: float, is_open: Callable[[int], bool],
             kappa: float = RRF_KAPPA) -> None:
    """Let each open raw turn of the raw-turn list ``turns`` stand in for its records, which a
    closing segment has still to write: at its rank there it adds ``weight`` / (κ + rank) to its
    fused score in ``fused``, ``weight`` being the query's record channels' weights summed, as
    if each of them ranked its records where the raw-turn channel ranks it (docs/design.md §7.4).
    Without it a turn added a moment ago, listed by one channel, ranks below every record that
    several channels list, however well it answers. Records and closed turns are left as they are."""
    seen: set[int] = set()
    for rank, item in enumerate(turns, start=1):
        if item not in seen and is_open(item):
            seen.add(item)
            fused[item] = fused.get(item, 0.0) + weight / (kappa + rank)


def ranking(scores: Mapping[int, float]) -> list[int]:
    """Items by score descending, ties by item ascending."""
    return sorted(scores, key=lambda item: (-scores[item], item))


class FinalScore(NamedTuple):
    """The parts of one candidate's final score (a named tuple: one is made per candidate of
    every search, and a frozen dataclass costs several times as much to make)."""

    s_best: float
    s_route: float
    s_final: float


def final_scores(route_lists: Sequence[Sequence[int]], kappa: float = RRF_KAPPA) -> dict[int, FinalScore]:
    """s_best, s_route and s_final of every candidate of the route-level lists (module docstring)."""
    fused = rrf(route_lists, kappa=kappa)
    if not fused:
        return {}
    top = max(fused.values())
    best: dict[int, float] = {}
    for items in route_lists:
        for rank, item in enumerate(items, start=1):
            best[item] = max(best.get(item, 0.0), (kappa + 1) / (kappa + rank))
    parts: dict[int, FinalScore] = {}
    for item, support in fused.items():
        s_best = best[item]
        parts[item] = FinalScore(s_best, support / top, S_BEST * s_best + S_ROUTE * support / top)
    return parts
