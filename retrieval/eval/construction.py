"""Memory construction for the evaluation: one retrieval bank per conversation and codebook, and
the construction-cost ledger of the store."""

from __future__ import annotations

import argparse
import itertools
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from isq.topology import TopologyParams
from retrieval.api.bulk import add_conversation
from retrieval.api.memory import Memory
from retrieval.api.replay import difference
from retrieval.contract import Retriever
from retrieval.eval.configs import TRAINED, EvaluationError, RetrievalConfig
from retrieval.eval.dual_path import DualPath, DualPathRetriever, Lexical
from retrieval.eval.locomo import LocomoConversation
from retrieval.eval.metrics import mean
from retrieval.extract.base import Extractor
from retrieval.ingestion.pipeline import IngestStats
from retrieval.memory.meta_keys import CONSTRUCTION_KEY
from retrieval.memory.protocols import Embedder, TextFingerprinter
from retrieval.memory.records import AMU, Turn
from retrieval.memory.store_contract import Store
from retrieval.memory.targets import POSTGRES_SCHEMES, url_scheme
from retrieval.multi_route.retriever import MultiRouteRetriever

STORE_DIR = "store"


def database_url(text: str) -> str:
    """``--database``'s argparse type: a PostgreSQL URL, never a path (a path would quietly make a
    local SQLite store of that name)."""
    if url_scheme(text) not in POSTGRES_SCHEMES:
        raise argparse.ArgumentTypeError(f"not a PostgreSQL URL (postgresql://USER@HOST:PORT/DB): {text!r}")
    return text

logger = logging.getLogger(__name__)


@dataclass
class BuiltConversation:
    """One conversation as the evaluation built it: its AMUs, one dual-path bank per codebook
    (same AMU order) and one multi-route retriever per multi-route configuration."""

    amus: list[AMU]
    banks: dict[str, DualPathRetriever]
    multi: dict[str, MultiRouteRetriever] = field(default_factory=dict)

    @property
    def coverable(self) -> set[str]:
        """Turn ids that some AMU points to: the most any retrieval can cover."""
        return {turn_id for amu in self.amus for turn_id in amu.source.turn_ids}

    def retriever(self, config: RetrievalConfig, topology: TopologyParams | None = None) -> Retriever:
        """``config``'s retriever over this conversation; ``topology`` rescores Path B (a sweep)."""
        if config.dual is None:
            return self.multi[config.name]
        bank = self.banks[config.codebook or TRAINED]
        return DualPath(bank if topology is None else bank.with_topology_params(topology), config.dual)


class ConstructionLedger:
    """Construction cost per conversation, kept in the store (meta ``construction:<id>``) and
    summed over the runs that built parts of it, so a rerun that reuses the store still reports
    what building it cost. (Which extractor and embedder built it, the store itself binds.)"""

    def __init__(self, store: Store) -> None:
        self.store = store

    def add(self, conversation_id: str, stats: IngestStats) -> None:
        if stats.segments == stats.resumed_segments + stats.retried_segments and not stats.amus:
            return  # everything came from the store: nothing was spent
        key = CONSTRUCTION_KEY.format(conversation_id)
        entry = self.store.meta(key) or {"seconds": 0.0, "llm_calls": 0, "tokens": 0}
        entry["seconds"] += stats.wall_s
        entry["llm_calls"] += stats.llm.calls
        entry["tokens"] += stats.llm.tokens
        self.store.put_meta(key, entry)

    def unrecorded(self, conversation_ids: Iterable[str]) -> list[str]:
        """The conversations whose building cost no run recorded here (built outside the evaluation)."""
        return [cid for cid in conversation_ids if self.store.meta(CONSTRUCTION_KEY.format(cid)) is None]

    def total(self, conversation_ids: Iterable[str], key: str) -> float:
        return sum((self.store.meta(CONSTRUCTION_KEY.format(cid)) or {}).get(key, 0)
                   for cid in conversation_ids)


def build_retriever(fingerprinter: TextFingerprinter, amus: Sequence[AMU], embeddings: np.ndarray,
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


def codebook_diagnostics(fingerprinter: TextFingerprinter, banks: Sequence[BuiltConversation], codebook: str,
                         query_codes: Sequence[frozenset[int]]) -> dict[str, Any]:
    """How the codebook spreads over the AMU banks: codes in use, codes per AMU and query, and
    how generic the codes are (a code in every AMU has IDF 0 and cannot discriminate)."""
    used: set[int] = set()
    per_amu, df_share, generic = [], [], []
    for bank in banks:
        topology = bank.banks[codebook].topology
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


def open_memory(target: str | Path, embedder: Embedder, extractor: Extractor, operator: Any | None, *,
                read_only: bool) -> Memory:
    """The evaluation's memory: records without fingerprints (each codebook fingerprints them
    itself, cached in the store), so one store serves every fingerprinter. Written, it is bound to
    being consolidated or not; read-only (``--store``), it is evaluated as it was built."""
    if read_only and operator is not None:
        raise EvaluationError("--store evaluates a memory as built; consolidate it first "
                              "(Memory.consolidate)")
    memory = Memory.open(target, embedder=embedder, extractor=extractor, read_only=read_only)
    if not read_only:
        try:
            memory.store.bind("consolidation", "none" if operator is None else operator.name,
                              hint="evaluate consolidated and unconsolidated memory in two --out directories")
        except BaseException:
            memory.close()
            raise
    return memory


def add_locomo_conversation(conversation: LocomoConversation, memory: Memory,
                            ledger: ConstructionLedger) -> tuple[float, int]:
    """Build one LoCoMo conversation's memory the way users do, through :meth:`Memory.add`
    (:func:`retrieval.api.bulk.add_conversation`; the conversation is a user), its cost in the
    ledger; returns the seconds spent and the turns found stored (a rerun). A read-only memory
    (``--store``) is checked to hold the conversation as the file has it: the same turns, in the
    same order, each the same (:func:`retrieval.api.replay.difference`, as a rerun's add compares
    them)."""
    cid = conversation.conversation_id
    if memory.store.read_only:
        if cid not in memory.store.users_with_segments():
            raise EvaluationError(f"{memory.store.location} holds no memory of {cid!r}")
        _check_stored(memory.store, cid, conversation.turns)
        if waiting := memory.store.uncovered_turns(cid):
            # the evaluation searches records only: these turns would be missing from every answer
            raise EvaluationError(
                f"{memory.store.location}: {len(waiting)} turns of {cid} are stored but not yet taken "
                f"into its records (from {waiting[0].turn_id!r}; its ingestion stopped before them): finish "
                "it first (python -m retrieval.ingest on the same file and store resumes it; a served "
                "memory: flush the user), then evaluate it")
        return 0.0, 0
    logger.info("%s: adding %d turns through Memory.add", cid, len(conversation.turns))
    stats = IngestStats()
    try:
        add_conversation(memory, conversation.turns, stats=stats)
    finally:  # a run stopped half-way counts what it spent: the segments it committed stay built
        ledger.add(cid, stats)
    # a rerun replays the file's turns; turns of a longer file an earlier run built from would be
    # searched beside them, as distractors of every question
    own = "--database" if url_scheme(memory.store.location) in POSTGRES_SCHEMES else "--out"
    _check_stored(memory.store, cid, conversation.turns, f"give a run from another file its own {own}")
    return stats.wall_s, len(conversation.turns) - stats.turns


def _check_stored(store: Store, cid: str, turns: Sequence[Turn],
                  advice: str = "build it from this file (without --store)") -> None:
    """:class:`EvaluationError` naming the first turn in which the store's memory of ``cid`` and the
    LoCoMo file differ (a store built from another release or an edited file)."""
    stored = store.turns(cid)
    for index, (kept, turn) in enumerate(itertools.zip_longest(stored, turns)):
        if kept is None or turn is None or kept.turn_id != turn.turn_id:
            where = f"turn {index + 1}: {'nothing' if kept is None else repr(kept.turn_id)} stored, " \
                    f"{'nothing' if turn is None else repr(turn.turn_id)} in the file"
        elif (changed := difference(kept, turn)) is not None:
            where = f"turn {turn.turn_id!r} is stored with another {changed}"
        else:
            continue
        raise EvaluationError(f"{store.location} holds another memory of {cid!r} than the LoCoMo file "
                              f"({where}); {advice}")
