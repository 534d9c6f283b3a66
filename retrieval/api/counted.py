"""The extractor as the ingestion stream sees it (:class:`CountedExtractor`): what a run reports
of its extraction, counted where every segment is extracted, so the command lines, the
evaluation's construction ledger and the batch path report the same counts."""

from __future__ import annotations

from retrieval.extract.base import Extraction, Extractor, ReferenceContext
from retrieval.ingestion.pipeline import IngestError
from retrieval.llm_client import LLMUsage
from retrieval.memory.records import AMUValidationError, Segment


class CountedExtractor:
    """An extractor that counts its segments that fell back to raw turns and the date phrases it
    kept unresolved, and refuses an invalid record with :class:`IngestError` naming the user's
    segment and turns. Its counts only grow: a run's share is the difference across the run."""

    def __init__(self, extractor: Extractor) -> None:
        self.extractor = extractor
        self.fallbacks = self.unresolved_dates = 0

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
        self.fallbacks += int(extraction.fallback)
        self.unresolved_dates += extraction.unresolved_dates
        return extraction
