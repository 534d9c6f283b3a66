"""Loading the LoCoMo benchmark (``locomo10.json`` or a subset of it, docs/design.md §6.1).

The file is a JSON list of conversations. Each has ``sample_id``, ``conversation`` (with
``speaker_a``, ``speaker_b``, ``session_<n>`` turn lists and ``session_<n>_date_time`` strings
such as ``"1:56 pm on 8 May, 2023"``) and ``qa`` (question, answer or adversarial_answer,
evidence dia_ids, category). Some releases carry date strings for sessions that have no turns;
those sessions are skipped. Sessions are returned in numeric order.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from retrieval.memory import strict_json
from retrieval.memory.records import MAX_TURN_CHARS, InputFormatError, Turn

LOCOMO_TIME_FORMAT = "%I:%M %p on %d %B, %Y"
"""strptime format of ``session_<n>_date_time`` values ("1:56 pm on 8 May, 2023")."""

_SESSION_KEY = re.compile(r"^session_(\d+)$")


@dataclass(frozen=True)
class LocomoQuestion:
    """One LoCoMo question. Category 1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop,
    5 adversarial (these carry ``adversarial_answer`` and usually no ``answer``)."""

    question: str
    answer: str | None
    evidence: tuple[str, ...]
    category: int
    adversarial_answer: str | None = None


@dataclass(frozen=True)
class LocomoSession:
    session_id: str
    index: int
    time: datetime
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class LocomoConversation:
    conversation_id: str
    speaker_a: str
    speaker_b: str
    sessions: tuple[LocomoSession, ...]
    questions: tuple[LocomoQuestion, ...]

    @property
    def turns(self) -> list[Turn]:
        """All turns, sessions in order."""
        return [turn for session in self.sessions for turn in session.turns]

    @property
    def participants(self) -> tuple[str, str]:
        return self.speaker_a, self.speaker_b


def parse_locomo_time(value: str) -> datetime:
    """``"1:56 pm on 8 May, 2023"`` -> ``datetime(2023, 5, 8, 13, 56)``; ``ValueError`` otherwise."""
    return datetime.strptime(value.strip(), LOCOMO_TIME_FORMAT)


def load_locomo(path: str | Path) -> list[LocomoConversation]:
    """Parse a LoCoMo file. Malformed input (an empty list, a question without a letter or digit,
    ...) raises :class:`InputFormatError` naming the file and either the JSON line/column or the
    conversation index and the missing or bad field."""
    path = Path(path)
    try:
        data = strict_json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise InputFormatError(f"{path}:{err.lineno}:{err.colno}: invalid JSON: {err.msg}") from None
    except strict_json.JSONRefused as err:
        raise InputFormatError(f"{path}: {err}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputFormatError(f"{path}: cannot read: {err}") from None
    if not isinstance(data, list):
        raise InputFormatError(f"{path}: expected a JSON list of conversations, got {type(data).__name__}")
    if not data:
        raise InputFormatError(f"{path}: the list of conversations is empty")
    conversations = [_parse_conversation(item, f"{path}: conversation {index}")
                     for index, item in enumerate(data)]
    first: dict[str, int] = {}
    for index, conversation in enumerate(conversations):  # one user each: a repeat would count twice
        earlier = first.setdefault(conversation.conversation_id, index)
        if earlier != index:
            raise InputFormatError(f"{path}: conversation {index}: field 'sample_id': "
                                   f"{conversation.conversation_id!r} is also conversation {earlier}'s; "
                                   "give each its own")
    return conversations


def _parse_conversation(item: Any, where: str) -> LocomoConversation:
    item = _mapping(item, where)
    conversation_id = _field(item, "sample_id", str, where)
    where = f"{where} ({conversation_id})"
    body = _mapping(_field(item, "conversation", dict, where), f"{where}: field 'conversation'")
    speaker_a = _field(body, "speaker_a", str, f"{where}: conversation")
    speaker_b = _field(body, "speaker_b", str, f"{where}: conversation")
    if speaker_a.strip() == speaker_b.strip():
        raise InputFormatError(f"{where}: field 'conversation.speaker_b': {speaker_b!r} is speaker_a's name "
                               "too; a conversation's two speakers need two names (its statements name them)")
    keys: dict[int, str] = {}
    for key in body:
        if (m := _SESSION_KEY.match(key)) is None:
            continue
        if (earlier := keys.setdefault(int(m[1]), key)) != key:
            raise InputFormatError(f"{where}: fields 'conversation.{earlier}' and 'conversation.{key}' are "
                                   f"the same session {int(m[1])}; give each session one key")
    sessions = []
    for number, session_id in sorted(keys.items()):
        turns_raw = _field(body, session_id, list, f"{where}: conversation")
        if not turns_raw:
            continue
        stamp = _field(body, f"{session_id}_date_time", str, f"{where}: conversation")
        try:
            time = parse_locomo_time(stamp)
        except ValueError:
            raise InputFormatError(f"{where}: field 'conversation.{session_id}_date_time': {stamp!r} is not "
                                   f"like '1:56 pm on 8 May, 2023'") from None
        turns = tuple(
            _parse_turn(raw, conversation_id, session_id, time, f"{where}: {session_id} turn {index}")
            for index, raw in enumerate(turns_raw)
        )
        sessions.append(LocomoSession(session_id, number, time, turns))
    seen: set[str] = set()
    for turn in (turn for session in sessions for turn in session.turns):
        if turn.turn_id in seen:
            raise InputFormatError(f"{where}: duplicate dia_id {turn.turn_id!r}")
        seen.add(turn.turn_id)
    questions = tuple(
        _parse_question(raw, f"{where}: qa {index}")
        for index, raw in enumerate(_field(item, "qa", list, where))
    )
    return LocomoConversation(conversation_id, speaker_a, speaker_b, tuple(sessions), questions)


def _parse_turn(raw: Any, conversation_id: str, session_id: str, time: datetime, where: str) -> Turn:
    raw = _mapping(raw, where)
    caption = raw.get("blip_caption")
    if caption is not None and not isinstance(caption, str):
        raise InputFormatError(f"{where}: field 'blip_caption' must be a string")
    return Turn(
        user_id=conversation_id,
        session_id=session_id,
        turn_id=_field(raw, "dia_id", str, where),
        speaker=_field(raw, "speaker", str, where),
        text=_field(raw, "text", str, where),
        session_time=time,
        image_caption=caption if caption and caption.strip() else None,  # a blank caption says nothing
    )


def _parse_question(raw: Any, where: str) -> LocomoQuestion:
    raw = _mapping(raw, where)
    evidence = _field(raw, "evidence", list, where)
    answer = raw.get("answer")
    adversarial = raw.get("adversarial_answer")
    return LocomoQuestion(
        question=_field(raw, "question", str, where),
        # Some answers are numbers (years); keep everything as text for scoring.
        answer=None if answer is None else str(answer),
        evidence=tuple(str(item) for item in evidence),
        category=_field(raw, "category", int, where),
        adversarial_answer=None if adversarial is None else str(adversarial),
    )


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InputFormatError(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


_NON_EMPTY = ("sample_id", "speaker_a", "speaker_b", "dia_id", "speaker")
"""Identifiers and names: an empty one would make records that point nowhere."""


def _field(mapping: Mapping[str, Any], name: str, kind: type, where: str) -> Any:
    if name not in mapping:
        raise InputFormatError(f"{where}: missing field {name!r}")
    value = mapping[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise InputFormatError(f"{where}: field {name!r} must be {kind.__name__}, got {type(value).__name__}")
    if name in _NON_EMPTY and isinstance(value, str) and not value.strip():
        raise InputFormatError(f"{where}: field {name!r} is empty")
    if name == "question" and isinstance(value, str) and not any(char.isalnum() for char in value):
        raise InputFormatError(f"{where}: field 'question' has no letter or digit ({value!r})")
    if name == "text" and isinstance(value, str) and len(value) > MAX_TURN_CHARS:
        raise InputFormatError(f"{where}: field 'text' has {len(value)} characters, "
                               f"over the limit of {MAX_TURN_CHARS}")
    return value


__all__ = [
    "LOCOMO_TIME_FORMAT", "LocomoConversation", "LocomoQuestion", "LocomoSession", "load_locomo",
    "parse_locomo_time",
]
