"""What every extractor shares: the result type, the interface, the reference context and the
AMU constructors (LycheeMemory section 3.3 / C.2, MemCode key design 1).

One extraction call per finalized segment turns its turns into AMUs. A segment whose extraction
fails is kept as raw-turn AMUs (:func:`raw_turn_amus`), never dropped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from retrieval.llm_client import one_line
from retrieval.llm_usage import LLMUsage
from retrieval.memory.records import AMU, Segment, SourcePointer, Turn, amu_id, names


@dataclass
class Extraction:
    """The AMUs of one segment, the extractor's disambiguation state after it (eq. 5), whether
    the segment fell back to raw-turn AMUs, and how many relative date phrases were kept as text
    because they resolve outside the representable years (:mod:`retrieval.extract.dates`)."""

    amus: list[AMU]
    state: str = ""
    fallback: bool = False
    unresolved_dates: int = 0


DISAMBIGUATION_CHARS = 1200
"""The disambiguation state a segment's extraction is given and keeps (LycheeMemory: at most
1,200 characters)."""


class ReferenceContext:
    """LycheeMemory's reference context rho (eq. 7): the latest disambiguation state (at most
    1,200 characters) and summaries of recent records of the same session (at most 12 records
    and 2,400 characters, newest kept). ``participants`` are the conversation's speakers."""

    def __init__(self, participants: Sequence[str], recent_chars: int = 2400,
                 recent_records: int = 12) -> None:
        self.participants = tuple(participants)
        self.recent_chars = recent_chars
        self.disambiguation = ""
        self.recent: deque[str] = deque(maxlen=recent_records)
        self.session_id: str | None = None

    def enter(self, session_id: str) -> None:
        """Call before each segment: recent records only carry over within a session."""
        if session_id != self.session_id:
            self.recent.clear()
            self.session_id = session_id

    def record(self, state: str, texts: Sequence[str]) -> None:
        """Fold in a finished segment: its state replaces the old one, its records join the recent."""
        self.disambiguation = state[:DISAMBIGUATION_CHARS]
        self.recent.extend(texts)

    def render(self) -> str:
        """The bounded context text ('' when there is nothing yet)."""
        kept: list[str] = []
        used = 0
        for text in reversed(self.recent):
            line = f"- {one_line(text)}"
            if used + len(line) + 1 > self.recent_chars:
                break
            kept.append(line)
            used += len(line) + 1
        parts = []
        if self.disambiguation:
            parts.append(f"Disambiguation state:\n{self.disambiguation}")
        if kept:
            parts.append("Recent records of this session:\n" + "\n".join(reversed(kept)))
        return "\n\n".join(parts)


class Extractor(Protocol):
    """One call per finalized segment."""

    @property
    def usage(self) -> LLMUsage: ...

    def extract(self, segment: Segment, context: ReferenceContext) -> Extraction: ...


def session_time(segment: Segment) -> datetime | None:
    """When the segment was said, on the speaker's clock: its first dated turn's local time (None
    when no turn has one)."""
    first = _first_dated(segment)
    return None if first is None else first.local_time


def make_amu(segment: Segment, index: int, text: str, memory_type: str, turns: Sequence[Turn], *,
              timestamps: Sequence[str] = (), entities: Sequence[str] = (), tags: Sequence[str] = (),
              t_ref: str | None = None, valid_from: str | None = None, valid_to: str | None = None) -> AMU:
    """The AMU of one extracted record, stated when the last of its ``turns`` was (else when the
    segment was). Without an explicit ``t_ref`` the record refers to the day it was stated: every
    record has a temporal scope when its turns or its segment are dated."""
    stated = _stated(turns, segment)
    when, local = (None, None) if stated is None else (stated.session_time, stated.local_time)
    return AMU(
        id=amu_id(segment.user_id, segment.seq, index),
        text=text,
        memory_type=memory_type,
        source=SourcePointer(segment.user_id, segment.session_id, tuple(t.turn_id for t in turns),
                             tuple(dict.fromkeys(t.speaker for t in turns)), segment.seq),
        observed_at=when.isoformat() if when else None,
        timestamps=tuple(timestamps),
        entities=names(entities),
        tags=names(tags),
        t_ref=t_ref or (local.date().isoformat() if local else None),
        valid_from=valid_from,
        valid_to=valid_to,
    )


def _stated(turns: Sequence[Turn], segment: Segment) -> Turn | None:
    """The turn whose time a record takes: the last dated of its turns, else the segment's first
    dated turn (None when no turn is dated)."""
    dated = [turn for turn in turns if turn.session_time is not None]
    if dated:
        return max(dated, key=lambda turn: turn.session_time or datetime.min)
    return _first_dated(segment)


def _first_dated(segment: Segment) -> Turn | None:
    return next((turn for turn in segment.turns if turn.session_time is not None), None)


def raw_turn_amus(segment: Segment) -> list[AMU]:
    """The fallback: one ``fact`` AMU per turn, text ``"Speaker: text"`` (image caption kept)."""
    return [make_amu(segment, index, turn.render(), "fact", [turn])
            for index, turn in enumerate(segment.turns)]
