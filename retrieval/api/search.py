"""One search of the memory API over a user's bank (its snapshot): plan-guided multi-route retrieval
(:class:`retrieval.multi_route.retriever.MultiRouteRetriever`, docs/design.md §7) with the codebook
channel when the bank has a topology, exactly ``k`` items (``plan_depth=0``) or every item
there is when there are fewer.

``session`` keeps retrieval to the items of one session: it is the retriever's scope, so every
channel ranks that session's items only (a filter before the channels' cuts, not after).
``explain`` adds each hit's per-channel rank and score, the routes (from 1) that found it, its
fused scores, for the code channel the codes the record shares with the query's, and for a raw
turn whether it is open (in no committed segment yet: it stood in for its records unless it is small
talk, :meth:`MemoryBank.stands_in`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from retrieval.api.results import SearchResult
from retrieval.contract import Hit, Query
from retrieval.multi_route.bank import MemoryBank
from retrieval.multi_route.retriever import MultiRouteRetriever


def run_search(bank: MemoryBank, query: str, k: int, *, session: str | None, explain: bool,
               planner: Any | None, reranker: Any | None) -> SearchResult:
    """The user's hits for ``query`` (see the module docstring)."""
    if bank.size == 0:
        return SearchResult(query, ())
    use_code = bank.topology is not None
    retriever = MultiRouteRetriever(bank, planner, reranker, use_code=use_code, plan_depth=0)
    scope = None if session is None else bank.session_mask(session)
    result = retriever.retrieve(Query(query), k, scope=scope)
    assert result.plan is not None  # multi-route retrieval always plans
    query_codes: frozenset[int] = frozenset()
    if explain and use_code and bank.fingerprinter is not None:
        texts = [q for route in result.plan.routes for q in route.queries]
        query_codes = frozenset().union(*(fp.codes for fp in bank.fingerprinter.fingerprint(texts)))
    hits = tuple(_explained(bank, hit, query_codes) for hit in result.hits) if explain else tuple(result.hits)
    return SearchResult(query, hits, result.plan.question_type, result.seconds, result.plan.to_dict(),
                        result.reranker or "", dict(result.timings))


def _explained(bank: MemoryBank, hit: Hit, query_codes: frozenset[int]) -> Hit:
    """``hit`` with its explanation (the module docstring)."""
    channels = {name: {"rank": hit.ranks[name], "score": hit.scores[name]} for name in hit.ranks}
    details: dict[str, Any] = {
        "channels": channels, "routes": [number + 1 for number in hit.route_indices],
        "fused": {name: hit.scores[name] for name in ("s_best", "s_route", "s_final") if name in hit.scores}}
    if query_codes and hit.kind == "record":
        codes = set(bank.records[hit.index].fingerprint or ())
        details["shared_codes"] = sorted(codes & query_codes)
    if hit.kind == "turn":  # in no committed segment yet (the module docstring)
        details["open"] = bool(bank.open_turns[hit.index - len(bank.records)])
    return replace(hit, explain=details)
