"""The multi-route configurations of the evaluation (``multi``, ``multi+code``; SPEC section 7):
one :class:`MultiRouteRetriever` per conversation over the same active AMUs, embeddings and
trained-codebook topology as the dual-path banks, and the plans' query texts embedded and
fingerprinted in one batch before any query is timed (the dual-path configurations' question
vectors are batched the same way), so that latency measures retrieval, not model forwards."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
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


def build_route_retriever(store: AMUStore, conversation_id: str, embedder: Any, amus: Sequence[AMU],
                          embeddings: np.ndarray, topology: CooccurrenceTopology, fingerprinter: Any,
                          planner: Any | None, reranker: CrossEncoderReranker | None) -> MultiRouteRetriever:
    """The conversation's route bank (the given records, vectors and topology) and its retriever."""
    bank = RouteBank.build(store, conversation_id, embedder, records=amus, record_vectors=embeddings,
                           topology=topology, fingerprinter=fingerprinter)
    return MultiRouteRetriever(bank, planner, reranker)


def prepare_queries(retrievers: Mapping[str, MultiRouteRetriever], questions: Sequence[EvalQuestion],
                    embedder: Any, fingerprinter: Any | None) -> list[Plan]:
    """Plan every question and put its route queries' vectors (and codes) in the store's caches
    with one batched call each; returns the plans, in question order."""
    plans = [retrievers[q.conversation_id].plan(q.question) for q in questions]
    texts = list(dict.fromkeys(query for plan in plans for route in plan.routes for query in route.queries))
    embedder.encode(texts)
    if fingerprinter is not None:
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

