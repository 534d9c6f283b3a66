"""Hierarchical agglomerative clustering (scipy.cluster.hierarchy) of AMU embeddings on cosine
distance, cut at a distance threshold (MemCode key design 4)."""

from __future__ import annotations

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.spatial.distance import squareform


def cosine_distances(vectors: np.ndarray) -> np.ndarray:
    """Condensed pairwise cosine distances 1 - cos (a zero vector is at distance 1 from all)."""
    matrix = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    unit = np.divide(matrix, norms, out=np.zeros_like(matrix), where=norms > 0)
    distances = np.clip(1.0 - unit @ unit.T, 0.0, 2.0)
    np.fill_diagonal(distances, 0.0)
    return squareform(distances, checks=False)


def hac_clusters(vectors: np.ndarray, threshold: float, method: str = "complete") -> list[list[int]]:
    """Row indices of the clusters with at least two members, cutting the HAC dendrogram at
    cosine distance ``threshold`` (with complete linkage: every pair within it). Each cluster
    lists its rows in order; clusters are ordered by their first row. Deterministic."""
    if len(vectors) < 2:
        return []
    tree = linkage(cosine_distances(vectors), method=method)
    labels = fcluster(tree, t=threshold, criterion="distance")
    clusters: dict[int, list[int]] = {}
    for row, label in enumerate(labels):
        clusters.setdefault(int(label), []).append(row)
    return sorted((rows for rows in clusters.values() if len(rows) > 1), key=lambda rows: rows[0])
