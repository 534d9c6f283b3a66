"""The two store backends behind one face, for the contract tests that run against both: open the
store (again), run raw SQL in a write transaction (to try the invariants), and the error a
constraint or trigger raises."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from retrieval.memory.postgres.store import PostgresStore
from retrieval.memory.store import AMUStore

SQLITE_BEFORE_VERSION_10 = "DROP INDEX amus_by_position; "
"""Makes a SQLite store of the current schema one as code before version 10 left it (no index of
each user's records in store order); a test then sets the older version it stands for."""
SQLITE_BEFORE_VERSION_9 = SQLITE_BEFORE_VERSION_10 + ("DROP TRIGGER segments_flush_moves_in_purge; "
                                                      "ALTER TABLE segments DROP COLUMN flushed_after;")
"""Makes a SQLite store of the current schema one as code before version 9 left it (no segment
keeps where its flush came, and what version 10 adds)."""


@dataclass
class Backend:
    name: str
    target: str
    opens: Callable[..., Any]
    integrity_error: type[Exception]

    def open(self, *, read_only: bool = False, role: str = "ingest") -> Any:
        """The store at this backend's target (created on first open for writing)."""
        return self.opens(self.target, read_only=read_only, role=role)

    def raw(self, store: Any, sql: str) -> None:
        """Run ``sql`` (no parameters) in one of the store's write transactions."""
        transaction = store._transaction() if isinstance(store, AMUStore) else store.db.transaction()
        with transaction as db:
            db.execute(sql)


def sqlite_backend(directory: Path) -> Backend:
    return Backend("sqlite", str(directory), AMUStore, sqlite3.IntegrityError)


def postgres_backend(url: str) -> Backend:
    return Backend("postgres", url, PostgresStore, psycopg.IntegrityError)
