"""Every result of the report from one fingerprinter and one text sample (:func:`analyse`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp

from isq.analysis import (
    EDITS,
    PCA2D,
    CodeConcordance,
    FingerprintLengths,
    LexicalConsistency,
    SampleCodes,
    Stability,
    UsageStats,
    code_counts,
    code_norms,
    collect,
    concordance,
    edited_texts,
    fingerprint_lengths,
    frequent_words,
    lexical_consistency,
    nearest_neighbour_distances,
    pairwise_distances,
    pca_2d,
    stability,
    usage_stats,
    word_codes,
)
from isq.fingerprint import Fingerprinter
from isq.topology import CooccurrenceTopology

DEFAULT_WORDS = 8
"""Without ``--words``, the codes of this many of the sample's most frequent words are listed."""


def sample_topology(sample: SampleCodes,
                    identity: Mapping[str, object] | None = None) -> CooccurrenceTopology:
    """The co-occurrence topology (docs/design.md §3) over the sample, one unit per text, default
    :class:`isq.topology.TopologyParams` (H_r, alpha)."""
    topology = CooccurrenceTopology(num_codes=sample.num_codes, identity=identity)
    topology.add(set(codes.tolist()) for codes in sample.token_codes)
    return topology


MULTI_HOP = 2
"""H_r of the multi-hop-only associations: under the default H_r = 1 a code's scores reach only
the codes it co-occurs with, so no pair that never co-occurs (M_ab = 0) could score."""


def multi_hop_scores(topology: CooccurrenceTopology) -> np.ndarray:
    """S_code of ``topology`` walked at least :data:`MULTI_HOP` steps (its other parameters kept)."""
    hops = max(MULTI_HOP, topology.params.max_hops)
    scores: np.ndarray = topology.with_params(replace(topology.params, max_hops=hops)).code_scores()
    return scores


@dataclass
class CodebookAnalysis:
    """Every result the report shows, from one fingerprinter and one text sample."""

    fingerprinter: dict[str, object]
    sample: SampleCodes
    counts: np.ndarray
    usage: UsageStats
    norms: np.ndarray
    pairwise: np.ndarray
    nearest: np.ndarray
    pca: PCA2D
    lengths: FingerprintLengths
    stability: dict[str, Stability]
    cooccurrence: sp.csr_matrix
    doc_freq: np.ndarray
    code_scores: np.ndarray
    multi_hop_scores: np.ndarray
    topology_params: dict[str, float]
    concordance: dict[int, CodeConcordance]
    words: dict[str, tuple[list[str], Counter[tuple[int, ...]]]]
    lexical: LexicalConsistency


def analyse(
    fingerprinter: Fingerprinter, texts: Sequence[str], words: Sequence[str] = (), batch_size: int = 64
) -> CodebookAnalysis:
    """Run every analysis; ``words`` defaults to the sample's most frequent words."""
    sample = collect(fingerprinter, texts, batch_size)
    counts = code_counts(sample.all_codes, sample.num_codes)
    results: dict[str, Stability] = {}
    for name, edit in EDITS.items():
        indices, edited = edited_texts(texts, edit)
        if indices:
            results[name] = stability(sample.select(indices), collect(fingerprinter, edited, batch_size))
    topology = sample_topology(sample, fingerprinter.identity)
    word_table = {}
    for word in list(words) or frequent_words(sample, DEFAULT_WORDS):
        pieces = fingerprinter.tokenizer.tokenize(word)
        word_table[word] = (pieces, word_codes(sample, pieces))
    run = fingerprinter.run_record or {}
    vectors = fingerprinter.codebook.vectors
    return CodebookAnalysis(
        fingerprinter={"codes": fingerprinter.codebook_size, "code_dim": fingerprinter.codebook.code_dim,
                       "encoder": fingerprinter.config.encoder, "steps": run.get("global_step", "unknown")},
        sample=sample,
        counts=counts,
        usage=usage_stats(counts),
        norms=code_norms(vectors),
        pairwise=pairwise_distances(vectors),
        nearest=nearest_neighbour_distances(vectors)[0],
        pca=pca_2d(vectors),
        lengths=fingerprint_lengths(sample.token_codes),
        stability=results,
        cooccurrence=topology.cooccurrence,
        doc_freq=topology.doc_freq,
        code_scores=topology.code_scores(),
        multi_hop_scores=multi_hop_scores(topology),
        topology_params={"units": topology.num_units, "max_hops": topology.params.max_hops,
                         "alpha": topology.params.alpha},
        concordance=concordance(sample),
        words=word_table,
        lexical=lexical_consistency(sample),
    )
