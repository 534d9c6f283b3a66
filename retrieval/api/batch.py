"""Batch ingestion: a recorded turn stream (one or more conversations) through the online path.

    store = open_store("runs/store")  # retrieval.memory.backends
    stats = ingest_turns(conversation.turns, store, SentenceEmbedder(), RuleExtractor())

Each conversation is a user. Its sessions are taken in order: a session's turns go into the turn
log (:class:`retrieval.memory.turn_log.TurnLog`), then through the user's
:class:`retrieval.api.online.UserStream` (``push``), and the session is flushed at its end (a
recorded session is complete). Segmentation, extraction, fingerprints, records and the vector
cache are therefore exactly what :meth:`Memory.add` and :meth:`Memory.flush` make of the same
sessions; the extractor's participants are the user's speakers in the turn log.

Resuming: the turns, then each closed segment, commit in their own transactions. A rerun skips
the stored turns, :meth:`UserStream.load` feeds the turns no segment covers again, so an
interrupted run loses at most the segment in progress and never duplicates a record; the
vectors a kill between a segment's commit and its embeddings left out are computed. A stored
turn given again with another text (speaker, session, time, caption) is refused naming it: the
store is append-only. Stored segments are kept as they are, also under other segmenter settings.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence

from tqdm.auto import tqdm

from retrieval.api.counted import CountedExtractor
from retrieval.api.errors import InvalidInput
from retrieval.api.inputs import check_recorded
from retrieval.api.online import StreamModels, UserStream
from retrieval.api.replay import difference
from retrieval.extract.base import Extractor, ReferenceContext
from retrieval.ingestion.pipeline import (
    IngestError,
    IngestStats,
    embed_segment,
    fingerprinted,
    segment_record,
)
from retrieval.ingestion.segmenter import SegmenterConfig, count_tokens, pair_exchanges
from retrieval.memory.cache import CachedEmbedder, model_identity
from retrieval.memory.protocols import Embedder, TextFingerprinter
from retrieval.memory.records import (
    AMU,
    Segment,
    SegmentRecord,
    Turn,
    amu_id,
)
from retrieval.memory.store_contract import Store

Sessions = dict[str, list[Turn]]


def ingest_turns(turns: Iterable[Turn], store: Store, embedder: Embedder, extractor: Extractor, *,
                 fingerprinter: TextFingerprinter | None = None, config: SegmenterConfig | None = None,
                 progress: bool = True, retry_fallbacks: bool = True) -> IngestStats:
    """Ingest an ordered turn stream (one or more conversations, each session contiguous) into
    ``store`` (module docstring). ``fingerprinter`` is any object with ``fingerprint(texts) -> [obj
    with .sequence]`` (e.g. ``isq.fingerprint.Fingerprinter``); each AMU then stores its code
    sequence. ``config`` defaults to :class:`SegmenterConfig`.

    The store is bound to the embedder, the extractor and the fingerprinter (or its absence):
    resuming with other ones raises :class:`StoreMismatch`. With ``retry_fallbacks``, stored
    segments that fell back to raw turns (the LLM endpoint was down) are extracted again; a
    successful retry archives the raw-turn AMUs and adds the new ones (revision ids). An empty
    ``turns`` binds nothing and returns zero counts.
    """
    started = time.perf_counter()
    usage_before = dataclasses.replace(extractor.usage)
    conversations = _group(turns)
    stats = IngestStats()
    if not conversations:  # nothing to store: bind no models, so an empty input fixes nothing
        return stats
    for user, sessions in conversations.items():
        _check_stored(store, user, sessions)
    if not isinstance(embedder, CachedEmbedder):  # segmentation embeddings: computed once per user
        embedder = CachedEmbedder(embedder, store)
    store.bind("embedder", model_identity(embedder))
    store.bind("extractor", model_identity(extractor))
    store.bind("fingerprinter", "none" if fingerprinter is None else model_identity(fingerprinter),
               hint="pass the fingerprinter this store was built with, or use a new store")
    counted = CountedExtractor(extractor)
    models = StreamModels(embedder, counted, fingerprinter, config or SegmenterConfig())
    bar = tqdm(total=sum(len(t) for sessions in conversations.values() for t in sessions.values()),
               unit="turn", disable=not progress)
    try:
        for user, sessions in conversations.items():
            bar.set_description(user)
            _ingest_user(user, sessions, store, models, stats, bar, retry_fallbacks)
    finally:
        bar.close()
    stats.fallback_segments, stats.unresolved_dates = counted.counts()
    stats.llm = extractor.usage.since(usage_before)
    stats.wall_s = time.perf_counter() - started
    return stats


def _group(turns: Iterable[Turn]) -> dict[str, Sessions]:
    """conversation -> session -> turns, in order of appearance; sessions must be contiguous, and
    every turn passes the memory's checks (:func:`retrieval.api.inputs.check_recorded`)."""
    grouped: dict[str, Sessions] = {}
    previous: dict[str, str] = {}
    for turn in turns:
        try:
            check_recorded(turn)
        except InvalidInput as err:
            raise IngestError(str(err)) from None
        turn = dataclasses.replace(turn, image_caption=turn.image_caption or None)  # "" is none, as in add
        sessions = grouped.setdefault(turn.user_id, {})
        if turn.session_id in sessions and previous[turn.user_id] != turn.session_id:
            raise IngestError(f"turn {turn.turn_id!r}: session {turn.session_id!r} of "
                              f"{turn.user_id!r} continues after another session started")
        sessions.setdefault(turn.session_id, []).append(turn)
        previous[turn.user_id] = turn.session_id
    return grouped


def _check_stored(store: Store, user: str, sessions: Sessions) -> None:
    """A turn the store holds must be given as stored (the store is append-only)."""
    stored = {turn.turn_id: turn for turn in store.turns(user)}
    for turn in (turn for session in sessions.values() for turn in session):
        if turn.turn_id in stored and (changed := difference(stored[turn.turn_id], turn)) is not None:
            raise IngestError(f"{user!r} turn {turn.turn_id!r}: the input's {changed} differs from what "
                              "the store holds; the store is append-only, so ingest the edited "
                              "conversation into a new store")


def _ingest_user(user: str, sessions: Sessions, store: Store, models: StreamModels, stats: IngestStats,
                 bar: tqdm, retry_fallbacks: bool) -> None:
    models = models.for_user(user)
    resumed = store.segments(user)
    if retry_fallbacks and any(record.fallback for record in resumed):
        _retry_fallbacks(user, resumed, store, models, stats)
    for record in resumed:  # a kill between a commit and its embeddings left them out: computes only those
        embed_segment(models.embedder, _record_turns(store, record), _current_amus(store, record))
    stream, amus = UserStream.load(user, store, models)
    for session_id, turns in sessions.items():
        amus += stream.push(store.append_turns(user, turns))
        amus += stream.flush(session_id)
        stats.sessions += 1
        stats.turns += len(turns)
        stats.exchanges += len(pair_exchanges(turns, models.config.pair_turns))
        bar.update(len(turns))
    stats.conversations += 1
    stats.amus += len(amus)
    stats.resumed_segments += len(resumed)
    stats.segments += len(store.segments(user))


def _retry_fallbacks(user: str, records: Sequence[SegmentRecord], store: Store, models: StreamModels,
                     stats: IngestStats) -> None:
    """Extract the stored fallback segments again, each with the reference context the stored
    segments before it give (as when it was first extracted)."""
    context = ReferenceContext(store.speakers(user))
    for record in records:
        context.enter(record.session_id)
        amus, state = _current_amus(store, record), record.state
        if record.fallback:
            turns = _record_turns(store, record)
            segment = _segment(record, turns, models.config)
            context.participants = store.speakers(user, turns[-1].turn_id)  # as when first extracted
            retried = models.extractor.extract(segment, context)
            if not retried.fallback:
                revision = record.revision + 1
                renamed = [dataclasses.replace(amu, id=amu_id(user, record.seq, i, revision))
                           for i, amu in enumerate(retried.amus)]
                amus = fingerprinted(renamed, models.fingerprinter)
                store.replace_extraction(dataclasses.replace(
                    segment_record(segment, retried.state, False, len(amus)), revision=revision), amus)
                embed_segment(models.embedder, turns, amus)
                state = retried.state
                stats.amus += len(amus)
                stats.retried_segments += 1
        context.record(state, [amu.text for amu in amus])


def _record_turns(store: Store, record: SegmentRecord) -> list[Turn]:
    return [store.turn(record.user_id, turn_id) for turn_id in record.turn_ids]


def _segment(record: SegmentRecord, turns: Sequence[Turn], config: SegmenterConfig) -> Segment:
    """The stored segment as the segmenter closed it (a segment starts at an exchange boundary, so
    pairing its turns again gives its exchanges)."""
    exchanges = tuple(pair_exchanges(turns, config.pair_turns))
    tokens = sum(count_tokens(exchange.text, config.words_to_tokens) for exchange in exchanges)
    return Segment(record.user_id, record.session_id, record.seq, exchanges, record.reason, tokens)


def _current_amus(store: Store, stored: SegmentRecord) -> list[AMU]:
    """The AMUs of the stored segment's current extraction: those of its latest revision (ids
    ``<conversation>:<seq>:<index>`` for revision 0, with ``:r<n>`` appended for revision n)."""
    prefix = f"{stored.user_id}:{stored.seq}:"

    def revision(amu: AMU) -> int:
        rest = amu.id[len(prefix):]
        return int(rest.split(":r", 1)[1]) if ":r" in rest else 0

    return [amu for amu in store.by_segment(stored.user_id, stored.seq)
            if revision(amu) == stored.revision]


__all__ = ["IngestError", "IngestStats", "ingest_turns"]
