"""Forest plot of paired differences (``forest.png``): one panel per question group (overall,
each category, the lexical-gap subset), one row per comparison, the mean difference in recall
points with its 95% bootstrap interval. The statistics are
:func:`retrieval.eval.paired_differences.compare`'s (the same numbers ``python -m retrieval.paired``
prints), read from ``questions.jsonl``; a row whose interval excludes 0 is drawn filled. Imports
no torch and no faiss (``python -m retrieval.paired --forest`` stays light).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from retrieval.eval.paired_differences import PairedDifference, compare

FOREST_FILE = "forest.png"
FOREST_TITLE = "paired recall differences, mean [95% bootstrap interval]; red: the interval excludes 0"
Table = dict[str, dict[str, PairedDifference]]
"""``{"config − baseline": {group: PairedDifference}}``, rows in drawing order."""


def label(name: str, baseline: str) -> str:
    """A row's label: ``name − baseline``."""
    return f"{name} − {baseline}"


def comparisons(names: Sequence[str], k: int) -> list[tuple[str, str]]:
    """The (configuration, baseline) pairs an evaluation of ``names`` draws: every configuration
    against the dense baseline of the same budget; each multi-route configuration with a
    codebook channel against ``multi``; each trained-codebook configuration against its k-means
    twin (``code`` -> ``kmeans`` in the name)."""
    from retrieval.eval.configs import MULTI_CONFIGS  # here: configs loads the dual path, and with it faiss

    dense = f"dense{k}"
    plain = MULTI_CONFIGS[0]
    pairs = [(name, dense) for name in names if dense in names and name != dense]
    pairs += [(name, plain) for name in names if name.startswith(f"{plain}+") and plain in names]
    pairs += [(name, twin) for name in names
              if "code" in name and (twin := name.replace("code", "kmeans")) != name and twin in names]
    return pairs


def forest_table(paths: Path | Sequence[Path], pairs: Sequence[tuple[str, str]],
                 tagged: Mapping[str, Path | Sequence[Path]] | None = None, resamples: int = 2000,
                 seed: int = 0) -> Table:
    """The paired differences of ``pairs`` (read and pooled as :func:`compare` does), in order."""
    by_baseline: dict[str, list[str]] = {}
    for name, baseline in pairs:
        by_baseline.setdefault(baseline, []).append(name)
    found = {baseline: compare(paths, baseline, names, resamples, seed, tagged)
             for baseline, names in by_baseline.items()}
    return {label(name, baseline): found[baseline][name] for name, baseline in pairs}


def plot_forest(table: Table, path: Path, title: str = "") -> None:
    """Draw ``table``: groups side by side, comparisons top to bottom, a line at 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows_labels = list(table)
    groups = list(next(iter(table.values())))
    figure, axes = plt.subplots(1, len(groups),
                                figsize=(2.2 + 2.6 * len(groups), 1.2 + 0.38 * len(rows_labels)),
                                sharey=True, squeeze=False)
    rows = range(len(rows_labels))[::-1]
    for axis, group in zip(axes[0], groups, strict=True):
        cells = [table[row_label][group] for row_label in rows_labels]
        for row, d in zip(rows, cells, strict=True):
            resolved = d.low > 0 or d.high < 0
            axis.errorbar(d.mean, row, xerr=[[d.mean - d.low], [d.high - d.mean]], fmt="o", capsize=3,
                          color="C3" if resolved else "C0", markerfacecolor=None if resolved else "white")
        axis.axvline(0.0, color="grey", linewidth=0.8)
        axis.set_title(f"{group} (n={cells[0].n})", fontsize=9)
        axis.set_xlabel("recall difference (points)", fontsize=8)
        axis.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks(list(rows), rows_labels, fontsize=8)
    if title:
        figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, format="png")  # the file named, even without a .png suffix
    plt.close(figure)


def write_forest(questions: Path, names: Sequence[str], k: int, path: Path) -> bool:
    """The evaluation's forest plot of :func:`comparisons` from its ``questions.jsonl``; False
    when the configurations give no pair (then no picture of an earlier run is left at ``path``)."""
    pairs = comparisons(names, k)
    if not pairs:
        path.unlink(missing_ok=True)
        return False
    plot_forest(forest_table(questions, pairs), path,
                FOREST_TITLE)
    return True
