"""Allowed ranges of numeric settings, and the one check that refuses a value outside them.

Used by :class:`isq.config.ISQConfig` and by the training module and data module, so every
numeric setting is refused the same way: one :class:`OutOfRange` line naming the owner, the
field, the value and the allowed range (``training.fit`` turns it into ``error:`` + exit 2).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


class OutOfRange(ValueError):
    """A setting is outside its allowed range or set of values (or is not a finite number, or not
    of its type)."""


@dataclass(frozen=True)
class Range:
    """An interval of allowed values; ``None`` leaves a side open-ended. ``low_open`` /
    ``high_open`` exclude the bound itself (``Range(0, low_open=True)`` is "> 0")."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def contains(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return self.high is None or not (value > self.high or (self.high_open and value == self.high))

    def __str__(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {_number(self.low)}"
        if self.low is None:
            return f"{'<' if self.high_open else '<='} {_number(self.high)}"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"in {left}{_number(self.low)}, {_number(self.high)}{right}"


POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
AT_LEAST_ONE = Range(1)
UNIT = Range(0, 1)
TOKEN_LENGTH = Range(3)
"""A length a text is cut to, in tokens: room for the special tokens a tokenizer adds (BERT's
[CLS] and [SEP], T5's </s>) and one of the text's. Cut to the special tokens' number, a text
keeps none of its own; cut to fewer, Hugging Face's tokenizers do not cut it at all (they warn
and keep it whole), so a long text overruns the encoder's positions."""


def check_ranges(owner: str, values: Mapping[str, object], allowed: Mapping[str, Range], *,
                 required: bool = False) -> None:
    """Raise :class:`OutOfRange` for the first field of ``allowed`` whose value in ``values``
    lies outside its range; ``None`` (an unset optional) passes unless ``required``."""
    for name, bounds in allowed.items():
        value = values[name]
        if value is None and not required:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not bounds.contains(value):
            raise OutOfRange(f"{owner} field {name!r} is {value!r}: allowed range is {bounds}")


def _number(bound: float | None) -> str:
    return f"{bound:g}"
