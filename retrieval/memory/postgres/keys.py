"""API keys in the PostgreSQL store (table ``api_keys``, schema version 2), so that every server
process over one database accepts the same keys and refuses a revoked one at its next request.

This part keeps the rows only: a key's id, its user, the salt and digest of its secret, when it was
made and revoked. Making a key, its format and checking a secret stay with the service's key store
(:mod:`retrieval.service.keys`), which keeps the same rows in ``keys.sqlite`` beside a SQLite store.
A purge leaves a user's keys alone, as on SQLite (they are revoked, not forgotten).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from retrieval.memory.postgres.database import Database

KeyRow = tuple[str, str, str, str | None]
"""(key id, user id, created, revoked): a key as listed, never its secret."""

_LISTED = "SELECT key_id, user_id, created, revoked FROM api_keys"


def _listed(row: Any) -> KeyRow:
    return row["key_id"], row["user_id"], row["created"], row["revoked"]


class Keys:
    """The ``api_keys`` table."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def add_key(self, key_id: str, user_id: str, salt: bytes, digest: bytes, created: str) -> None:
        """Store a new key's row (a duplicate id is an ``IntegrityError``)."""
        with self.db.transaction() as conn:
            conn.execute("INSERT INTO api_keys (key_id, user_id, salt, digest, created) "
                         "VALUES (%s, %s, %s, %s, %s)", (key_id, user_id, salt, digest, created))

    def live_key(self, key_id: str) -> tuple[str, bytes, bytes] | None:
        """(user id, salt, digest) of a key not revoked, or None."""
        row = self.db.row("SELECT user_id, salt, digest FROM api_keys WHERE key_id = %s AND revoked IS NULL",
                          (key_id,))
        return None if row is None else (row["user_id"], bytes(row["salt"]), bytes(row["digest"]))

    def key_rows(self, user_id: str | None = None) -> list[KeyRow]:
        """Every key (or one user's), oldest first."""
        if user_id is None:
            return [_listed(row) for row in self.db.rows(_LISTED + " ORDER BY position")]
        return [_listed(row) for row in self.db.rows(_LISTED + " WHERE user_id = %s ORDER BY position",
                                                     (user_id,))]

    def revoke_key(self, key_id: str, when: str) -> KeyRow | None:
        """Revoke a key at ``when`` (revoking twice keeps the first time); its row, None if unknown."""
        with self.db.transaction() as conn:
            conn.execute("UPDATE api_keys SET revoked = %s WHERE key_id = %s AND revoked IS NULL",
                         (when, key_id))
        row = self.db.row(_LISTED + " WHERE key_id = %s", (key_id,))
        return None if row is None else _listed(row)
