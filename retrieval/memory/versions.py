"""What a reader asks the store to know whether its copy of a user is still the store's (a part
of :class:`retrieval.memory.store.AMUStore`): has anything committed since, has this user changed,
and has anything but its own adds changed it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from retrieval.memory.sqlite_part import SQLitePart


def user_rows(db: sqlite3.Connection, user_id: str) -> tuple[int, ...]:
    """:meth:`StoreVersions.user_version` read on ``db`` (the writer, inside a transaction)."""
    turns = db.execute("SELECT count(*), coalesce(max(position), 0) FROM turns "
                       "WHERE conversation_id = ?", (user_id,)).fetchone()
    records = db.execute("SELECT count(*), coalesce(max(position), 0), count(fingerprint) "
                         "FROM amus WHERE conversation_id = ? AND archived = 0",
                         (user_id,)).fetchone()
    segments = db.execute("SELECT count(*) FROM segments WHERE conversation_id = ?", (user_id,)).fetchone()
    purges = db.execute("SELECT coalesce(max(count), 0) FROM purges WHERE conversation_id = ?",
                        (user_id,)).fetchone()
    return (*map(int, turns), *map(int, records), int(segments[0]), int(purges[0]))


class StoreVersions(SQLitePart):
    """The store's change markers (a part of :class:`retrieval.memory.store.AMUStore`)."""

    def data_version(self) -> int:
        """SQLite's ``PRAGMA data_version`` of the store's watching connection, which never writes:
        it moves whenever any connection commits (this store's writer, another process, the job
        worker's store), so equal values mean nothing was committed in between (an immutable
        store's: :meth:`retrieval.memory.connection.SQLiteConnection.version`)."""
        return self._connection.version()

    def user_version(self, user_id: str) -> tuple[int, ...]:
        """The user's rows in short: count and highest position of its turns, of its active
        records, how many of those have a fingerprint, its segments' count and its purges' count.
        Positions only grow (AUTOINCREMENT), turns never change, archiving is one way and always
        comes with the record that replaces it, and the purge count only grows, so every append,
        archive, purge, new fingerprint or committed segment (one without records too) of the user
        changes this tuple, and no sequence of them brings it back (a turn added and then purged
        leaves the counts and positions as they were, but not the purge count)."""
        return user_rows(self._db, user_id)

    def user_versions(self, users: Sequence[str]) -> dict[str, tuple[int, ...]]:
        """:meth:`user_version` of each of ``users``."""
        return {user: user_rows(self._db, user) for user in users}

    def ingestion_marks(self, user_id: str) -> tuple[int, ...]:
        """The user's next segment number, records (archived too) and purges: what closing a segment
        or purging changes, and an add of turns does not."""
        row = self._db.execute(
            "SELECT (SELECT coalesce(max(seq) + 1, 0) FROM segments WHERE conversation_id = ?), "
            "(SELECT count(*) FROM amus WHERE conversation_id = ?), "
            "(SELECT coalesce(max(count), 0) FROM purges WHERE conversation_id = ?)",
            (user_id, user_id, user_id)).fetchone()
        return tuple(int(value) for value in row)
