"""BM25 over codes: a lexical control for Path B (docs/design.md §4.2).

Path B with the self term and sum aggregation scores a unit by the IDF-weighted overlap of code
sets. Okapi BM25 over the codes themselves adds what full-text retrieval would: term frequency
with saturation (a code seen three times in a unit counts more than once, but not three times
as much) and unit-length normalisation. If Path B's walk adds nothing over this, the codebook
acts as a vocabulary, and its gains are a lexical matcher's.

    score(u, Q) = Σ_{b ∈ Q} idf(b) · tf(b, u) (k1 + 1) / (tf(b, u) + k1 (1 − B + B |u| / avg|u|))
    idf(b) = log(1 + (N − n(b) + 0.5) / (n(b) + 0.5))

(|u|: the unit's number of token codes; B: the length normalisation, the argument ``b``; the
Lucene idf, always positive.)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from isq.topk import empty_result, top_k_of_scores

_FILE = "code_bm25.npz"


class CodeBM25:
    """Okapi BM25 over units given as token-code sequences (repeats count as term frequency).

    Args:
        num_codes: codebook size N_c.
        k1: term-frequency saturation (1.2, the usual value).
        b: length normalisation (0.75).
    """

    def __init__(self, num_codes: int, k1: float = 1.2, b: float = 0.75) -> None:
        self.num_codes, self.k1, self.b = num_codes, k1, b
        self._rows: list[sp.csr_matrix] = []
        self._weights: sp.csr_matrix | None = None
        self._idf: np.ndarray | None = None

    def __len__(self) -> int:
        return sum(rows.shape[0] for rows in self._rows)

    def add(self, sequences: Iterable[Sequence[int]]) -> None:
        """Append units, each the codes of its tokens in order."""
        arrays = [np.asarray(list(codes), dtype=np.int64) for codes in sequences]
        if not arrays:
            return
        indptr = np.concatenate(([0], np.cumsum([a.size for a in arrays])))
        codes = np.concatenate(arrays)
        if codes.size and (codes.min() < 0 or codes.max() >= self.num_codes):
            raise ValueError(f"codes must lie in [0, {self.num_codes})")
        counts = sp.csr_matrix((np.ones(codes.size), codes, indptr), shape=(len(arrays), self.num_codes))
        counts.sum_duplicates()  # term frequencies
        self._rows.append(counts)
        self._weights = None

    def _term_frequencies(self) -> sp.csr_matrix:
        """(units, codes) term counts of every unit added so far."""
        return sp.vstack(self._rows, format="csr") if self._rows else sp.csr_matrix((0, self.num_codes))

    def _prepare(self) -> tuple[sp.csr_matrix, np.ndarray]:
        """The saturated, length-normalised term weights of every unit, and the idf of every code."""
        if self._weights is None:
            tf = self._term_frequencies()
            lengths = np.asarray(tf.sum(axis=1)).ravel()
            norm = self.k1 * (1 - self.b
                              + self.b * lengths / max(lengths.mean(), 1e-12)) if lengths.size else lengths
            per_entry = np.repeat(norm, np.diff(tf.indptr))
            weights = tf.copy()
            weights.data = tf.data * (self.k1 + 1) / (tf.data + per_entry)
            df = np.bincount(tf.indices, minlength=self.num_codes)
            n = tf.shape[0]
            self._weights, self._idf = weights, np.log(1 + (n - df + 0.5) / (df + 0.5))
        return self._weights, self._idf  # type: ignore[return-value]

    def scores(self, query_codes: Iterable[int]) -> np.ndarray:
        """BM25 of every unit for the distinct query codes (zeros for an empty query)."""
        weights, idf = self._prepare()
        query = np.unique(np.fromiter(query_codes, dtype=np.int64))
        if query.size and (query[0] < 0 or query[-1] >= self.num_codes):
            raise ValueError(f"query codes must lie in [0, {self.num_codes})")
        vector = np.zeros(self.num_codes)
        vector[query] = idf[query]
        return weights @ vector

    def search(self, query_codes: Iterable[int], k: int,
               exclude: Iterable[int] = ()) -> tuple[np.ndarray, np.ndarray]:
        """Top-k (unit indices, scores) with a positive score, ``exclude`` left out, ties by index."""
        if len(self) == 0:
            return empty_result()
        return top_k_of_scores(self.scores(query_codes), k, exclude)

    def save(self, directory: str | Path) -> None:
        """Write ``code_bm25.npz`` (the term frequencies and parameters) into ``directory``."""
        tf = self._term_frequencies()
        np.savez(Path(directory) / _FILE, data=tf.data, indices=tf.indices, indptr=tf.indptr,
                 params=json.dumps({"num_codes": self.num_codes, "k1": self.k1, "b": self.b}))

    @classmethod
    def load(cls, directory: str | Path) -> CodeBM25:
        with np.load(Path(directory) / _FILE) as arrays:
            index = cls(**json.loads(str(arrays["params"])))
            tf = sp.csr_matrix((arrays["data"], arrays["indices"], arrays["indptr"]),
                               shape=(arrays["indptr"].size - 1, index.num_codes))
        if tf.shape[0]:
            index._rows = [tf]
        return index
