"""API keys bound to users: beside a SQLite store in ``STORE/keys.sqlite`` (never inside the memory
store), in the ``api_keys`` table of a PostgreSQL store (so every server process over one database
accepts the same keys; :mod:`retrieval.memory.postgres.keys`). The same rows, format and checks in
both.

A key is ``isqm_<key id>_<secret>``: the id finds the row, the secret is checked against a salted
SHA-256 digest. The secret is 256 random bits, so a fast hash is enough (nothing can be
guessed offline from the digest); a slow password hash would cost every request milliseconds.
The rows keep only the salt and the digest: a lost key cannot be recovered, only revoked and
replaced. Every lookup reads the table, so a key revoked by the command line (or through another
server over the same database) is refused by a running server at its next request. A key's user
id passes the memory's own id check (:func:`retrieval.api.inputs.check_id`), so every key names a
user the memory accepts, and the served ids' pattern (:data:`retrieval.api.limits.ID_PATTERN`), so
every memory id of that user can be named in a URL. A metrics key (``keys create --metrics``) is
bound to :data:`METRICS` instead of a user: it reads ``/metrics`` and nothing else, and no user's
key reads ``/metrics`` (its counts over all users would show one user what the others store).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import sqlite3
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol, cast

from retrieval.api.errors import InvalidInput
from retrieval.api.inputs import check_id
from retrieval.api.limits import ID_PATTERN
from retrieval.memory.connection import file_states, read_only_connection
from retrieval.memory.errors import StoreError
from retrieval.memory.private import private_directory, private_file
from retrieval.memory.targets import local_directory, redacted

KEYS_FILE = "keys.sqlite"
PREFIX = "isqm"
METRICS = "*metrics"
"""What a metrics key's row holds in place of a user id: never a user's (an id starts with a letter
or digit)."""

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


class UnservableKey(ValueError):
    """A live key whose user id the server cannot serve (a key file made before the ids' pattern
    was checked at ``keys create``, or a metrics key): no user's memory is its to reach."""


def unservable(user_id: str) -> str | None:
    """Why ``user_id`` cannot be served (None when it can): the memory's id check and the served
    ids' pattern (:data:`ID_PATTERN`)."""
    try:
        check_id("user id", user_id)
    except InvalidInput as err:
        return str(err)
    if not re.fullmatch(ID_PATTERN, user_id):
        return (f"user id {user_id!r} must start with a letter or digit and hold only ASCII letters, digits "
                "and ._:@- (it appears in the URLs of the user's memories)")
    return None


def check_servable(user_id: str) -> None:
    """:class:`KeyCommandError` naming ``--user`` when ``user_id`` cannot be served (:func:`unservable`)."""
    problem = unservable(user_id)
    if problem is not None:
        raise KeyCommandError(f"--user: {problem}")


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
    return datetime.now(UTC).isoformat(timespec="seconds")


KeyRow = tuple[str, str, str, str | None]
"""(key id, user id, created, revoked): a key as listed, never its secret."""


class KeyRows(Protocol):
    """Where the key rows are kept (a key file beside a SQLite store, a PostgreSQL store)."""

    def add_key(self, key_id: str, user_id: str, salt: bytes, digest: bytes, created: str) -> None: ...
    def live_key(self, key_id: str) -> tuple[str, bytes, bytes] | None: ...
    def key_rows(self, user_id: str | None = None) -> list[KeyRow]: ...
    def revoke_key(self, key_id: str, when: str) -> KeyRow | None: ...
    def close(self) -> None: ...


def _connected(uri: str) -> sqlite3.Connection:
    """A read-only connection to the key file at ``uri`` that has read its table."""
    db = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None, timeout=30.0)
    try:
        db.execute("SELECT 1 FROM api_keys LIMIT 1")
    except sqlite3.Error:
        db.close()
        raise
    return db


def _unreadable(path: Path, err: sqlite3.Error, *, read_only: bool = False) -> StoreError:
    if getattr(err, "sqlite_errorname", "") in ("SQLITE_NOTADB", "SQLITE_CORRUPT"):
        return StoreError(f"{path}: not a key file this server can read ({err}); restore it from a "
                          "copy, or move it aside and create the keys again")
    return _unopenable(path, err, read_only=read_only)


def _unopenable(path: Path, err: OSError | sqlite3.Error, *, read_only: bool = False) -> StoreError:
    reason = (err.strerror if isinstance(err, OSError) else None) or str(err)
    need = "readable" if read_only else "a writable directory"
    return StoreError(f"{path}: cannot open the key file ({reason}); the store directory must be {need}")


class KeyFile:
    """The key rows in ``keys.sqlite`` of a store directory; safe to share between threads.

    ``read_only`` (a read-only server, ``keys list``): the file is read as it is, nothing written
    or made, so a store on read-only media serves; where the file's WAL index cannot be made
    there, the file (closed cleanly: nothing left in its log) is read as immutable and opened
    again whenever it changes, so a revocation made elsewhere counts at the next request."""

    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._snapshot: tuple[object, ...] | None = None
        """The file's state when it was opened as immutable (else None)."""
        self._db = self._open_read_only() if read_only else self._open()

    def _open(self) -> sqlite3.Connection:
        try:
            private_directory(self.path.parent)
            private_file(self.path)
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30.0)
        except (OSError, sqlite3.Error) as err:
            raise _unopenable(self.path, err) from None
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(_SCHEMA)
        except sqlite3.Error as err:
            db.close()
            raise _unreadable(self.path, err) from None
        return db

    def _open_read_only(self) -> sqlite3.Connection:
        state = file_states(self.path)
        try:
            db, immutable = read_only_connection(self.path, _connected, sqlite3.Error)
        except sqlite3.Error as err:
            raise _unreadable(self.path, err, read_only=True) from None
        self._snapshot = state if immutable else None
        return db

    def _reader(self) -> sqlite3.Connection:
        """The connection, opened again first when it reads an immutable file that has changed."""
        if self._snapshot is not None and file_states(self.path) != self._snapshot:
            stale, self._db = self._db, self._open_read_only()
            stale.close()
        return self._db

    def close(self) -> None:
        self._db.close()

    def add_key(self, key_id: str, user_id: str, salt: bytes, digest: bytes, created: str) -> None:
        with self._lock:
            self._db.execute("INSERT INTO api_keys VALUES (?, ?, ?, ?, ?, NULL)",
                             (key_id, user_id, salt, digest, created))

    def live_key(self, key_id: str) -> tuple[str, bytes, bytes] | None:
        with self._lock:
            row = self._reader().execute("SELECT user_id, salt, digest FROM api_keys WHERE key_id = ? "
                                         "AND revoked IS NULL", (key_id,)).fetchone()
        return None if row is None else (row[0], row[1], row[2])

    def key_rows(self, user_id: str | None = None) -> list[KeyRow]:
        query = "SELECT key_id, user_id, created, revoked FROM api_keys"
        args: tuple[str, ...] = ()
        if user_id is not None:
            query, args = query + " WHERE user_id = ?", (user_id,)
        with self._lock:
            return self._reader().execute(query + " ORDER BY rowid", args).fetchall()  # creation order

    def revoke_key(self, key_id: str, when: str) -> KeyRow | None:
        with self._lock:
            self._db.execute("UPDATE api_keys SET revoked = ? WHERE key_id = ? AND revoked IS NULL",
                             (when, key_id))
            row: KeyRow | None = self._db.execute("SELECT key_id, user_id, created, revoked FROM api_keys "
                                                  "WHERE key_id = ?", (key_id,)).fetchone()
        return row


def key_rows_at(store: str | Path, *, create: bool = True, read_only: bool = False) -> KeyRows:
    """The key rows of ``store``: its key file (made when missing unless ``create`` is False, then a
    store without one is a :class:`KeyCommandError`), or the PostgreSQL store at a URL (opened
    ``read_only`` for a server that only reads: a replica's connection may take no write, not
    even the schema's)."""
    directory = local_directory(store)
    if directory is None:
        from retrieval.memory.backends import open_store

        return cast(KeyRows, open_store(store, read_only=read_only))  # a PostgresStore keeps key rows
    path = directory / KEYS_FILE
    if directory.exists() and not directory.is_dir():
        raise KeyCommandError(f"{directory}: not a store directory (a file is there)")
    if path.exists() and not path.is_file():
        raise KeyCommandError(f"{path}: not a key file (a directory or other non-file is there)")
    if not create and not path.is_file():
        raise KeyCommandError(f"{path}: no key store there (keys create makes one)")
    return KeyFile(path, read_only=read_only)


class KeyStore:
    """The API keys of one store (see the module docstring); safe to share between threads."""

    def __init__(self, store: str | Path, *, create: bool = True, read_only: bool = False) -> None:
        """The keys of ``store`` (a directory or a PostgreSQL URL; see :func:`key_rows_at`)."""
        self.where = redacted(store)
        self.rows = key_rows_at(store, create=create, read_only=read_only)
        self.local = isinstance(self.rows, KeyFile)
        """Whether a key is read from a local file (microseconds), not from a database server."""

    def close(self) -> None:
        self.rows.close()

    def create(self, user_id: str) -> str:
        """A new key for ``user_id``; the only time its secret is seen."""
        check_servable(user_id)
        return self._add(user_id)

    def create_metrics(self) -> str:
        """A new key that reads ``/metrics`` only; the only time its secret is seen."""
        return self._add(METRICS)

    def _add(self, holder: str) -> str:
        key_id, secret, salt = secrets.token_hex(8), secrets.token_urlsafe(32), secrets.token_bytes(16)
        self.rows.add_key(key_id, holder, salt, _digest(salt, secret), _now())
        return f"{PREFIX}_{key_id}_{secret}"

    def holder(self, key: str) -> str | None:
        """What a live key is bound to (a user id, or :data:`METRICS`); None for a malformed,
        unknown or revoked key."""
        prefix, _, rest = key.partition("_")
        key_id, _, secret = rest.partition("_")
        if prefix != PREFIX or not key_id or not secret:
            return None
        row = self.rows.live_key(key_id)
        if row is None or not hmac.compare_digest(_digest(row[1], secret), row[2]):
            return None
        return row[0]

    def user(self, key: str) -> str | None:
        """The user a live key belongs to; None for a malformed, unknown or revoked key;
        :class:`UnservableKey` for a metrics key and for a live key of a user id the server cannot
        serve."""
        holder = self.holder(key)
        if holder is None:
            return None
        key_id = key.split("_")[1]
        if holder == METRICS:
            raise UnservableKey(f"key {key_id} is a metrics key: it reads /metrics only")
        problem = unservable(holder)
        if problem is not None:
            raise UnservableKey(f"key {key_id}: {problem}; revoke it (keys revoke {key_id}) and create "
                                "a key for another user id")
        return holder

    def list(self, user_id: str | None = None) -> list[KeyInfo]:
        """Every key (or one user's), oldest first."""
        return [KeyInfo(*row) for row in self.rows.key_rows(user_id)]

    def revoke(self, key_or_id: str) -> KeyInfo:
        """Revoke a key given by its id or in full; revoking twice keeps the first time."""
        key_id = key_or_id.split("_")[1] if key_or_id.startswith(f"{PREFIX}_") else key_or_id
        row = self.rows.revoke_key(key_id, _now())
        if row is None:
            raise KeyCommandError(f"{self.where}: no key with id {key_id!r} (keys list shows them)")
        return KeyInfo(*row)
