"""Memory construction for the evaluation: one retrieval bank per conversation and codebook, and
the construction-cost ledger of the store."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from isq.fingerprint import Fingerprinter
from isq.topology import TopologyParams
from retrieval.api.bulk import add_conversation
from retrieval.api.memory import Memory
from retrieval.eval.locomo import LocomoConversation
from retrieval.eval.metrics import mean
from retrieval.extract.base import Extractor
from retrieval.index.embed import Embedder
from retrieval.memory.cache import CachedFingerprinter
from retrieval.memory.ingest import IngestStats, ingest_turns
from retrieval.memory.records import AMU
from retrieval.memory.store import AMUStore
from retrieval.retriever import DualPathRetriever, Lexical
from retrieval.routes.retriever import MultiRouteRetriever

STORE_DIR = "store"


@dataclass
class ConversationBank:
    """One conversation's AMUs, its dual-path retrievers (one per codebook, same AMU order) and,
    for the multi-route configurations, its multi-route retriever."""

    amus: list[AMU]
    retrievers: dict[str, DualPathRetriever]
    routes: MultiRouteRetriever | None = None

    @property
    def coverable(self) -> set[str]:
        """Turn ids that some AMU points to: the most any retrieval can cover."""
        return {turn_id for amu in self.amus for turn_id in amu.source.turn_ids}


class ConstructionLedger:
    """Construction cost per conversation, kept in the store (meta ``construction:<id>``) and
    summed over the runs that built parts of it, so a rerun that reuses the store still reports
    what building it cost. (Which extractor and embedder built it, the store itself binds.)"""

    def __init__(self, store: AMUStore) -> None:
        self.store = store

    def add(self, conversation_id: str, stats: IngestStats) -> None:
        if stats.segments == stats.resumed_segments + stats.retried_segments and not stats.amus:
            return  # everything came from the store: nothing was spent
        key = f"construction:{conversation_id}"
        entry = self.store.meta(key) or {"seconds": 0.0, "llm_calls": 0, "tokens": 0}
        entry["seconds"] += stats.wall_s
        entry["llm_calls"] += stats.llm.calls
        entry["tokens"] += stats.llm.tokens
        self.store.put_meta(key, entry)

    def total(self, conversation_ids: Iterable[str], key: str) -> float:
        return sum((self.store.meta(f"construction:{cid}") or {}).get(key, 0) for cid in conversation_ids)


def build_retriever(fingerprinter: Fingerprinter | CachedFingerprinter, amus: Sequence[AMU], embeddings: np.ndarray,
                    params: TopologyParams, lexical: Lexical | None = None) -> DualPathRetriever:
    """A dual-path bank over ``amus`` with their fingerprints by ``fingerprinter``; ``lexical`` is
    its BM25 channel (the store's FTS5 table over the same AMUs, in the evaluation)."""
    retriever = DualPathRetriever(embeddings.shape[1], fingerprinter.identity, params=params, lexical=lexical)
    prints = fingerprinter.fingerprint([amu.text for amu in amus])
    sources = [{"session_id": amu.source.session_id, "turn_ids": list(amu.source.turn_ids)} for amu in amus]
    retriever.add([amu.id for amu in amus], [amu.text for amu in amus], embeddings,
                  [fp.codes for fp in prints], sources, [fp.token_codes for fp in prints])
    retriever.topology.prepare()
    return retriever


def codebook_diagnostics(fingerprinter: Fingerprinter | CachedFingerprinter, banks: Sequence[ConversationBank], codebook: str,
                         query_codes: Sequence[frozenset[int]]) -> dict[str, Any]:
    """How the codebook spreads over the AMU banks: codes in use, codes per AMU and query, and
    how generic the codes are (a code in every AMU has IDF 0 and cannot discriminate)."""
    used: set[int] = set()
    per_amu, df_share, generic = [], [], []
    for bank in banks:
        topology = bank.retrievers[codebook].topology
        incidence = topology.incidence
        doc_freq = topology.doc_freq
        units = max(topology.num_units, 1)
        used.update(np.flatnonzero(doc_freq).tolist())
        per_amu += np.diff(incidence.indptr).tolist()
        df_share += (doc_freq[incidence.indices] / units).tolist()
        generic.append(int((doc_freq >= 0.5 * units).sum()))
    return {
        "codebook_size": fingerprinter.codebook_size,
        "codes_used": len(used),
        "utilisation": len(used) / fingerprinter.codebook_size,
        "mean_codes_per_amu": mean(per_amu),
        "mean_codes_per_query": mean([len(codes) for codes in query_codes]),
        "mean_amu_share_per_code": mean(df_share),
        "codes_in_half_the_amus": mean(generic),
    }


def ingest_locomo_conversation(conversation: LocomoConversation, store: AMUStore, embedder: Embedder,
                               extractor: Extractor, **options: Any) -> IngestStats:
    """Ingest one LoCoMo conversation, sessions in order (keyword options as :func:`ingest_turns`)."""
    return ingest_turns(conversation.turns, store, embedder, extractor,
                        participants={conversation.conversation_id: conversation.participants}, **options)


def open_memory(directory: Path, embedder: Embedder, extractor: Extractor, *, read_only: bool = False) -> Memory:
    """The evaluation's memory: records without fingerprints (each codebook fingerprints them
    itself, cached in the store), so one store serves every fingerprinter."""
    return Memory.open(directory, embedder=embedder, extractor=extractor, read_only=read_only)


def add_locomo_conversation(conversation: LocomoConversation, memory: Memory) -> IngestStats:
    """Build one LoCoMo conversation's memory the way users do, through :meth:`Memory.add`
    (:func:`retrieval.api.bulk.add_conversation`): the conversation is a user."""
    return add_conversation(memory, conversation.turns)
