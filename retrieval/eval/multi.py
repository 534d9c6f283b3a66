"""The multi-route configurations of the evaluation (``multi``, ``multi+code``, ``multi+kmeans``;
SPEC section 7): per conversation one route bank over the same active AMUs and embeddings as the
dual-path banks and one :class:`MultiRouteRetriever` per codebook, whose code route searches
that codebook's topology (the other routes and the plans are shared); the plans' query texts
are embedded and fingerprinted in one batch before any query is timed (the dual-path
configurations' question vectors are batched the same way), so that latency measures
retrieval, not model forwards."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from isq.topology import CooccurrenceTopology
from retrieval.eval.evidence import EvalQuestion
from retrieval.eval.results import MultiRouteInfo
from retrieval.memory.records import AMU
from retrieval.memory.store import AMUStore
from retrieval.routes.bank import RouteBank
from retrieval.routes.plan import Plan
from retrieval.routes.rerank import CrossEncoderReranker
from retrieval.routes.retriever import RERANKER_OFF, MultiRouteRetriever


def build_route_retrievers(store: AMUStore, conversation_id: str, embedder: Any, amus: Sequence[AMU],
                           embeddings: np.ndarray, codebooks: Mapping[str, tuple[CooccurrenceTopology, Any]],
                           planner: Any | None, reranker: CrossEncoderReranker | None
                           ) -> dict[str, MultiRouteRetriever]:
    """The conversation's route bank (the given records and vectors) and, per codebook of
    ``codebooks`` (name -> its topology over the same records and its fingerprinter), a
    retriever whose code route uses it. The bank is built once: the codebooks' banks share its
    arrays and differ only in the topology and the fingerprinter of the query texts."""
    (first, (topology, fingerprinter)), *others = codebooks.items()
    bank = RouteBank.build(store, conversation_id, embedder, records=amus, record_vectors=embeddings,
                           topology=topology, fingerprinter=fingerprinter)
    banks = {first: bank, **{name: dataclasses.replace(bank, topology=topo, fingerprinter=fp)
                             for name, (topo, fp) in others}}
    return {name: MultiRouteRetriever(each, planner, reranker) for name, each in banks.items()}


def prepare_queries(retrievers: Mapping[str, MultiRouteRetriever], questions: Sequence[EvalQuestion],
                    embedder: Any, fingerprinters: Iterable[Any]) -> list[Plan]:
    """Plan every question and put its route queries' vectors and, per fingerprinter, codes in
    the store's caches with one batched call each; returns the plans, in question order."""
    plans = [retrievers[q.conversation_id].plan(q.question) for q in questions]
    texts = list(dict.fromkeys(query for plan in plans for route in plan.routes for query in route.queries))
    embedder.encode(texts)
    for fingerprinter in fingerprinters:
        fingerprinter.fingerprint(texts)
    return plans


def multi_info(retrievers: Mapping[str, MultiRouteRetriever], plans: Sequence[Plan],
               bank_seconds: Mapping[str, float]) -> MultiRouteInfo:
    """What ``results.json`` records of the multi-route runs."""
    first = next(iter(retrievers.values()))
    reranker = first.reranker.name if first.reranker is not None else RERANKER_OFF
    nodes = {cid: dict(Counter(node.node_type for node in r.bank.nodes)) for cid, r in retrievers.items()}
    return MultiRouteInfo(planner=getattr(first.planner, "name", type(first.planner).__name__), reranker=reranker,
                          question_types=dict(Counter(plan.question_type for plan in plans)),
                          mean_routes=float(np.mean([len(plan.routes) for plan in plans])) if plans else 0.0,
                          nodes=nodes, bank_seconds={cid: round(s, 2) for cid, s in bank_seconds.items()})

