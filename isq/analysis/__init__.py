"""Codebook health: utilisation, geometry, fingerprints, stability and co-occurrence topology.

One fingerprinter pass, :func:`collect`, turns a text sample into :class:`SampleCodes` (tokens,
token codes, ||z_t|| and the quantisation error ||z_t - e_k||^2 of every non-padding token).
Everything else is a plain function over arrays (counts, code vectors, code sequences, the
co-occurrence matrix M and the S_code matrix of docs/design.md §3.2), so each statistic can be
checked on hand-built inputs. ``isq.report`` and ``notebooks/codebook_analysis.ipynb`` draw them.

Modules: ``sample`` (the fingerprinter pass), ``usage`` (utilisation, fingerprint lengths),
``geometry`` (code vectors), ``lexical`` (token <-> code), ``edits`` (stability under small
edits) and ``associations`` (topology degrees and S_code links).
"""

from __future__ import annotations

from isq.analysis.associations import Association, degrees, top_associations
from isq.analysis.edits import (
    EDITS,
    NAMES,
    Stability,
    change_digit,
    edited_texts,
    stability,
    substitute_name,
)
from isq.analysis.geometry import (
    PCA2D,
    CodeVectors,
    code_norms,
    nearest_neighbour_distances,
    pairwise_distances,
    pca_2d,
)
from isq.analysis.lexical import (
    CodeConcordance,
    LexicalConsistency,
    concordance,
    frequent_words,
    lexical_consistency,
    word_codes,
)
from isq.analysis.sample import SampleCodes, collect, sample_texts
from isq.analysis.usage import (
    FingerprintLengths,
    UsageStats,
    code_counts,
    fingerprint_lengths,
    gini,
    usage_stats,
)

__all__ = [
    "EDITS",
    "NAMES",
    "PCA2D",
    "Association",
    "CodeConcordance",
    "CodeVectors",
    "FingerprintLengths",
    "LexicalConsistency",
    "SampleCodes",
    "Stability",
    "UsageStats",
    "change_digit",
    "code_counts",
    "code_norms",
    "collect",
    "concordance",
    "degrees",
    "edited_texts",
    "fingerprint_lengths",
    "frequent_words",
    "gini",
    "lexical_consistency",
    "nearest_neighbour_distances",
    "pairwise_distances",
    "pca_2d",
    "sample_texts",
    "stability",
    "substitute_name",
    "top_associations",
    "usage_stats",
    "word_codes",
]
