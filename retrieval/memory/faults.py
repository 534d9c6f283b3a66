"""SQLite faults after a store is opened, as one :class:`StoreFault` naming the store and what to do.

A store's connection is a :class:`GuardedConnection`: every statement and every fetch that fails
for a reason outside the code (a damaged page, a table dropped by hand, a full disk, an I/O error,
read-only media) raises :class:`StoreFault` instead of a bare ``sqlite3`` error, so every command
that reads or writes a store (ingest, query, consolidate, evaluate, the background worker) ends
in one ``error:`` line. Constraint violations (``IntegrityError``: the append-only triggers, a
duplicate id) are the code's own checks and pass through unchanged.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from retrieval.memory.errors import StoreFault, StoreGone

T = TypeVar("T")

_CHECK = "python -m retrieval.store check --store {directory}"
_ADVICE = {
    "SQLITE_FULL": "the disk is full; nothing committed is lost: free space and rerun (ingestion "
                   "resumes after the last stored segment; a compaction or backup needs about the "
                   "store's size free)",
    "SQLITE_CORRUPT": "the store file is damaged; see `" + _CHECK
    + "`, then rebuild the store from its input "
                      "into a new directory (or restore a copy)",
    "SQLITE_NOTADB": "the file is not a usable SQLite store; "
                     "rebuild the store from its input into a new directory",
    "SQLITE_ERROR": "the store's schema was changed outside this code (a table or column is missing); see `"
                    + _CHECK + "`, then rebuild the store from its input into a new directory",
    "SQLITE_IOERR_SHMSIZE": "the store's WAL index file (-shm) cannot grow: the disk is probably full; "
                            "free space and rerun (nothing committed is lost)",
    "SQLITE_IOERR": "the disk reported an I/O error; check the medium and rerun (nothing committed is lost)",
    "SQLITE_READONLY": "the store cannot be written here (read-only file or medium); "
                       "copy it somewhere writable",
    "SQLITE_CANTOPEN": "a file beside the store cannot be created or opened "
                       "(its directory may be read-only); copy the store somewhere writable",
    "SQLITE_BUSY": "another process kept the store locked too long; rerun when it has finished",
    "SQLITE_LOCKED": "another process kept the store locked too long; rerun when it has finished",
}


DAMAGE = ("SQLITE_CORRUPT", "SQLITE_NOTADB", "SQLITE_FORMAT", "SQLITE_IOERR_CORRUPTFS")
"""SQLite faults that say the store's files (or the file system under them) are damaged; with a
missing table or column (``SQLITE_ERROR`` "no such ..."), the faults a retry will meet again."""
OUTSIDE = ("SQLITE_FULL", "SQLITE_IOERR", "SQLITE_BUSY", "SQLITE_LOCKED")
"""SQLite faults from outside the store's contents: the disk full or failing, another process
holding the file locked."""


def _name(err: StoreFault) -> str:
    return getattr(err.__cause__, "sqlite_errorname", None) or ""


def passing(err: StoreFault) -> bool:
    """Whether ``err`` leaves the store as it was, for a later try (a full disk, another writer's
    lock, a file that cannot be opened now, a PostgreSQL outage: the only faults that store raises
    as :class:`StoreFault`, :mod:`retrieval.memory.postgres.database`), rather than saying it is
    damaged or altered (:data:`DAMAGE`, a missing table)."""
    name = _name(err)
    altered = name == "SQLITE_ERROR" and "no such" in str(err.__cause__)
    return not (name.startswith(DAMAGE) or altered or isinstance(err, StoreGone))


POSTGRES_DISK_FULL = "53100"
"""PostgreSQL's SQLSTATE ``disk_full``: the server could not extend a file, or a shared-memory
segment (``/dev/shm`` full: memory, not disk, and it passes)."""


def disk_full(err: BaseException) -> bool:
    """Whether ``err`` is a store's fault of a full disk (SQLite's ``SQLITE_FULL``, PostgreSQL's
    :data:`POSTGRES_DISK_FULL` but for shared memory): unlike the store's other passing faults, no
    retry mends it until space is freed."""
    if not isinstance(err, StoreFault):
        return False
    if getattr(err.__cause__, "sqlstate", None) == POSTGRES_DISK_FULL:  # also for full shared memory
        return "shared memory" not in str(err.__cause__)
    return _name(err).startswith("SQLITE_FULL")


def outside_fault(err: StoreFault) -> bool:
    """Whether ``err`` comes from outside the store (:data:`OUTSIDE`) and is not damage: a
    healthy store on a full disk, or locked by another process."""
    return _name(err).startswith(OUTSIDE) and passing(err)


def fault(err: sqlite3.Error, path: Path) -> StoreFault | None:
    """The :class:`StoreFault` for a SQLite error on the store file ``path``; None for an error
    of the code itself (a constraint, a misused API, bad SQL), which should stay a traceback."""
    name = getattr(err, "sqlite_errorname", "") or ""
    if isinstance(err, (sqlite3.IntegrityError, sqlite3.ProgrammingError)):
        return None
    if name == "SQLITE_ERROR" and "no such" not in str(err):
        return None
    family = next((key for key in _ADVICE if name == key or name.startswith(key + "_")), None)
    advice = _ADVICE[family] if family else "rerun; if it persists, see `" + _CHECK + "`"
    return StoreFault(f"{path}: {err} ({name or type(err).__name__}); {advice.format(directory=path.parent)}")


def _guarded(path: Path, call: Callable[..., T], *args: Any) -> T:
    try:
        return call(*args)
    except sqlite3.DatabaseError as err:
        translated = fault(err, path)
        if translated is None:
            raise
        raise translated from err


class GuardedCursor(sqlite3.Cursor):
    """A cursor whose statements and fetches raise :class:`StoreFault` for SQLite faults."""

    connection: GuardedConnection

    def execute(self, sql: str, parameters: Any = ()) -> GuardedCursor:
        return _guarded(self.connection.store_path, super().execute, sql, parameters)

    def executemany(self, sql: str, parameters: Any) -> GuardedCursor:
        return _guarded(self.connection.store_path, super().executemany, sql, parameters)

    def fetchone(self) -> Any:
        return _guarded(self.connection.store_path, super().fetchone)

    def fetchmany(self, size: int | None = None) -> list[Any]:
        return _guarded(self.connection.store_path, super().fetchmany, size or self.arraysize)

    def fetchall(self) -> list[Any]:
        return _guarded(self.connection.store_path, super().fetchall)

    # sqlite3.Cursor types __iter__ as returning itself, hence the ignore
    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        # One guarded fetch for all rows: a Python-level __next__ per row would double the cost of
        # reading a large result (the store's queries return bounded results).
        return iter(self.fetchall())

    def __next__(self) -> Any:
        return _guarded(self.connection.store_path, super().__next__)


class GuardedConnection(sqlite3.Connection):
    """The store's connection (``sqlite3.connect(..., factory=GuardedConnection)``, then set
    ``store_path``): its shortcuts go through :class:`GuardedCursor`."""

    store_path: Path

    def cursor(self, factory: Any = GuardedCursor) -> Any:  # noqa: D102
        return super().cursor(factory)

    def execute(self, sql: str, parameters: Any = ()) -> GuardedCursor:
        return self.cursor().execute(sql, parameters)

    def executemany(self, sql: str, parameters: Any) -> GuardedCursor:
        return self.cursor().executemany(sql, parameters)

    def executescript(self, script: str) -> Any:
        return _guarded(self.store_path, super().executescript, script)
