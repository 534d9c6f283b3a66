"""Retrieval configurations by name, and the topology sweep grid.

Configurations at equal budget are named ``dense{K}``, ``code{K}``, ``kmeans{K}``, ``bm25_{K}`` or
``dense{K}+code{K}`` / ``dense{K}+kmeans{K}`` / ``dense{K}+bm25_{K}``: ``code`` is Path B with the
trained fingerprinter, ``kmeans`` Path B with the k-means control, and a ``+`` path only adds
items that the dense path did not return (SPEC section 4). ``multi`` is plan-guided multi-route
retrieval with every route but the codebook, ``multi+code`` adds the codebook route (SPEC
section 7) and ``multi+kmeans`` adds it with the k-means control as its codebook (the same plans
and routes otherwise); all three return the evaluation's total budget (k_dense + k_code) of
distinct items.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from isq.topology import AGGREGATES, TopologyParams

TRAINED, KMEANS = "trained", "kmeans"
"""Names of the two codebooks: the trained fingerprinter and the k-means control."""

SWEEP_HOPS = (1, 2, 3)
SWEEP_ALPHAS = (0.3, 0.5, 0.8)
SWEEP_SELF_TERMS = (False, True)

class EvaluationError(ValueError):
    """The evaluation cannot run as asked (e.g. a configuration needs a fingerprinter not given)."""


_PART = re.compile(r"(dense|codebm25_|code|kmeans|bm25_)(\d+)")
MULTI_CONFIGS = ("multi", "multi+code")
"""The multi-route retriever's modes: without and with its codebook route."""
MULTI_KMEANS = "multi+kmeans"
"""``multi+code`` with the k-means control as the code route's codebook."""


@dataclass(frozen=True)
class RetrievalConfig:
    """One retrieval configuration: its name, DualPathRetriever mode ("multi" or "multi+code" for
    multi-route retrieval) and budgets (a multi-route configuration's whole budget is ``k_dense``),
    and the codebook whose retriever runs it."""

    name: str
    mode: str
    k_dense: int
    k_code: int
    codebook: str = TRAINED

    @property
    def uses_codes(self) -> bool:
        return self.mode.endswith(("code", "codebm25"))

    @property
    def multi(self) -> bool:
        return self.mode in MULTI_CONFIGS

    @property
    def budget(self) -> int:
        return self.k_dense + self.k_code


def parse_config(name: str, budget: int = 40) -> RetrievalConfig:
    """``dense20`` / ``code40`` / ``kmeans40`` / ``bm25_40`` / ``codebm25_40`` / ``dense20+code20`` /
    ``dense20+kmeans20`` / ``dense20+bm25_20`` / ``dense20+codebm25_20`` -> :class:`RetrievalConfig`; ``multi`` and
    ``multi+code`` / ``multi+kmeans`` take ``budget`` items."""
    if name in MULTI_CONFIGS:
        return RetrievalConfig(name, name, budget, 0)
    if name == MULTI_KMEANS:
        return RetrievalConfig(name, "multi+code", budget, 0, KMEANS)
    parts = [_PART.fullmatch(part) for part in name.split("+")]
    valid = all(parts) and (len(parts) == 1 or (len(parts) == 2 and parts[0][1] == "dense" and parts[1][1] != "dense"))
    if not valid:
        raise EvaluationError(f"unknown configuration {name!r}: expected dense<K>, code<K>, kmeans<K>, bm25_<K>, "
                              "codebm25_<K>, dense<K>+ one of those, multi, multi+code or multi+kmeans")
    k_dense = int(parts[0][2]) if parts[0][1] == "dense" else 0
    other = parts[-1] if parts[-1][1] != "dense" else None
    path = {None: "dense", "code": "code", "kmeans": "code", "bm25_": "bm25", "codebm25_": "codebm25"}[
        other[1] if other else None]
    mode = f"dense+{path}" if k_dense and other else path
    return RetrievalConfig(name, mode, k_dense, int(other[2]) if other else 0,
                           KMEANS if other is not None and other[1] == "kmeans" else TRAINED)


def default_configs(k_dense: int = 20, k_code: int = 20, with_kmeans: bool = False) -> list[str]:
    """Dense-K, Dense-2K, Dense-K + Codebook-K, Dense-K + BM25-K, Codebook-2K, with the control
    Dense-K + k-means-K, and multi-route retrieval without and with the codebook route (with the
    control: also with the control as that route): the ablation at equal budgets."""
    total = k_dense + k_code
    names = [f"dense{k_dense}", f"dense{total}", f"dense{k_dense}+code{k_code}", f"dense{k_dense}+bm25_{k_code}",
             f"code{total}"]
    return (names + ([f"dense{k_dense}+kmeans{k_code}"] if with_kmeans else []) + list(MULTI_CONFIGS)
            + ([MULTI_KMEANS] if with_kmeans else []))


def resolve_configs(names: Sequence[str], codebooks: Collection[str], answer_configs: Sequence[str] = (),
                    budget: int = 40) -> list[RetrievalConfig]:
    """Parse ``names`` (multi-route ones with ``budget`` items), checking that each one's codebook
    is among ``codebooks`` and that every answer configuration is one of them."""
    selected = [parse_config(name, budget) for name in names]
    missing = [c.name for c in selected if c.codebook not in codebooks]
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
