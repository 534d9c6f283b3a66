"""Co-occurrence topology views (docs/design.md §3): code degrees and the strongest S_code links.

The functions take arrays (M and S_code, e.g. from :class:`isq.topology.CooccurrenceTopology`),
so each can be checked on hand-built matrices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp


def degrees(cooccurrence: sp.spmatrix | np.ndarray) -> np.ndarray:
    """Topology degree of every code: the number of other codes it co-occurs with (M_ab > 0, b != a)."""
    entries = sp.csr_matrix(cooccurrence).tocoo()  # via CSR: duplicate entries summed
    partners = (entries.row != entries.col) & (entries.data != 0)
    return np.bincount(entries.row[partners], minlength=entries.shape[0])


@dataclass(frozen=True)
class Association:
    """S_code(target | source) and how often the two codes co-occur directly (M_ab)."""

    source: int
    target: int
    score: float
    cooccurrences: int


def top_associations(
    code_scores: np.ndarray,
    cooccurrence: sp.spmatrix | np.ndarray,
    k: int = 20,
    indirect_only: bool = False,
    sources: np.ndarray | None = None,
) -> list[Association]:
    """The ``k`` strongest off-diagonal S_code entries (row = source, column = target).

    With ``indirect_only``, only pairs that never co-occur directly (M_ab = 0), i.e. links
    that exist through multi-hop walks alone. ``sources``, a boolean mask over codes, limits
    the source codes (e.g. to codes seen in enough units: a code seen once has a high IDF and
    trivially certain co-occurrences). Zero scores are never listed; ties go to the smaller
    (source, target).
    """
    scores = np.array(code_scores, dtype=np.float64)
    np.fill_diagonal(scores, 0.0)
    if sources is not None:
        scores[~np.asarray(sources, dtype=bool)] = 0.0
    counts = sp.csr_matrix(cooccurrence)
    if indirect_only:
        direct = counts.tocoo()
        scores[direct.row[direct.data > 0], direct.col[direct.data > 0]] = 0.0
    flat = np.flatnonzero(scores > 0)
    order = flat[np.lexsort((flat, -scores.ravel()[flat]))][:k]
    source_codes, target_codes = np.unravel_index(order, scores.shape)
    return [
        Association(int(a), int(b), float(scores[a, b]), int(counts[a, b]))
        for a, b in zip(source_codes, target_codes, strict=True)
    ]
