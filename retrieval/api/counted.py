"""The extractor as the ingestion stream sees it (:class:`CountedExtractor`): what a run reports
of its extraction, counted where every segment is extracted, so the command lines, the
evaluation's construction ledger and the batch path report the same counts."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable

from retrieval.extract.base import Extraction, Extractor, ReferenceContext
from retrieval.ingestion.pipeline import IngestError
from retrieval.llm_usage import LLMUsage
from retrieval.memory.records import AMUValidationError, Segment


class CountedExtractor:
    """An extractor that counts, per user, its segments that fell back to raw turns and the date
    phrases it kept unresolved, and refuses an invalid record with :class:`IngestError` naming the
    user's segment and turns. Threads extract at once (the ingestion worker, flushes), so the
    counts are kept under a lock; they only grow: a run's share is the difference across the run,
    over the run's own users."""

    def __init__(self, extractor: Extractor) -> None:
        self.extractor = extractor
        self._fallbacks: Counter[str] = Counter()
        self._unresolved: Counter[str] = Counter()
        self._lock = threading.Lock()

    def counts(self, users: Iterable[str] | None = None) -> tuple[int, int]:
        """Fallback segments and unresolved date phrases so far, of ``users`` (all when None)."""
        with self._lock:
            if users is None:
                return self._fallbacks.total(), self._unresolved.total()
            chosen = set(users)
            return (sum(n for user, n in self._fallbacks.items() if user in chosen),
                    sum(n for user, n in self._unresolved.items() if user in chosen))

    @property
    def usage(self) -> LLMUsage:
        return self.extractor.usage

    def extract(self, segment: Segment, context: ReferenceContext) -> Extraction:
        try:
            extraction = self.extractor.extract(segment, context)
        except AMUValidationError as err:
            turn_ids = [turn.turn_id for turn in segment.turns]
            raise IngestError(f"{segment.user_id!r} segment {segment.seq} "
                              f"(turns {turn_ids[0]}..{turn_ids[-1]}): the extractor made an invalid "
                              f"record: {err}") from None
        with self._lock:
            self._fallbacks[segment.user_id] += int(extraction.fallback)
            self._unresolved[segment.user_id] += extraction.unresolved_dates
        return extraction
