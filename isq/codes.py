"""A text's codes (docs/design.md §2.1): one per token, S_fp with consecutive repeats removed, and
the set U_fp. Numpy only, so the store and the indexes hold codes without loading torch; the
model that computes them is :class:`isq.fingerprint.Fingerprinter`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Fingerprint:
    """Codes of one text.

    ``token_codes``: one code per non-padding token (length L, before de-duplication);
    ``sequence``: S_fp, consecutive repeats removed; ``codes``: U_fp, the set of distinct codes.
    """

    token_codes: tuple[int, ...]
    sequence: tuple[int, ...]
    codes: frozenset[int]

    @classmethod
    def from_token_codes(cls, token_codes: np.ndarray) -> Fingerprint:
        """From the codes of a text's real tokens (1-D integer array)."""
        keep = np.ones(token_codes.size, dtype=bool)
        keep[1:] = token_codes[1:] != token_codes[:-1]
        codes = token_codes.tolist()
        return cls(tuple(codes), tuple(token_codes[keep].tolist()), frozenset(codes))


def collapse_repeats(token_codes: Sequence[int]) -> tuple[int, ...]:
    """S_fp: drop a code equal to the one before it."""
    return Fingerprint.from_token_codes(np.asarray(token_codes, dtype=np.int64)).sequence
