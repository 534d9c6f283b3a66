"""What a reader asks the store to know whether its copy of a user is still the store's (a mixin
of :class:`retrieval.memory.store.AMUStore`): has anything committed since, and has this user
changed.
"""

from __future__ import annotations

import sqlite3


class StoreVersions:
    """The store's change markers (a mixin of :class:`retrieval.memory.store.AMUStore`)."""

    _db: sqlite3.Connection

    def data_version(self) -> int:
        """SQLite's ``PRAGMA data_version`` of this connection: it moves when another connection
        (another process, or another connection of this one) commits, never for this
        connection's own commits."""
        (version,) = self._db.execute("PRAGMA data_version").fetchone()
        return int(version)

    def user_version(self, user_id: str) -> tuple[int, ...]:
        """The user's rows in short: count and highest position of its turns, of its active
        records, and how many of those have a fingerprint. Positions only grow (AUTOINCREMENT),
        turns never change and archiving is one way, so every append, archive, purge or new
        fingerprint of the user changes this tuple."""
        turns = self._db.execute("SELECT count(*), coalesce(max(position), 0) FROM turns "
                                 "WHERE conversation_id = ?", (user_id,)).fetchone()
        records = self._db.execute("SELECT count(*), coalesce(max(position), 0), count(fingerprint) "
                                   "FROM amus WHERE conversation_id = ? AND archived = 0",
                                   (user_id,)).fetchone()
        return (*map(int, turns), *map(int, records))
