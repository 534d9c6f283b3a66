"""Ingestion: turn stream -> online segmentation -> one extraction per segment -> AMU store.

Library use::

    store = AMUStore("runs/store")
    stats = ingest_locomo_conversation(conversation, store, SentenceEmbedder(), RuleExtractor())

Command line::

    python -m retrieval.ingest --locomo locomo10.json --store DIR [--extractor rule|llm]
        [--embedder NAME_OR_PATH] [--fingerprinter DIR] [--llm-cache DIR] [--no-progress]
    python -m retrieval.ingest --jsonl turns.jsonl --store DIR ...

JSONL turn stream: one JSON object per line (blank lines ignored), turns in order and each
session's turns contiguous::

    {"session_id": "s1", "session_time": "2023-05-08T13:56:00", "speaker": "Caroline",
     "turn_id": "D1:1", "text": "Hey Mel!"}

``session_time`` is ISO 8601 (relative dates are resolved against it). Optional fields:
``conversation_id`` (default: the file name without extension) and ``image_caption``.

Resuming: each segment's turns, AMUs and progress row commit in one transaction. A rerun on
the same store recomputes the (deterministic) segmentation, skips the segments already stored
(checking that they cover the same turns) and continues, so an interrupted run loses at most the
segment in progress and never duplicates a unit. Sessions are assumed complete when ingested.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from tqdm.auto import tqdm

from retrieval.amu import AMU, AMUStore, InputFormatError, SegmentRecord, Turn
from retrieval.embed import Embedder
from retrieval.extract import Extractor, LLMUsage, ReferenceContext
from retrieval.locomo import LocomoConversation, load_locomo
from retrieval.segmenter import SegmenterConfig, SemanticSegmenter


class IngestError(RuntimeError):
    """Ingestion cannot continue (e.g. the store holds a different segmentation of the same turns)."""


@dataclass
class IngestStats:
    """Counts of one ingestion run. ``segments`` includes ``resumed_segments`` (already stored and
    skipped); ``amus`` counts units written by this run; ``llm`` is this run's share of the
    extractor's usage."""

    conversations: int = 0
    sessions: int = 0
    turns: int = 0
    exchanges: int = 0
    segments: int = 0
    resumed_segments: int = 0
    amus: int = 0
    fallback_segments: int = 0
    llm: LLMUsage = field(default_factory=LLMUsage)
    wall_s: float = 0.0

    @property
    def mean_exchanges_per_segment(self) -> float:
        return self.exchanges / self.segments if self.segments else 0.0

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
            f"AMUs written {self.amus} | raw-turn fallback segments {self.fallback_segments}",
            f"LLM calls {llm.http_calls} (retries {llm.retries}, cache hits {llm.cache_hits}) | tokens "
            f"prompt {llm.prompt_tokens} + completion {llm.completion_tokens} "
            f"(from cache {llm.cached_prompt_tokens} + {llm.cached_completion_tokens})",
            f"wall time {self.wall_s:.1f} s",
        ])


def _usage_delta(after: LLMUsage, before: LLMUsage) -> LLMUsage:
    """after - before, field by field: one run's share of an extractor's running totals."""
    return LLMUsage(**{
        f.name: getattr(after, f.name) - getattr(before, f.name) for f in dataclasses.fields(LLMUsage)
    })


def ingest_turns(turns: Iterable[Turn], store: AMUStore, embedder: Embedder, extractor: Extractor, *,
                 fingerprinter: Any | None = None, config: SegmenterConfig | None = None,
                 participants: Mapping[str, Sequence[str]] | None = None, progress: bool = True) -> IngestStats:
    """Ingest an ordered turn stream (one or more conversations) into ``store``.

    Each conversation gets its own :class:`SemanticSegmenter` (so surprise history and segment
    numbering are per conversation; ``config`` defaults to :class:`SegmenterConfig`) and
    :class:`ReferenceContext`. ``participants`` maps a
    conversation id to its speakers (default: the distinct speakers in order of appearance).
    ``fingerprinter`` is any object with ``fingerprint(texts) -> [obj with .sequence]`` (e.g.
    ``isq.fingerprint.Fingerprinter``); each AMU then stores its code sequence.
    """
    started = time.perf_counter()
    usage_before = dataclasses.replace(extractor.usage)
    conversations = _group(turns)
    stats = IngestStats()
    bar = tqdm(total=sum(len(t) for sessions in conversations.values() for t in sessions.values()),
               unit="turn", disable=not progress)
    try:
        for conversation_id, sessions in conversations.items():
            bar.set_description(conversation_id)
            speakers = (participants or {}).get(conversation_id) or tuple(
                dict.fromkeys(turn.speaker for session in sessions.values() for turn in session)
            )
            _ingest_conversation(conversation_id, sessions, store, embedder, extractor, fingerprinter,
                                 config or SegmenterConfig(),
                                 ReferenceContext(speakers), stats, bar)
    finally:
        bar.close()
    stats.llm = _usage_delta(extractor.usage, usage_before)
    stats.wall_s = time.perf_counter() - started
    return stats


def _group(turns: Iterable[Turn]) -> dict[str, dict[str, list[Turn]]]:
    """conversation -> session -> turns, in order of appearance; sessions must be contiguous."""
    grouped: dict[str, dict[str, list[Turn]]] = {}
    previous: dict[str, str] = {}
    for turn in turns:
        sessions = grouped.setdefault(turn.conversation_id, {})
        if turn.session_id in sessions and previous[turn.conversation_id] != turn.session_id:
            raise IngestError(f"turn {turn.turn_id!r}: session {turn.session_id!r} of {turn.conversation_id!r} "
                              "continues after another session started")
        sessions.setdefault(turn.session_id, []).append(turn)
        previous[turn.conversation_id] = turn.session_id
    return grouped


def _ingest_conversation(conversation_id: str, sessions: Mapping[str, list[Turn]], store: AMUStore,
                         embedder: Embedder, extractor: Extractor, fingerprinter: Any | None,
                         config: SegmenterConfig, context: ReferenceContext, stats: IngestStats,
                         bar: tqdm) -> None:
    segmenter = SemanticSegmenter(embedder, conversation_id, config)
    stats.conversations += 1
    for session_turns in sessions.values():
        stats.sessions += 1
        for segment in segmenter.segment_session(session_turns):
            context.enter(segment.session_id)
            turn_ids = tuple(turn.turn_id for turn in segment.turns)
            stored = store.segment(conversation_id, segment.seq)
            if stored is not None:
                if stored.turn_ids != turn_ids:
                    raise IngestError(
                        f"{conversation_id!r} segment {segment.seq}: the store holds turns "
                        f"{list(stored.turn_ids)}, "
                        f"this run segments {list(turn_ids)}; the input, embedder or segmenter settings changed "
                        "since the store was written (use a new store)"
                    )
                # Replay what the extractor saw, so the next prompts match the first run's.
                context.record(stored.state, [amu.text for amu in store.by_segment(conversation_id, segment.seq)])
                stats.resumed_segments += 1
            else:
                extraction = extractor.extract(segment, context)
                amus = _fingerprinted(extraction.amus, fingerprinter)
                store.commit_segment(
                    SegmentRecord(conversation_id, segment.seq, segment.session_id, turn_ids, segment.reason,
                                  extraction.state, extraction.fallback, len(amus)),
                    segment.turns, amus,
                )
                context.record(extraction.state, [amu.text for amu in amus])
                stats.amus += len(amus)
                stats.fallback_segments += int(extraction.fallback)
            stats.segments += 1
            stats.exchanges += len(segment.exchanges)
            stats.turns += len(segment.turns)
            bar.update(len(segment.turns))


def _fingerprinted(amus: list[AMU], fingerprinter: Any | None) -> list[AMU]:
    if fingerprinter is None or not amus:
        return amus
    prints = fingerprinter.fingerprint([amu.text for amu in amus])
    return [dataclasses.replace(amu, fingerprint=tuple(fp.sequence)) for amu, fp in zip(amus, prints, strict=True)]


def ingest_locomo_conversation(conversation: LocomoConversation, store: AMUStore, embedder: Embedder,
                               extractor: Extractor, **options: Any) -> IngestStats:
    """Ingest one LoCoMo conversation, sessions in order (keyword options as :func:`ingest_turns`)."""
    return ingest_turns(conversation.turns, store, embedder, extractor,
                        participants={conversation.conversation_id: conversation.participants}, **options)


# ---------------------------------------------------------------------------------------------
# JSONL input
# ---------------------------------------------------------------------------------------------

_TURN_LINE_SCHEMA = {
    "type": "object",
    "required": ["session_id", "session_time", "speaker", "turn_id", "text"],
    "properties": {
        "conversation_id": {"type": "string", "minLength": 1},
        "session_id": {"type": "string", "minLength": 1},
        "session_time": {"type": "string"},
        "speaker": {"type": "string", "minLength": 1},
        "turn_id": {"type": "string", "minLength": 1},
        "text": {"type": "string"},
        "image_caption": {"type": ["string", "null"]},
    },
}
_TURN_LINE_VALIDATOR = Draft202012Validator(_TURN_LINE_SCHEMA)


def read_turns_jsonl(path: str | Path) -> list[Turn]:
    """Read a JSONL turn stream (format in the module doc). Errors name the file and line."""
    path = Path(path)
    turns: list[Turn] = []
    seen_turns: set[tuple[str, str]] = set()
    session_times: dict[tuple[str, str], datetime] = {}
    current: dict[str, tuple[str, str]] = {}  # conversation -> its session being read
    try:
        handle = path.open(encoding="utf-8")
    except OSError as err:
        raise InputFormatError(f"{path}: cannot read: {err}") from None
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise InputFormatError(f"{where}:{err.colno}: invalid JSON: {err.msg}") from None
            error = best_match(_TURN_LINE_VALIDATOR.iter_errors(row))
            if error is not None:
                field_name = ".".join(str(part) for part in error.path)
                raise InputFormatError(f"{where}: {'field ' + repr(field_name) + ': ' if field_name else ''}"
                                       f"{error.message}")
            conversation_id = row.get("conversation_id") or path.stem
            session = (conversation_id, row["session_id"])
            try:
                session_time = datetime.fromisoformat(row["session_time"])
            except ValueError:
                raise InputFormatError(f"{where}: field 'session_time': {row['session_time']!r} is not an "
                                       "ISO 8601 datetime") from None
            if session != current.get(conversation_id) and session in session_times:
                raise InputFormatError(f"{where}: session {row['session_id']!r} continues after another "
                                       "session started (sessions must be contiguous)")
            if session_times.setdefault(session, session_time) != session_time:
                raise InputFormatError(f"{where}: session_time differs from earlier turns of session "
                                       f"{row['session_id']!r}")
            if (conversation_id, row["turn_id"]) in seen_turns:
                raise InputFormatError(f"{where}: duplicate turn_id {row['turn_id']!r}")
            seen_turns.add((conversation_id, row["turn_id"]))
            current[conversation_id] = session
            turns.append(Turn(conversation_id, row["session_id"], row["turn_id"], row["speaker"], row["text"],
                              session_time, row.get("image_caption") or None))
    return turns


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    from isq.encoders import MINILM_ALIAS

    parser = argparse.ArgumentParser(prog="python -m retrieval.ingest", description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--locomo", type=Path, help="LoCoMo JSON file (list of conversations)")
    source.add_argument("--jsonl", type=Path, help="JSONL turn stream (format: module docstring)")
    parser.add_argument("--store", type=Path, required=True, help="store directory (created if missing)")
    parser.add_argument("--extractor", choices=("rule", "llm"), default="rule")
    parser.add_argument("--embedder", default=MINILM_ALIAS, help="sentence-transformers name or path for "
                        "segmentation embeddings (default: offline all-MiniLM-L6-v2)")
    parser.add_argument("--fingerprinter", type=Path, help="exported ISQ fingerprinter directory")
    parser.add_argument("--llm-cache", type=Path, help="LLM response cache (default: STORE/llm_cache)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.locomo is not None:
            conversations = load_locomo(args.locomo)
            turns = [turn for conversation in conversations for turn in conversation.turns]
            participants = {c.conversation_id: c.participants for c in conversations}
        else:
            turns, participants = read_turns_jsonl(args.jsonl), None
        if args.extractor == "llm":
            from retrieval.extract import LLMExtractor

            try:
                extractor: Extractor = LLMExtractor(cache_dir=args.llm_cache or args.store / "llm_cache")
            except ValueError as err:
                raise IngestError(str(err)) from None
        else:
            from retrieval.extract import RuleExtractor

            extractor = RuleExtractor()
        fingerprinter = None
        if args.fingerprinter is not None:
            from isq.fingerprint import Fingerprinter

            fingerprinter = Fingerprinter.from_pretrained(args.fingerprinter)
        from retrieval.embed import SentenceEmbedder

        embedder = SentenceEmbedder(args.embedder)
        with AMUStore(args.store) as store:
            stats = ingest_turns(turns, store, embedder, extractor, fingerprinter=fingerprinter,
                                 participants=participants, progress=not args.no_progress)
    except (InputFormatError, IngestError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(stats.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
