"""The store's meta entries and model binding (a part of :class:`retrieval.memory.store.AMUStore`):
JSON values by key (:mod:`retrieval.memory.meta_keys` names them), and :meth:`StoreMeta.bind`,
which records the models that built the store, so a resumed run with other models is refused
instead of mixing them.
"""

from __future__ import annotations

import json
from typing import Any

from retrieval.memory.errors import StoreMismatch
from retrieval.memory.meta_keys import bound_alike, bound_otherwise
from retrieval.memory.sqlite_part import SQLitePart


class StoreMeta(SQLitePart):
    """The ``meta`` table."""

    def meta(self, key: str) -> Any:
        """The value bound to ``key`` (JSON), or None."""
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def put_meta(self, key: str, value: Any) -> None:
        """Set a mutable record (e.g. the construction cost so far) under ``key``; None removes it."""
        with self._transaction() as db:
            if value is None:
                db.execute("DELETE FROM meta WHERE key = ?", (key,))
            else:
                db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, json.dumps(value)))

    def bind(self, key: str, value: Any, hint: str = "use a new store") -> None:
        """Record ``value`` under ``key`` on first use; afterwards refuse any value not bound alike
        (:func:`retrieval.memory.meta_keys.bound_alike`; :class:`StoreMismatch` naming both), so
        one store never mixes two models."""
        saved = self.meta(key)
        if saved is None:
            with self._transaction() as db:  # refused on a read-only store
                db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)", (key, json.dumps(value)))
            saved = self.meta(key)
        if not bound_alike(key, saved, value):
            where = self._connection.directory
            raise StoreMismatch(f"{where} {bound_otherwise(key, saved, value)}; {hint}")
