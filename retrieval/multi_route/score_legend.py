"""What the score columns of a multi-route retrieval mean, and why its order is not by score:
the legend ``python -m retrieval.query`` prints (and puts in its ``--json`` output)."""

from __future__ import annotations

from retrieval.multi_route.params import (
    MMR_RELEVANCE,
    MMR_SIMILARITY,
    NODE_RELEVANCE,
    PLAN_DEPTH,
    S_BEST,
    S_ROUTE,
)

SCORE_COLUMNS = {
    "records": "cosine of the record to a route query (0..1]: only positive ones are listed",
    "turns": "cosine of the verbatim turn to a route query (0..1]: only positive ones are listed",
    "nodes": f"evidence-node weight (match x key specificity) + {NODE_RELEVANCE} x cosine",
    "temporal": f"time-node weight inside the route's time range + {NODE_RELEVANCE} x cosine",
    "lexical": "FTS5 BM25 of the query's content words (0 and up, unbounded)",
    "code": "S_amu of the codebook walk (docs/design.md §3.3; its own scale, not comparable to the others)",
    "s_best": "best route-level rank as a reciprocal rank, 1 at rank 1 (0..1]",
    "s_route": "fused RRF support across routes, 1 for the best-supported item (0..1]",
    "s_final": f"{S_BEST} s_best + {S_ROUTE} s_route: the relevance the selection uses (0..1]",
}
"""Each column is a channel's best score for the item over the plan's queries, on that channel's
scale; an item shows only the channels that found it (the fusion uses ranks, not these values)."""

ORDER_NOTE = (f"Order: each route's best items first (route coverage), then MMR ({MMR_RELEVANCE} s_final - "
              f"{MMR_SIMILARITY} similarity to the items already chosen), so s_final is not sorted; "
              "rank 1 is the first item selected.")


def size_note(requested: int, returned: int, exact: bool) -> str:
    """Why the list has ``returned`` items when ``requested`` were asked for."""
    if exact or requested >= PLAN_DEPTH:
        return f"{returned} items (k = {requested})" + ("" if returned == requested else
                                                          f"; the user has only {returned}")
    return (f"{returned} items: k = {requested} is raised to plan_depth {PLAN_DEPTH} (LycheeMemory Table 14: "
            f"final top-k = max(k, {PLAN_DEPTH})); --exact-k returns exactly {requested}")


def legend_lines() -> list[str]:
    """The legend as indented lines of the listing."""
    width = max(map(len, SCORE_COLUMNS))
    return (["Scores (each channel's best for the item, on its own scale; only the channels that found it):"]
            + [f"  {name:<{width}}  {meaning}" for name, meaning in SCORE_COLUMNS.items()] + [ORDER_NOTE])
