"""One user's search snapshot: the :class:`retrieval.multi_route.bank.MemoryBank` that multi-route
retrieval reads, built once from the store (cached arrays: SELECTs, no model forward) and then
extended in place as turns and segments are added, so a search never rebuilds it from SQL.

Growth is amortised: the vector matrices keep spare rows (capacity doubles), and the bank's
arrays are views of their filled part. The codebook topology is built from the fingerprints the
store holds (the code set of a sequence is the set of its codes) and grows by
:meth:`isq.topology.CooccurrenceTopology.add`. Queries are embedded and fingerprinted by the raw
models, never written to the store's caches: a query leaves no trace in the store.

Deletion and consolidation remove records, which would renumber every item: the memory drops the
user's snapshot then and the next search builds it again (:mod:`retrieval.api.states` keeps the
snapshots fresh against other connections' commits and bounded in size).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from isq.topology import CooccurrenceTopology, TopologyParams
from retrieval.index.evidence_nodes import SEARCHABLE_TYPES, searchable_text
from retrieval.memory.records import AMU, Turn
from retrieval.memory.store import AMUStore
from retrieval.multi_route.bank import MemoryBank
from retrieval.multi_route.planner_rules import PlanContext
from retrieval.multi_route.retriever import MultiRouteRetriever

ITEM_BYTES = 2048
"""The estimated bytes of one record, raw turn or evidence node of a snapshot besides its vector
and the lexical table (both measured apart): its text, Python objects and cached selection
signature (tracemalloc over a 300-turn user after one search: about 2.2 KiB an item)."""


class GrowingRows:
    """A float32 matrix with spare rows: appending is amortised O(rows added)."""

    def __init__(self, initial: np.ndarray) -> None:
        self._data = np.array(initial, dtype=np.float32, ndmin=2)
        self.size = len(initial)

    @property
    def nbytes(self) -> int:
        """Bytes held, spare rows included."""
        return int(self._data.nbytes)

    def extend(self, rows: np.ndarray) -> np.ndarray:
        """Append ``rows``; returns the filled part (a view)."""
        rows = np.asarray(rows, dtype=np.float32)
        if self.size + len(rows) > len(self._data):
            grown = np.zeros((max(2 * len(self._data), self.size + len(rows), 64), self._data.shape[1]),
                             dtype=np.float32)
            grown[: self.size] = self._data[: self.size]
            self._data = grown
        self._data[self.size : self.size + len(rows)] = rows
        self.size += len(rows)
        return self._data[: self.size]


class Snapshot:
    """A user's bank and what extending it needs (see the module docstring)."""

    def __init__(self, bank: MemoryBank, embedder: Any) -> None:
        self.bank, self.embedder = bank, embedder
        self._records = GrowingRows(bank.record_vectors)
        self._turns = GrowingRows(bank.turn_vectors)
        self._nodes = GrowingRows(bank.node_vectors)
        self._turn_index = {turn.turn_id: j for j, turn in enumerate(bank.turns)}
        self._retriever: MultiRouteRetriever | None = None

    def size_bytes(self) -> int:
        """An estimate of the memory the snapshot holds: its vectors (spare rows included), the
        lexical table's pages, the topology's sparse arrays and :data:`ITEM_BYTES` per item."""
        bank = self.bank
        items = len(bank.records) + len(bank.turns) + len(bank.nodes)
        return (self._records.nbytes + self._turns.nbytes + self._nodes.nbytes + bank.lexical.size_bytes()
                + (bank.topology.nbytes if bank.topology is not None else 0) + ITEM_BYTES * items)

    def retriever(self, planner: Any | None, reranker: Any | None) -> MultiRouteRetriever:
        """The snapshot's retriever, kept between searches (it caches each item's selection
        signature); a new one after the snapshot grew, since growth renumbers the raw turns."""
        if self._retriever is None:
            self._retriever = MultiRouteRetriever(self.bank, planner, reranker, plan_depth=0)
        return self._retriever

    @classmethod
    def build(cls, store: AMUStore, user: str, embedder: Any, query_embedder: Any,
              fingerprinter: Any | None) -> Snapshot:
        """The user's snapshot over the store's active records and every stored turn. ``embedder``
        is the store-cached one; queries go through ``query_embedder`` and ``fingerprinter``."""
        records = list(store.amus(user))
        topology = None
        if fingerprinter is not None:
            topology = CooccurrenceTopology(fingerprinter.codebook_size, TopologyParams(),
                                            fingerprinter.identity)
            topology.add(code_sets(records, fingerprinter))
        bank = MemoryBank.build(store, user, embedder, records=records, topology=topology,
                                    fingerprinter=fingerprinter)
        bank.embedder = query_embedder
        return cls(bank, embedder)

    def add_turns(self, turns: Sequence[Turn]) -> None:
        """Stored turns join the raw-turn channel at once (their vectors go to the store's cache)."""
        if not turns:
            return
        bank, self._retriever = self.bank, None
        vectors = self.embedder.encode([turn.render() for turn in turns])
        for turn in turns:
            self._turn_index[turn.turn_id] = len(bank.turns)
            bank.turns.append(turn)
        bank.turn_vectors = self._turns.extend(vectors)
        bank.turn_record = np.concatenate([bank.turn_record, np.full(len(turns), -1, dtype=np.int64)])
        times = [turn.session_time for turn in turns if turn.session_time is not None]
        context = bank.context
        bank.context = dataclasses.replace(
            context, participants=tuple(dict.fromkeys([*context.participants, *(t.speaker for t in turns)])),
            now=max([*times, *([context.now] if context.now else [])]) if times else context.now)

    def add_records(self, store: AMUStore, amus: Sequence[AMU]) -> None:
        """A committed segment's active records join every channel (records, turns merged into a
        record, evidence nodes, lexical positions, the topology, the planner's keys)."""
        amus = [amu for amu in amus if not amu.archived]
        if not amus:
            return
        bank, self._retriever = self.bank, None
        first = len(bank.records)
        bank.records.extend(amus)
        bank.record_vectors = self._records.extend(self.embedder.encode([amu.text for amu in amus]))
        bank.lexical.add_records(amus)
        for offset, amu in enumerate(amus):
            if len(amu.source.turn_ids) == 1:
                j = self._turn_index.get(amu.source.turn_ids[0])
                if j is not None and bank.turn_record[j] < 0:
                    bank.turn_record[j] = first + offset
        if bank.topology is not None and bank.fingerprinter is not None:
            bank.topology.add(code_sets(amus, bank.fingerprinter))
        self._add_nodes(store, [amu.id for amu in amus])

    def _add_nodes(self, store: AMUStore, amu_ids: Sequence[str]) -> None:
        bank = self.bank
        new_searchable: list[int] = []
        for node, amu_id in store.node_links(amu_ids):
            record = bank.lexical.position[amu_id]
            index = bank.node_lookup.get((node.node_type, node.key))
            if index is None:
                index = len(bank.nodes)
                bank.node_lookup[(node.node_type, node.key)] = index
                bank.nodes.append(node)
                bank.node_members.append(np.array([record], dtype=np.int64))
                if node.node_type in SEARCHABLE_TYPES:
                    new_searchable.append(index)
            else:
                bank.nodes[index] = dataclasses.replace(bank.nodes[index],
                                                        amu_ids=bank.nodes[index].amu_ids + (amu_id,))
                bank.node_members[index] = np.append(bank.node_members[index], record)
        if new_searchable:
            texts = [searchable_text(bank.nodes[i].node_type, bank.nodes[i].text,
                                     [bank.records[r].text for r in bank.node_members[i]])
                     for i in new_searchable]
            bank.node_vectors = self._nodes.extend(self.embedder.encode(texts))
            bank.searchable = np.concatenate([bank.searchable, np.array(new_searchable, dtype=np.int64)])
        keys = {kind: {key for (node_type, key) in bank.node_lookup if node_type == kind}
                for kind in ("entity", "topic")}
        bank.context = PlanContext(bank.context.participants, frozenset(keys["entity"]),
                                   frozenset(keys["topic"]), bank.context.now)


def code_sets(records: Sequence[AMU], fingerprinter: Any) -> list[frozenset[int]]:
    """Each record's code set U_fp: the stored fingerprint, or, for a record stored without one (a
    store built before it had a fingerprinter), its text fingerprinted now."""
    sets = [frozenset(amu.fingerprint or ()) for amu in records]
    unprinted = [i for i, amu in enumerate(records) if not amu.fingerprint]
    if unprinted:
        for i, printed in zip(unprinted, fingerprinter.fingerprint([records[i].text for i in unprinted]),
                              strict=True):
            sets[i] = frozenset(printed.codes)
    return sets
