"""The lexical channel: BM25 (Okapi, rank-bm25) over lower-cased word tokens of record texts."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import numpy as np
from rank_bm25 import BM25Okapi

from isq.topk import empty_result, top_k_of_scores

_WORD = re.compile(r"\w+")


def bm25_tokens(text: str) -> list[str]:
    """Lower-cased word tokens for the BM25 baseline."""
    return _WORD.findall(text.lower())


class BM25Index:
    """BM25 over a growing list of texts; position i is the i-th text added. The Okapi model
    cannot grow, so it is rebuilt lazily at the first query after texts were added."""

    def __init__(self) -> None:
        self._tokens: list[list[str]] = []
        self._model: BM25Okapi | None = None

    def __len__(self) -> int:
        return len(self._tokens)

    def add(self, texts: Iterable[str]) -> None:
        self._tokens += [bm25_tokens(text) for text in texts]
        self._model = None

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every text for ``query`` (zeros for a query without word tokens)."""
        tokens = bm25_tokens(query)
        if not self._tokens or not tokens:
            return np.zeros(len(self._tokens), dtype=np.float64)
        if self._model is None:
            self._model = BM25Okapi(self._tokens)
        return np.asarray(self._model.get_scores(tokens), dtype=np.float64)

    def search(self, query: str, k: int, exclude: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
        """Top-k (positions, scores) with a positive score, ``exclude`` left out; ties by position."""
        if not self._tokens or k == 0:
            return empty_result()
        return top_k_of_scores(self.scores(query), k, exclude)
