"""What one consolidation run did to one conversation (the ``consolidation`` block of an
evaluation's results, the command line's summary line)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from retrieval.llm_usage import LLMUsage


@dataclass
class ConsolidationReport:
    """Counts of one run over one conversation.

    ``amus_before`` / ``amus_active_after``: active AMUs before and after; ``archived``: AMUs this
    run archived; ``created``: merged AMUs it wrote; ``clusters``: distinct gated clusters the
    operator saw; ``operations``: applied MERGE / UPDATE / AGGREGATE drafts and KEEP answers;
    ``exact_duplicates``: MERGEs of identical statements; ``count_sensitive``,
    ``pending_reextraction``, ``window_splits``: active AMUs held back and clusters split by the
    time window, as the first fresh plan of the run saw them; ``conflicts``: drafts not applied
    because a member had been archived meanwhile; ``refused``: drafts not applied because the
    merged AMU would not state what its members stated or absorb too many
    (:mod:`retrieval.consolidation.fidelity`); ``unanswered``: clusters without a usable LLM answer (retried
    by a later run). ``turns_before`` / ``turns_after``: the turn ids the active AMUs point to, from which a
    caller computes recall ceilings (:meth:`lost_turns` must be empty). ``llm`` is this run's usage;
    :attr:`llm_calls` and :attr:`tokens` count cache hits too (what building the memory cost).
    """

    user_id: str
    operator: str
    threshold: float
    amus_before: int = 0
    amus_active_after: int = 0
    archived: int = 0
    created: int = 0
    clusters: int = 0
    operations: Counter[str] = field(default_factory=Counter)
    exact_duplicates: int = 0
    count_sensitive: int = 0
    pending_reextraction: int = 0
    window_splits: int = 0
    conflicts: int = 0
    refused: int = 0
    unanswered: int = 0
    passes: int = 0
    seconds: float = 0.0
    llm: LLMUsage = field(default_factory=LLMUsage)
    turns_before: frozenset[str] = frozenset()
    turns_after: frozenset[str] = frozenset()
    turns_stored: frozenset[str] = frozenset()
    """The user's turn ids stored when the run ended: a turn deleted meanwhile was not lost."""

    @property
    def llm_calls(self) -> int:
        return self.llm.calls

    @property
    def tokens(self) -> int:
        return self.llm.tokens

    @property
    def lost_turns(self) -> frozenset[str]:
        """Stored turns an active AMU pointed to before and none points to after (always empty)."""
        return (self.turns_before - self.turns_after) & self.turns_stored

    def absorb(self, later: ConsolidationReport) -> None:
        """Fold a later run over the same conversation into this one (the background worker's
        rounds): counts add up; ``amus_active_after``, ``turns_after`` and ``turns_stored`` are the
        later run's."""
        for name in ("archived", "created", "clusters", "exact_duplicates", "conflicts", "refused",
                     "unanswered", "passes", "seconds"):
            setattr(self, name, getattr(self, name) + getattr(later, name))
        self.operations.update(later.operations)
        self.llm = self.llm + later.llm
        # Ingestion may commit between and during the runs: every turn an active AMU pointed to at
        # any point counts as before, and "before" is the active count consolidation undid.
        self.turns_before |= later.turns_before | later.turns_after
        self.amus_active_after, self.turns_after = later.amus_active_after, later.turns_after
        self.turns_stored = later.turns_stored
        self.amus_before = self.amus_active_after + self.archived - self.created
        self.count_sensitive, self.pending_reextraction = later.count_sensitive, later.pending_reextraction
        self.window_splits = later.window_splits

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready counts (the turn sets as sizes)."""
        return {
            "user_id": self.user_id, "operator": self.operator, "threshold": self.threshold,
            "amus_before": self.amus_before, "amus_active_after": self.amus_active_after,
            "archived": self.archived, "created": self.created, "clusters": self.clusters,
            "operations": dict(sorted(self.operations.items())), "exact_duplicates": self.exact_duplicates,
            "count_sensitive": self.count_sensitive, "pending_reextraction": self.pending_reextraction,
            "window_splits": self.window_splits, "conflicts": self.conflicts, "refused": self.refused,
            "unanswered": self.unanswered,
            "passes": self.passes, "seconds": round(self.seconds, 3), "llm_calls": self.llm_calls,
            "tokens": self.tokens, "turns_before": len(self.turns_before),
            "turns_after": len(self.turns_after), "lost_turns": len(self.lost_turns),
        }

    def summary(self) -> str:
        """One line for the command line."""
        operations = ", ".join(f"{name} {count}" for name, count in sorted(self.operations.items())) or "none"
        return (f"{self.user_id}: active AMUs {self.amus_before} -> {self.amus_active_after} | "
                f"clusters {self.clusters} | archived {self.archived} | created {self.created} "
                f"({operations}; exact {self.exact_duplicates}) | held back: "
                f"count-sensitive {self.count_sensitive}, window splits {self.window_splits}, "
                f"merges refused {self.refused}, unanswered {self.unanswered} | passes {self.passes} | "
                f"LLM calls {self.llm_calls}, "
                f"tokens {self.tokens} | turns lost {len(self.lost_turns)} | {self.seconds:.1f} s")


def combined(reports: Iterable[ConsolidationReport]) -> dict[str, Any]:
    """The counts of several conversations' reports summed (an evaluation's ``consolidation``
    block; the caller adds the recall ceilings it computes from the turn sets)."""
    reports = list(reports)
    keys = ("amus_before", "amus_active_after", "archived", "created", "clusters", "exact_duplicates",
            "count_sensitive", "window_splits", "conflicts", "refused", "unanswered", "llm_calls", "tokens",
            "lost_turns")
    rows = [report.to_dict() for report in reports]
    block: dict[str, Any] = {key: sum(row[key] for row in rows) for key in keys}
    block["operations"] = dict(sorted(sum((r.operations for r in reports), Counter()).items()))
    block["seconds"] = round(sum(report.seconds for report in reports), 3)
    block["operator"] = sorted({report.operator for report in reports})
    block["threshold"] = sorted({report.threshold for report in reports})
    return block
