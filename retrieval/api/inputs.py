"""Checking what callers pass before anything is stored: ids, turns (dicts or
:class:`retrieval.memory.records.Turn`), times and sizes. Every refusal is one
:class:`retrieval.api.errors.InvalidInput` naming the argument, the turn's position and the field.

A turn dict has ``speaker`` and ``text`` (required), ``time`` (ISO 8601 string or ``datetime``:
when it was said; relative dates are resolved against it), ``turn_id`` (unique per user; given
ids make replays idempotent) and ``image_caption``; no other fields.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from retrieval.api.errors import InvalidInput
from retrieval.contract import EmptyQuery
from retrieval.contract import check_query as check_words
from retrieval.memory.records import MAX_TURN_CHARS, Turn

TURN_FIELDS = ("speaker", "text", "time", "turn_id", "image_caption")
MAX_ID_CHARS = 200
"""The longest user, session, turn or idempotency id accepted."""


@dataclass(frozen=True)
class TurnInput:
    """A checked turn, before the store gives it a turn id when the caller did not."""

    speaker: str
    text: str
    time: datetime | None
    turn_id: str | None
    image_caption: str | None

    def bind(self, user: str, session_id: str, turn_id: str) -> Turn:
        return Turn(user, session_id, turn_id, self.speaker, self.text, self.time, self.image_caption)


def check_id(name: str, value: Any) -> str:
    """A required id: a non-blank string of at most :data:`MAX_ID_CHARS` characters."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(f"{name} is required: a non-empty string, got {value!r}")
    if len(value) > MAX_ID_CHARS:
        raise InvalidInput(f"{name} has {len(value)} characters; the limit is {MAX_ID_CHARS}")
    return value


def optional_id(name: str, value: Any) -> str | None:
    return None if value is None else check_id(name, value)


def check_query(query: Any) -> str:
    """A query: a string with a letter or digit (:func:`retrieval.contract.check_query`), not oversized."""
    if not isinstance(query, str):
        raise InvalidInput(f"query must be a non-empty string, got {query!r}")
    try:
        check_words(query)
    except EmptyQuery as err:
        raise InvalidInput(str(err)) from None
    if len(query) > MAX_TURN_CHARS:
        raise InvalidInput(f"query has {len(query)} characters; the limit is {MAX_TURN_CHARS}")
    return query


def check_positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(f"{name} must be a positive integer, got {value!r}")
    return value


def _time(where: str, value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            pass
    raise InvalidInput(f"{where}: field 'time': {value!r} is not an ISO 8601 datetime (e.g. "
                       "2023-05-08T10:00:00)")


def _text(where: str, name: str, value: Any, *, required: bool) -> str | None:
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value.strip()):
        raise InvalidInput(f"{where}: field {name!r} must be a non-empty string, got {value!r}")
    if len(value) > MAX_TURN_CHARS:
        raise InvalidInput(f"{where}: field {name!r} has {len(value)} characters; "
                           f"the limit is {MAX_TURN_CHARS} (split it into several turns)")
    return value


def check_turn(index: int, turn: Any) -> TurnInput:
    """One turn of an ``add`` (a dict or a :class:`Turn`), checked."""
    where = f"turns[{index}]"
    if isinstance(turn, Turn):
        turn = {"speaker": turn.speaker, "text": turn.text, "time": turn.session_time,
                "turn_id": turn.turn_id, "image_caption": turn.image_caption}
    if not isinstance(turn, Mapping):
        raise InvalidInput(f"{where}: a turn is a dict with 'speaker' and 'text' (or a Turn), "
                           f"got {type(turn).__name__}")
    unknown = sorted(set(turn) - set(TURN_FIELDS))
    if unknown:
        raise InvalidInput(f"{where}: unknown field(s) {unknown}; a turn has {list(TURN_FIELDS)}")
    speaker = _text(where, "speaker", turn.get("speaker"), required=True)
    text = _text(where, "text", turn.get("text"), required=True)
    turn_id = turn.get("turn_id")
    if turn_id is not None:
        check_id(f"{where}: field 'turn_id'", turn_id)
    caption = _text(where, "image_caption", turn.get("image_caption"), required=False)
    assert speaker is not None and text is not None
    return TurnInput(speaker, text, _time(where, turn.get("time")), turn_id, caption or None)


def check_turns(turns: Any) -> list[TurnInput]:
    """The turns of an ``add``: a non-empty sequence, each checked, turn ids distinct."""
    if isinstance(turns, (str, bytes, Mapping)) or not isinstance(turns, Sequence) or not turns:
        raise InvalidInput(f"turns must be a non-empty list of turns, got {type(turns).__name__}")
    checked = [check_turn(index, turn) for index, turn in enumerate(turns)]
    given = [turn.turn_id for turn in checked if turn.turn_id is not None]
    if len(given) != len(set(given)):
        raise InvalidInput("turns: a turn_id appears twice in one add: "
                           f"{sorted(t for t in given if given.count(t) > 1)}")
    return checked
