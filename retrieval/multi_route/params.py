"""The constants of plan-guided multi-route retrieval in one place. Each comes from LycheeMemory
(section 3.5, Algorithm B.2, appendix C.4 and its Table 14; docs/design.md §7.3-§7.4) unless it
says it is this project's choice (the paper does not give it)."""

from __future__ import annotations

from dataclasses import dataclass, field

QUESTION_TYPES = ("single", "aggregate", "temporal", "comparison", "personalized_advice",
                  "prior_assistant_response", "other")
"""The planner's internal question types (appendix C.4): they select retrieval strategies, not
benchmark categories."""

CHANNELS = ("records", "nodes", "temporal", "turns", "lexical", "code")
"""Recall channels of a route: direct record recall (dense), evidence-node recall, temporal
recall, raw-turn recall (section 3.5), the FTS5 lexical channel and the codebook path
(docs/design.md §7.3)."""

STAND_IN_CHANNELS = ("records", "nodes", "lexical", "code")
"""The channels that list a query's records: an open raw turn, whose records are still to be
written, stands in for them in these (:func:`retrieval.multi_route.fusion.stand_in`)."""

PLAN_DEPTH = 15
"""Table 14: plan_depth; the final top-k is max(requested k, plan_depth, 1) (Algorithm B.2 line 3)."""

RRF_KAPPA = 60.0
"""Table 14: the RRF smoothing constant κ of eq. 9."""

S_BEST, S_ROUTE = 0.82, 0.18
"""Appendix C.4: s_final = 0.82 s_best + 0.18 s_route."""

MMR_RELEVANCE, MMR_SIMILARITY = 0.75, 0.25
"""Appendix C.4: s_select = 0.75 s_rel - 0.25 s_sim (MMR-style diversity-aware selection)."""

MAX_ROUTE_QUOTA = 4
"""Appendix C.4: route coverage quota max(1, min(4, k // routes))."""

RERANK_CANDIDATES = 100
"""Table 14: configured reranker candidate limit; the route-level limit is max(100, 4k)."""

MAX_ROUTES = 4
"""This project's choice: a plan has at most this many routes (the paper gives no bound)."""

NODE_MATCHES = 12
"""This project's choice: evidence nodes matched by semantic search per query (Algorithm B.2
line 8 gives no number); exact key matches of the plan's entities and topics come on top."""

NODE_RELEVANCE = 0.5
"""This project's choice: an expanded record scores the sum of its matched nodes' weights
(match score x key specificity) plus this share of its own cosine to the query, which orders the
members of a large node (an entity node of a speaker links most records)."""


def final_top_k(k: int, plan_depth: int = PLAN_DEPTH) -> int:
    """Table 14: final top-k = max(requested_top_k, plan_depth, 1)."""
    return max(k, plan_depth, 1)


def record_budget(k: int) -> int:
    """Table 14: evidence-node and direct record recall budget max(3k, 30) (multipliers 1); this
    project gives the lexical and codebook channels the same budget."""
    return max(3 * k, 30)


def turn_budget(k: int) -> int:
    """Table 14: raw-turn recall budget max(k, 20)."""
    return max(k, 20)


def temporal_budget(k: int) -> int:
    """Table 14: temporal filter recall budget max(10k, 100)."""
    return max(10 * k, 100)


def rerank_limit(k: int) -> int:
    """Table 14: route-level rerank candidate limit max(100, 4k); also the MMR candidate pool."""
    return max(RERANK_CANDIDATES, 4 * k)


def route_quota(k: int, routes: int) -> int:
    """Appendix C.4: items each route keeps before diversity-aware selection."""
    return max(1, min(MAX_ROUTE_QUOTA, k // max(routes, 1)))


@dataclass(frozen=True)
class ChannelWeights:
    """Weights of each channel's reciprocal ranks inside a route, per question type (section 3.5:
    "the question type selects retrieval parameters such as channel weights"). The values are
    this project's choice: 1 everywhere, except that temporal questions weigh the temporal
    filter and aggregate questions the evidence nodes double."""

    default: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CHANNELS, 1.0))
    by_type: dict[str, dict[str, float]] = field(default_factory=lambda: {
        "temporal": {"temporal": 2.0}, "aggregate": {"nodes": 2.0}})

    def weight(self, question_type: str, channel: str) -> float:
        return self.by_type.get(question_type, {}).get(channel, self.default.get(channel, 1.0))
