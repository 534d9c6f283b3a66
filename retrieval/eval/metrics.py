"""Evidence metrics per question and their averages (docs/design.md §6.1).

Per question with evidence ids E and the turn ids R that the retrieved items' source pointers
cover: recall@k = |E ∩ R| / |E|; hit@k = 1 if at least one evidence id is covered; complete@k
= 1 if all are. Each is averaged over questions (micro average: every question weighs the
same) per category and overall.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from retrieval.eval.questions import CATEGORY_NAMES

if TYPE_CHECKING:  # only for annotations: the paired statistics import this module without faiss
    from retrieval.contract import Hit


@dataclass(frozen=True)
class EvidenceScore:
    """Recall, hit and completeness of one question's evidence by one retrieval."""

    recall: float
    hit: bool
    complete: bool
    found: tuple[str, ...]


def covered_turns(hits: Iterable[Hit]) -> set[str]:
    """The turn ids that the retrieved items' source pointers name (a raw-turn item names its own)."""
    return {turn_id for hit in hits for turn_id in hit.turns}


def score_evidence(evidence: Sequence[str], covered: Collection[str]) -> EvidenceScore:
    """recall = share of the evidence ids covered; hit = at least one; complete = all."""
    if not evidence:
        raise ValueError("a question without evidence cannot be scored")
    found = tuple(turn_id for turn_id in evidence if turn_id in covered)
    return EvidenceScore(len(found) / len(evidence), bool(found), len(found) == len(evidence), found)


def mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if values else 0.0


def summarise(rows: Iterable[tuple[str, Mapping[str, float]]]) -> dict[str, Any]:
    """``(category name, {metric: value})`` per question -> ``{"overall": {...}, "by_category":
    {...}}``, each ``{metric: mean, ..., "n": questions}``; categories without questions are absent.
    The caller validates it into its :class:`retrieval.eval.results.Summary` (e.g. of recall blocks)."""
    groups: dict[str, list[Mapping[str, float]]] = {}
    everything: list[Mapping[str, float]] = []
    for category, values in rows:
        groups.setdefault(category, []).append(values)
        everything.append(values)

    def block(items: list[Mapping[str, float]]) -> dict[str, Any]:
        metrics = list(items[0]) if items else []
        return {**{m: mean([float(item[m]) for item in items]) for m in metrics}, "n": len(items)}

    order = [name for name in CATEGORY_NAMES.values() if name in groups]
    return {"overall": block(everything), "by_category": {name: block(groups[name]) for name in order}}


def tied_at_cut(hits: Sequence[Hit]) -> float | None:
    """Share of the code or BM25 path's hits whose score equals that path's last (lowest) score:
    among tied AMUs the order of the bank decides, not the score. None without such hits (dense
    and multi-route lists)."""
    scores = [hit.score for hit in hits if hit.channel in ("code", "bm25", "codebm25")]
    return sum(score == scores[-1] for score in scores) / len(scores) if scores else None
