"""What a reader asks the PostgreSQL store to know whether its copy of a user is still the store's:
has anything committed since (:meth:`Versions.data_version`), has this user changed
(:meth:`Versions.user_version`), has anything but its own adds changed it
(:meth:`Versions.ingestion_marks`).

``data_version`` is the sum of the commit counters (``commits``): every write transaction
increments one of them as its last statement, so the sum moves exactly when something committed,
in any process (the increment commits with the transaction or not at all; counters only grow).
(PostgreSQL has no ``PRAGMA data_version``; the statistics views lag and are per server.) There
are :data:`COMMIT_SLOTS` counters, one chosen by the server process of the connection, so two
writers queue on one only when their connections share a slot, and then only between that last
statement and their commit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from retrieval.memory.postgres.database import Database

COMMIT_SLOTS = 16
"""Commit counters: writers on connections whose server process ids differ modulo this never queue."""

BUMP_COMMITS = f"UPDATE commits SET count = count + 1 WHERE slot = pg_backend_pid() % {COMMIT_SLOTS}"


_INGESTION_MARKS = ("SELECT (SELECT coalesce(max(seq) + 1, 0) FROM segments WHERE user_id = %s) AS seq, "
                    "(SELECT count(*) FROM amus WHERE user_id = %s) AS records, "
                    "(SELECT coalesce(max(count), 0) FROM purges WHERE user_id = %s) AS purges")

_VERSION_COLUMNS = "t.n, t.last, a.n AS records, a.last AS record_last, a.printed, s.n AS segments, p.purges"
_VERSION_PARTS = ("(SELECT count(*) AS n, coalesce(max(position), 0) AS last FROM turns "
                  "WHERE user_id = {user}) t",
                  "(SELECT count(*) AS n, coalesce(max(position), 0) AS last, count(fingerprint) AS printed "
                  "FROM amus WHERE user_id = {user} AND NOT archived) a",
                  "(SELECT count(*) AS n FROM segments WHERE user_id = {user}) s",
                  "(SELECT coalesce(max(count), 0) AS purges FROM purges WHERE user_id = {user}) p")
_USER_VERSION = (f"SELECT {_VERSION_COLUMNS} FROM "
                 + ", ".join(part.format(user="%s") for part in _VERSION_PARTS))
_USER_VERSIONS = (f"SELECT u.user_id, {_VERSION_COLUMNS} FROM unnest(%s::text[]) AS u (user_id) "
                  + " ".join("CROSS JOIN LATERAL " + part.format(user="u.user_id")
                             for part in _VERSION_PARTS))

VERSIONS_READ_TOGETHER = 1000
"""How many users' versions one statement of :func:`user_versions_of` reads."""


def user_version_of(conn: Any, user_id: str) -> tuple[int, ...]:
    """Count and highest position of the user's turns, of its active records, how many of those
    have a fingerprint, its segments' count and its purges' count (as the SQLite store's:
    :meth:`retrieval.memory.versions.StoreVersions.user_version` says why every change of the user
    changes this tuple and none brings it back)."""
    row = conn.execute(_USER_VERSION, (user_id,) * len(_VERSION_PARTS)).fetchone()
    return tuple(int(value) for value in row.values())


def user_versions_of(conn: Any, users: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """:func:`user_version_of` of each of ``users``, the same subqueries joined laterally to a list
    of users: one statement for :data:`VERSIONS_READ_TOGETHER` users (a user at a time, the round
    trips were most of a scan of many users: 2.5-3.8 s against 0.2-0.4 s for the versions of
    10,000; for one user the plain statement is the faster)."""
    versions: dict[str, tuple[int, ...]] = {}
    for start in range(0, len(users), VERSIONS_READ_TOGETHER):
        for row in conn.execute(_USER_VERSIONS, (list(users[start:start + VERSIONS_READ_TOGETHER]),)):
            user, *counts = row.values()
            versions[user] = tuple(int(value) for value in counts)
    return versions


class Versions:
    """The store's change markers."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def data_version(self) -> int:
        """The number of write transactions committed to the database so far."""
        return int(self.db.value("SELECT sum(count) FROM commits"))

    def user_version(self, user_id: str) -> tuple[int, ...]:
        with self.db.connection() as conn:
            return user_version_of(conn, user_id)

    def user_versions(self, users: Sequence[str]) -> dict[str, tuple[int, ...]]:
        with self.db.connection() as conn:
            return user_versions_of(conn, users)

    def ingestion_marks(self, user_id: str) -> tuple[int, ...]:
        """The user's next segment number, records (archived too) and purges (as the SQLite store's)."""
        row = self.db.row(_INGESTION_MARKS, (user_id, user_id, user_id))
        return tuple(int(value) for value in row.values())
