"""The optional non-generative reranker inside a route (LycheeMemory section 3.5, Table 14: a
cross-encoder over at most max(100, 4k) route candidates). Any sentence-transformers
``CrossEncoder`` directory the user gives works (the paper uses bge-reranker-v2-m3); nothing
is downloaded, and without a path reranking is off (the results say so)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from retrieval.index.model_thread import on_model_thread


class CrossEncoderReranker:
    """A local ``sentence_transformers.CrossEncoder``; ``name`` is its path."""

    def __init__(self, path: str | Path, batch_size: int = 32) -> None:
        from sentence_transformers import CrossEncoder

        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"reranker {path}: no such model directory")
        self.name = str(path)
        self.batch_size = batch_size
        try:
            self._model = on_model_thread(lambda: CrossEncoder(str(path), device="cpu"))
        except (OSError, ValueError) as err:
            raise ValueError(f"reranker {path}: not a sentence-transformers cross-encoder ({err})") from err

    def scores(self, query: str, texts: Sequence[str]) -> np.ndarray:
        """One relevance score per text (higher is better), from a forward on the model thread
        (:mod:`retrieval.index.model_thread`)."""
        if not texts:
            return np.zeros(0, dtype=np.float64)
        pairs = [(query, text) for text in texts]
        raw = on_model_thread(lambda: self._model.predict(pairs, batch_size=self.batch_size,
                                                          show_progress_bar=False))
        return np.asarray(raw, dtype=np.float64).reshape(len(texts), -1)[:, 0]


def rerank(order: Sequence[int], scores: np.ndarray) -> list[int]:
    """``order`` re-sorted by ``scores`` (one per item, in ``order``'s order) descending; ties keep
    the previous order."""
    if len(order) != len(scores):
        raise ValueError(f"{len(scores)} scores for {len(order)} items")
    positions = sorted(range(len(order)), key=lambda i: (-float(scores[i]), i))
    return [order[i] for i in positions]
