"""The recall channels of one route (LycheeMemory section 3.5, Algorithm B.2 lines 6-11;
docs/design.md §7.3), each a ranked list of bank items
(:class:`retrieval.multi_route.bank.MemoryBank`) with its own scores. Ties are broken by item
order (:func:`isq.topk.select_top_k`), so every list is deterministic.

- ``records``: direct record recall, cosine over record embeddings.
- ``nodes``: evidence-node recall: nodes matched exactly (the plan's entities, topics and their
  pairs, by normalised key) or by semantic search over node embeddings, expanded to their
  active records.
- ``temporal``: records of the temporal nodes inside the route's time range (exact date or range).
- ``turns``: raw-turn recall, cosine over verbatim turn embeddings.
- ``lexical``: FTS5 ``bm25()`` over record text, entities and topics.
- ``code``: the codebook path (docs/design.md §7.5), top S_amu over the same records.

Every channel takes an optional ``scope``, a boolean mask over the bank's items (records, then
raw turns): only items in scope are ranked, so a filter (one session) applies before each
channel's budget cuts its list, never after.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from isq.topk import empty_result, select_top_k, top_k_of_scores
from retrieval.index.products import inner_products
from retrieval.memory.evidence_keys import PAIR_SEPARATOR, normalise_key
from retrieval.memory.times import time_interval
from retrieval.multi_route.bank import MemoryBank
from retrieval.multi_route.params import NODE_MATCHES, NODE_RELEVANCE
from retrieval.multi_route.query_plan import Route, TimeConstraint

MONTH_DAYS = 28
"""A time range this long or longer also matches month keys in full; shorter ranges match the
month keys that contain them at half weight (a record dated only "in May" may be on that day)."""


@dataclass(frozen=True)
class ChannelList:
    """One channel's ranked items (best first) and their scores; ``via`` names, per item, the
    evidence nodes it was reached through (node and temporal channels)."""

    channel: str
    items: np.ndarray
    scores: np.ndarray
    via: dict[int, tuple[str, ...]] = field(default_factory=dict)


Scope = np.ndarray | None
"""A boolean mask over the bank's items (records, then raw turns), or None for every item."""


def _ranked(channel: str, items: np.ndarray, scores: np.ndarray) -> ChannelList:
    return ChannelList(channel, np.asarray(items, dtype=np.int64), np.asarray(scores, dtype=np.float64))


def record_scope(bank: MemoryBank, scope: Scope) -> np.ndarray | None:
    """The records' part of ``scope``."""
    return None if scope is None else scope[: len(bank.records)]


def _top(scores: np.ndarray, budget: int, scope: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The ``budget`` best positive scores among the items in ``scope``."""
    return top_k_of_scores(scores if scope is None else np.where(scope, scores, 0.0), budget)


def record_recall(bank: MemoryBank, query: np.ndarray, budget: int, scope: Scope = None) -> ChannelList:
    """Direct record recall: the ``budget`` records most similar to the query (positive cosine)."""
    similarity = inner_products(bank.record_vectors, query)
    return _ranked("records", *_top(similarity, budget, record_scope(bank, scope)))


def turn_recall(bank: MemoryBank, query: np.ndarray, budget: int, scope: Scope = None) -> ChannelList:
    """Raw-turn recall: the ``budget`` turns most similar to the query, a turn that is a record's
    whole provenance standing for that record."""
    turns, scores = _top(inner_products(bank.turn_vectors, query), budget,
                         None if scope is None else scope[len(bank.records):])
    merged = np.where(bank.turn_record[turns] >= 0, bank.turn_record[turns], len(bank.records) + turns)
    return _ranked("turns", merged, scores)


def lexical_recall(bank: MemoryBank, text: str, budget: int, scope: Scope = None) -> ChannelList:
    """FTS5 ``bm25()`` over the conversation's active records (the user's own statistics)."""
    records = record_scope(bank, scope)
    within = None if records is None else np.flatnonzero(records).tolist()
    return _ranked("lexical", *bank.lexical.search(text, budget, within=within))


def code_recall(bank: MemoryBank, codes: Iterable[int], budget: int, scope: Scope = None) -> ChannelList:
    """The codebook path: the ``budget`` best S_amu records for the query's code set (in scope:
    the exact scores of every record, the walks' reference)."""
    if bank.topology is None:
        raise ValueError("the codebook channel needs a bank built with a fingerprinter or topology")
    records = record_scope(bank, scope)
    if records is None:
        return _ranked("code", *bank.topology.search(codes, budget))
    return _ranked("code", *_top(bank.topology.unit_scores(codes), budget, records))


def _specificity(bank: MemoryBank, node: int) -> float:
    """How specific a node is, in (0, 1]: log(1 + R/|members|) / log(1 + R) over R records."""
    total = max(len(bank.records), 1)
    return math.log1p(total / max(bank.node_members[node].size, 1)) / math.log1p(total)


def _expand(bank: MemoryBank, channel: str, matched: dict[int, float], query: np.ndarray,
            budget: int, scope: Scope) -> ChannelList:
    """Records (in scope) of the matched nodes, each scoring the sum of its nodes' weights (match
    score x specificity) plus :data:`NODE_RELEVANCE` x its cosine to the query."""
    if not matched:
        return ChannelList(channel, *empty_result())
    scores = np.zeros(len(bank.records), dtype=np.float64)
    reached = np.zeros(len(bank.records), dtype=bool)
    for node, match in sorted(matched.items()):
        members = bank.node_members[node]
        scores[members] += match * _specificity(bank, node)
        reached[members] = True
    in_scope = record_scope(bank, scope)
    records = np.flatnonzero(reached if in_scope is None else reached & in_scope)
    relevance = scores[records] + NODE_RELEVANCE * inner_products(bank.record_vectors, query, records)
    items, best = select_top_k(records, relevance, budget)
    return ChannelList(channel, items, best,
                       _via(bank, [(node, bank.node_members[node]) for node in sorted(matched)], items))


def _via(bank: MemoryBank, reached: list[tuple[int, np.ndarray]],
         items: np.ndarray) -> dict[int, tuple[str, ...]]:
    """Per listed item, the names of the nodes it was reached through: the ``reached`` (node,
    members) pairs in their order, a node named once per time the item is among its members. Only
    the listed items are named, found in each node's members by one lookup in a mask of the listed
    records (a speaker's node may reach most of the bank; a set test per node costs more)."""
    via: dict[int, list[str]] = {int(item): [] for item in items}
    listed = np.zeros(len(bank.records), dtype=bool)
    listed[items] = True
    for node, members in reached:
        name = bank.nodes[node].name
        for record in members[listed[members]].tolist():
            via[record].append(name)
    return {item: tuple(names) for item, names in via.items()}


def node_recall(bank: MemoryBank, route: Route, query: np.ndarray, budget: int,
                scope: Scope = None) -> ChannelList:
    """Evidence-node recall: exact matches (score 1) of the route's entities, topics and their
    pairs, and the :data:`NODE_MATCHES` searchable nodes most similar to the query (score =
    cosine), expanded to their records."""
    entities = [normalise_key(e) for e in route.entities]
    topics = [normalise_key(t) for t in route.topics]
    keys = [("entity", e) for e in entities] + [("topic", t) for t in topics]
    keys += [("entity_topic", f"{e}{PAIR_SEPARATOR}{t}") for e in entities for t in topics]
    matched = {node: 1.0 for node in (bank.node(kind, key) for kind, key in keys) if node is not None}
    for node, cosine in _nearest_nodes(bank, query, scope):
        matched[node] = max(matched.get(node, 0.0), cosine)
    return _expand(bank, "nodes", matched, query, budget, scope)


def _nearest_nodes(bank: MemoryBank, query: np.ndarray, scope: Scope) -> list[tuple[int, float]]:
    """The :data:`NODE_MATCHES` searchable nodes most similar to the query (positive cosine, ties
    by order) with their cosines; with a ``scope``, among the nodes with a record in it (the
    filter before the cut: nodes of other sessions would take the places and reach nothing)."""
    if not bank.searchable.size:
        return []
    similarity = inner_products(bank.node_vectors, query)
    records = record_scope(bank, scope)
    if records is None:
        order, cosines = top_k_of_scores(similarity, NODE_MATCHES)
        return [(int(bank.searchable[p]), c) for p, c in zip(order.tolist(), cosines.tolist(), strict=True)]
    positive = np.flatnonzero(similarity > 0)
    found: list[tuple[int, float]] = []
    for position in positive[np.lexsort((positive, -similarity[positive]))].tolist():
        node = int(bank.searchable[position])
        if records[bank.node_members[node]].any():
            found.append((node, float(similarity[position])))
            if len(found) == NODE_MATCHES:
                break
    return found


def temporal_recall(bank: MemoryBank, time: TimeConstraint, query: np.ndarray,
                    budget: int, scope: Scope = None) -> ChannelList:
    """Temporal recall: records with a day key inside the range score 1; month keys overlapping
    the range count in full for a range of :data:`MONTH_DAYS` days or more, else at 0.5 and only
    for records dated to the month alone (a record dated to another day of that month is not a
    match). Records add :data:`NODE_RELEVANCE` x their cosine to the query, which orders ties."""
    start, end = time_interval(time.start)[0], time_interval(time.end)[1]
    low, high = start.date().isoformat(), end.date().isoformat()
    long_range = (end - start).days + 1 >= MONTH_DAYS
    temporal = [(key, node) for (kind, key), node in bank.node_lookup.items() if kind == "temporal"]
    dated_to_day = np.zeros(len(bank.records), dtype=bool)
    for key, node in temporal:
        if len(key) == 10:
            dated_to_day[bank.node_members[node]] = True
    weight = np.zeros(len(bank.records), dtype=np.float64)
    reached: list[tuple[int, np.ndarray]] = []
    for key, node in temporal:
        members = bank.node_members[node]
        if len(key) == 10 and low <= key <= high:
            value = 1.0
        elif len(key) == 7 and low[:7] <= key <= high[:7]:
            value = 1.0 if long_range else 0.5
            members = members if long_range else members[~dated_to_day[members]]
        else:
            continue
        weight[members] = np.maximum(weight[members], value)
        reached.append((node, members))
    in_scope = record_scope(bank, scope)
    records = np.flatnonzero(weight > 0 if in_scope is None else (weight > 0) & in_scope)
    if records.size == 0:
        return ChannelList("temporal", *empty_result())
    relevance = weight[records] + NODE_RELEVANCE * inner_products(bank.record_vectors, query, records)
    items, scores = select_top_k(records, relevance, budget)
    return ChannelList("temporal", items, scores, _via(bank, reached, items))
