"""Fingerprinter identity: what makes two codebooks' codes comparable, and what makes two
fingerprinters give the same codes to a text.

Two fingerprinters with the same codebook size and codebook checksum assign the same code to
the same vector, so anything built from one's codes (a topology, a retrieval bank) can be used
with the other; with any other fingerprinter it cannot (:func:`check_identity`). Which vectors a
text gives is the encoder's part (its tokenizer, weights, projection and maximum length), named by
``encoder_sha256``: a store that caches texts' codes is bound to that too
(:func:`same_text_codes`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

IDENTITY_KEYS = ("codebook_size", "codebook_sha256")
ENCODER_KEY = "encoder_sha256"
"""The identity field naming the encoder part (absent from identities recorded before it was)."""


class IdentityMismatch(ValueError):
    """Codes of one codebook were about to be used with another codebook."""


def normalise_identity(identity: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Reduce a fingerprinter identity to the fields that decide what a code means (anything
    else, e.g. the directory it was loaded from, is not compared)."""
    if identity is None:
        return None
    missing = [key for key in IDENTITY_KEYS if key not in identity]
    if missing:
        raise ValueError(f"fingerprinter identity lacks {missing}: {dict(identity)}")
    return {"codebook_size": int(identity["codebook_size"]),
            "codebook_sha256": str(identity["codebook_sha256"])}


def check_identity(saved: Mapping[str, Any] | None, expected: Mapping[str, Any], what: str) -> None:
    """Refuse ``what`` (built with identity ``saved``) for a caller whose fingerprinter is
    ``expected``; a missing saved identity is refused too."""
    saved_key, expected_key = normalise_identity(saved), normalise_identity(expected)
    if saved_key is None or saved_key != expected_key:
        raise IdentityMismatch(
            f"{what} was built with fingerprinter identity {saved_key}, "
            f"but it is being used with fingerprinter identity {expected_key}; "
            "codes of different codebooks are not comparable, rebuild it"
        )


def same_text_codes(recorded: Any, current: Any) -> bool:
    """Whether a store that recorded fingerprinter identity ``recorded`` may be used with one of
    identity ``current``: the same identity, or a recorded one from before identities named the
    encoder (no ``encoder_sha256``) with the same codebook, which is all such a store can check."""
    if recorded == current:
        return True
    if not (isinstance(recorded, Mapping) and isinstance(current, Mapping)) or ENCODER_KEY in recorded:
        return False
    try:
        return normalise_identity(recorded) == normalise_identity(current)
    except (TypeError, ValueError):  # a recorded identity that is not one (a field missing or null)
        return False
