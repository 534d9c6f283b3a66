"""Recall@k curves of an evaluation, k = 5, 10, ..., 100 (``recall_at_k.png``).

Each path of a configuration retrieves once at the largest k and the lists are cut at every k.
A single path (``dense40``, ``code40``) or multi-route retrieval is its own list cut at k. A
two-path configuration (``dense20+code20``) keeps its split in proportion, k_d = k·k_dense/budget:
the cut takes the first k_d dense hits (rounded half up), then the complementary path's best hits among the
rest, read from that path's list retrieved without exclusions. A path ranks the remaining items in
the same order whatever it excludes, so every cut of a single or two-path configuration is
exactly that configuration at that budget (``dense20+code20`` at k = 40 is the table's figure).
Multi-route retrieval is the exception: it sizes its channels and selection by the k it is
asked for, so its cut at 40 of a list of 100 can differ a little from a run at 40.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from retrieval.eval.configs import RetrievalConfig
from retrieval.eval.dual_path import DualPathMode
from retrieval.eval.metrics import covered_turns, score_evidence
from retrieval.eval.questions import CATEGORY_NAMES, EvalQuestion
from retrieval.eval.results import RecallCurves

if TYPE_CHECKING:
    from retrieval.contract import Hit

CURVE_KS = tuple(range(5, 101, 5))
"""The cuts of the curves: k = 5 ... 100 items."""
CURVES_FILE = "recall_at_k.png"
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*", "h", "p", "d", "8")
"""One marker per configuration, in order (they repeat only past 14 configurations)."""
CONTROL, TRAINED_PART = "kmeans", "code"
"""A k-means control is named as its configuration with ``kmeans`` for ``code``
(``dense20+kmeans20`` is the control of ``dense20+code20``)."""


class HitsRun(Protocol):
    """What a retrieval run of the evaluation gives: each question's hits, in question order."""

    hits: list[list[Hit]]


def path_runs(config: RetrievalConfig, k: int) -> list[RetrievalConfig]:
    """The single-path (or multi-route) retrievals at ``k`` items whose lists :func:`cut` combines."""
    dual = config.dual
    if dual is None or dual.complement is None or dual.k_dense == 0:
        return [dataclasses.replace(config, k=k)]
    return [dataclasses.replace(config, k=k, dual=DualPathMode(None, 0)),
            dataclasses.replace(config, k=k, dual=DualPathMode(dual.complement, 0))]


def cut(config: RetrievalConfig, lists: Sequence[Sequence[Hit]], k: int) -> list[Hit]:
    """``config``'s first ``k`` items from the lists of :func:`path_runs` (one question's)."""
    if len(lists) == 1:
        return list(lists[0][:k])
    assert config.dual is not None  # two lists: a dense + complement configuration
    dense, other = lists
    k_dense = int(k * config.dual.k_dense / config.k + 0.5)  # half a dense item rounds up
    taken = list(dense[:k_dense])
    seen = {hit.index for hit in taken}
    return taken + [hit for hit in other if hit.index not in seen][: k - k_dense]


def curve(questions: Sequence[EvalQuestion], recalled: Callable[[int, int], Sequence[Hit]], ks: Sequence[int]
          ) -> dict[str, list[float]]:
    """Mean evidence recall of ``recalled(question index, k)`` for every k of ``ks``, overall and
    per category (micro averages over questions, as the evaluation's tables)."""
    recall = np.array([[score_evidence(q.evidence, covered_turns(recalled(i, k))).recall for k in ks]
                       for i, q in enumerate(questions)]).reshape(len(questions), len(ks))
    categories = np.array([q.category_name for q in questions])
    groups = {"overall": np.ones(len(questions), dtype=bool)}
    groups |= {name: categories == name for name in CATEGORY_NAMES.values() if (categories == name).any()}
    return {group: [float(v) for v in recall[rows].mean(axis=0)] for group, rows in groups.items()}


def recall_curves(configs: Sequence[RetrievalConfig], questions: Sequence[EvalQuestion],
                  retrieve: Callable[[RetrievalConfig], HitsRun],
                  ks: Sequence[int] = CURVE_KS) -> RecallCurves:
    """The curve of every configuration: ``retrieve`` (the evaluation's run of a configuration)
    runs once per path of each configuration at ``max(ks)`` items."""
    top = max(ks)
    curves = {}
    for config in configs:
        runs = [retrieve(run).hits for run in path_runs(config, top)]
        curves[config.name] = curve(questions, functools.partial(_cut_question, config, runs), ks)
    return RecallCurves(ks=list(ks), configs=curves)


def _cut_question(config: RetrievalConfig, runs: Sequence[Sequence[Sequence[Hit]]], question: int, k: int
                  ) -> list[Hit]:
    """Question ``question``'s first ``k`` items of ``config`` from its path runs."""
    return cut(config, [run[question] for run in runs], k)


def curve_family(name: str) -> tuple[str, bool]:
    """The configuration whose hue a curve takes (a control takes its configuration's) and whether
    it is a k-means control."""
    return name.replace(CONTROL, TRAINED_PART), CONTROL in name


def curve_styles(names: Sequence[str]) -> dict[str, tuple[str, str, str]]:
    """(colour, marker, line style) of each configuration's curve. Each family (a configuration
    and its k-means control) has one hue of matplotlib's paired ``tab20`` palette, in order of
    first appearance: the configuration its dark shade with a solid line, the control its light
    shade with a dashed line; every configuration has its own marker."""
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    tab20 = colormaps["tab20"]
    palette = [to_hex(tab20(index)) for index in range(tab20.N)]  # dark, light, dark, light ...
    families: dict[str, int] = {}
    styles = {}
    for position, name in enumerate(names):
        family, control = curve_family(name)
        hue = families.setdefault(family, len(families)) % (len(palette) // 2)
        line = "--" if control else "-"
        styles[name] = (palette[2 * hue + int(control)], MARKERS[position % len(MARKERS)], line)
    return styles


def plot_curves(curves: RecallCurves, path: Path) -> None:
    """One panel per group (overall first, then the categories): recall@k per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(next(iter(curves.configs.values())))
    styles = curve_styles(list(curves.configs))
    figure, axes = plt.subplots(1, len(groups), figsize=(3.6 * len(groups), 4), sharey=True, squeeze=False)
    for axis, group in zip(axes[0], groups, strict=True):
        for name, by_group in curves.configs.items():
            colour, marker, line = styles[name]
            axis.plot(curves.ks, [100 * v for v in by_group[group]], color=colour, marker=marker,
                      markersize=4, linestyle=line, label=name)
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
