"""Ingestion: turn stream -> online segmentation -> one extraction per segment -> AMU store.

Library use::

    store = AMUStore("runs/store")
    stats = ingest_turns(conversation.turns, store, SentenceEmbedder(), RuleExtractor(),
                         participants={conversation.conversation_id: conversation.participants})

Resuming: each segment's turns, AMUs and progress row commit in one transaction. A rerun on
the same store recomputes the (deterministic) segmentation, skips the segments already stored
(checking that they cover the same turns, and embedding what a kill between a commit and its
embeddings left out) and continues, so an interrupted run loses at most the segment in progress
and never duplicates a record. Sessions are assumed complete when ingested.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from retrieval.extract.base import Extraction, Extractor, ReferenceContext
from retrieval.index.evidence_nodes import segment_search_texts
from retrieval.ingestion.segmenter import SegmenterConfig, SemanticSegmenter
from retrieval.llm_client import LLMUsage
from retrieval.memory.cache import CachedEmbedder, model_identity
from retrieval.memory.protocols import Embedder, TextFingerprinter
from retrieval.memory.records import (
    AMU,
    MAX_TURN_CHARS,
    AMUValidationError,
    Segment,
    SegmentRecord,
    Turn,
    amu_id,
)
from retrieval.memory.store import AMUStore, turns_sha256


class IngestError(RuntimeError):
    """Ingestion cannot continue (e.g. the store holds a different segmentation of the same turns)."""


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


def ingest_turns(turns: Iterable[Turn], store: AMUStore, embedder: Embedder, extractor: Extractor, *,
                 fingerprinter: TextFingerprinter | None = None, config: SegmenterConfig | None = None,
                 participants: Mapping[str, Sequence[str]] | None = None, progress: bool = True,
                 retry_fallbacks: bool = True) -> IngestStats:
    """Ingest an ordered turn stream (one or more conversations) into ``store``.

    Each conversation gets its own :class:`SemanticSegmenter` (so surprise history and segment
    numbering are per conversation; ``config`` defaults to :class:`SegmenterConfig`) and
    :class:`ReferenceContext`. ``participants`` maps a
    conversation id to its speakers (default: the distinct speakers in order of appearance).
    ``fingerprinter`` is any object with ``fingerprint(texts) -> [obj with .sequence]`` (e.g.
    ``isq.fingerprint.Fingerprinter``); each AMU then stores its code sequence.

    Each committed segment's raw turns and records are embedded into the store's vector cache
    (the structured evidence indexes are built by the store itself, in the commit).
    The store is bound to the embedder, the extractor and the fingerprinter (or its absence):
    resuming with other ones raises :class:`StoreMismatch`. A stored segment whose turns differ
    from this run's (edited input) is refused with :class:`IngestError` naming it: the store is
    append-only, so an edited conversation goes into a new store. With ``retry_fallbacks``,
    stored segments that fell back to raw turns (the LLM endpoint was down) are extracted again;
    a successful retry archives the raw-turn AMUs and adds the new ones (revision ids). An empty
    ``turns`` binds nothing and returns zero counts.
    """
    started = time.perf_counter()
    usage_before = dataclasses.replace(extractor.usage)
    conversations = _group(turns)
    stats = IngestStats()
    if not conversations:  # nothing to store: bind no models, so an empty input fixes nothing
        return stats
    if not isinstance(embedder, CachedEmbedder):  # segmentation embeddings: computed once per store
        embedder = CachedEmbedder(embedder, store)
    store.bind("embedder", model_identity(embedder))
    store.bind("extractor", model_identity(extractor))
    store.bind("fingerprinter", "none" if fingerprinter is None else model_identity(fingerprinter),
               hint="pass the fingerprinter this store was built with, or use a new store")
    bar = tqdm(total=sum(len(t) for sessions in conversations.values() for t in sessions.values()),
               unit="turn", disable=not progress)
    try:
        for user_id, sessions in conversations.items():
            bar.set_description(user_id)
            speakers = (participants or {}).get(user_id) or tuple(
                dict.fromkeys(turn.speaker for session in sessions.values() for turn in session)
            )
            _ingest_conversation(user_id, sessions, store, embedder, extractor, fingerprinter,
                                 config or SegmenterConfig(), ReferenceContext(speakers), stats, bar,
                                 retry_fallbacks)
    finally:
        bar.close()
    stats.llm = extractor.usage.since(usage_before)
    stats.wall_s = time.perf_counter() - started
    return stats


def _group(turns: Iterable[Turn]) -> dict[str, dict[str, list[Turn]]]:
    """conversation -> session -> turns, in order of appearance; sessions must be contiguous."""
    grouped: dict[str, dict[str, list[Turn]]] = {}
    previous: dict[str, str] = {}
    for turn in turns:
        if len(turn.text) > MAX_TURN_CHARS:
            raise IngestError(f"turn {turn.turn_id!r} of {turn.user_id!r} has {len(turn.text)} "
                              f"characters; the limit is {MAX_TURN_CHARS} (split it into several turns)")
        sessions = grouped.setdefault(turn.user_id, {})
        if turn.session_id in sessions and previous[turn.user_id] != turn.session_id:
            raise IngestError(f"turn {turn.turn_id!r}: session {turn.session_id!r} of "
                              f"{turn.user_id!r} continues after another session started")
        sessions.setdefault(turn.session_id, []).append(turn)
        previous[turn.user_id] = turn.session_id
    return grouped


def _ingest_conversation(user_id: str, sessions: Mapping[str, list[Turn]], store: AMUStore,
                         embedder: Embedder, extractor: Extractor, fingerprinter: TextFingerprinter | None,
                         config: SegmenterConfig, context: ReferenceContext, stats: IngestStats,
                         bar: tqdm, retry_fallbacks: bool) -> None:
    segmenter = SemanticSegmenter(embedder, user_id, config)
    stats.conversations += 1
    for session_segments in segmenter.segment_sessions(list(sessions.values())):
        stats.sessions += 1
        for segment in session_segments:
            context.enter(segment.session_id)
            stored = store.segment(user_id, segment.seq)
            if stored is None:
                extraction = _extract(extractor, segment, context)
                stats.unresolved_dates += extraction.unresolved_dates
                amus = fingerprinted(extraction.amus, fingerprinter)
                store.commit_segment(segment_record(segment, extraction.state, extraction.fallback,
                                                    len(amus)),
                                     segment.turns, amus)
                embed_segment(embedder, segment.turns, amus)
                state = extraction.state
                stats.amus += len(amus)
                stats.fallback_segments += int(extraction.fallback)
            else:
                _check_unchanged(stored, segment)
                stats.resumed_segments += 1
                amus = _current_amus(store, stored)
                state = stored.state
                if stored.fallback and retry_fallbacks:
                    retried = _extract(extractor, segment, context)
                    if not retried.fallback:
                        revision = stored.revision + 1
                        renamed = [dataclasses.replace(amu,
                                                       id=amu_id(user_id, segment.seq, i, revision))
                                   for i, amu in enumerate(retried.amus)]
                        amus = fingerprinted(renamed, fingerprinter)
                        store.replace_extraction(dataclasses.replace(
                            segment_record(segment, retried.state, False, len(amus)), revision=revision),
                                                 amus)
                        embed_segment(embedder, segment.turns, amus)
                        state = retried.state
                        stats.amus += len(amus)
                        stats.retried_segments += 1
                    else:
                        stats.fallback_segments += 1
                # A kill between a segment's commit and its embeddings left them out: computes only those.
                embed_segment(embedder, segment.turns, amus)
            # What the extractor saw, replayed on resume, so the next prompts match the first run's.
            context.record(state, [amu.text for amu in amus])
            stats.segments += 1
            stats.exchanges += len(segment.exchanges)
            stats.turns += len(segment.turns)
            bar.update(len(segment.turns))


def _extract(extractor: Extractor, segment: Segment, context: ReferenceContext) -> Extraction:
    """One segment's extraction; an invalid record is refused naming the conversation and turns."""
    try:
        return extractor.extract(segment, context)
    except AMUValidationError as err:
        turn_ids = [turn.turn_id for turn in segment.turns]
        raise IngestError(f"{segment.user_id!r} segment {segment.seq} "
                          f"(turns {turn_ids[0]}..{turn_ids[-1]}): the extractor made an invalid record: "
                          f"{err}") from None


def embed_segment(embedder: Embedder, turns: Sequence[Turn], amus: Sequence[AMU]) -> None:
    """Embed a committed segment's raw turns (verbatim, as rendered), records and the texts of its
    searchable evidence nodes into the store's vector cache: multi-route retrieval reads them back."""
    embedder.encode([turn.render() for turn in turns] + [amu.text for amu in amus]
                    + segment_search_texts(amus))


def segment_record(segment: Segment, state: str, fallback: bool, count: int) -> SegmentRecord:
    return SegmentRecord(segment.user_id, segment.seq, segment.session_id,
                         tuple(turn.turn_id for turn in segment.turns), segment.reason, state, fallback,
                         count)


def _check_unchanged(stored: SegmentRecord, segment: Segment) -> None:
    """The stored segment must cover the same turns saying the same things as this run's."""
    turn_ids = tuple(turn.turn_id for turn in segment.turns)
    where = f"{segment.user_id!r} segment {segment.seq}"
    if stored.turn_ids != turn_ids:
        raise IngestError(f"{where}: the store holds turns {list(stored.turn_ids)}, this run segments "
                          f"{list(turn_ids)}; the input, embedder or segmenter settings changed since the "
                          "store was written (use a new store)")
    if stored.content_sha256 != turns_sha256(segment.turns):
        raise IngestError(f"{where} (turns {turn_ids[0]}..{turn_ids[-1]}): "
                          "the input's text differs from what the store holds; the store is append-only, "
                          "so ingest the edited conversation into a new store")


def _current_amus(store: AMUStore, stored: SegmentRecord) -> list[AMU]:
    """The AMUs of the stored segment's current extraction: those of its latest revision (ids
    ``<conversation>:<seq>:<index>`` for revision 0, with ``:r<n>`` appended for revision n)."""
    prefix = f"{stored.user_id}:{stored.seq}:"

    def revision(amu: AMU) -> int:
        rest = amu.id[len(prefix):]
        return int(rest.split(":r", 1)[1]) if ":r" in rest else 0

    return [amu for amu in store.by_segment(stored.user_id, stored.seq)
            if revision(amu) == stored.revision]


def fingerprinted(amus: list[AMU], fingerprinter: TextFingerprinter | None) -> list[AMU]:
    """``amus`` with their fingerprint code sequences (unchanged without a fingerprinter)."""
    if fingerprinter is None or not amus:
        return amus
    prints = fingerprinter.fingerprint([amu.text for amu in amus])
    return [dataclasses.replace(amu, fingerprint=tuple(fp.sequence))
            for amu, fp in zip(amus, prints, strict=True)]
