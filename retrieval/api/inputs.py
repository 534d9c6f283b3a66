"""Checking what callers pass before anything is stored: ids, turns (dicts or
:class:`retrieval.memory.records.Turn`), times and sizes. Every refusal is one
:class:`retrieval.api.errors.InvalidInput` naming the argument, the turn's position and the field
(its ``field``: ``turns.3.text``). The limits are :mod:`retrieval.api.limits`'.

A turn dict has ``speaker`` and ``text`` (required), ``time`` (ISO 8601 string or ``datetime``:
when it was said; relative dates are resolved against it), ``turn_id`` (unique per user; given
ids make replays idempotent) and ``image_caption``; no other fields. Every string must be valid
Unicode (no lone surrogates); ids and speakers may not hold control characters, nor a text or
caption a NUL (U+0000), which PostgreSQL's text cannot keep: refused on every store alike.
"""

from __future__ import annotations

import threading
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from retrieval.api.errors import InvalidInput
from retrieval.api.limits import (
    MAX_ID_CHARS,
    MAX_K,
    MAX_MEMORY_ID_CHARS,
    MAX_PAGE,
    MAX_QUERY_CHARS,
    MAX_TEXT_CHARS,
    MAX_TURN_ID_CHARS,
)
from retrieval.contract import EmptyQuery
from retrieval.contract import check_query as check_words
from retrieval.memory.records import InputFormatError, Turn, lone_surrogate
from retrieval.memory.times import naive_utc, parse_iso

TURN_FIELDS = ("speaker", "text", "time", "turn_id", "image_caption")


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


def _unicode(name: str, field: str, value: str) -> None:
    """Refuse a string SQLite, JSON and the tokenizers cannot take: one with a lone surrogate."""
    at = lone_surrogate(value)
    if at is not None:
        raise InvalidInput(f"{name} is not valid Unicode (a lone surrogate at character {at})", field)


def check_id(name: str, value: Any, field: str | None = None, *, limit: int = MAX_ID_CHARS) -> str:
    """A required id: a non-blank string of at most ``limit`` characters, valid Unicode, without
    control characters."""
    field = field or name
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(f"{name} is required: a non-empty string, got {value!r}", field)
    if len(value) > limit:
        raise InvalidInput(f"{name} has {len(value)} characters; the limit is {limit}", field)
    _unicode(name, field, value)
    if any(unicodedata.category(char) == "Cc" for char in value):
        raise InvalidInput(f"{name} {value!r} holds a control character", field)
    return value


def check_memory_id(value: Any) -> str:
    """A memory id (``get``, ``history``, ``delete``): :func:`check_id` with its own limit,
    :data:`MAX_MEMORY_ID_CHARS`."""
    return check_id("id", value, limit=MAX_MEMORY_ID_CHARS)


def check_new_id(name: str, value: Any, field: str | None = None, *, limit: int = MAX_ID_CHARS) -> str:
    """An id a write stores (a user, session or turn id): :func:`check_id`, showing something and
    no more than it holds, so that two ids that look the same are the same ("alice" and
    "alice\u200b" or "alice " would be two users): no space at either end, not made only of
    characters that show nothing, no invisible format character, line break, grapheme joiner or
    stray variation selector outside an emoji (or an ideograph's variant), and in Unicode NFC form
    (a letter and its accent composed, as most keyboards write them). Reads and deletions
    take any id :func:`check_id` takes: what an earlier version stored can still be read and
    forgotten."""
    value = check_id(name, value, field, limit=limit)
    if value != value.strip() or not any(_visible(char) and char not in _SHOWS_NOTHING for char in value):
        raise InvalidInput(f"{name} {value!r} shows nothing, or has a space at an end", field or name)
    hidden = next((char for at, char in enumerate(value) if _hides(value, at)), None)
    if hidden is not None:
        raise InvalidInput(f"{name} {value!r} holds an invisible character or line break "
                           f"(U+{ord(hidden):04X})", field or name)
    if not unicodedata.is_normalized("NFC", value):  # "cafe" + a combining accent is "café" too
        raise InvalidInput(f"{name} {value!r} is not in Unicode NFC form: write it as "
                           f"{unicodedata.normalize('NFC', value)!r}, which looks the same", field or name)
    return value


_SHOWS_NOTHING = frozenset("\u115f\u1160\u3164\uffa0\u2800")
"""Letters and symbols drawn blank: the Hangul fillers and the empty braille pattern."""


def _hides(value: str, at: int) -> bool:
    """Whether ``value[at]`` is invisible where it stands: a format character, line or paragraph
    separator, the grapheme joiner or a variation selector, except as part of an emoji (a zero-width
    joiner between its symbols, a tag after a flag, a presentation selector after a symbol) or of an
    ideograph's variant."""
    char, before = value[at], value[at - 1] if at else ""
    if char == "\u200d":  # joins emoji: after a symbol, a skin tone or a presentation selector
        after = value[at + 1] if at + 1 < len(value) else ""
        return not (before and (_symbol(before) or before == "\ufe0f") and after and _symbol(after))
    if "\U000e0020" <= char <= "\U000e007f":  # tags spell a subdivision flag after its black flag
        return not (before and (_symbol(before) or "\U000e0020" <= before <= "\U000e007f"))
    if "\ufe00" <= char <= "\ufe0f" or "\U000e0100" <= char <= "\U000e01ef":
        return not (before and (_symbol(before) or unicodedata.category(before) == "Lo"))
    return unicodedata.category(char) in ("Cf", "Zl", "Zp") or char == "\u034f"


def _symbol(char: str) -> bool:
    return unicodedata.category(char) in ("So", "Sk")


def optional_id(name: str, value: Any) -> str | None:
    return None if value is None else check_id(name, value)


def check_query(query: Any) -> str:
    """A query: a string with a letter or digit (:func:`retrieval.contract.check_query`), not oversized."""
    if not isinstance(query, str):
        raise InvalidInput(f"query must be a non-empty string, got {query!r}", "query")
    if len(query) > MAX_QUERY_CHARS:
        raise InvalidInput(f"query has {len(query)} characters; the limit is {MAX_QUERY_CHARS}", "query")
    _unicode("query", "query", query)
    try:
        check_words(query)
    except EmptyQuery as err:
        raise InvalidInput(str(err), "query") from None
    return query


def check_count(name: str, value: Any, maximum: int) -> int:
    """A whole number from 1 to ``maximum`` (``k``: :data:`MAX_K`, ``limit``: :data:`MAX_PAGE`)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise InvalidInput(f"{name} must be an integer from 1 to {maximum}, got {value!r}", name)
    return value


def check_k(value: Any) -> int:
    return check_count("k", value, MAX_K)


def check_limit(value: Any) -> int:
    return check_count("limit", value, MAX_PAGE)


def check_flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput(f"{name} must be True or False, got {value!r}", name)
    return value


def check_timeout(value: Any) -> float | None:
    """``timeout_s``: None (wait as long as it takes) or a number of seconds, 0 or more, up to the
    longest wait a thread can be given (``threading.TIMEOUT_MAX``, about 292 years)."""
    if value is None:
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not 0 <= value <= threading.TIMEOUT_MAX:  # NaN compares false, an int exactly
        raise InvalidInput("timeout_s must be None or a number of seconds from 0 to "
                           f"{threading.TIMEOUT_MAX:.0f}, got {value!r}", "timeout_s")
    return float(value)


def _time(where: str, field: str, value: Any) -> datetime | None:
    if value is None:
        return None
    # a datetime subclass finer than microseconds (pandas' Timestamp) would be cut, not kept
    moment = value if isinstance(value, datetime) and not getattr(value, "nanosecond", 0) else None
    if isinstance(value, str) and len(value) <= MAX_ID_CHARS:
        try:
            moment = parse_iso(value)  # a finer fraction than microseconds is refused, not cut
        except ValueError:
            pass
    if moment is None:
        raise InvalidInput(f"{where}: field 'time': {value!r} is not an ISO 8601 datetime (e.g. "
                           "2023-05-08T10:00:00, seconds to at most 6 decimals)", field)
    try:
        naive_utc(moment)  # the store keeps times in UTC: one that leaves the calendar is refused now
    except ValueError as err:
        raise InvalidInput(f"{where}: field 'time': {err}", field) from None
    return moment


def _text(where: str, name: str, value: Any, *, required: bool, limit: int) -> str | None:
    """A turn's string field; ``where`` is ``turns[<index>]``."""
    field = f"turns.{where[6:-1]}.{name}"
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not _visible(value)):
        raise InvalidInput(f"{where}: field {name!r} must be a non-empty string, got {value!r}", field)
    if value and not _visible(value):  # an optional field given blank: neither text nor none
        raise InvalidInput(f"{where}: field {name!r} holds no visible character ({value!r}); give it text "
                           "or leave it out", field)
    if len(value) > limit:
        advice = " (split it into several turns)" if name == "text" else ""
        raise InvalidInput(f"{where}: field {name!r} has {len(value)} characters; "
                           f"the limit is {limit}{advice}", field)
    _unicode(f"{where}: field {name!r}", field, value)
    if name == "speaker" and any(unicodedata.category(char) in ("Cc", "Zl", "Zp") for char in value):
        # a record reads "<speaker>: <text>": a line break in the name would put words in the text
        raise InvalidInput(f"{where}: field 'speaker' {value!r} holds a control character or line break",
                           field)
    if "\x00" in value:
        raise InvalidInput(f"{where}: field {name!r} holds a NUL character (U+0000) at character "
                           f"{value.index(chr(0))}", field)
    return value


def _visible(value: str) -> bool:
    """Whether ``value`` holds a character one can see: not only spaces, control and format
    characters (a zero-width space is as blank as a space)."""
    return any(not char.isspace() and unicodedata.category(char) not in ("Cc", "Cf") for char in value)


def check_turn(index: int, turn: Any) -> TurnInput:
    """One turn of an ``add`` (a dict or a :class:`Turn`), checked."""
    where, field = f"turns[{index}]", f"turns.{index}"
    if isinstance(turn, Turn):
        turn = {"speaker": turn.speaker, "text": turn.text, "time": turn.stored_time(),
                "turn_id": turn.turn_id, "image_caption": turn.image_caption}
    if not isinstance(turn, Mapping):
        raise InvalidInput(f"{where}: a turn is a dict with 'speaker' and 'text' (or a Turn), "
                           f"got {type(turn).__name__}", field)
    unknown = sorted(set(turn) - set(TURN_FIELDS), key=str)
    if unknown:
        raise InvalidInput(f"{where}: unknown field(s) {unknown}; a turn has {list(TURN_FIELDS)}",
                           f"{field}.{unknown[0]}")
    speaker = _text(where, "speaker", turn.get("speaker"), required=True, limit=MAX_ID_CHARS)
    text = _text(where, "text", turn.get("text"), required=True, limit=MAX_TEXT_CHARS)
    turn_id = turn.get("turn_id")
    if turn_id is not None:
        check_new_id(f"{where}: field 'turn_id'", turn_id, f"{field}.turn_id", limit=MAX_TURN_ID_CHARS)
    caption = _text(where, "image_caption", turn.get("image_caption"), required=False, limit=MAX_TEXT_CHARS)
    assert speaker is not None and text is not None
    return TurnInput(speaker, text, _time(where, f"{field}.time", turn.get("time")), turn_id, caption or None)


def check_recorded(turn: Turn) -> None:
    """A turn of a recorded conversation (ingestion's input): its conversation (user) and session
    ids, and the turn as ``add`` checks it; a refusal names where it is (conversation, session,
    turn id) and the input's own field (``conversation_id``)."""
    try:
        check_new_id("conversation_id", turn.user_id)
        check_new_id("session_id", turn.session_id)
        check_turn(0, turn)
    except InvalidInput as err:
        where = f"conversation {turn.user_id!r}, session {turn.session_id!r}, turn {turn.turn_id!r}"
        raise InvalidInput(f"{where}: {str(err).removeprefix('turns[0]: ')}", err.field) from None


def check_recorded_file(source: Path, turns: Sequence[Turn]) -> None:
    """Every turn of a recorded conversation file checked as the memory will check it
    (:func:`check_recorded`), before a store is created or a model loads: a refusal
    (:class:`InputFormatError`) names the file and where in it."""
    for turn in turns:
        try:
            check_recorded(turn)
        except InvalidInput as err:
            raise InputFormatError(f"{source}: {err}") from None


def check_turns(turns: Any, user: str, session: str) -> list[TurnInput]:
    """The turns of an ``add`` to ``user``'s ``session`` (ids :func:`check_new_id` takes): a
    non-empty sequence, each checked, turn ids distinct; a :class:`Turn` names its user and session,
    which must be these (the add stores it under them: one naming others would be moved silently)."""
    if isinstance(turns, (str, bytes, Mapping)) or not isinstance(turns, Sequence) or not turns:
        raise InvalidInput(f"turns must be a non-empty list of turns, got {type(turns).__name__}", "turns")
    check_new_id("user_id", user)
    check_new_id("session_id", session)
    for index, turn in enumerate(turns):
        if isinstance(turn, Turn) and (turn.user_id, turn.session_id) != (user, session):
            name, added = ("user_id", user) if turn.user_id != user else ("session_id", session)
            raise InvalidInput(f"turns[{index}]: the Turn's {name} is {getattr(turn, name)!r}, not the "
                               f"add's {added!r}; add it with its own {name}, or pass "
                               f"dataclasses.replace(turn, {name}=...)", f"turns.{index}.{name}")
    checked = [check_turn(index, turn) for index, turn in enumerate(turns)]
    given = [turn.turn_id for turn in checked if turn.turn_id is not None]
    if len(given) != len(set(given)):
        twice = sorted(t for t in set(given) if given.count(t) > 1)
        index = next(i for i, turn in enumerate(checked) if turn.turn_id in twice and
                     [t.turn_id for t in checked[:i]].count(turn.turn_id))
        raise InvalidInput(f"turns: a turn_id appears twice in one add: {twice}", f"turns.{index}.turn_id")
    return checked
