"""One conversation's memory as multi-route retrieval reads it (LycheeMemory section 3.4): the
active records with their embeddings, the raw turns with theirs, the evidence nodes with their
members and the embeddings of the searchable ones, the lexical channel over the records (an FTS5
table of the user's own, :class:`retrieval.index.fts.RecordLexical`) and, optionally, the
codebook topology over the same records.

Items are numbered: record i is item i, raw turn j is item ``len(records) + j``. A raw turn
that is the whole provenance of a record is the same evidence as that record: raw-turn recall
returns that record instead (Algorithm B.2 line 12, "merge duplicate candidates"), so the
final list never spends two items on one turn that way. Every array comes through the store's
caches (:class:`retrieval.memory.cache.CachedEmbedder`), so a bank over a built store costs
SELECTs, not model forwards (ingestion embedded the turns, records and node texts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from isq.topology import CooccurrenceTopology, TopologyParams
from retrieval.index.evidence_nodes import SEARCHABLE_TYPES, searchable_text
from retrieval.index.fts import RecordLexical
from retrieval.memory.indexing import EvidenceNode
from retrieval.memory.protocols import Embedder, TextFingerprinter
from retrieval.memory.records import AMU, Turn, raw_turn_id
from retrieval.memory.store import AMUStore
from retrieval.multi_route.planner_rules import PlanContext


@dataclass
class MemoryBank:
    """See the module docstring. ``embedder`` and ``fingerprinter`` encode queries (cached)."""

    user_id: str
    records: list[AMU]
    record_vectors: np.ndarray
    turns: list[Turn]
    turn_vectors: np.ndarray
    turn_record: np.ndarray
    nodes: list[EvidenceNode]
    node_members: list[np.ndarray]
    node_lookup: dict[tuple[str, str], int]
    searchable: np.ndarray
    node_vectors: np.ndarray
    lexical: RecordLexical
    embedder: Embedder
    context: PlanContext
    topology: CooccurrenceTopology | None = None
    fingerprinter: TextFingerprinter | None = None

    @property
    def size(self) -> int:
        """Number of items: records, then raw turns."""
        return len(self.records) + len(self.turns)

    def is_record(self, item: int) -> bool:
        return item < len(self.records)

    def text(self, item: int) -> str:
        return (self.records[item].text if self.is_record(item)
                else self.turns[item - len(self.records)].render())

    def source(self, item: int) -> dict[str, Any]:
        """Provenance in the evaluation's form: session id and turn ids (a raw turn covers itself)."""
        if self.is_record(item):
            src = self.records[item].source
            return {"session_id": src.session_id, "turn_ids": list(src.turn_ids)}
        turn = self.turns[item - len(self.records)]
        return {"session_id": turn.session_id, "turn_ids": [turn.turn_id]}

    def item_id(self, item: int) -> str:
        """A record's AMU id; ``<user>:turn:<turn id>`` for a raw turn."""
        if self.is_record(item):
            return self.records[item].id
        return raw_turn_id(self.user_id, self.turns[item - len(self.records)].turn_id)

    @classmethod
    def build(cls, store: AMUStore, user_id: str, embedder: Embedder, *,
              records: Sequence[AMU] | None = None,
              record_vectors: np.ndarray | None = None, topology: CooccurrenceTopology | None = None,
              fingerprinter: TextFingerprinter | None = None,
              topology_params: TopologyParams = TopologyParams()) -> MemoryBank:
        """The bank of one stored conversation. ``records`` / ``record_vectors`` / ``topology``
        may be passed when the caller has them (same active records, same order); with a
        ``fingerprinter`` and no ``topology`` the codebook topology is built here."""
        records = list(store.amus(user_id)) if records is None else list(records)
        if record_vectors is None:
            record_vectors = embedder.encode([amu.text for amu in records])
        turns = store.turns(user_id)
        turn_vectors = embedder.encode([turn.render() for turn in turns])
        index = {amu.id: i for i, amu in enumerate(records)}
        single: dict[str, int] = {}
        for i, amu in enumerate(records):
            if len(amu.source.turn_ids) == 1:
                single.setdefault(amu.source.turn_ids[0], i)
        turn_record = np.array([single.get(turn.turn_id, -1) for turn in turns], dtype=np.int64)
        nodes = store.evidence_nodes(user_id)
        members = [np.array([index[amu_id] for amu_id in node.amu_ids if amu_id in index], dtype=np.int64)
                   for node in nodes]
        searchable = np.array([i for i, node in enumerate(nodes) if node.node_type in SEARCHABLE_TYPES],
                              dtype=np.int64)
        node_texts = [searchable_text(nodes[i].node_type, nodes[i].text,
                                      [records[r].text for r in members[i]])
                      for i in searchable]
        node_vectors = embedder.encode(node_texts) if node_texts else np.zeros((0, record_vectors.shape[1]),
                                                                                 dtype=np.float32)
        if topology is None and fingerprinter is not None:
            topology = CooccurrenceTopology(fingerprinter.codebook_size, topology_params,
                                            fingerprinter.identity)
            topology.add([fp.codes for fp in fingerprinter.fingerprint([amu.text for amu in records])])
        times = [turn.session_time for turn in turns if turn.session_time is not None]
        context = PlanContext(
            participants=tuple(dict.fromkeys(turn.speaker for turn in turns)),
            entity_keys=frozenset(node.key for node in nodes if node.node_type == "entity"),
            topic_keys=frozenset(node.key for node in nodes if node.node_type == "topic"),
            now=max(times) if times else None)
        return cls(user_id, records, np.asarray(record_vectors, dtype=np.float32), turns,
                   np.asarray(turn_vectors, dtype=np.float32), turn_record, nodes, members,
                   {(node.node_type, node.key): i for i, node in enumerate(nodes)}, searchable,
                   np.asarray(node_vectors, dtype=np.float32),
                   RecordLexical(records), embedder, context,
                   topology, fingerprinter)

    def node(self, node_type: str, key: str) -> int | None:
        """The index of the node ``node_type:key`` (a normalised key), if the conversation has it."""
        return self.node_lookup.get((node_type, key))

