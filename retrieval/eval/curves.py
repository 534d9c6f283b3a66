"""Recall@k curves of an evaluation, k = 5, 10, ..., 100 (``recall_at_k.png``).

Each configuration retrieves once at the largest k, its budgets scaled in proportion
(``dense20+code20`` runs as dense50 + code50, ``code40`` as code100, ``multi`` with 100 items),
and that list is cut at every k. A two-path list is cut in the proportion of its budgets: the
dense hits and the complementary path's hits are interleaved by their rank within their path,
so a cut at k holds about k·k_dense/budget dense hits. One retrieval is cheaper than twenty, but
a cut is not a run at that budget: the complementary path of dense50 + code50 leaves out the 50
dense hits, not the first k/2, and multi-route retrieval sizes its channels and selection by
the k it is asked for. So a curve at the evaluation's budget can differ slightly from the table
(for a single-path configuration it cannot: its top k is the top k of its top 100).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from retrieval.eval.configs import RetrievalConfig
from retrieval.eval.evidence import CATEGORY_NAMES, EvalQuestion
from retrieval.eval.metrics import covered_turns, score_evidence
from retrieval.eval.results import RecallCurves

if TYPE_CHECKING:  # only for annotations: rendering results.md loads no faiss
    from retrieval.retriever import Hit

CURVE_KS = tuple(range(5, 101, 5))
"""The cuts of the curves: k = 5 ... 100 items."""
CURVES_FILE = "recall_at_k.png"


def scaled(config: RetrievalConfig, k: int) -> RetrievalConfig:
    """``config`` (same name) with a budget of ``k`` items, split between its paths in the
    proportion of its own budgets."""
    k_dense = round(k * config.k_dense / config.budget)
    return dataclasses.replace(config, k_dense=k_dense, k_code=k - k_dense)


def cut_order(hits: Sequence[Hit], config: RetrievalConfig) -> list[Hit]:
    """The order in which ``hits`` of ``config`` are cut: a single path's (or multi-route) list as
    ranked; a dense + complement list interleaved by rank over each path's budget (ties: dense
    first)."""
    if config.multi or not (config.k_dense and config.k_code):
        return list(hits)

    def position(hit: Hit) -> tuple[float, bool]:
        budget = config.k_dense if hit.path == "dense" else config.k_code
        return (hit.rank - 0.5) / budget, hit.path != "dense"

    return sorted(hits, key=position)


def curve(questions: Sequence[EvalQuestion], ordered: Sequence[Sequence[Hit]], ks: Sequence[int]
          ) -> dict[str, list[float]]:
    """Mean evidence recall of the first k items for every k of ``ks``, overall and per category
    (micro averages over questions, as the evaluation's tables)."""
    recall = np.array([[score_evidence(q.evidence, covered_turns(hits[:k])).recall for k in ks]
                       for q, hits in zip(questions, ordered, strict=True)]).reshape(len(questions), len(ks))
    categories = np.array([q.category_name for q in questions])
    groups = {"overall": np.ones(len(questions), dtype=bool)}
    groups |= {name: categories == name for name in CATEGORY_NAMES.values() if (categories == name).any()}
    return {group: [float(v) for v in recall[rows].mean(axis=0)] for group, rows in groups.items()}


def recall_curves(configs: Sequence[RetrievalConfig], questions: Sequence[EvalQuestion],
                  retrieve: Callable[[RetrievalConfig], list[list[Hit]]], ks: Sequence[int] = CURVE_KS
                  ) -> RecallCurves:
    """The curve of every configuration: ``retrieve`` (the evaluation's hits of a configuration,
    in question order) runs once per configuration at ``max(ks)`` items."""
    top = max(ks)
    curves = {}
    for config in configs:
        big = scaled(config, top)
        curves[config.name] = curve(questions, [cut_order(hits, big) for hits in retrieve(big)], ks)
    return RecallCurves(ks=list(ks), configs=curves)


def plot_curves(curves: RecallCurves, path: Path) -> None:
    """One panel per group (overall first, then the categories): recall@k per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(next(iter(curves.configs.values())))
    figure, axes = plt.subplots(1, len(groups), figsize=(3.6 * len(groups), 4), sharey=True, squeeze=False)
    for axis, group in zip(axes[0], groups, strict=True):
        for name, by_group in curves.configs.items():
            axis.plot(curves.ks, [100 * v for v in by_group[group]], marker=".", label=name)
        axis.set_title(group)
        axis.set_xlabel("k (items retrieved)")
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel("evidence recall@k (%)")
    axes[0][0].set_ylim(0, 100)
    figure.legend(*axes[0][0].get_legend_handles_labels(), fontsize=8, ncol=min(len(curves.configs), 5),
                  loc="lower center")
    figure.tight_layout(rect=(0, 0.12, 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)
