"""How evenly a sample uses the codebook, and how much a fingerprint compresses a text."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from isq.codebook import perplexity
from isq.codes import collapse_repeats


@dataclass(frozen=True)
class UsageStats:
    """How evenly a sample uses the codebook.

    A code is dead here when no token of the sample maps to it (training's revival rule uses a
    windowed mean count instead). ``entropy`` is in nats; ``normalised_entropy`` divides it by
    log N_c (1 = uniform use); ``perplexity`` = exp(entropy), between 1 and N_c; ``gini`` is the
    Gini coefficient of the per-code counts over all N_c codes (0 = uniform, 1 - 1/N_c = a single code).
    """

    num_codes: int
    tokens: int
    used: int
    dead: int
    dead_share: float
    entropy: float
    normalised_entropy: float
    perplexity: float
    gini: float


def code_counts(codes: npt.ArrayLike, num_codes: int) -> np.ndarray:
    """Per-code token counts (length ``num_codes``); negative entries (padding) are ignored."""
    codes = np.asarray(codes, dtype=np.int64).ravel()
    codes = codes[codes >= 0]
    if codes.size and codes.max() >= num_codes:
        raise ValueError(f"code {codes.max()} is outside a codebook of {num_codes} codes")
    return np.bincount(codes, minlength=num_codes)


def gini(values: npt.ArrayLike) -> float:
    """Gini coefficient of non-negative values: 0 when all are equal, (n - 1) / n for one non-zero."""
    x = np.sort(np.asarray(values, dtype=np.float64).ravel())
    total = x.sum()
    if x.size == 0 or total == 0:
        raise ValueError("the Gini coefficient needs at least one positive value")
    ranks = np.arange(1, x.size + 1)
    return float(2.0 * (ranks * x).sum() / (x.size * total) - (x.size + 1) / x.size)


def usage_stats(counts: npt.ArrayLike) -> UsageStats:
    """Utilisation statistics from per-code counts (see :func:`code_counts`).

    The perplexity is training's (:func:`isq.codebook.perplexity`), taken in float64 here.
    """
    counts = np.asarray(counts, dtype=np.float64)
    total = counts.sum()
    if total == 0:
        raise ValueError("no token was counted")
    p = counts[counts > 0] / total
    entropy = float(-(p * np.log(p)).sum())
    num_codes = counts.size
    dead = int((counts == 0).sum())
    return UsageStats(
        num_codes=num_codes,
        tokens=int(total),
        used=num_codes - dead,
        dead=dead,
        dead_share=dead / num_codes,
        entropy=entropy,
        normalised_entropy=float(entropy / np.log(num_codes)) if num_codes > 1 else 1.0,
        perplexity=float(perplexity(torch.from_numpy(counts))),
        gini=gini(counts),
    )


@dataclass(frozen=True)
class FingerprintLengths:
    """Per text: L (tokens), |S_fp| (repeats collapsed) and |U_fp| (distinct codes)."""

    tokens: np.ndarray
    sequence: np.ndarray
    distinct: np.ndarray

    def summary(self) -> dict[str, float]:
        """Means and medians, and the mean |S_fp| / L and |U_fp| / L ratios."""
        lengths = np.maximum(self.tokens, 1)  # an empty text has nothing to compress
        return {
            "mean_L": float(self.tokens.mean()),
            "median_L": float(np.median(self.tokens)),
            "mean_S_fp": float(self.sequence.mean()),
            "median_S_fp": float(np.median(self.sequence)),
            "mean_U_fp": float(self.distinct.mean()),
            "median_U_fp": float(np.median(self.distinct)),
            "mean_S_fp_over_L": float((self.sequence / lengths).mean()),
            "mean_U_fp_over_L": float((self.distinct / lengths).mean()),
        }


def fingerprint_lengths(token_codes: Sequence[Sequence[int] | np.ndarray]) -> FingerprintLengths:
    """Lengths of L, S_fp and U_fp (docs/design.md §2.1) for every text's token codes."""
    if not token_codes:
        raise ValueError("no fingerprints")
    codes = [list(np.asarray(c).tolist()) for c in token_codes]
    return FingerprintLengths(
        tokens=np.array([len(c) for c in codes]),
        sequence=np.array([len(collapse_repeats(c)) for c in codes]),
        distinct=np.array([len(set(c)) for c in codes]),
    )
