"""Paired comparison of retrieval configurations, from an evaluation's ``questions.jsonl``.

Every configuration of one evaluation answers the same questions, so the per-question
difference in evidence recall cancels how hard each question is. For each configuration against
the baseline: the mean difference in recall points, a 95% percentile-bootstrap interval over
questions (:func:`scipy.stats.bootstrap` on the per-question differences, resampled with a fixed
seed), and how many questions got better and worse.
Imports no torch: it reads ``questions.jsonl`` through :func:`retrieval.eval.results.read_questions`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats

from isq.markdown import markdown_table
from retrieval.eval.metrics import score_evidence
from retrieval.eval.questions import CATEGORY_NAMES
from retrieval.eval.results import QuestionRecord, read_questions


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
    percentile-bootstrap interval of that mean: the per-question differences are resampled with
    replacement ``resamples`` times, drawn by ``np.random.default_rng(seed)``. One question has
    the zero-width interval at its difference (every resample is that question; scipy refuses a
    sample of one)."""
    if len(baseline) != len(other):
        raise ValueError(f"paired samples differ in length: {len(baseline)} and {len(other)}")
    if len(baseline) == 0:
        raise ValueError("no questions to compare")
    diff = 100.0 * (np.asarray(other, dtype=float) - np.asarray(baseline, dtype=float))
    if diff.size == 1:
        low = high = float(diff[0])
    else:
        interval = stats.bootstrap((diff,), np.mean, n_resamples=resamples, confidence_level=level,
                                   method="percentile", rng=np.random.default_rng(seed)).confidence_interval
        low, high = float(interval.low), float(interval.high)
    return PairedDifference(int(diff.size), float(diff.mean()), low, high, int((diff > 0).sum()),
                            int((diff < 0).sum()))


def _read_runs(paths: Sequence[Path], reference: tuple[Path, list] | None = None) -> list[list]:
    """The rows of each ``questions.jsonl``, checked to hold the same questions as ``reference``
    (a path and its rows; default: the first of ``paths``)."""
    runs = [read_questions(path) for path in paths]
    if not runs[0]:
        raise ValueError(f"{paths[0]}: no questions")
    ref_path, ref_rows = reference or (paths[0], runs[0])
    keys = [_question(r) for r in ref_rows]
    for path, rows in zip(paths, runs, strict=True):
        if len(rows) != len(keys):
            raise ValueError(f"{path}: not the same questions as {ref_path} ({len(rows)} against "
                             f"{len(keys)})")
        for row, key in zip(rows, keys, strict=True):
            if _question(row) != key:
                raise ValueError(f"{path}: not the same questions as {ref_path} (conversation "
                                 f"{row.conversation} qa {row.qa_index} differs in its place, text, category "
                                 "or evidence)")
    return runs


def _question(row: QuestionRecord) -> tuple[object, ...]:
    """What makes two runs' rows the same question: its place, text, category and evidence."""
    return row.conversation, row.qa_index, row.question, row.category, tuple(row.evidence)


def _mean_recalls(runs: list[list]) -> dict[str, list[float]]:
    """Per configuration (those every run has), each question's recall averaged over the runs."""
    first = runs[0]
    names = [name for name in first[0].found if all(name in rows[0].found for rows in runs)]
    return {name: [sum(score_evidence(rows[i].evidence, set(rows[i].found[name])).recall for rows in runs)
                   / len(runs) for i in range(len(first))] for name in names}


def read_recalls(paths: Sequence[Path], tagged: Mapping[str, Path | Sequence[Path]] | None = None
                 ) -> tuple[list[str], list[bool], dict[str, list[float]]]:
    """Categories, lexical-gap flags and per-configuration recall of every question, from one
    ``questions.jsonl`` or several runs over the same questions (e.g. training seeds), whose
    recalls are averaged question by question. ``tagged`` adds the configurations of other runs
    over the same questions as ``<configuration>@<tag>`` (e.g. the same configuration evaluated
    on consolidated memory, or with another Path B setting); several runs under one tag are
    averaged the same way."""
    runs = _read_runs(paths)
    recalls = _mean_recalls(runs)
    for tag, tag_paths in (tagged or {}).items():
        tag_paths = [tag_paths] if isinstance(tag_paths, Path) else list(tag_paths)
        tag_runs = _read_runs(tag_paths, reference=(paths[0], runs[0]))
        recalls.update({f"{name}@{tag}": values for name, values in _mean_recalls(tag_runs).items()})
    return [row.category for row in runs[0]], [bool(row.lexical_gap) for row in runs[0]], recalls


def compare(paths: Path | Sequence[Path], baseline: str, others: Sequence[str], resamples: int = 2000,
            seed: int = 0,
            tagged: Mapping[str, Path | Sequence[Path]] | None = None) -> dict[str,
                                                                               dict[str, PairedDifference]]:
    """``{config: {"overall" | category | "lexical gap": PairedDifference}}`` against ``baseline``
    (the lexical-gap group when the file flags such questions); ``tagged`` as :func:`read_recalls`."""
    paths = [paths] if isinstance(paths, Path) else list(paths)
    categories, gaps, recalls = read_recalls(paths, tagged)
    unknown = [name for name in (baseline, *others) if name not in recalls]
    if unknown:
        raise ValueError(f"{paths[0]}: no configuration {', '.join(unknown)}; it has {', '.join(recalls)}")
    groups = {"overall": list(range(len(categories)))}
    known = [name for name in CATEGORY_NAMES.values() if name in categories]
    for category in known + sorted(set(categories) - set(known)):
        groups[category] = [i for i, c in enumerate(categories) if c == category]
    if any(gaps):
        groups["lexical gap"] = [i for i, gap in enumerate(gaps) if gap]
    return {
        name: {group: paired_difference([recalls[baseline][i] for i in rows],
                                        [recalls[name][i] for i in rows], resamples, seed)
               for group, rows in groups.items()}
        for name in others
    }


def render(baseline: str, table: dict[str, dict[str, PairedDifference]]) -> str:
    """A Markdown table: one row per configuration, one column per group (with its question count)."""
    first = next(iter(table.values()))
    headers = ["configuration", *(f"{group} ({d.n})" for group, d in first.items())]
    rows = [[name, *(str(d) for d in row.values())] for name, row in table.items()]
    return (f"Recall difference to {baseline} in points: mean [95% bootstrap interval], "
            "questions better/worse\n\n" + markdown_table(headers, rows))
