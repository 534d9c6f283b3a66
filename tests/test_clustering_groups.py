"""Consolidation's clustering run one linked group at a time gives the clusters of one HAC over
all rows, for every accepted linkage, and never builds a distance matrix over all of them."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import pdist

from retrieval.consolidation import clustering
from retrieval.consolidation.clustering import hac_clusters, linked_groups
from retrieval.consolidation.config import LINKAGES


def _whole(vectors: np.ndarray, threshold: float, method: str) -> list[list[int]]:
    """The clusters of one HAC over every row, from scipy's own cosine distances."""
    distances = np.nan_to_num(pdist(np.asarray(vectors, dtype=np.float64), "cosine"), nan=1.0)
    labels = fcluster(linkage(np.clip(distances, 0.0, 2.0), method=method), t=threshold, criterion="distance")
    found: dict[int, list[int]] = {}
    for row, label in enumerate(labels.tolist()):
        found.setdefault(label, []).append(row)
    return sorted((rows for rows in found.values() if len(rows) > 1), key=lambda rows: rows[0])


def _paraphrases(rng: np.random.Generator, n: int, dim: int, spread: float) -> np.ndarray:
    """Rows around a few centres (near-duplicates of each other), some copied exactly."""
    centres = rng.normal(size=(int(rng.integers(1, 12)), dim))
    rows = centres[rng.integers(0, len(centres), n)] + rng.normal(size=(n, dim)) * spread
    copies = int(rng.integers(0, n // 3 + 1))
    rows[rng.integers(0, n, copies)] = rows[rng.integers(0, n, copies)]
    return rows.astype(np.float32)


@pytest.mark.parametrize("method", LINKAGES)
def test_groups_give_the_clusters_of_one_hac_over_all_rows(method):
    rng = np.random.default_rng(7)
    clustered = 0
    for _ in range(60):
        vectors = _paraphrases(rng, int(rng.integers(2, 120)), int(rng.choice([3, 16, 384])),
                               float(rng.choice([0.02, 0.1, 0.3])))
        threshold = float(rng.choice([0.05, 0.1, 0.25, 0.6]))
        whole = _whole(vectors, threshold, method)
        assert hac_clusters(vectors, threshold, method) == whole
        clustered += len(whole)
    assert clustered > 60  # the draws do cluster: the comparison is not of empty lists


def test_a_chain_within_the_threshold_is_one_group_and_complete_linkage_splits_it():
    """a~b, b~c, a far from c: one linked group; complete linkage clusters two of them."""
    angle = np.radians([0.0, 35.0, 70.0, 180.0])
    vectors = np.stack([np.cos(angle), np.sin(angle)], axis=1)
    assert [group.tolist() for group in linked_groups(vectors, 0.25)] == [[0, 1, 2]]
    assert hac_clusters(vectors, 0.25) == _whole(vectors, 0.25, "complete")
    assert len(hac_clusters(vectors, 0.25)) == 1 and len(hac_clusters(vectors, 0.25)[0]) == 2


def test_a_pair_at_the_threshold_is_linked():
    """Cosine distance exactly 0.5 (60 degrees) is within a threshold of 0.5, as HAC's cut is."""
    vectors = np.array([[1.0, 0.0], [0.5, np.sqrt(3) / 2]])
    assert hac_clusters(vectors, 0.5) == [[0, 1]]
    assert hac_clusters(vectors, 0.49) == []
    assert hac_clusters(vectors.tolist(), 0.5) == [[0, 1]]  # rows as lists too


def test_screening_blocks_meet_every_pair(monkeypatch):
    """Blocks of two rows: pairs across blocks are found, and groups join through rows whose
    pairs lie in different blocks (row 0 meets 150 in the first block, 150 meets 299 in the
    last); a group of many equal rows is one group."""
    monkeypatch.setattr(clustering, "SCREEN_ELEMENTS", 600)
    rng = np.random.default_rng(5)
    vectors = rng.normal(size=(300, 64)).astype(np.float32)
    vectors[150] = vectors[0]
    vectors[299] = vectors[150] * 2.0
    vectors[10:40] = vectors[10]
    groups = [group.tolist() for group in linked_groups(vectors, 0.01)]
    assert groups == [[0, 150, 299], list(range(10, 40))]
    assert hac_clusters(vectors, 0.01) == groups


def test_distances_computed_in_blocks_are_the_condensed_matrix(monkeypatch):
    """Blocks of three rows (the last one short) give every pair once, in squareform's order,
    as 1 - cos clipped to [0, 2], a zero row at distance 1."""
    monkeypatch.setattr(clustering, "SCREEN_ELEMENTS", 60)
    rng = np.random.default_rng(11)
    vectors = rng.normal(size=(20, 8))
    vectors[4] = 0.0
    vectors[7] = -vectors[3]
    expected = np.clip(np.nan_to_num(pdist(vectors, "cosine"), nan=1.0), 0.0, 2.0)
    distances = clustering.cosine_distances(vectors)
    assert distances.shape == expected.shape and np.allclose(distances, expected, rtol=0, atol=1e-12)
    assert distances[squareform_index(20, 3, 7)] == pytest.approx(2.0, abs=1e-12)


def squareform_index(n: int, i: int, j: int) -> int:
    """The position of the pair (i, j), i < j, in a condensed matrix of n rows."""
    return n * i - i * (i + 1) // 2 + j - i - 1


def test_no_distance_matrix_over_all_rows_is_built():
    """6,000 rows in pairs: one HAC over all of them would hold 6,000 x 6,000 float64 distances
    (288 MB, then 144 MB condensed); by linked groups the peak stays near one screening block."""
    rng = np.random.default_rng(3)
    centres = rng.normal(size=(3000, 32))
    vectors = np.repeat(centres, 2, axis=0) + rng.normal(size=(6000, 32)) * 1e-3
    tracemalloc.start()
    try:
        clusters = hac_clusters(vectors.astype(np.float32), 0.1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert clusters == [[2 * i, 2 * i + 1] for i in range(3000)]
    assert peak < 64 * 2**20


def test_embeddings_that_are_not_finite_are_refused():
    vectors = np.array([[1.0, 0.0], [np.nan, 0.0], [1.0, 0.01]])
    with pytest.raises(ValueError, match="finite"):
        hac_clusters(vectors, 0.1)
