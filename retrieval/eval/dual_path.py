"""Dense + codebook dual-path retrieval over an AMU bank (docs/design.md §4).

Path A takes the K_v nearest AMUs by cosine similarity (faiss). Path B takes the K_c best AMUs
by topology score S_amu that Path A did not return: it only complements Path A (asymmetric).
The baselines of the ablation run through the same object at the same budgets: Dense-K alone,
codebook alone, and Dense + BM25 (BM25 top-K excluding the dense hits). BM25 is SQLite FTS5's
``bm25()`` (:mod:`retrieval.index.fts`): the store's table when the caller passes it (the
evaluation does), else an in-memory one over the bank's texts.

AMUs are numbered by insertion order; that index is shared by the dense index, the topology
and the metadata lists (AMU id, text, source pointer).
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from isq.identity import check_identity, normalise_identity
from isq.topology import CooccurrenceTopology, TopologyParams
from retrieval.contract import Hit, Query, Retrieval, check_query
from retrieval.index.code_bm25 import CodeBM25
from retrieval.index.dense import DenseIndex
from retrieval.index.fts import FTSIndex


class Channel(str, Enum):
    """A dual-path channel: Path A (dense), Path B (code: the topology's S_amu) and the lexical
    controls, BM25 over words and BM25 over token codes (:class:`retrieval.index.code_bm25.CodeBM25`)."""

    DENSE = "dense"
    CODE = "code"
    BM25 = "bm25"
    CODEBM25 = "codebm25"

    @property
    def uses_codes(self) -> bool:
        return self in (Channel.CODE, Channel.CODEBM25)


@dataclass(frozen=True)
class DualPathMode:
    """Which channels run: ``dense`` with ``k_dense`` items, then ``complement`` with the rest of
    the budget among the items the dense path did not return (docs/design.md §4.2). ``complement``
    alone (``k_dense`` 0) is that channel with the whole budget; no complement is Dense-K."""

    complement: Channel | None
    k_dense: int

    @property
    def uses_codes(self) -> bool:
        return self.complement is not None and self.complement.uses_codes


_CONFIG_FILE = "retriever.json"


class Lexical(Protocol):
    """A lexical index over the bank's positions: top-k (positions, scores), ``exclude`` left out."""

    def search(self, query: str, k: int, exclude: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]: ...


class DualPathRetriever:
    """AMU bank with a dense index, a codebook topology and a lexical (FTS5 BM25) index.

    Args:
        dim: embedding dimension of the AMU and query vectors.
        identity: the fingerprinter identity (``codebook_size``, ``codebook_sha256``); the
            codebook size sets the topology's N_c and the identity is checked on load.
        params: Path B's topology parameters (:class:`isq.topology.TopologyParams`).
        dense_kind: faiss index kind (see DenseIndex); exact "flat" by default.
        lexical: the lexical index over the bank's positions (e.g. the conversation's records'
            FTS5 table, :class:`retrieval.index.fts.RecordLexical`); by default an
            in-memory FTS5 table that :meth:`add` fills with the texts.
    """

    def __init__(
        self,
        dim: int,
        identity: Mapping[str, Any],
        params: TopologyParams = TopologyParams(),
        dense_kind: str = "flat",
        lexical: Lexical | None = None,
    ) -> None:
        self.identity = normalise_identity(identity)
        if self.identity is None:
            raise ValueError("a fingerprinter identity is required")
        self.dense = DenseIndex(dim, kind=dense_kind)
        self.topology = CooccurrenceTopology(
            num_codes=self.identity["codebook_size"], params=params, identity=self.identity)
        self.code_bm25 = CodeBM25(self.identity["codebook_size"])
        self.ids: list[str] = []
        self.texts: list[str] = []
        self.sources: list[dict[str, Any]] = []
        self._index_of: dict[str, int] = {}
        self._own_lexical = lexical is None
        self.lexical: Lexical = FTSIndex() if lexical is None else lexical

    def __len__(self) -> int:
        return len(self.ids)

    def add(
        self,
        ids: Sequence[str],
        texts: Sequence[str],
        embeddings: np.ndarray,
        code_sets: Sequence[Iterable[int]],
        sources: Sequence[Mapping[str, Any]],
        code_sequences: Sequence[Sequence[int]] | None = None,
    ) -> None:
        """Append AMUs: unique ids, fact texts, L2-normalised embeddings (n x dim), fingerprint code
        sets (U_fp), source pointers (``{"session_id": ..., "turn_ids": [...]}``, saved as JSON) and, for
        BM25 over codes, each AMU's token codes (default: its code set, every code once)."""
        count = len(ids)
        embeddings = np.asarray(embeddings, dtype=np.float32)
        if not (len(texts) == len(embeddings) == len(code_sets) == len(sources) == count):
            raise ValueError(
                f"ids, texts, embeddings, code_sets and sources must have equal lengths, got "
                f"{count}, {len(texts)}, {len(embeddings)}, {len(code_sets)}, {len(sources)}"
            )
        if count == 0:
            return
        if embeddings.ndim != 2 or embeddings.shape[1] != self.dense.dim:
            raise ValueError(f"embeddings must have shape (n, {self.dense.dim}), got {embeddings.shape}")
        clashes = [amu_id for amu_id in ids if amu_id in self._index_of]
        if clashes or len(set(ids)) != count:
            raise ValueError(f"AMU ids must be unique; repeated: {clashes or sorted(ids)}")
        # the topology validates every code before it changes anything, so it goes first
        code_lists = [list(codes) for codes in code_sets]
        self.topology.add(code_lists)
        self.code_bm25.add(code_sequences if code_sequences is not None else code_lists)
        self.dense.add(embeddings)
        for amu_id, text, source in zip(ids, texts, sources, strict=True):
            self._index_of[amu_id] = len(self.ids)
            self.ids.append(amu_id)
            self.texts.append(text)
            self.sources.append(dict(source))
        if self._own_lexical:
            self.lexical.add(texts)  # type: ignore[attr-defined]

    def with_topology_params(self, params: TopologyParams) -> DualPathRetriever:
        """The same bank with Path B scored under other topology parameters (a sweep), sharing
        every index."""
        view = copy.copy(self)
        view.topology = self.topology.with_params(params)
        return view

    def search(self, query: Query, mode: DualPathMode, k: int) -> list[Hit]:
        """The ``k`` items of ``mode`` for one query; dense hits come first, then the complement's.

        Dense-K (no complement) takes the k nearest AMUs by cosine (needs ``query.embedding``);
        a complement alone takes its k best; ``dense`` + complement takes ``mode.k_dense`` dense
        hits, then the complement's ``k - k_dense`` best among the rest (docs/design.md §4.2). The
        code channels need ``query.codes``, BM25 the query text. AMUs with a non-positive code
        or BM25 score are never returned, so a complement may return fewer than its budget. A
        query without a letter or digit raises :class:`retrieval.contract.EmptyQuery`.
        """
        check_query(query.text)
        k_dense = k if mode.complement is None else mode.k_dense
        if k_dense < 0 or k < k_dense:
            raise ValueError(f"budgets must satisfy 0 <= k_dense <= k, got k_dense={k_dense}, k={k}")
        hits = self._dense_hits(query.embedding, k_dense) if k_dense else []
        exclude = [hit.index for hit in hits]
        channel, rest = mode.complement, k - k_dense
        if channel is None:
            return hits
        if channel.uses_codes:
            if query.codes is None:
                raise ValueError(f"the {channel.value} channel needs the query's codes")
            index = self.code_bm25 if channel is Channel.CODEBM25 else self.topology
            return hits + self._hits(channel, *index.search(query.codes, rest, exclude))
        return hits + self._hits(channel, *self.lexical.search(query.text, rest, exclude))

    def _hits(self, channel: Channel, indices: np.ndarray, scores: np.ndarray) -> list[Hit]:
        return [
            Hit(id=self.ids[i], text=self.texts[i], score=float(score), kind="record",
                session_id=self.sources[i]["session_id"], turns=tuple(self.sources[i]["turn_ids"]),
                index=int(i), channel=channel.value, rank=rank, scores={channel.value: float(score)})
            for rank, (i, score) in enumerate(zip(indices, scores, strict=True), start=1)
        ]

    def _dense_hits(self, query_embedding: np.ndarray | None, k: int) -> list[Hit]:
        if query_embedding is None:
            raise ValueError("the dense channel needs the query's embedding")
        scores, ids = self.dense.search(np.asarray(query_embedding, dtype=np.float32).reshape(1, -1), k)
        found = ids[0] >= 0  # approximate faiss kinds pad missing neighbours with -1
        return self._hits(Channel.DENSE, ids[0][found], scores[0][found])

    def save(self, directory: str | Path) -> None:
        """Write the bank: ``retriever.json`` (identity, ids, texts, sources and the lexical table's
        rows), the dense index, the topology and the code-BM25 files, all in ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.dense.save(directory)
        self.topology.save(directory)
        self.code_bm25.save(directory)
        record: dict[str, Any] = {"identity": self.identity, "ids": self.ids, "texts": self.texts,
                                  "sources": self.sources}
        if isinstance(self.lexical, FTSIndex):  # with its entities and topics columns
            record["lexical"], record["lexical_format"] = self.lexical.rows(), LEXICAL_FORMAT
        (directory / _CONFIG_FILE).write_text(json.dumps(record))

    @classmethod
    def load(cls, directory: str | Path, identity: Mapping[str, Any]) -> DualPathRetriever:
        """Read a saved bank, refusing one built with a different fingerprinter than ``identity``."""
        directory = Path(directory)
        record = json.loads((directory / _CONFIG_FILE).read_text())
        check_identity(record["identity"], identity, f"AMU bank in {directory}")
        dense = DenseIndex.load(directory)
        topology = CooccurrenceTopology.load(directory, identity=identity)
        if not len(dense) == topology.num_units == len(record["ids"]):
            raise ValueError(
                f"inconsistent bank in {directory}: {len(dense)} vectors, {topology.num_units} code sets, "
                f"{len(record['ids'])} ids"
            )
        retriever = cls(dense.dim, record["identity"])
        retriever.dense, retriever.topology = dense, topology
        retriever.code_bm25 = CodeBM25.load(directory)
        retriever.ids, retriever.texts, retriever.sources = record["ids"], record["texts"], record["sources"]
        if record.get("lexical_format") == LEXICAL_FORMAT:
            retriever.lexical.add_rows(map(tuple, record["lexical"]))  # type: ignore[attr-defined]
        else:  # saved without its rows, or tokenised otherwise: the texts, without entities and topics
            retriever.lexical.add(retriever.texts)  # type: ignore[attr-defined]
        retriever._index_of = {amu_id: i for i, amu_id in enumerate(retriever.ids)}
        return retriever


LEXICAL_FORMAT = 3
"""How a saved bank's lexical rows are tokenised (:meth:`retrieval.index.fts.FTSIndex.rows`): 3, runs
of letters written without spaces (kana, CJK, and since 3 Thai, Lao, Myanmar and Khmer without their
marks) as pairs and a last character (:func:`retrieval.index.fts.paired`)."""


@dataclass(frozen=True)
class DualPath:
    """One configuration of the dual-path ablation over a bank, as a :class:`retrieval.contract.
    Retriever` (several configurations share one bank)."""

    bank: DualPathRetriever
    mode: DualPathMode

    def retrieve(self, query: Query, k: int) -> Retrieval:
        started = time.perf_counter()
        hits = self.bank.search(query, self.mode, k)
        return Retrieval(query.text, hits, time.perf_counter() - started)
