"""A conversation stream as JSONL: one turn per line, turns in order, sessions contiguous::

    {"session_id": "s1", "session_time": "2023-05-08T13:56:00", "speaker": "Caroline",
     "turn_id": "D1:1", "text": "Hey Mel!"}

``session_time`` is when the turn was said, ISO 8601 (relative dates are resolved against it, on
the speaker's clock): the ``time`` of a turn the memory's ``add`` takes, so a session's turns may
differ in it (one that runs past midnight); one with an offset is converted to UTC, its offset
kept, one without is taken as written (:class:`retrieval.memory.records.Turn`). Optional fields:
``conversation_id`` (default: the file name without extension) and ``image_caption``; any other
field is refused.
Blank lines are ignored; every error names the file and line.
"""

from __future__ import annotations

import json
from pathlib import Path

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from retrieval.memory import strict_json
from retrieval.memory.records import MAX_TURN_CHARS, InputFormatError, Turn, shown
from retrieval.memory.times import naive_utc, parse_iso

_TURN_LINE_FIELDS: dict[str, dict[str, object]] = {
    "conversation_id": {"type": "string", "pattern": r"\S"},
    "session_id": {"type": "string", "pattern": r"\S"},
    "session_time": {"type": "string"},
    "speaker": {"type": "string", "pattern": r"\S"},
    "turn_id": {"type": "string", "pattern": r"\S"},
    "text": {"type": "string", "maxLength": MAX_TURN_CHARS},
    "image_caption": {"type": ["string", "null"]},
}
_TURN_LINE_SCHEMA = {"type": "object", "properties": _TURN_LINE_FIELDS, "additionalProperties": False,
                     "required": ["session_id", "session_time", "speaker", "turn_id", "text"]}
_TURN_LINE_VALIDATOR = Draft202012Validator(_TURN_LINE_SCHEMA)


def _refuse_unknown_fields(where: str, row: object) -> None:
    """A field a turn line does not have is refused by name (a misspelt ``image_caption`` would
    otherwise be dropped, its caption lost)."""
    fields = _TURN_LINE_FIELDS
    unknown = sorted(set(row) - set(fields)) if isinstance(row, dict) else []
    if unknown:
        hint = " (the stream calls it session_time)" if unknown[0] == "time" else ""
        raise InputFormatError(f"{where}: field {unknown[0]!r}: not a field of a turn line{hint}; its fields "
                               f"are {', '.join(fields)}")


def read_turns_jsonl(path: str | Path) -> list[Turn]:
    """Read a JSONL turn stream (format in the module doc). Errors name the file and line."""
    path = Path(path)
    turns: list[Turn] = []
    seen_turns: set[tuple[str, str]] = set()
    sessions: set[tuple[str, str]] = set()
    current: dict[str, tuple[str, str]] = {}  # conversation -> its session being read
    try:
        data = path.read_bytes()
    except OSError as err:
        raise InputFormatError(f"{path}: cannot read: {err}") from None
    for number, raw in enumerate(data.splitlines(), start=1):
        where = f"{path}:{number}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise InputFormatError(f"{where}: not UTF-8 text (byte {err.start + 1}: {err.reason})") from None
        if not line.strip():
            continue
        try:
            row = strict_json.loads(line)
        except json.JSONDecodeError as err:
            raise InputFormatError(f"{where}:{err.colno}: invalid JSON: {err.msg}") from None
        except strict_json.JSONRefused as err:
            raise InputFormatError(f"{where}: {err}") from None
        _refuse_unknown_fields(where, row)
        error = best_match(_TURN_LINE_VALIDATOR.iter_errors(row))
        if error is not None:
            field_name = ".".join(str(part) for part in error.path)
            message = error.message.replace(repr(error.instance), shown(error.instance))
            raise InputFormatError(f"{where}: {'field ' + repr(field_name) + ': ' if field_name else ''}"
                                   f"{message}")
        user_id = row.get("conversation_id") or path.stem
        session = (user_id, row["session_id"])
        try:
            given = parse_iso(row["session_time"])
            naive_utc(given)  # one the conversion to UTC takes out of the calendar is refused here
        except (ValueError, OverflowError):
            raise InputFormatError(f"{where}: field 'session_time': {row['session_time']!r} is not an "
                                   "ISO 8601 datetime between years 1 and 9999 (UTC), seconds to at most "
                                   "6 decimals") from None
        if session != current.get(user_id) and session in sessions:
            raise InputFormatError(f"{where}: session {row['session_id']!r} continues after another "
                                   "session started (sessions must be contiguous)")
        sessions.add(session)
        if (user_id, row["turn_id"]) in seen_turns:
            raise InputFormatError(f"{where}: duplicate turn_id {row['turn_id']!r}")
        seen_turns.add((user_id, row["turn_id"]))
        current[user_id] = session
        turns.append(Turn(user_id, row["session_id"], row["turn_id"], row["speaker"], row["text"],
                          given, row.get("image_caption") or None))
    return turns
