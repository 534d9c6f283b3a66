"""The store's ``meta`` entries that belong to a user or a record, named once: what consolidation
and the evaluation write and what a purge removes."""

from __future__ import annotations

from typing import Any

from isq.identity import same_text_codes

PLAN_KEY = "consolidation_plan:{}"
"""A user's interrupted consolidation pass (its plan and settings), cleared when the pass ends."""
CONSTRUCTION_KEY = "construction:{}"
"""What building a user's memory cost in the evaluation (seconds, LLM calls, tokens)."""
USER_KEYS = (PLAN_KEY, CONSTRUCTION_KEY)
"""Every per-user entry: forgetting a user removes each of them."""
COMPACTION_OWED = "compaction_owed"
"""Set by a purge's transaction, cleared when the store's files hold nothing of what it removed
(SQLite's :meth:`retrieval.memory.purge.Purge.compact`): a process killed in between leaves the
compaction owed, and the next writer to open the store does it."""
MERGE_KEY = "consolidation:{}"
"""The operation that made a merged record (keyed by its id); purged with the record."""


PIPELINE_KEY = "pipeline_sha256"
"""The field of a sentence embedder's identity naming what turns its weights into vectors (its
modules and their settings, the transformer's configuration, the tokenizer), absent from
identities recorded before it was."""


def bound_alike(key: str, saved: Any, value: Any) -> bool:
    """Whether a store bound to ``saved`` under ``key`` (``embedder``, ``extractor``,
    ``fingerprinter``) takes ``value``: the same value, or an identity recorded before a field
    was part of it that agrees on the others: for a fingerprinter one before identities named the
    encoder, with the same codebook (:func:`isq.identity.same_text_codes`); for an embedder one
    before they named its pipeline (:data:`PIPELINE_KEY`), with the same name and weights."""
    if saved == value:
        return True
    if key == "fingerprinter":
        return same_text_codes(saved, value)
    return (key == "embedder" and isinstance(saved, dict) and isinstance(value, dict)
            and PIPELINE_KEY not in saved
            and saved == {name: field for name, field in value.items() if name != PIPELINE_KEY})


def bound_otherwise(key: str, saved: Any, value: Any) -> str:
    """Why a store bound to ``saved`` under ``key`` refuses ``value``: both, and where both are
    identities (mappings), the fields they differ in, so nobody compares checksums by eye."""
    differing = ""
    if isinstance(saved, dict) and isinstance(value, dict):
        fields = sorted(name for name in saved.keys() | value.keys() if saved.get(name) != value.get(name))
        differing = f" (they differ in {', '.join(fields)})"
    return f"was built with {key} {saved!r}, not {value!r}{differing}"
