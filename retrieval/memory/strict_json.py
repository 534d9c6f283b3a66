"""JSON a caller wrote (a request body, a JSONL line, a LoCoMo file), read as written or refused:
an object that gives a key twice (``{"text": "a", "text": "b"}``) would keep its last value
alone, the others dropped unseen (RFC 8259 leaves such objects' meaning open), and a document
nested past the parser's depth raises ``RecursionError`` and an integer of more digits than
Python converts a ``ValueError`` that reads as a hint to its programmer: neither names the input."""

from __future__ import annotations

import json
import sys
from typing import Any


class JSONRefused(Exception):
    """Well-formed JSON read no further: a key given twice in one object, nesting too deep, or a
    number too long. The message says which, to follow a place (a file and line, a field)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    held: dict[str, Any] = {}
    for key, value in pairs:
        if key in held:
            raise JSONRefused(f"key {key!r} is given twice in one object; give each key once")
        held[key] = value
    return held


def loads(text: str | bytes) -> Any:
    """``json.loads`` of ``text``, or :class:`JSONRefused`; malformed JSON raises
    :class:`json.JSONDecodeError` as ``json.loads`` does (bytes that are not in the encoding it
    guesses, :class:`UnicodeDecodeError`)."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise JSONRefused("JSON nested too deep to read") from None
    except (json.JSONDecodeError, UnicodeDecodeError):  # not JSON (bytes guessed UTF-16 or -32)
        raise
    except ValueError:  # the integer conversion's limit, the one other error of a parse
        raise JSONRefused(f"a number of more than {sys.get_int_max_str_digits()} digits") from None
