"""Stability of token codes under small edits of a text (a first name, one digit)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from isq.analysis.sample import SampleCodes

# Capitalised names that are not also common words ("Will", "May", "Bill" are left out).
NAMES = (
    "John", "Mary", "Tom", "Jane", "Jack", "Susan", "David", "Linda", "Peter", "Anna", "Ben",
    "Lisa", "Paul", "Kate", "Sarah", "James", "Emily", "Bob", "Alice", "Steve", "Nancy", "Jim",
    "Sam", "Tony", "Helen", "Mike", "Laura", "Carla", "Luis", "Grace",
)
_NAME_PATTERN = re.compile(r"\b(" + "|".join(NAMES) + r")\b")
_NUMBER_PATTERN = re.compile(r"\d+")


def substitute_name(text: str) -> str | None:
    """Replace the first known first name with the next one in :data:`NAMES`; None if there is none."""
    match = _NAME_PATTERN.search(text)
    if match is None:
        return None
    other = NAMES[(NAMES.index(match.group(1)) + 1) % len(NAMES)]
    return text[: match.start()] + other + text[match.end() :]


def change_digit(text: str) -> str | None:
    """Change the last digit of the first number (a day, hour, year, price); None without digits."""
    match = _NUMBER_PATTERN.search(text)
    if match is None:
        return None
    last = match.end() - 1
    return text[:last] + str((int(text[last]) + 1) % 10) + text[last + 1 :]


EDITS: dict[str, Callable[[str], str | None]] = {"name": substitute_name, "digit": change_digit}
"""The small edits of the stability check, by name."""


def edited_texts(texts: Sequence[str], edit: Callable[[str], str | None]) -> tuple[list[int], list[str]]:
    """Indices of the texts that ``edit`` applies to, and their edited versions."""
    indices, edited = [], []
    for i, text in enumerate(texts):
        changed = edit(text)
        if changed is not None:
            indices.append(i)
            edited.append(changed)
    return indices, edited


@dataclass(frozen=True)
class Stability:
    """Share of identical token codes between texts and their edited versions.

    Only pairs with equal token counts are compared, position by position (``compared``;
    the others are ``skipped``). ``share`` is over every aligned position; ``share_unedited``
    only over positions whose token did not change, i.e. how far an edit's effect spreads.
    Either is NaN when there is nothing to compare.
    """

    share: float
    share_unedited: float
    compared: int
    skipped: int


def stability(original: SampleCodes, edited: SampleCodes) -> Stability:
    """Compare text i of ``original`` with text i of ``edited``."""
    if len(original.texts) != len(edited.texts):
        raise ValueError(f"{len(original.texts)} original texts but {len(edited.texts)} edited ones")
    same = positions = same_unedited = unedited = compared = 0
    for tokens_a, codes_a, tokens_b, codes_b in zip(
        original.tokens, original.token_codes, edited.tokens, edited.token_codes, strict=True
    ):
        if len(codes_a) != len(codes_b):
            continue
        compared += 1
        equal_codes = codes_a == codes_b
        equal_tokens = np.array([a == b for a, b in zip(tokens_a, tokens_b, strict=True)], dtype=bool)
        same += int(equal_codes.sum())
        positions += len(codes_a)
        same_unedited += int((equal_codes & equal_tokens).sum())
        unedited += int(equal_tokens.sum())
    return Stability(
        share=same / positions if positions else float("nan"),
        share_unedited=same_unedited / unedited if unedited else float("nan"),
        compared=compared,
        skipped=len(original.texts) - compared,
    )
