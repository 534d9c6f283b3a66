"""The multi-route configurations of the evaluation (``multi``, ``multi+code``, ``multi+kmeans``;
docs/design.md §7): one :class:`MultiRouteRetriever` per conversation and configuration over the
same active AMUs and embeddings as the dual-path banks, whose code channel searches the
configuration's codebook (the trained one's topology for ``multi+code``, the control's for
``multi+kmeans``; the other routes and the plans are shared), and the plans' query texts
embedded and fingerprinted in one batch before any query is timed (the dual-path
configurations' question vectors are batched the same way), so that latency measures
retrieval, not model forwards."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from retrieval.eval.configs import TRAINED, RetrievalConfig
from retrieval.eval.dual_path import DualPathRetriever
from retrieval.eval.questions import EvalQuestion
from retrieval.eval.results import MultiRouteInfo
from retrieval.memory.cache import CachedEmbedder, CachedFingerprinter
from retrieval.memory.protocols import Embedder, TextFingerprinter
from retrieval.memory.records import AMU
from retrieval.memory.store_contract import Store
from retrieval.multi_route.bank import MemoryBank
from retrieval.multi_route.planner_rules import Planner
from retrieval.multi_route.query_plan import Plan
from retrieval.multi_route.rerank import CrossEncoderReranker
from retrieval.multi_route.retriever import RERANKER_OFF, MultiRouteRetriever


def build_route_retrievers(store: Store, conversation_id: str, embedder: Embedder, amus: Sequence[AMU],
                           embeddings: np.ndarray, banks: Mapping[str, DualPathRetriever],
                           fingerprinters: Mapping[str, TextFingerprinter], planner: Planner | None,
                           reranker: CrossEncoderReranker | None,
                           configs: Sequence[RetrievalConfig]) -> dict[str, MultiRouteRetriever]:
    """The conversation's memory bank (the given records and vectors) and, over it, one
    retriever per multi-route configuration of ``configs``, whose codebook channel (where the
    configuration uses codes) searches its codebook: the topology of that codebook's dual-path
    bank in ``banks`` (same records), queries fingerprinted by its entry in ``fingerprinters``.
    The bank is built once, with the trained codebook; another codebook's bank shares its
    arrays. Equal budgets: plan_depth 0, so each returns exactly the k asked for."""
    bank = MemoryBank.build(store, conversation_id, embedder, records=amus, record_vectors=embeddings,
                            topology=banks[TRAINED].topology, fingerprinter=fingerprinters[TRAINED])
    memory_banks = {name: bank if name == TRAINED
                    else bank.with_codebook(banks[name].topology, fingerprinters[name]) for name in banks}
    return {config.name: MultiRouteRetriever(memory_banks[config.codebook or TRAINED], planner, reranker,
                                             use_code=config.uses_codes, plan_depth=0)
            for config in configs}


def prepare_queries(retrievers: Mapping[str, MultiRouteRetriever], questions: Sequence[EvalQuestion],
                    embedder: CachedEmbedder, fingerprinters: Iterable[CachedFingerprinter]) -> list[Plan]:
    """Plan every question and put its route queries' vectors and, per fingerprinter, codes in
    the store's caches, under the question's conversation, with one batched call each; returns
    the plans, in question order."""
    plans = [retrievers[q.conversation_id].plan(q.question) for q in questions]
    owned = list(dict.fromkeys((q.conversation_id, query) for q, plan in zip(questions, plans, strict=True)
                               for route in plan.routes for query in route.queries))
    users, texts = [user for user, _ in owned], [text for _, text in owned]
    embedder.encode_for(users, texts)
    for fingerprinter in fingerprinters:
        fingerprinter.fingerprint_for(users, texts)
    return plans


def multi_info(retrievers: Mapping[str, MultiRouteRetriever], plans: Sequence[Plan],
               bank_seconds: Mapping[str, float]) -> MultiRouteInfo:
    """What ``results.json`` records of the multi-route runs."""
    first = next(iter(retrievers.values()))
    reranker = first.reranker.name if first.reranker is not None else RERANKER_OFF
    nodes = {cid: dict(Counter(node.node_type for node in r.bank.nodes)) for cid, r in retrievers.items()}
    return MultiRouteInfo(planner=getattr(first.planner, "name", type(first.planner).__name__),
                          reranker=reranker,
                          question_types=dict(Counter(plan.question_type for plan in plans)),
                          mean_routes=float(np.mean([len(plan.routes) for plan in plans])) if plans else 0.0,
                          nodes=nodes, bank_seconds={cid: round(s, 2) for cid, s in bank_seconds.items()},
                          plans_by=dict(Counter(plan.planner for plan in plans)))

