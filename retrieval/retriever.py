"""Dense + codebook dual-path retrieval over an AMU bank (SPEC section 4).

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

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from isq.code_bm25 import CodeBM25
from isq.identity import check_identity, normalise_identity
from isq.topology import CooccurrenceTopology, TopologyParams
from retrieval.index.dense import DenseIndex
from retrieval.index.fts import FTSIndex

MODES = ("dense", "code", "bm25", "codebm25", "dense+code", "dense+bm25", "dense+codebm25")
_WORD = re.compile(r"[^\W_]", re.UNICODE)


class EmptyQuery(ValueError):
    """A query with no letter or digit: nothing to retrieve for (its codes would be those of the
    tokenizer's special tokens, its embedding that of an empty sentence)."""


def check_query(text: str) -> str:
    """``text`` unchanged, or :class:`EmptyQuery` when it holds no letter or digit (empty,
    whitespace, punctuation or emoji only)."""
    if not _WORD.search(text):
        raise EmptyQuery(f"the query {text!r} has no letter or digit: nothing to retrieve for")
    return text

_CONFIG_FILE = "retriever.json"


class Lexical(Protocol):
    """A lexical index over the bank's positions: top-k (positions, scores), ``exclude`` left out."""

    def search(self, query: str, k: int, exclude: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass(frozen=True)
class Hit:
    """One retrieved AMU.

    ``path`` is the path that found it ("dense", "code" or "bm25"), ``score`` that path's score
    (cosine, S_amu or BM25) and ``rank`` its 1-based position within that path's list.
    ``source`` is the AMU's source pointer (session id, turn ids, ...), as given to ``add``.
    """

    amu_id: str
    index: int
    path: str
    score: float
    rank: int
    source: dict[str, Any]


class DualPathRetriever:
    """AMU bank with a dense index, a codebook topology and a lexical (FTS5 BM25) index.

    Args:
        dim: embedding dimension of the AMU and query vectors.
        identity: the fingerprinter identity (``codebook_size``, ``codebook_sha256``); the
            codebook size sets the topology's N_c and the identity is checked on load.
        params: Path B's topology parameters (:class:`isq.topology.TopologyParams`).
        dense_kind: faiss index kind (see DenseIndex); exact "flat" by default.
        lexical: the lexical index over the bank's positions (e.g. the store's FTS5 table seen
            through the bank, :class:`retrieval.routes.bank.StoreLexical`); by default an
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

    def index_of(self, amu_id: str) -> int:
        """The bank index of an AMU id."""
        return self._index_of[amu_id]

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
        sets (U_fp), JSON-serialisable source pointers (e.g. session id and turn ids) and, for
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
        code_sets = [list(codes) for codes in code_sets]
        self.topology.add(code_sets)
        self.code_bm25.add(code_sequences if code_sequences is not None else code_sets)
        self.dense.add(embeddings)
        for amu_id, text, source in zip(ids, texts, sources, strict=True):
            self._index_of[amu_id] = len(self.ids)
            self.ids.append(amu_id)
            self.texts.append(text)
            self.sources.append(dict(source))
        if self._own_lexical:
            self.lexical.add(texts)  # type: ignore[attr-defined]

    def retrieve(
        self,
        query_text: str | None = None,
        query_embedding: np.ndarray | None = None,
        query_codes: Iterable[int] | None = None,
        k_dense: int = 20,
        k_code: int = 20,
        mode: str = "dense+code",
    ) -> list[Hit]:
        """Retrieve for one query; dense hits come first, then the complementary path's hits.

        Modes and budgets:
            "dense": Dense-K, the k_dense nearest AMUs (needs ``query_embedding``).
            "code": codebook only, the k_code best S_amu (needs ``query_codes``).
            "bm25": BM25 only, k_code AMUs (needs ``query_text``).
            "codebm25": BM25 over token codes (:class:`isq.code_bm25.CodeBM25`), k_code AMUs
                (needs ``query_codes``): the lexical control of Path B.
            "dense+code": Path A (k_dense), then Path B's k_code best among the rest (SPEC 4).
            "dense+bm25": Path A (k_dense), then BM25's k_code best among the rest.
            "dense+codebm25": Path A (k_dense), then code BM25's k_code best among the rest.
        AMUs with a non-positive code or BM25 score are never returned, so a complementary path
        may return fewer than its budget. A ``query_text`` without a letter or digit raises
        :class:`EmptyQuery`.
        """
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if query_text is not None:
            check_query(query_text)
        if k_dense < 0 or k_code < 0:
            raise ValueError(f"budgets must be >= 0, got k_dense={k_dense}, k_code={k_code}")
        hits: list[Hit] = []
        if mode.startswith("dense"):
            hits += self._dense_hits(query_embedding, k_dense)
        exclude = [hit.index for hit in hits]
        if mode.endswith(("code", "codebm25")):
            if query_codes is None:
                raise ValueError(f"mode {mode!r} needs query_codes")
            index = self.code_bm25 if mode.endswith("codebm25") else self.topology
            hits += self._hits(mode.split("+")[-1], *index.search(query_codes, k_code, exclude))
        elif mode.endswith("bm25"):
            hits += self._bm25_hits(query_text, k_code, exclude)
        return hits

    def _hits(self, path: str, indices: np.ndarray, scores: np.ndarray) -> list[Hit]:
        return [
            Hit(self.ids[i], int(i), path, float(score), rank, self.sources[i])
            for rank, (i, score) in enumerate(zip(indices, scores, strict=True), start=1)
        ]

    def _dense_hits(self, query_embedding: np.ndarray | None, k: int) -> list[Hit]:
        if query_embedding is None:
            raise ValueError("dense modes need query_embedding")
        scores, ids = self.dense.search(np.asarray(query_embedding, dtype=np.float32).reshape(1, -1), k)
        found = ids[0] >= 0  # approximate faiss kinds pad missing neighbours with -1
        return self._hits("dense", ids[0][found], scores[0][found])

    def _bm25_hits(self, query_text: str | None, k: int, exclude: Sequence[int]) -> list[Hit]:
        if query_text is None:
            raise ValueError("BM25 modes need query_text")
        return self._hits("bm25", *self.lexical.search(query_text, k, exclude))

    def save(self, directory: str | Path) -> None:
        """Write the bank: ``retriever.json`` (identity, ids, texts, sources), the dense index, the
        topology and the code-BM25 files, all in ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.dense.save(directory)
        self.topology.save(directory)
        self.code_bm25.save(directory)
        record = {"identity": self.identity, "ids": self.ids, "texts": self.texts, "sources": self.sources}
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
        retriever.lexical.add(retriever.texts)  # type: ignore[attr-defined]
        retriever._index_of = {amu_id: i for i, amu_id in enumerate(retriever.ids)}
        return retriever
