"""The evaluation on consolidated memory (``python -m retrieval.evaluate --consolidate``): what
consolidation did to each conversation's store, and whether any evidence turn became
unreachable (the recall ceiling before and after)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set

from retrieval.consolidation.report import ConsolidationReport, combined
from retrieval.eval.metrics import score_evidence, summarise
from retrieval.eval.questions import EvalQuestion
from retrieval.eval.results import CeilingBlock, ConsolidationBlock, Summary


def recall_ceiling(questions: Sequence[EvalQuestion],
                   covered: Mapping[str, Set[str]]) -> Summary[CeilingBlock]:
    """Evidence recall if every AMU were retrieved: the share of evidence turns some AMU points to."""
    return Summary[CeilingBlock].model_validate(summarise(
        (q.category_name, {"recall": score_evidence(q.evidence, covered[q.conversation_id]).recall})
        for q in questions))


def consolidation_block(reports: Sequence[ConsolidationReport],
                        questions: Sequence[EvalQuestion]) -> ConsolidationBlock:
    """The ``consolidation`` block of ``results.json``."""
    before = recall_ceiling(questions, {r.user_id: r.turns_before for r in reports})
    after = recall_ceiling(questions, {r.user_id: r.turns_after for r in reports})
    return ConsolidationBlock(**combined(reports), recall_ceiling_before=before, recall_ceiling_after=after)
