"""What built the PostgreSQL store (the ``meta`` table): values bound on first use and refused
afterwards when they differ, and mutable entries (the SQLite store's ``meta``, ``put_meta``, ``bind``)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from retrieval.memory.errors import StoreMismatch
from retrieval.memory.meta_keys import bound_alike, bound_otherwise

if TYPE_CHECKING:
    from retrieval.memory.postgres.database import Database


class Meta:
    """The ``meta`` entries."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def meta(self, key: str) -> Any:
        """The value bound to ``key`` (JSON), or None."""
        row = self.db.row("SELECT value FROM meta WHERE key = %s", (key,))
        return None if row is None else json.loads(row["value"])

    def put_meta(self, key: str, value: Any) -> None:
        """Set a mutable record under ``key``; None removes it."""
        with self.db.transaction() as conn:
            if value is None:
                conn.execute("DELETE FROM meta WHERE key = %s", (key,))
            else:
                conn.execute("INSERT INTO meta (key, value) VALUES (%s, %s) ON CONFLICT (key) DO UPDATE "
                             "SET value = excluded.value", (key, json.dumps(value)))

    def bind(self, key: str, value: Any, hint: str = "use a new store") -> None:
        """Record ``value`` under ``key`` on first use (the first writer wins when several race);
        afterwards refuse any other value with :class:`StoreMismatch` naming both."""
        saved = self.meta(key)
        if saved is None:
            with self.db.transaction() as conn:  # refused on a read-only store
                conn.execute("INSERT INTO meta (key, value) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                             (key, json.dumps(value)))
            saved = self.meta(key)
        if not bound_alike(key, saved, value):
            raise StoreMismatch(f"{self.db.where} {bound_otherwise(key, saved, value)}; {hint}")
