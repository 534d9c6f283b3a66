"""Plan-guided multi-route retrieval (LycheeMemory section 3.5, Algorithm B.2; docs/design.md §7).

One plan per question (:mod:`retrieval.multi_route.planner_rules` or ``planner_llm``), then
non-generative recall: per route and query the channels of :mod:`retrieval.multi_route.channels`
(records, nodes, turns, lexical, and code when switched on; temporal when the route has a time
range), fused inside the route by RRF with the question type's channel weights
(:class:`retrieval.multi_route.params.ChannelWeights`), optionally reranked by a cross-encoder
(:mod:`retrieval.multi_route.rerank`), fused across routes into s_final (:mod:`retrieval.multi_route.
fusion`), and selected with route coverage quotas and MMR (:mod:`retrieval.multi_route.selection`).
The result always has exactly the final top-k distinct items (records or raw turns) when the
bank holds that many: should the candidates run short, the items most similar to the first
query fill the list. A ``scope`` (:data:`retrieval.multi_route.channels.Scope`) keeps retrieval to
some items (one session's): every channel ranks only those, and so does the filling.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from retrieval.contract import Hit, Query, Retrieval
from retrieval.index.products import inner_products
from retrieval.index.query_batcher import queue_clock
from retrieval.multi_route.bank import MemoryBank
from retrieval.multi_route.channels import (
    ChannelList,
    Scope,
    code_recall,
    lexical_recall,
    node_recall,
    record_recall,
    temporal_recall,
    turn_recall,
)
from retrieval.multi_route.fusion import final_scores, ranking, rrf, stand_in
from retrieval.multi_route.params import (
    PLAN_DEPTH,
    STAND_IN_CHANNELS,
    ChannelWeights,
    final_top_k,
    record_budget,
    rerank_limit,
    route_quota,
    temporal_budget,
    turn_budget,
)
from retrieval.multi_route.planner_rules import Planner, RulePlanner
from retrieval.multi_route.query_plan import Plan, Route
from retrieval.multi_route.rerank import CrossEncoderReranker, rerank
from retrieval.multi_route.selection import Signature, mmr_select

RERANKER_OFF = "off (no reranker path given)"


@dataclass(slots=True)
class _Candidate:
    """One item's scoring state while a retrieval runs (channel scores and ranks, the queries,
    nodes and routes that found it); private: what the retrieval returns is a ``Hit``."""

    scores: dict[str, float] = field(default_factory=dict)
    ranks: dict[str, int] = field(default_factory=dict)
    queries: set[str] = field(default_factory=set)
    nodes: set[str] = field(default_factory=set)
    route_indices: set[int] = field(default_factory=set)


def _gather(candidates: dict[int, _Candidate], tag: str, number: int, ranked: ChannelList) -> None:
    """Fold one channel list of route ``number`` (query ``tag``) into the candidates: per item its
    best score and best rank in the channel, the query, nodes and route that found it. One pass
    per list with the channel's fields bound once: this runs for every listed item of a search."""
    channel, via = ranked.channel, ranked.via
    for rank, (item, score) in enumerate(zip(ranked.items.tolist(), ranked.scores.tolist(), strict=True), 1):
        candidate = candidates.get(item)
        if candidate is None:
            candidate = candidates[item] = _Candidate()
        held = candidate.scores.get(channel)
        if held is None or score > held:
            candidate.scores[channel] = score
        best = candidate.ranks.get(channel)
        if best is None or rank < best:
            candidate.ranks[channel] = rank
        candidate.queries.add(tag)
        if via:
            candidate.nodes.update(via.get(item, ()))
        candidate.route_indices.add(number)


class MultiRouteRetriever:
    """Multi-route retrieval over one :class:`MemoryBank`, as a :class:`retrieval.contract.
    Retriever`. ``planner`` defaults to the rule planner; ``reranker`` (a
    :class:`CrossEncoderReranker`) is off when None; ``use_code`` adds the codebook channel;
    ``plan_depth`` is Table 14's (an equal-budget comparison passes 0 to get exactly k items)."""

    def __init__(self, bank: MemoryBank, planner: Planner | None = None,
                 reranker: CrossEncoderReranker | None = None, weights: ChannelWeights | None = None, *,
                 use_code: bool = False, plan_depth: int = PLAN_DEPTH) -> None:
        self.bank = bank
        self.planner: Planner = planner or RulePlanner()
        self.reranker = reranker
        self.weights = weights or ChannelWeights()
        self.use_code, self.plan_depth = use_code, plan_depth

    def plan(self, question: str) -> Plan:
        return self.planner.plan(question, self.bank.context)

    def retrieve(self, query: Query, k: int, *, plan: Plan | None = None,
                 scope: Scope = None) -> Retrieval:
        """The final top-k = max(k, plan_depth, 1) items for ``query`` (Algorithm B.2 line 3), of
        the items in ``scope`` when one is given. Its ``timings`` split the wall time: "model_wait"
        (the route queries' calls queued for the model behind other forwards, where the models
        share a batcher: :func:`retrieval.index.query_batcher.queue_clock`), "encode" (the rest
        of their embeddings and fingerprints), "routes" (the plan, the channels and the fusion
        inside each route) and "fusion" (final scores, MMR, filling, the hits)."""
        question = query.text
        started = time.perf_counter()
        plan = plan or self.plan(question)
        k = final_top_k(k, self.plan_depth)
        texts = list(dict.fromkeys(text for route in plan.routes for text in route.queries))
        planned = time.perf_counter()
        with queue_clock() as waits:
            vectors, codes = self._encode(texts)
        encoded = time.perf_counter()
        candidates: dict[int, _Candidate] = {}
        route_lists = [self._route(number, route, plan.question_type, vectors, codes, k, candidates, scope)
                       for number, route in enumerate(plan.routes)]
        routed = time.perf_counter()
        scores = final_scores(route_lists)
        relevance = {item: part.s_final for item, part in scores.items()}
        order = ranking(relevance)
        quota = route_quota(k, len(route_lists))
        seeds = [item for items in route_lists for item in items[:quota]]
        pool = order[:rerank_limit(k)]
        signatures = {item: self._signature(item, candidates[item]) for item in dict.fromkeys(seeds + pool)}
        selected = mmr_select(pool, relevance, signatures, k, seeds)
        if len(selected) < k:  # every candidate is selected (the pool holds them all): fill from outside
            taken = set(selected)
            rest = [item for item in self._fallback(vectors[texts[0]], scope)
                    if item not in taken and item not in scores]
            selected += rest[: k - len(selected)]
        hits = [self._hit(rank, item, candidates.get(item), scores.get(item))
                for rank, item in enumerate(selected, start=1)]
        reranker = self.reranker.name if self.reranker is not None else RERANKER_OFF
        done = time.perf_counter()
        waited = min(sum(waits), encoded - planned)
        timings = {"model_wait": waited, "encode": encoded - planned - waited,
                   "routes": (planned - started) + (routed - encoded), "fusion": done - routed}
        return Retrieval(question, hits, done - started, plan, reranker, timings)

    def _encode(self, texts: list[str]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Each query text's vector and, with the codebook channel on, its code set."""
        vectors = dict(zip(texts, self.bank.query_embedder.encode(texts), strict=True))
        codes: dict[str, Any] = {}
        if self.use_code:
            if self.bank.fingerprinter is None:
                raise ValueError("the codebook channel needs a bank built with a fingerprinter")
            codes = {text: fp.codes
                     for text, fp in zip(texts, self.bank.fingerprinter.fingerprint(texts), strict=True)}
        return vectors, codes

    def _route(self, number: int, route: Route, question_type: str, vectors: Mapping[str, np.ndarray],
               codes: Mapping[str, Any], k: int, candidates: dict[int, _Candidate],
               scope: Scope = None) -> list[int]:
        """The route-level ranked list L_i (Algorithm B.2 lines 5-15)."""
        bank = self.bank
        lists: list[tuple[str, ChannelList]] = []
        for index, query in enumerate(route.queries):
            tag, vector = f"r{number}q{index}", vectors[query]
            lists += [(tag, record_recall(bank, vector, record_budget(k), scope)),
                      (tag, node_recall(bank, route, vector, record_budget(k), scope)),
                      (tag, turn_recall(bank, vector, turn_budget(k), scope)),
                      (tag, lexical_recall(bank, query, record_budget(k), scope))]
            if codes:
                lists.append((tag, code_recall(bank, codes[query], record_budget(k), scope)))
        if route.time is not None:
            lists.append((f"r{number}t", temporal_recall(bank, route.time, vectors[route.queries[0]],
                                                         temporal_budget(k), scope)))
        for tag, ranked in lists:
            _gather(candidates, tag, number, ranked)
        weights = [self.weights.weight(question_type, ranked.channel) for _, ranked in lists]
        fused = rrf([ranked.items.tolist() for _, ranked in lists], weights)
        self._stand_in(fused, lists, weights)
        order = ranking(fused)
        if self.reranker is not None and order:
            top = order[:rerank_limit(k)]
            scores = self.reranker.scores(route.queries[0], [bank.text(item) for item in top])
            order = rerank(top, scores) + order[len(top):]
        return order

    def _stand_in(self, fused: dict[int, float], lists: list[tuple[str, ChannelList]],
                  weights: list[float]) -> None:
        """The open raw turns of each query's raw-turn list stand in for their records in the
        query's record channels (:func:`retrieval.multi_route.fusion.stand_in`), small talk aside
        (:meth:`MemoryBank.stands_in`)."""
        if not self.bank.open_turns.any():
            return
        for tag, ranked in lists:
            if ranked.channel == "turns":
                weight = sum(w for (other, listed), w in zip(lists, weights, strict=True)
                             if other == tag and listed.channel in STAND_IN_CHANNELS)
                stand_in(fused, ranked.items.tolist(), weight, self.bank.stands_in)

    def _signature(self, item: int, candidate: _Candidate) -> Signature:
        """The item's fixed signature (:meth:`MemoryBank.signature`) with the queries and nodes
        that found it in this retrieval."""
        return {**self.bank.signature(item), "queries": frozenset(candidate.queries),
                "nodes": frozenset(candidate.nodes)}

    def _fallback(self, vector: np.ndarray, scope: Scope = None) -> list[int]:
        """Every item in scope (records, then turns not merged into one), most similar to
        ``vector`` first."""
        bank = self.bank
        turns = np.flatnonzero(bank.turn_record < 0)
        items = np.concatenate([np.arange(len(bank.records)), len(bank.records) + turns])
        similarity = np.concatenate([inner_products(bank.record_vectors, vector),
                                     inner_products(bank.turn_vectors, vector, turns)])
        if scope is not None:
            kept = scope[items]
            items, similarity = items[kept], similarity[kept]
        return [int(items[i]) for i in np.lexsort((items, -similarity))]

    def _hit(self, rank: int, item: int, candidate: _Candidate | None, score: Any) -> Hit:
        bank = self.bank
        parts = dict(candidate.scores) if candidate else {}
        if score is not None:
            parts.update(s_best=score.s_best, s_route=score.s_route, s_final=score.s_final)
        if bank.is_record(item):
            record = bank.records[item]
            kind, memory_type, when = "record", record.memory_type, record.t_ref or record.observed_at
        else:
            turn = bank.turns[item - len(bank.records)]
            kind, memory_type = "turn", None
            when = turn.session_time.isoformat() if turn.session_time else None
        source = bank.source(item)
        return Hit(id=bank.item_id(item), text=bank.text(item), score=parts.get("s_final", 0.0), kind=kind,
                   session_id=source["session_id"], turns=tuple(source["turn_ids"]),
                   memory_type=memory_type, time=when, index=item, channel="multi", rank=rank,
                   scores=parts, ranks=dict(candidate.ranks) if candidate else {},
                   route_indices=tuple(sorted(candidate.route_indices)) if candidate else ())
