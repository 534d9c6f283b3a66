"""Derived arrays cached in the PostgreSQL store under (user, model key, SHA-256 of the text):
embeddings in ``vectors``, fingerprint codes in ``codes``, both ``bytea`` exactly as SQLite's blobs
(the SQLite store's :class:`retrieval.memory.cache.ArrayCache`; :class:`retrieval.memory.cache.
CachedEmbedder` and ``CachedFingerprinter`` work over either)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from retrieval.memory.postgres.database import Database

_COLUMNS = {"vectors": "vector", "codes": "codes"}


class ArrayCache:
    """The cache tables."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def cached(self, table: str, model: str, user: str, items: Sequence[str]) -> list[bytes | None]:
        """The user's stored blob of each of ``items`` under ``model`` in ``table`` ("vectors" or
        "codes"), in order (None where there is none): one statement for the whole list."""
        column = _COLUMNS[table]
        rows = self.db.rows(f"SELECT c.{column} AS blob FROM unnest(%s::text[]) WITH ORDINALITY AS "
                            f"k(item, n) LEFT JOIN {table} AS c ON c.user_id = %s AND c.model = %s "
                            "AND c.item = k.item ORDER BY k.n",
                            (list(items), user, model))
        return [row["blob"] for row in rows]

    def cache(self, table: str, model: str, user: str, blobs: Mapping[str, bytes],
              purges: int | None = None) -> None:
        """Store the user's blobs (nothing on a read-only store: the caller computed them anyway);
        with ``purges``, only while the user's purge count is still that (under the user's lock)."""
        if self.db.read_only or not blobs:
            return
        column = _COLUMNS[table]
        with self.db.transaction([user]) as conn:
            if purges is not None and self.purge_count(user) != purges:
                return
            conn.cursor().executemany(f"INSERT INTO {table} (user_id, model, item, {column}) "  # type: ignore[arg-type]
                                      "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                                      [(user, model, item, blob) for item, blob in blobs.items()])

    def purge_count(self, user: str) -> int:
        """How many purges the user has had (the ``purges`` row, which only grows)."""
        return int(self.db.value("SELECT coalesce(max(count), 0) FROM purges WHERE user_id = %s", (user,)))

    def copy_cache(self, source: str, target: str) -> None:
        """Give ``target`` a copy of every array ``source`` has cached."""
        if self.db.read_only:
            return
        with self.db.transaction() as conn:
            for table, column in _COLUMNS.items():
                conn.execute(f"INSERT INTO {table} (user_id, model, item, {column}) "  # type: ignore[arg-type]
                             f"SELECT %s, model, item, {column} FROM {table} WHERE user_id = %s "
                             "ON CONFLICT DO NOTHING", (target, source))
