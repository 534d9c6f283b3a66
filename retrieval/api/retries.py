"""When the ingestion worker (:mod:`retrieval.api.backlog`) tries again a user whose step failed:
after :data:`RETRY_S`, twice as long after each failure in a row, at most :data:`RETRY_MAX_S`, so
an endpoint that is down is not called at every add."""

from __future__ import annotations

import time
from collections.abc import MutableMapping

RETRY_S = 1.0
"""How long the worker leaves a user whose step failed before it tries again (doubled after each
failure in a row)."""
RETRY_MAX_S = 300.0
"""The longest pause between the worker's tries of a user whose steps keep failing."""


class Retries:
    """The failed users the worker leaves for now, and when it tries each again (its caller
    serialises the calls)."""

    def __init__(self) -> None:
        self._at: dict[str, float] = {}

    def failed(self, user: str, failures: int) -> None:
        """``user``'s step failed, the ``failures``-th time in a row."""
        self.after(user, min(RETRY_MAX_S, RETRY_S * 2 ** (failures - 1)))

    def after(self, user: str, pause_s: float) -> None:
        """Try ``user`` again ``pause_s`` seconds from now."""
        self._at[user] = time.monotonic() + pause_s

    def cancel(self, user: str) -> None:
        """``user`` is tried now, or needs no retry."""
        self._at.pop(user, None)

    def release(self, due: MutableMapping[str, None]) -> float | None:
        """Make due (in ``due``, the worker's queue) the users whose pause is over, no longer
        waiting; returns the seconds until the next pause ends (None if none is running)."""
        now = time.monotonic()
        over = [user for user, at in self._at.items() if at <= now]
        for user in over:
            del self._at[user]
            due[user] = None
        return min(self._at.values()) - now if self._at else None
