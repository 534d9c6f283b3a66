"""Every setting of asynchronous consolidation (docs/design.md §8, MemCode key design 4) in one place.

The paper gives no numbers for the clustering threshold, the time window or the prefix span;
the values here are this project's choices (``docs/consolidation.md`` says why):

- HAC with *complete* linkage on cosine distances of the AMUs' cached sentence embeddings:
  every pair inside a cluster is within the threshold, so clusters never chain through a
  middle member (single linkage would).
- Thresholds per operator: the offline path only merges near-duplicates, so it cuts tight;
  an LLM can judge looser groups (it may answer KEEP).
- Time window: a cluster whose statements span more than :data:`WINDOW_DAYS` is split into
  consecutive sub-clusters of at most that span.
- A merged AMU whose statements span more than :data:`PREFIX_MIN_SPAN_MINUTES` (i.e. more than
  minutes: several sessions) gets the "[T_start to T_end]" prefix.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from typing import Any

LINKAGES = ("complete", "average", "single")
"""scipy.cluster.hierarchy linkage methods accepted (``complete`` by default)."""

OFFLINE_THRESHOLD = 0.10
"""Cosine distance cut of the offline (near-duplicate MERGE) path: similarity >= 0.90."""

LLM_THRESHOLD = 0.25
"""Cosine distance cut when an LLM chooses the operation: similarity >= 0.75."""

WINDOW_DAYS = 30.0
"""Longest span of statement times inside one cluster (the time-window gate)."""

PREFIX_MIN_SPAN_MINUTES = 60.0
"""A merged AMU spanning more than this gets the "[T_start to T_end]" prefix."""

MAX_DAYS = 3_652_059
"""The longest time window and prefix span accepted: the whole calendar (1-01-01 to 9999-12-31),
so the longest means no window."""

MAX_PASSES = 50
"""Safety bound on clustering passes per conversation (each applied pass removes at least one AMU)."""

WORKER_INTERVAL_S = 30.0
"""Pause of the background worker between two rounds over the store's conversations: consolidation
is maintenance, and a round reads a changed conversation's AMUs back (about 1.5 ms each, most of
it the record validation), so rounds after every segment would cost the ingest CPU time."""


@dataclass(frozen=True)
class ConsolidationConfig:
    """Clustering and gate settings of one consolidation run.

    ``threshold`` None means the operator's default (:data:`OFFLINE_THRESHOLD` or
    :data:`LLM_THRESHOLD`). Invalid values raise ``ValueError`` naming the field.
    """

    threshold: float | None = None
    linkage: str = "complete"
    window_days: float = WINDOW_DAYS
    prefix_min_span_minutes: float = PREFIX_MIN_SPAN_MINUTES
    max_passes: int = MAX_PASSES

    def __post_init__(self) -> None:
        numbers = {"threshold": self.threshold, "window_days": self.window_days,
                   "prefix_min_span_minutes": self.prefix_min_span_minutes}
        for name, value in numbers.items():
            if not (value is None and name == "threshold" or _is_number(value)):
                raise ValueError(f"{name} must be a number, got {value!r}")
        if isinstance(self.max_passes, bool) or not isinstance(self.max_passes, int):
            raise ValueError(f"max_passes must be a whole number, got {self.max_passes!r}")
        if self.threshold is not None and not 0.0 < self.threshold <= 2.0:
            raise ValueError(f"threshold {self.threshold} is not a cosine distance in (0, 2]")
        if self.linkage not in LINKAGES:
            raise ValueError(f"linkage {self.linkage!r} is not one of {', '.join(LINKAGES)}")
        if not 0 < self.window_days <= MAX_DAYS:
            raise ValueError(f"window_days {self.window_days} must be positive and at most {MAX_DAYS:,}")
        if not 0 <= self.prefix_min_span_minutes <= MAX_DAYS * 24 * 60:
            raise ValueError(f"prefix_min_span_minutes {self.prefix_min_span_minutes} must not be negative "
                             f"nor more than {MAX_DAYS:,} days")
        if self.max_passes < 1:
            raise ValueError(f"max_passes {self.max_passes} must be at least 1")

    @property
    def window(self) -> timedelta:
        return timedelta(days=self.window_days)

    @property
    def prefix_min_span(self) -> timedelta:
        return timedelta(minutes=self.prefix_min_span_minutes)

    def resolved(self, default_threshold: float) -> ConsolidationConfig:
        """This config with the operator's default threshold filled in."""
        if self.threshold is not None:
            return self
        return replace(self, threshold=default_threshold)

    def key(self) -> dict[str, Any]:
        """What a persisted plan records of the settings that made it."""
        return asdict(self)


def _is_number(value: Any) -> bool:
    """A real number that is not a bool (``True`` is no threshold), nor NaN."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
