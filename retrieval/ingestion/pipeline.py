"""What every ingested segment is made of beside its commit, and what an ingestion run counts.

Ingestion itself is the online stream (:class:`retrieval.api.online.UserStream`): the memory API's
adds and the batch ingestion of recorded conversations (:func:`retrieval.api.batch.ingest_turns`)
close segments through it, and each closed segment's records get their fingerprints
(:func:`fingerprinted`), its progress row (:func:`segment_record`) and its vectors
(:func:`embed_segment`) here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from retrieval.index.evidence_nodes import segment_search_texts
from retrieval.llm_usage import LLMUsage
from retrieval.memory.protocols import Embedder, TextFingerprinter
from retrieval.memory.records import AMU, Segment, SegmentRecord, Turn


class IngestError(RuntimeError):
    """Ingestion cannot continue (e.g. a stored turn given with another text, an invalid record)."""


@dataclass
class IngestStats:
    """Counts of one ingestion run. ``segments`` includes ``resumed_segments`` (already stored and
    skipped); ``amus`` counts records written by this run; ``llm`` is this run's share of the
    extractor's usage."""

    conversations: int = 0
    sessions: int = 0
    turns: int = 0
    exchanges: int = 0
    segments: int = 0
    resumed_segments: int = 0
    retried_segments: int = 0
    amus: int = 0
    fallback_segments: int = 0
    unresolved_dates: int = 0
    llm: LLMUsage = field(default_factory=LLMUsage)
    wall_s: float = 0.0

    @property
    def mean_exchanges_per_segment(self) -> float:
        return self.exchanges / self.segments if self.segments else 0.0

    @property
    def turns_per_s(self) -> float:
        """Ingestion throughput over the whole run (segmentation, extraction, store writes)."""
        return self.turns / self.wall_s if self.wall_s else 0.0

    @property
    def mean_turns_per_segment(self) -> float:
        return self.turns / self.segments if self.segments else 0.0

    def summary(self) -> str:
        llm = self.llm
        return "\n".join([
            f"conversations {self.conversations} | sessions {self.sessions} | turns {self.turns} | "
            f"exchanges {self.exchanges}",
            f"segments {self.segments} ({self.resumed_segments} already stored) | "
            f"mean exchanges/segment {self.mean_exchanges_per_segment:.2f} | "
            f"mean turns/segment {self.mean_turns_per_segment:.2f}",
            f"AMUs written {self.amus} | raw-turn fallback segments {self.fallback_segments} | "
            f"fallbacks retried successfully {self.retried_segments} | "
            f"date phrases kept unresolved (outside years 1-9999) {self.unresolved_dates}",
            f"LLM calls {llm.http_calls} (retries {llm.retries}, cache hits {llm.cache_hits}) | tokens "
            f"prompt {llm.prompt_tokens} + completion {llm.completion_tokens} "
            f"(from cache {llm.cached_prompt_tokens} + {llm.cached_completion_tokens})",
            f"wall time {self.wall_s:.1f} s ({self.turns_per_s:.1f} turns/s)",
        ])


def embed_segment(embedder: Embedder, turns: Sequence[Turn], amus: Sequence[AMU]) -> None:
    """Embed a committed segment's raw turns (verbatim, as rendered), records and the texts of its
    searchable evidence nodes into the store's vector cache: multi-route retrieval reads them back."""
    embedder.encode([turn.render() for turn in turns] + [amu.text for amu in amus]
                    + segment_search_texts(amus))


def segment_record(segment: Segment, state: str, fallback: bool, count: int,
                   flushed_after: str | None = None) -> SegmentRecord:
    return SegmentRecord(segment.user_id, segment.seq, segment.session_id,
                         tuple(turn.turn_id for turn in segment.turns), segment.reason, state, fallback,
                         count, flushed_after=flushed_after)


def fingerprinted(amus: list[AMU], fingerprinter: TextFingerprinter | None) -> list[AMU]:
    """``amus`` with their fingerprint code sequences (unchanged without a fingerprinter)."""
    if fingerprinter is None or not amus:
        return amus
    prints = fingerprinter.fingerprint([amu.text for amu in amus])
    return [dataclasses.replace(amu, fingerprint=tuple(fp.sequence))
            for amu, fp in zip(amus, prints, strict=True)]
