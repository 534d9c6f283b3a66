"""One conversation's memory as multi-route retrieval reads it (LycheeMemory section 3.4): the
active records with their embeddings, the raw turns with theirs, the evidence nodes with their
members and the embeddings of the searchable ones, the lexical channel over the records (an FTS5
table of the user's own, :class:`retrieval.index.fts.RecordLexical`) and, optionally, the
codebook topology over the same records.

Items are numbered: record i is item i, raw turn j is item ``len(records) + j``. A raw turn
that is the whole provenance of a record is the same evidence as that record: raw-turn recall
returns that record instead (Algorithm B.2 line 12, "merge duplicate candidates"), so the
final list never spends two items on one turn that way; a record of several turns (a merge's
among them) leaves each of its turns an item of its own, which may be selected beside it. A raw
turn no committed segment covers yet is *open* (:attr:`MemoryBank.open_turns`): its records are
still to be written, and the retriever lets it stand in for them
(:func:`retrieval.multi_route.fusion.stand_in`) unless it is small talk, of which no record will
be written (:meth:`MemoryBank.stands_in`).

Built once from the store, a bank then owns its growth: :meth:`MemoryBank.add_turns` and
:meth:`MemoryBank.add_records` extend it in place as turns and segments are stored, so a search
never rebuilds it from SQL. Every stored text's vector comes through the store's cache
(``embedder``, a :class:`retrieval.memory.cache.CachedEmbedder`), read back as one matrix, so a
bank over a built store costs SELECTs, not model forwards; the codebook topology is built from
the fingerprints the store holds (the code set of a sequence is the set of its codes). Queries go
through ``query_embedder`` and ``fingerprinter`` (the raw models in the memory API, so a query
leaves no trace in the store). The vector matrices keep spare rows (capacity doubles) and the
bank's arrays are views of their filled part. Deletion and consolidation remove records, which
would renumber every item: the memory drops the bank then and the next search builds it again
(:mod:`retrieval.api.states`).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

import numpy as np

from isq.topology import CooccurrenceTopology, TopologyParams
from retrieval.extract.rules import content_words, is_informative
from retrieval.index.evidence_nodes import SEARCHABLE_TYPES, searchable_text
from retrieval.index.fts import RecordLexical
from retrieval.memory.evidence_keys import normalise_key
from retrieval.memory.indexing import EvidenceNode
from retrieval.memory.protocols import Embedder, TextFingerprinter
from retrieval.memory.records import AMU, Turn, raw_turn_id
from retrieval.memory.store_contract import Store
from retrieval.multi_route.collector import collector_paused
from retrieval.multi_route.growing import GrowingFlags, GrowingInts, GrowingRows
from retrieval.multi_route.planner_rules import PlanContext

ITEM_BYTES = 2048
"""The estimated bytes of one record, raw turn or evidence node of a bank besides its vector
and the lexical table (both measured apart): its text, Python objects and cached selection
signature (tracemalloc over a 300-turn user after one search: about 2.2 KiB an item)."""


class MemoryBank:
    """See the module docstring; build one with :meth:`build` (``topology``, when given, already
    holds ``records``; ``record_vectors`` become the bank's own; ``query_embedder`` defaults to
    ``embedder``)."""

    def __init__(self, store: Store, user_id: str, embedder: Embedder, records: Sequence[AMU],
                 record_vectors: np.ndarray, *, query_embedder: Embedder | None,
                 topology: CooccurrenceTopology | None, fingerprinter: TextFingerprinter | None) -> None:
        self.user_id, self.embedder = user_id, embedder
        self.query_embedder = embedder if query_embedder is None else query_embedder
        self.topology: CooccurrenceTopology | None = None  # set below: it holds ``records`` already
        self.fingerprinter = fingerprinter
        self.records: list[AMU] = []
        self.turns: list[Turn] = []
        self.nodes: list[EvidenceNode] = []
        self.node_members: list[np.ndarray] = []
        self.node_lookup: dict[tuple[str, str], int] = {}
        self.lexical = RecordLexical()
        self.context = PlanContext(participants=(), entity_keys=frozenset(), topic_keys=frozenset(), now=None,
                                   user=user_id)
        dim = embedder.dim
        self._record_rows, self._turn_rows, self._node_rows = (GrowingRows(dim) for _ in range(3))
        self._turn_record, self._searchable, self._turn_open = GrowingInts(), GrowingInts(), GrowingFlags()
        self._record_sessions, self._turn_sessions = GrowingInts(), GrowingInts()
        self._sessions: dict[str, int] = {}
        self._turn_index: dict[str, int] = {}
        self._latest: datetime | None = None  # the latest session time (UTC) of the bank's turns
        self._signatures: dict[int, dict[str, frozenset[str]]] = {}
        self.add_turns(store.turns(user_id))
        self.open_only(store.uncovered_turn_ids(user_id))
        self._add_records(records, record_vectors, store.evidence_nodes(user_id))
        self.topology = topology

    @classmethod
    def build(cls, store: Store, user_id: str, embedder: Embedder, *,
              records: Sequence[AMU] | None = None, record_vectors: np.ndarray | None = None,
              query_embedder: Embedder | None = None, topology: CooccurrenceTopology | None = None,
              fingerprinter: TextFingerprinter | None = None,
              topology_params: TopologyParams = TopologyParams()) -> MemoryBank:
        """The bank of one stored conversation: its active records and every stored turn.
        ``records`` / ``record_vectors`` / ``topology`` may be passed when the caller has them
        (same active records, same order); with a ``fingerprinter`` and no ``topology`` the
        codebook topology is built here from the records' stored fingerprints. The garbage
        collector is paused meanwhile (:mod:`retrieval.multi_route.collector`)."""
        with collector_paused():
            records = list(store.amus(user_id)) if records is None else list(records)
            record_vectors = (embedder.encode([amu.text for amu in records]) if record_vectors is None
                              else np.array(record_vectors, dtype=np.float32))  # the bank's own copy
            if topology is None and fingerprinter is not None:
                topology = CooccurrenceTopology(fingerprinter.codebook_size, topology_params,
                                                fingerprinter.identity)
                topology.add_incidence(*code_incidence(records, fingerprinter))
            return cls(store, user_id, embedder, records, record_vectors, query_embedder=query_embedder,
                       topology=topology, fingerprinter=fingerprinter)

    # ------------------------------------------------------------------ reading

    @property
    def record_vectors(self) -> np.ndarray:
        return self._record_rows.view

    @property
    def turn_vectors(self) -> np.ndarray:
        return self._turn_rows.view

    @property
    def node_vectors(self) -> np.ndarray:
        """The embeddings of the searchable nodes, in the order of :attr:`searchable`."""
        return self._node_rows.view

    @property
    def turn_record(self) -> np.ndarray:
        """Per raw turn, the record it is the whole provenance of, or -1."""
        return self._turn_record.view

    @property
    def open_turns(self) -> np.ndarray:
        """Per raw turn, whether it is open: stored, in no committed segment (as far as the bank
        was told: :meth:`add_turns` opens, :meth:`close_turns` and :meth:`open_only` close). The
        bank's own array, to read."""
        return self._turn_open.view

    def stands_in(self, item: int) -> bool:
        """Whether ``item`` is an open raw turn that will have records: not small talk (no image
        and fewer than two content words, :func:`retrieval.extract.rules.is_informative`, the
        turns the rule extractor makes no record of and the LLM extractor is told to skip)."""
        j = item - len(self.records)
        return (j >= 0 and bool(self._turn_open.view[j])
                and is_informative(self.turns[j], self.context.participants))

    @property
    def searchable(self) -> np.ndarray:
        """The indices of the nodes whose embeddings node recall searches."""
        return self._searchable.view

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

    def node(self, node_type: str, key: str) -> int | None:
        """The index of the node ``node_type:key`` (a normalised key), if the conversation has it."""
        return self.node_lookup.get((node_type, key))

    def session_mask(self, session: str) -> np.ndarray:
        """The items (records, then raw turns) of one session, as a boolean mask."""
        number = self._sessions.get(session, -1)
        return np.concatenate([self._record_sessions.view == number, self._turn_sessions.view == number])

    def with_codebook(self, topology: CooccurrenceTopology | None,
                      fingerprinter: TextFingerprinter | None) -> MemoryBank:
        """The same bank (its arrays shared, for reading) searched with another codebook."""
        view = copy.copy(self)
        view.topology, view.fingerprinter = topology, fingerprinter
        return view

    def size_bytes(self) -> int:
        """An estimate of the memory the bank holds: its vectors (spare rows included), the
        lexical table's pages, the topology's sparse arrays and :data:`ITEM_BYTES` per item."""
        items = len(self.records) + len(self.turns) + len(self.nodes)
        vectors = self._record_rows.nbytes + self._turn_rows.nbytes + self._node_rows.nbytes
        topology = self.topology.nbytes if self.topology is not None else 0
        return vectors + self.lexical.size_bytes() + topology + ITEM_BYTES * items

    def signature(self, item: int) -> dict[str, frozenset[str]]:
        """The item's session, entities, turns and text tokens: the fixed part of its selection
        signature (:mod:`retrieval.multi_route.selection`), kept between searches until records
        are added (they renumber the raw turns; turns added after the others renumber nothing)."""
        static = self._signatures.get(item)
        if static is None:
            source = self.source(item)
            entities = self.records[item].entities if self.is_record(item) else ()
            static = {"session": frozenset([source["session_id"]]),
                      "entities": frozenset(normalise_key(e) for e in entities),
                      "turns": frozenset(source["turn_ids"]),
                      "tokens": frozenset(content_words(self.text(item), set()))}
            self._signatures[item] = static
        return static

    # ------------------------------------------------------------------ growing

    def add_turns(self, turns: Sequence[Turn]) -> None:
        """Stored turns join the raw-turn channel at once (their vectors go to the store's cache)."""
        if not turns:
            return
        self._turn_rows.extend(self.embedder.encode([turn.render() for turn in turns]), fresh=True)
        for turn in turns:
            self._turn_index[turn.turn_id] = len(self.turns)
            self.turns.append(turn)
        self._turn_record.extend(np.full(len(turns), -1, dtype=np.int64), fresh=True)
        self._turn_open.extend(np.ones(len(turns), dtype=bool), fresh=True)
        self._turn_sessions.extend(self._session_numbers(turn.session_id for turn in turns), fresh=True)
        context = self.context
        stamped = [(turn.session_time, turn) for turn in turns if turn.session_time is not None]
        if stamped:
            when, latest = max(stamped, key=lambda pair: pair[0])
            if self._latest is None or when > self._latest:
                # the latest session on its speaker's clock: a question's "yesterday" is that
                # speaker's day, as the records' relative dates are (README, "Times and dates")
                self._latest, context = when, dataclasses.replace(context, now=latest.local_time)
        self.context = dataclasses.replace(
            context, participants=tuple(dict.fromkeys([*context.participants, *(t.speaker for t in turns)])))

    def close_turns(self, turn_ids: Sequence[str]) -> None:
        """A committed segment covers these turns: they are no longer open."""
        opened = self._turn_open.view
        for turn_id in turn_ids:
            j = self._turn_index.get(turn_id)
            if j is not None:
                opened[j] = False

    def open_only(self, turn_ids: Collection[str]) -> None:
        """Of the bank's turns, these alone are open (the store's ``uncovered_turn_ids``)."""
        opened = self._turn_open.view
        opened[:] = False
        for turn_id in turn_ids:
            j = self._turn_index.get(turn_id)
            if j is not None:
                opened[j] = True

    def add_records(self, store: Store, amus: Sequence[AMU]) -> None:
        """A committed segment's active records join every channel (records, turns merged into a
        record, evidence nodes, lexical positions, the topology, the planner's keys)."""
        amus = [amu for amu in amus if not amu.archived]
        if amus:
            self._add_records(amus, self.embedder.encode([amu.text for amu in amus]),
                              [node for node, _ in store.node_links([amu.id for amu in amus])])

    def _add_records(self, amus: Sequence[AMU], vectors: np.ndarray, nodes: Sequence[EvidenceNode]) -> None:
        self._signatures = {}
        first = len(self.records)
        self.records.extend(amus)
        self._record_rows.extend(vectors, fresh=True)
        self._record_sessions.extend(self._session_numbers(amu.source.session_id for amu in amus), fresh=True)
        self.lexical.add_records(amus)
        turn_record = self._turn_record.view
        for offset, amu in enumerate(amus):
            if len(amu.source.turn_ids) == 1:
                j = self._turn_index.get(amu.source.turn_ids[0])
                if j is not None and turn_record[j] < 0:
                    turn_record[j] = first + offset
        if self.topology is not None and self.fingerprinter is not None:
            self.topology.add_incidence(*code_incidence(amus, self.fingerprinter))
        self._add_nodes(nodes)

    def _add_nodes(self, nodes: Sequence[EvidenceNode]) -> None:
        """Evidence nodes of the records just added (a node already held gains their ids)."""
        position = self.lexical.position
        new_searchable: list[int] = []
        for node in nodes:
            members = [at for at in map(position.get, node.amu_ids) if at is not None]
            index = self.node_lookup.get((node.node_type, node.key))
            if index is None:
                index = len(self.nodes)
                self.node_lookup[(node.node_type, node.key)] = index
                self.nodes.append(node)
                self.node_members.append(np.array(members, dtype=np.int64))
                if node.node_type in SEARCHABLE_TYPES:
                    new_searchable.append(index)
            else:
                held = self.nodes[index]
                self.nodes[index] = dataclasses.replace(held, amu_ids=held.amu_ids + node.amu_ids)
                self.node_members[index] = np.append(self.node_members[index], members)
        if new_searchable:
            texts = [searchable_text(self.nodes[i].node_type, self.nodes[i].text,
                                     (self.records[r].text for r in self.node_members[i].tolist()))
                     for i in new_searchable]  # member texts read only where they are the text
            self._node_rows.extend(self.embedder.encode(texts), fresh=True)
            self._searchable.extend(np.array(new_searchable, dtype=np.int64), fresh=True)
        self.context = dataclasses.replace(
            self.context,
            entity_keys=self.context.entity_keys | {node.key for node in nodes if node.node_type == "entity"},
            topic_keys=self.context.topic_keys | {node.key for node in nodes if node.node_type == "topic"})

    def _session_numbers(self, sessions: Any) -> np.ndarray:
        numbers = self._sessions
        return np.array([numbers.setdefault(session, len(numbers)) for session in sessions], dtype=np.int64)


def code_incidence(records: Sequence[AMU], fingerprinter: TextFingerprinter) -> tuple[np.ndarray, np.ndarray]:
    """The records' code sets U_fp in CSR form (``indptr``, ``codes``; repeats allowed, a set
    counts each once): each stored fingerprint, or, for a record stored without one (a store
    built before it had a fingerprinter), its text fingerprinted now."""
    sequences: list[Sequence[int]] = [amu.fingerprint or () for amu in records]
    unprinted = [i for i, amu in enumerate(records) if not amu.fingerprint]
    if unprinted:
        for i, printed in zip(unprinted, fingerprinter.fingerprint([records[i].text for i in unprinted]),
                              strict=True):
            sequences[i] = sorted(printed.codes)
    lengths = np.fromiter((len(codes) for codes in sequences), dtype=np.int64, count=len(sequences))
    indptr = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    codes = np.fromiter(itertools.chain.from_iterable(sequences), dtype=np.int64, count=int(indptr[-1]))
    return indptr, codes
