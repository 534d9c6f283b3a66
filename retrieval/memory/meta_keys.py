"""The store's per-user ``meta`` entries, named once: what the purge of a user removes and what
consolidation and the evaluation write."""

from __future__ import annotations

PLAN_KEY = "consolidation_plan:{}"
"""A user's interrupted consolidation pass (its plan and settings), cleared when the pass ends."""
CONSTRUCTION_KEY = "construction:{}"
"""What building a user's memory cost in the evaluation (seconds, LLM calls, tokens)."""
USER_KEYS = (PLAN_KEY, CONSTRUCTION_KEY)
"""Every per-user entry: forgetting a user removes each of them."""
