"""One part of the SQLite store (records, turn log, evidence indexes, vector cache, jobs, change
markers, purge, meta): an object over the store's one :class:`~retrieval.memory.connection.
SQLiteConnection`, which the store (:mod:`retrieval.memory.store`) shares between its parts."""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from retrieval.memory.connection import SQLiteConnection

class SQLitePart:
    """One part of the SQLite store: its methods read through :attr:`_db` (this thread's reader,
    or the writer inside a transaction) and write in :meth:`_transaction`, all on the store's one
    :class:`SQLiteConnection`."""

    def __init__(self, connection: SQLiteConnection) -> None:
        self._connection = connection

    @property
    def _db(self) -> sqlite3.Connection:
        return self._connection.db

    @property
    def read_only(self) -> bool:
        return self._connection.read_only

    def _transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        """The store's write transaction, yielding the writer connection."""
        return self._connection.transaction()

    def _writing(self) -> AbstractContextManager[sqlite3.Connection]:
        """The writer connection held without a transaction (VACUUM, checkpoints)."""
        return self._connection.writing()
