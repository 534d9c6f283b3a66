"""Paired comparison of retrieval configurations, from an evaluation's ``questions.jsonl``.

Every configuration of one evaluation answers the same questions, so the per-question
difference in evidence recall cancels how hard each question is. For each configuration against
the baseline: the mean difference in recall points, a 95% percentile-bootstrap interval over
questions (:func:`scipy.stats.bootstrap` on the per-question differences, resampled with a fixed
seed), and how many questions got better and worse.

Several runs over the same questions (training seeds) are pooled question by question, and the
interval then resamples questions only: it leaves out how much the runs differ. With
``resample_runs`` each resample also draws the runs with replacement
(:func:`resampled_difference`), so the interval holds part of the runs' spread too (a draw
of n runs from n spans no more than they do). Questions that share a conversation are resampled
as if independent: with two conversations no interval over conversations can be had, and
``by_conversation`` shows each conversation's difference apart. Questions that cite the same
evidence turn are one draw with ``by_evidence_unit`` (:func:`evidence_units`).
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


RESAMPLE_CHUNK = 10_000
"""Resamples drawn at once by :func:`resampled_difference` (its arrays are this many rows of
one weight per question)."""


def resampled_difference(baseline: np.ndarray, other: np.ndarray, same_runs: bool, resamples: int = 2000,
                         seed: int = 0, level: float = 0.95, *, draw_runs: bool = True,
                         units: np.ndarray | None = None) -> PairedDifference:
    """``other − baseline`` as :func:`paired_difference` of the run-averaged recalls, with a
    percentile-bootstrap interval in which every resample draws the questions with replacement and,
    with ``draw_runs``, the runs of each side with replacement (the same draw for both when
    ``same_runs``: then the runs are paired, as a seed's two configurations are). ``units`` (one
    number per question) makes the questions of one unit one draw: the resample draws as many
    units as there are, and each question counts as often as its unit was drawn. ``baseline`` and
    ``other`` are recalls in [0, 1], runs × questions; drawn by ``np.random.default_rng(seed)``."""
    if baseline.shape[1] != other.shape[1] or baseline.shape[1] == 0:
        raise ValueError(f"paired samples differ in length or are empty: {baseline.shape[1]} and "
                         f"{other.shape[1]}")
    rng = np.random.default_rng(seed)
    questions = baseline.shape[1]

    def draw(count: int, size: int) -> np.ndarray:
        return rng.multinomial(count, np.full(count, 1.0 / count), size=size) / count

    def fixed(count: int, size: int) -> np.ndarray:
        return np.full((size, count), 1.0 / count)

    numbered = None if units is None else np.unique(units, return_inverse=True)[1]  # units 0, 1, ...

    def question_weights(size: int) -> np.ndarray:
        if numbered is None:
            return draw(questions, size)
        counts = draw(int(numbered.max()) + 1, size)[:, numbered]
        return counts / counts.sum(axis=1, keepdims=True)

    runs = draw if draw_runs else fixed
    means = []
    for start in range(0, resamples, RESAMPLE_CHUNK):
        size = min(RESAMPLE_CHUNK, resamples - start)
        weights = question_weights(size)
        base_runs = runs(baseline.shape[0], size)
        other_runs = base_runs if same_runs else runs(other.shape[0], size)
        means.append(100.0 * ((other_runs @ other - base_runs @ baseline) * weights).sum(axis=1))
    low, high = np.percentile(np.concatenate(means), [50.0 * (1 - level), 50.0 * (1 + level)])
    diff = 100.0 * (other.mean(axis=0) - baseline.mean(axis=0))
    return PairedDifference(questions, float(diff.mean()), float(low), float(high), int((diff > 0).sum()),
                            int((diff < 0).sum()))


def evidence_units(questions: Sequence[QuestionRecord]) -> np.ndarray:
    """One number per question, shared by the questions of one conversation linked by evidence
    turns (two questions citing one turn, and so on transitively): such questions are not
    independent draws, since one memory item decides their recall together."""
    unit = list(range(len(questions)))

    def root(i: int) -> int:
        while unit[i] != i:
            unit[i] = unit[unit[i]]
            i = unit[i]
        return i

    first_citing: dict[tuple[str, str], int] = {}
    for i, row in enumerate(questions):
        for turn in row.evidence:
            j = first_citing.setdefault((row.conversation, turn), i)
            unit[root(i)] = root(j)
    return np.array([root(i) for i in range(len(questions))])


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


@dataclass(frozen=True)
class RunRecalls:
    """One configuration's recall of every question in each run (runs × questions) and the runs
    it was read from: ``""`` for the main runs, else the tag they were given under."""

    runs: np.ndarray
    source: str

    def mean(self) -> list[float]:
        """Each question's recall averaged over the runs."""
        return list((self.runs.sum(axis=0) / self.runs.shape[0]).tolist())


def _run_recalls(runs: list[list], source: str) -> dict[str, RunRecalls]:
    """Per configuration (those every run has), each question's recall in each run."""
    first = runs[0]
    names = [name for name in first[0].found if all(name in rows[0].found for rows in runs)]
    return {name: RunRecalls(np.array([[score_evidence(rows[i].evidence, set(rows[i].found[name])).recall
                                        for i in range(len(first))] for rows in runs]), source)
            for name in names}


def read_recalls(paths: Sequence[Path], tagged: Mapping[str, Path | Sequence[Path]] | None = None
                 ) -> tuple[list[str], list[bool], dict[str, list[float]]]:
    """Categories, lexical-gap flags and per-configuration recall of every question averaged over
    the runs (:func:`read_run_recalls`, whose arguments these are)."""
    questions, recalls = read_run_recalls(paths, tagged)
    return ([row.category for row in questions], [bool(row.lexical_gap) for row in questions],
            {name: values.mean() for name, values in recalls.items()})


def read_run_recalls(paths: Sequence[Path], tagged: Mapping[str, Path | Sequence[Path]] | None = None
                     ) -> tuple[list[QuestionRecord], dict[str, RunRecalls]]:
    """The questions (the first run's rows) and per-configuration recall of every question in
    every run, from one ``questions.jsonl`` or several runs over the same questions (e.g.
    training seeds). ``tagged`` adds the configurations of other runs over the same questions as
    ``<configuration>@<tag>`` (e.g. the same configuration evaluated on consolidated memory, or
    with another Path B setting), one or several runs under each tag."""
    runs = _read_runs(paths)
    recalls = _run_recalls(runs, "")
    for tag, tag_paths in (tagged or {}).items():
        tag_paths = [tag_paths] if isinstance(tag_paths, Path) else list(tag_paths)
        tag_runs = _read_runs(tag_paths, reference=(paths[0], runs[0]))
        recalls.update({f"{name}@{tag}": values for name, values in _run_recalls(tag_runs, tag).items()})
    return runs[0], recalls


def compare(paths: Path | Sequence[Path], baseline: str, others: Sequence[str], resamples: int = 2000,
            seed: int = 0, tagged: Mapping[str, Path | Sequence[Path]] | None = None, *,
            resample_runs: bool = False, by_conversation: bool = False,
            by_evidence_unit: bool = False) -> dict[str, dict[str, PairedDifference]]:
    """``{config: {"overall" | category | "lexical gap" | conversation: PairedDifference}}``
    against ``baseline`` (the lexical-gap group when the file flags such questions, a group per
    conversation with ``by_conversation``); ``tagged`` as :func:`read_recalls`; with
    ``resample_runs`` the intervals resample the runs too, with ``by_evidence_unit`` the questions
    linked by evidence turns as one draw (:func:`resampled_difference`, :func:`evidence_units`)."""
    paths = [paths] if isinstance(paths, Path) else list(paths)
    questions, recalls = read_run_recalls(paths, tagged)
    unknown = [name for name in (baseline, *others) if name not in recalls]
    if unknown:
        raise ValueError(f"{paths[0]}: no configuration {', '.join(unknown)}; it has {', '.join(recalls)}")
    groups = _groups(questions, by_conversation)
    means = {name: recalls[name].mean() for name in (baseline, *others)}
    units = evidence_units(questions) if by_evidence_unit else None

    def difference(name: str, rows: list[int]) -> PairedDifference:
        base, other = recalls[baseline], recalls[name]
        if resample_runs or units is not None:
            return resampled_difference(base.runs[:, rows], other.runs[:, rows],
                                        base.source == other.source, resamples, seed,
                                        draw_runs=resample_runs,
                                        units=None if units is None else units[rows])
        return paired_difference([means[baseline][i] for i in rows], [means[name][i] for i in rows],
                                 resamples, seed)

    return {name: {group: difference(name, rows) for group, rows in groups.items()} for name in others}


def _groups(questions: Sequence[QuestionRecord], by_conversation: bool) -> dict[str, list[int]]:
    """The question groups compared: overall, each category, the lexical-gap questions (when the
    run flags any) and, with ``by_conversation``, each conversation in the order of the file."""
    categories = [row.category for row in questions]
    groups = {"overall": list(range(len(questions)))}
    known = [name for name in CATEGORY_NAMES.values() if name in categories]
    for category in known + sorted(set(categories) - set(known)):
        groups[category] = [i for i, c in enumerate(categories) if c == category]
    if any(row.lexical_gap for row in questions):
        groups["lexical gap"] = [i for i, row in enumerate(questions) if row.lexical_gap]
    if by_conversation:
        for conversation in dict.fromkeys(row.conversation for row in questions):
            groups[conversation] = [i for i, row in enumerate(questions) if row.conversation == conversation]
    return groups


def render(baseline: str, table: dict[str, dict[str, PairedDifference]]) -> str:
    """A Markdown table: one row per configuration, one column per group (with its question count)."""
    first = next(iter(table.values()))
    headers = ["configuration", *(f"{group} ({d.n})" for group, d in first.items())]
    rows = [[name, *(str(d) for d in row.values())] for name, row in table.items()]
    return (f"Recall difference to {baseline} in points: mean [95% bootstrap interval], "
            "questions better/worse\n\n" + markdown_table(headers, rows))
