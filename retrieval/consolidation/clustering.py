"""Hierarchical agglomerative clustering (scipy.cluster.hierarchy) of AMU embeddings on cosine
distance, cut at a distance threshold (MemCode key design 4).

The dendrogram is cut at the threshold, so only merges at or below it matter, and with the
linkages accepted (:data:`retrieval.consolidation.config.LINKAGES`: single, complete, average)
two clusters are never closer than their closest pair of members. A merge at or below the
threshold therefore joins rows that a chain of pairs within the threshold connects, and the
clustering is the same run on each such group of rows (a connected component of the pairs
within the threshold) apart, but for merges at exactly equal distances, which scipy takes in an
order the other rows also decide, and for a distance within a rounding error of the threshold.
The condensed distance matrix, n(n-1)/2 float64 entries, is then only ever built for one group,
not over a user's every record (the full matrix and its condensed half take 16 and 8 GB at
45,000 records). The pairs are found block by block in float32 with a margin
(:data:`SCREEN_MARGIN`) well above its rounding, so no pair is missed; a pair admitted by the
margin alone only joins rows that the group's exact float64 clustering keeps apart.
"""

from __future__ import annotations

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

SCREEN_ELEMENTS = 2**22
"""Entries of one block of the float32 similarity screen (16 MiB): its rows are this over n."""

SCREEN_MARGIN = 1e-3
"""Slack added to the threshold in the float32 screen; float32 cosines of unit vectors err by
~1e-6 at the embedders' widths."""


def _block_rows(n: int) -> int:
    """Rows of one block of ``n`` columns within :data:`SCREEN_ELEMENTS` entries (at least one)."""
    return max(1, SCREEN_ELEMENTS // max(n, 1))


def _unit(vectors: np.ndarray, dtype: type[np.floating]) -> np.ndarray:
    """Rows scaled to unit length in ``dtype``; a zero row stays zero (at distance 1 from all)."""
    matrix = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return np.divide(matrix, norms, out=np.zeros_like(matrix), where=norms > 0).astype(dtype, copy=False)


def cosine_distances(vectors: np.ndarray) -> np.ndarray:
    """Condensed pairwise cosine distances 1 - cos (a zero vector is at distance 1 from all),
    computed a block of rows at a time (:data:`SCREEN_ELEMENTS` entries): no n x n matrix beside
    the condensed one, and no ``x @ x.T`` of float64 rows, which numpy hands to OpenBLAS's dsyrk,
    whose 0.3.31 build crashes the process (SIGSEGV) from about 16,000 rows of 384."""
    unit = _unit(vectors, np.float64)
    n = len(unit)
    condensed = np.empty(n * (n - 1) // 2)
    step, at = _block_rows(n), 0
    for start in range(0, n, step):
        block = np.clip(1.0 - unit[start:start + step] @ unit[start:].T, 0.0, 2.0)
        for row, distances in enumerate(block):
            after = distances[row + 1:]  # the pairs (i, j > i), in squareform's order
            condensed[at:at + len(after)] = after
            at += len(after)
    return condensed


def linked_groups(vectors: np.ndarray, threshold: float) -> list[np.ndarray]:
    """The connected components of two or more rows of the graph whose edges are the pairs
    within ``threshold`` cosine distance (plus :data:`SCREEN_MARGIN`), each as ascending row
    indices, ordered by their first row. The screen goes a block of rows at a time and keeps
    only each row's group so far (its first row) and at most a block's worth of pairs not yet
    linked, so its memory is bounded however many pairs are near."""
    unit = _unit(vectors, np.float32)
    n = len(unit)
    first = np.arange(n)  # per row, the first row of its group so far
    step = _block_rows(n)
    pending: list[tuple[np.ndarray, np.ndarray]] = []
    held = 0
    for start in range(0, n, step):
        # Pairs (i, j) with j > i only: the block's rows against the rows after its first.
        similar = unit[start:start + step] @ unit[start:].T >= np.float32(1.0 - threshold - SCREEN_MARGIN)
        rows, cols = np.nonzero(np.triu(similar, k=1))
        pending.append((rows + start, cols + start))
        held += len(rows)
        if held >= SCREEN_ELEMENTS or start + step >= n:  # linked in batches of pairs: bounded memory
            pairs_rows, pairs_cols = (np.concatenate(side) for side in zip(*pending, strict=True))
            first = _merged(first, pairs_rows, pairs_cols)
            pending, held = [], 0
    order = np.argsort(first, kind="stable")
    groups = np.split(order, np.flatnonzero(np.diff(first[order])) + 1)
    return sorted((group for group in groups if len(group) > 1), key=lambda group: int(group[0]))


def _merged(first: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``first`` (per row, the first row of its group) after linking each ``rows[k]`` with
    ``cols[k]``: the components of the new pairs together with each row's link to its first."""
    n = len(first)
    graph = coo_matrix((np.ones(len(rows) + n, dtype=np.int8),
                        (np.concatenate([rows, np.arange(n)]), np.concatenate([cols, first]))), shape=(n, n))
    count, labels = connected_components(graph, directed=False)
    lowest = np.full(count, n)
    np.minimum.at(lowest, labels, np.arange(n))
    return lowest[labels]


def hac_clusters(vectors: np.ndarray, threshold: float, method: str = "complete") -> list[list[int]]:
    """Row indices of the clusters with at least two members, cutting the HAC dendrogram at
    cosine distance ``threshold`` (with complete linkage: every pair within it), found one
    linked group (:func:`linked_groups`) at a time. Each cluster lists its rows in order;
    clusters are ordered by their first row. Deterministic."""
    vectors = np.asarray(vectors)
    if len(vectors) < 2:
        return []
    if not np.isfinite(vectors).all():
        raise ValueError("the embeddings to cluster must be finite")
    clusters: list[list[int]] = []
    for group in linked_groups(vectors, threshold):
        tree = linkage(cosine_distances(vectors[group]), method=method)
        labels = fcluster(tree, t=threshold, criterion="distance")
        found: dict[int, list[int]] = {}
        for row, label in zip(group.tolist(), labels.tolist(), strict=True):
            found.setdefault(label, []).append(row)
        clusters += [rows for rows in found.values() if len(rows) > 1]
    return sorted(clusters, key=lambda rows: rows[0])
