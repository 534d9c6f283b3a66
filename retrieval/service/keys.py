"""API keys bound to users, kept in ``STORE/keys.sqlite`` beside (never inside) the memory store.

A key is ``isqm_<key id>_<secret>``: the id finds the row, the secret is checked against a salted
SHA-256 digest. The secret is 256 random bits, so a fast hash is enough (nothing can be
guessed offline from the digest); a slow password hash would cost every request milliseconds.
The store keeps only the salt and the digest: a lost key cannot be recovered, only revoked and
replaced. Every lookup reads the table, so a key revoked by the command line is refused by a
running server at its next request. A key's user id passes the memory's own id check
(:func:`retrieval.api.inputs.check_id`), so every key names a user the memory accepts.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import sqlite3
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from retrieval.api.errors import InvalidInput
from retrieval.api.inputs import check_id
from retrieval.memory.targets import local_directory, redacted

KEYS_FILE = "keys.sqlite"
PREFIX = "isqm"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    key_id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    salt BLOB NOT NULL,
    digest BLOB NOT NULL,
    created TEXT NOT NULL,
    revoked TEXT
)"""


class KeyCommandError(ValueError):
    """A key command cannot be done (unknown key id, bad user id); the message says which."""


@dataclass(frozen=True)
class KeyInfo:
    """One key as listed: never its secret."""

    key_id: str
    user_id: str
    created: str
    revoked: str | None


def _digest(salt: bytes, secret: str) -> bytes:
    return hashlib.sha256(salt + secret.encode()).digest()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class KeyStore:
    """The key table of one store directory; safe to share between threads."""

    def __init__(self, store: str | Path, *, create: bool = True) -> None:
        """The key table of ``store``, made when missing unless ``create`` is False (then a store
        without one is a :class:`KeyCommandError`). A store on a database server keeps no key file."""
        directory = local_directory(store)
        if directory is None:
            raise KeyCommandError(f"{redacted(store)}: API keys are kept in a store directory "
                                  f"({KEYS_FILE}); a PostgreSQL store's keys are not supported yet")
        self.path = directory / KEYS_FILE
        if not create and not self.path.is_file():
            raise KeyCommandError(f"{self.path}: no key store there (keys create makes one)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(_SCHEMA)
        self._lock = threading.Lock()

    def close(self) -> None:
        self._db.close()

    def create(self, user_id: str) -> str:
        """A new key for ``user_id``; the only time its secret is seen."""
        try:
            check_id("user id (--user)", user_id)
        except InvalidInput as err:
            raise KeyCommandError(str(err)) from None
        key_id, secret, salt = secrets.token_hex(8), secrets.token_urlsafe(32), secrets.token_bytes(16)
        with self._lock:
            self._db.execute("INSERT INTO api_keys VALUES (?, ?, ?, ?, ?, NULL)",
                             (key_id, user_id, salt, _digest(salt, secret), _now()))
        return f"{PREFIX}_{key_id}_{secret}"

    def user(self, key: str) -> str | None:
        """The user a live key belongs to; None for a malformed, unknown or revoked key."""
        prefix, _, rest = key.partition("_")
        key_id, _, secret = rest.partition("_")
        if prefix != PREFIX or not key_id or not secret:
            return None
        with self._lock:
            row = self._db.execute("SELECT user_id, salt, digest FROM api_keys WHERE key_id = ? "
                                   "AND revoked IS NULL",
                                   (key_id,)).fetchone()
        if row is None or not hmac.compare_digest(_digest(row[1], secret), row[2]):
            return None
        return row[0]

    def list(self, user_id: str | None = None) -> list[KeyInfo]:
        """Every key (or one user's), oldest first."""
        query = "SELECT key_id, user_id, created, revoked FROM api_keys"
        args: tuple[str, ...] = ()
        if user_id is not None:
            query, args = query + " WHERE user_id = ?", (user_id,)
        with self._lock:
            rows = self._db.execute(query + " ORDER BY rowid", args).fetchall()  # creation order
        return [KeyInfo(*row) for row in rows]

    def revoke(self, key_or_id: str) -> KeyInfo:
        """Revoke a key given by its id or in full; revoking twice keeps the first time."""
        key_id = key_or_id.split("_")[1] if key_or_id.startswith(f"{PREFIX}_") else key_or_id
        with self._lock:
            self._db.execute("UPDATE api_keys SET revoked = ? WHERE key_id = ? AND revoked IS NULL",
                             (_now(), key_id))
            row = self._db.execute("SELECT key_id, user_id, created, revoked FROM api_keys WHERE key_id = ?",
                                   (key_id,)).fetchone()
        if row is None:
            raise KeyCommandError(f"{self.path}: no key with id {key_id!r} (keys list shows them)")
        return KeyInfo(*row)
