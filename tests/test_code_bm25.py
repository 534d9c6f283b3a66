"""BM25 over token codes (the lexical control of Path B) against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from retrieval.contract import Query
from retrieval.eval.configs import parse_config
from retrieval.eval.dual_path import Channel, DualPath, DualPathMode, DualPathRetriever
from retrieval.index.code_bm25 import CodeBM25

UNITS = [[1, 1, 2], [2, 3], [1, 4, 4, 4], [5]]  # lengths 3, 2, 4, 1: mean 2.5


def bm25(tf: int, length: int, df: int, n: int = 4, k1: float = 1.2, b: float = 0.75) -> float:
    idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
    return idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / 2.5))


def test_scores_are_okapi_bm25_with_term_frequency_and_length() -> None:
    index = CodeBM25(8)
    index.add(UNITS)
    expected = [bm25(2, 3, 2), 0.0, bm25(1, 4, 2), 0.0]  # query code 1: in units 0 (twice) and 2
    np.testing.assert_allclose(index.scores([1]), expected, rtol=1e-12)
    both = index.scores([1, 4, 4])  # a query's codes count once
    assert both[2] == pytest.approx(bm25(1, 4, 2) + bm25(3, 4, 1))
    assert both[0] == pytest.approx(bm25(2, 3, 2))


def test_search_keeps_positive_scores_excludes_and_breaks_ties_by_index() -> None:
    index = CodeBM25(8)
    index.add([[2], [2], [2, 2], [7]])
    indices, scores = index.search([2], 3, exclude=[2])
    assert list(indices) == [0, 1] and scores[0] == scores[1] > 0
    assert len(CodeBM25(8).search([1], 3)[0]) == 0
    with pytest.raises(ValueError, match="codes must lie"):
        index.add([[9]])


def test_the_retriever_runs_code_bm25_as_a_complement() -> None:
    identity = {"codebook_size": 8, "codebook_sha256": "d" * 64}
    retriever = DualPathRetriever(2, identity)
    vectors = np.array([[1, 0], [0.9, 0.1], [0, 1], [0.1, 0.9]], dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    retriever.add(["a", "b", "c", "d"], ["w x", "y z", "p q", "r s"], vectors, [set(u) for u in UNITS],
                  [{"session_id": "s", "turn_ids": [f"D1:{i}"]} for i in range(4)], UNITS)
    config = parse_config("dense1+codebm25_2")
    assert config.dual == DualPathMode(Channel.CODEBM25, 1) and config.k == 3 and config.uses_codes
    query = Query("w", np.array([1, 0], dtype=np.float32), frozenset({1, 4}))
    hits = DualPath(retriever, config.dual).retrieve(query, config.k).hits
    assert [(h.id, h.channel) for h in hits] == [("a", "dense"), ("c", "codebm25")]
