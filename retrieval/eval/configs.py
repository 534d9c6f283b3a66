"""Retrieval configurations by name, and the topology sweep grid.

Configurations at equal budget are named ``dense{K}``, ``code{K}``, ``kmeans{K}``, ``bm25_{K}`` or
``dense{K}+code{K}`` / ``dense{K}+kmeans{K}`` / ``dense{K}+bm25_{K}``: ``code`` is Path B with the
trained fingerprinter, ``kmeans`` Path B with the k-means control, and a ``+`` path only adds
items that the dense path did not return (docs/design.md §4.2). ``multi`` is plan-guided
multi-route retrieval with every channel but the codebook, ``multi+code`` adds the codebook channel
(docs/design.md §7.5) and ``multi+kmeans`` adds it with the k-means control as its codebook (the
same plans and routes otherwise); all three return the evaluation's total budget (k_dense +
k_code) of distinct items.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from isq.topology import AGGREGATES, TopologyParams
from retrieval.eval.dual_path import Channel, DualPathMode

TRAINED, KMEANS = "trained", "kmeans"
"""Names of the two codebooks: the trained fingerprinter and the k-means control."""

K_DENSE, K_CODE = 20, 20
"""The default split of the evaluation's budget: Dense-20 + Codebook-20 against Dense-40."""

BUDGET = K_DENSE + K_CODE
"""The items a multi-route configuration returns unless told otherwise, as every default one does."""

SWEEP_HOPS = (1, 2, 3)
SWEEP_ALPHAS = (0.3, 0.5, 0.8)
SWEEP_SELF_TERMS = (False, True)

class EvaluationError(ValueError):
    """The evaluation cannot run as asked (e.g. a configuration needs a fingerprinter not given)."""


_PART = re.compile(r"(dense|codebm25_|code|kmeans|bm25_)(\d+)")
MULTI_CONFIGS = ("multi", "multi+code", "multi+kmeans")
"""Multi-route retrieval without a codebook channel, with the trained codebook's, with the control's."""


@dataclass(frozen=True)
class RetrievalConfig:
    """One retrieval configuration: its name, its k (the items it returns), the codebook whose
    codes it uses (``None``: none) and, for the dual-path ablation, which channels run
    (:class:`DualPathMode`); ``dual`` is None for multi-route retrieval."""

    name: str
    k: int
    codebook: str | None = None
    dual: DualPathMode | None = None

    @property
    def uses_codes(self) -> bool:
        return self.codebook is not None

    @property
    def multi(self) -> bool:
        return self.dual is None

    @property
    def walks_topology(self) -> bool:
        """Whether Path B's topology scores it (what a topology sweep changes)."""
        return self.dual is not None and self.dual.complement is Channel.CODE


_CHANNELS = {"code": Channel.CODE, "kmeans": Channel.CODE, "bm25_": Channel.BM25,
             "codebm25_": Channel.CODEBM25}


def parse_config(name: str, k: int = BUDGET) -> RetrievalConfig:
    """``dense20`` / ``code40`` / ``kmeans40`` / ``bm25_40`` / ``codebm25_40`` / ``dense20+code20`` /
    ``dense20+kmeans20`` / ``dense20+bm25_20`` / ``dense20+codebm25_20`` -> :class:`RetrievalConfig`;
    ``multi`` and ``multi+code`` / ``multi+kmeans`` take ``k`` items."""
    if name in MULTI_CONFIGS:
        return RetrievalConfig(name, k, {"multi+code": TRAINED, "multi+kmeans": KMEANS}.get(name))
    parts = [match for part in name.split("+") if (match := _PART.fullmatch(part)) is not None]
    valid = len(parts) == name.count("+") + 1 and (
        len(parts) == 1 or (len(parts) == 2 and parts[0][1] == "dense" and parts[1][1] != "dense"))
    if not valid:
        raise EvaluationError(f"unknown configuration {name!r}: expected dense<K>, code<K>, kmeans<K>, "
                              "bm25_<K>, codebm25_<K>, dense<K>+ one of those, multi, "
                              "multi+code or multi+kmeans")
    if any(int(part[2]) < 1 for part in parts):
        raise EvaluationError(f"configuration {name!r}: each K must be at least 1 (a part of K = 0 "
                              "reads nothing)")
    k_dense = int(parts[0][2]) if parts[0][1] == "dense" else 0
    other = parts[-1] if parts[-1][1] != "dense" else None
    if other is None:
        return RetrievalConfig(name, k_dense, None, DualPathMode(None, 0))
    complement = _CHANNELS[other[1]]
    codebook = (KMEANS if other[1] == "kmeans" else TRAINED) if complement.uses_codes else None
    return RetrievalConfig(name, k_dense + int(other[2]), codebook, DualPathMode(complement, k_dense))


def default_configs(k_dense: int = K_DENSE, k_code: int = K_CODE, with_kmeans: bool = False) -> list[str]:
    """Dense-K, Dense-2K, Dense-K + Codebook-K, Dense-K + BM25-K, Codebook-2K, with the control
    Dense-K + k-means-K, and multi-route retrieval without and with the codebook channel (with the
    control: also with the control as that channel): the ablation at equal budgets."""
    total = k_dense + k_code
    names = [f"dense{k_dense}", f"dense{total}", f"dense{k_dense}+code{k_code}",
             f"dense{k_dense}+bm25_{k_code}", f"code{total}"]
    multi = [name for name in MULTI_CONFIGS if with_kmeans or parse_config(name).codebook != KMEANS]
    return names + ([f"dense{k_dense}+kmeans{k_code}"] if with_kmeans else []) + multi


def resolve_configs(names: Sequence[str], codebooks: Collection[str], answer_configs: Sequence[str] = (),
                    k: int = BUDGET, *, sweep: bool = False) -> list[RetrievalConfig]:
    """Parse ``names`` (multi-route ones with ``k`` items), checking that each one's codebook
    is among ``codebooks``, that every answer configuration is one of them and, for a ``sweep``,
    that one walks the topology (refused before any work, not after the build)."""
    selected = [parse_config(name, k) for name in names]
    if sweep and not any(config.walks_topology for config in selected):
        raise EvaluationError("--sweep needs a configuration with a codebook path")
    missing = [c.name for c in selected if c.codebook is not None and c.codebook not in codebooks]
    if missing:
        raise EvaluationError(f"configuration(s) {', '.join(missing)} need a k-means control fingerprinter")
    unknown = [name for name in answer_configs if name not in names]
    if unknown:
        raise EvaluationError(f"answer configuration(s) {', '.join(unknown)} are not among {list(names)}")
    return selected


def sweep_grid() -> list[TopologyParams]:
    """H_r x α x self term x aggregate. The aggregate varies fastest: it does not change S_code,
    so consecutive settings reuse the cached S_code."""
    return [TopologyParams(hops, alpha, self_term, aggregate) for hops in SWEEP_HOPS for alpha in SWEEP_ALPHAS
            for self_term in SWEEP_SELF_TERMS for aggregate in AGGREGATES]
