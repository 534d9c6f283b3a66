"""Paired comparison of retrieval configurations, from an evaluation's ``questions.jsonl``.

Every configuration of one evaluation answers the same questions, so the per-question
difference in evidence recall cancels how hard each question is. For each configuration against
the baseline: the mean difference in recall points, a 95% percentile-bootstrap interval over
questions (resampled with a fixed seed), and how many questions got better and worse.
Imports no torch: it reads ``questions.jsonl`` only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retrieval.eval.evidence import CATEGORY_NAMES
from retrieval.eval.metrics import score_evidence


@dataclass(frozen=True)
class PairedDifference:
    """``other − baseline`` in recall points over ``n`` paired questions."""

    n: int
    mean: float
    low: float
    high: float
    better: int
    worse: int

    def __str__(self) -> str:
        return f"{self.mean:+.1f} [{self.low:+.1f}, {self.high:+.1f}], +{self.better}/-{self.worse}"


def paired_difference(baseline: Sequence[float], other: Sequence[float], resamples: int = 2000,
                      seed: int = 0, level: float = 0.95) -> PairedDifference:
    """Mean of ``other[i] − baseline[i]`` (in points: inputs are shares in [0, 1]) with a
    percentile-bootstrap interval: questions are resampled with replacement ``resamples`` times."""
    if len(baseline) != len(other):
        raise ValueError(f"paired samples differ in length: {len(baseline)} and {len(other)}")
    if len(baseline) == 0:
        raise ValueError("no questions to compare")
    diff = 100.0 * (np.asarray(other, dtype=float) - np.asarray(baseline, dtype=float))
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, diff.size, size=(resamples, diff.size))].mean(axis=1)
    tail = 100.0 * (1 - level) / 2
    low, high = np.percentile(means, [tail, 100.0 - tail])
    return PairedDifference(int(diff.size), float(diff.mean()), float(low), float(high),
                            int((diff > 0).sum()), int((diff < 0).sum()))


def read_recalls(path: Path) -> tuple[list[str], dict[str, list[float]]]:
    """Categories and per-configuration recall of every question in a ``questions.jsonl``."""
    categories: list[str] = []
    recalls: dict[str, list[float]] = {}
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                evidence, found = row["evidence"], row["found"]
                category = row["category"]
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise ValueError(f"{path}:{line_number}: not a questions.jsonl record ({err})") from None
            if categories and set(found) != set(recalls):
                raise ValueError(f"{path}:{line_number}: configurations {sorted(found)} differ from line 1's")
            categories.append(category)
            for name, turns in found.items():
                recalls.setdefault(name, []).append(score_evidence(evidence, set(turns)).recall)
    if not categories:
        raise ValueError(f"{path}: no questions")
    return categories, recalls


def compare(path: Path, baseline: str, others: Sequence[str], resamples: int = 2000,
            seed: int = 0) -> dict[str, dict[str, PairedDifference]]:
    """``{config: {"overall" | category: PairedDifference}}`` against ``baseline``."""
    categories, recalls = read_recalls(path)
    unknown = [name for name in (baseline, *others) if name not in recalls]
    if unknown:
        raise ValueError(f"{path}: no configuration {', '.join(unknown)}; it has {', '.join(recalls)}")
    groups = {"overall": list(range(len(categories)))}
    known = [name for name in CATEGORY_NAMES.values() if name in categories]
    for category in known + sorted(set(categories) - set(known)):
        groups[category] = [i for i, c in enumerate(categories) if c == category]
    return {
        name: {group: paired_difference([recalls[baseline][i] for i in rows], [recalls[name][i] for i in rows],
                                        resamples, seed)
               for group, rows in groups.items()}
        for name in others
    }


def render(baseline: str, table: dict[str, dict[str, PairedDifference]]) -> str:
    first = next(iter(table.values()))
    lines = [f"Recall difference to {baseline} in points: mean [95% bootstrap interval], questions better/worse",
             "", "| configuration | " + " | ".join(f"{g} ({d.n})" for g, d in first.items()) + " |",
             "|---|" + "---|" * len(first)]
    lines += [f"| {name} | " + " | ".join(str(d) for d in row.values()) + " |" for name, row in table.items()]
    return "\n".join(lines)
