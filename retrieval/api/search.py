"""One search of the memory API over a user's snapshot: plan-guided multi-route retrieval
(:class:`retrieval.routes.multi_route.MultiRouteRetriever`, docs/design.md §7) with the codebook
channel when the snapshot has a topology, exactly ``k`` items (``plan_depth=0``).

``routes`` names the channels that may vote (records, nodes, turns, lexical, temporal, code);
the others are weighted 0 and an item only they found is dropped. ``session`` keeps the hits of
one session: the retriever is asked for :data:`SESSION_WIDENING` times ``k`` items first.
``explain`` adds each hit's per-channel rank and score, the routes (from 1) that found it, its
fused scores and, for the code channel, the codes the record shares with the query's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from retrieval.api.errors import InvalidInput
from retrieval.api.results import SearchHit, SearchResult
from retrieval.api.snapshot import Snapshot
from retrieval.contract import Hit, Query
from retrieval.routes.params import CHANNELS, ChannelWeights
from retrieval.routes.snapshot import MemorySnapshot

SESSION_WIDENING = 4


def _weights(routes: Sequence[str] | None, has_code: bool) -> tuple[ChannelWeights | None, set[str]]:
    known = set(CHANNELS)
    if routes is None:
        return None, known
    if isinstance(routes, str) or not set(routes) or not set(routes) <= known:
        raise InvalidInput(f"routes must be a list of channels among {sorted(known)}, got {routes!r}")
    if "code" in routes and not has_code:
        raise InvalidInput("the code route needs a memory opened with a fingerprinter")
    chosen = set(routes)
    return ChannelWeights(default={c: float(c in chosen) for c in known}, by_type={}), chosen


def run_search(snapshot: Snapshot, query: str, k: int, *, session: str | None, routes: Sequence[str] | None,
               explain: bool, planner: Any | None, reranker: Any | None) -> SearchResult:
    """The user's hits for ``query`` (see the module docstring)."""
    bank = snapshot.bank
    has_code = bank.topology is not None
    weights, chosen = _weights(routes, has_code)
    if bank.size == 0:
        return SearchResult(query, ())
    use_code = has_code and "code" in chosen
    retriever = snapshot.retriever(planner, reranker)
    retriever.weights, retriever.use_code = weights or ChannelWeights(), use_code
    budget = min(bank.size, k * SESSION_WIDENING) if session is not None else k
    result = retriever.retrieve(Query(query), budget)
    assert result.plan is not None  # multi-route retrieval always plans
    hits = [hit for hit in result.hits if (session is None or hit.source["session_id"] == session)
            and (routes is None or chosen & set(hit.ranks))][:k]
    query_codes: frozenset[int] = frozenset()
    if explain and use_code and bank.fingerprinter is not None:
        texts = [q for route in result.plan.routes for q in route.queries]
        query_codes = frozenset().union(*(fp.codes for fp in bank.fingerprinter.fingerprint(texts)))
    return SearchResult(query, tuple(_hit(bank, hit, explain, query_codes) for hit in hits),
                        result.plan.question_type, result.seconds, result.plan.to_dict(),
                        result.reranker or "")


def _hit(bank: MemorySnapshot, hit: Hit, explain: bool, query_codes: frozenset[int]) -> SearchHit:
    details = None
    if explain:
        channels = {name: {"rank": hit.ranks[name], "score": hit.channels[name]} for name in hit.ranks}
        details = {"channels": channels, "routes": [number + 1 for number in hit.routes],
                   "fused": {name: hit.channels[name] for name in ("s_best", "s_route", "s_final")
                             if name in hit.channels}}
        if query_codes and hit.kind == "record":
            codes = set(bank.records[hit.index].fingerprint or ())
            details["shared_codes"] = sorted(codes & query_codes)
    return SearchHit(hit.id, hit.text, float(hit.score), hit.kind, hit.source["session_id"],
                     tuple(hit.source["turn_ids"]), hit.memory_type, hit.time, details)
