"""The SQLite store's connections, shared by its parts (:mod:`retrieval.memory.store`).

One :class:`SQLiteConnection` per open store holds the writer connection, a reader connection
per thread and the writer's transactions; each part of the store (records, turn log, evidence
indexes, vector cache, jobs, change markers, purge, meta) is a :class:`SQLitePart` over it.

Writes go through the writer connection, one transaction at a time (threads of the process queue
on a lock for it; reads inside a transaction use it too). Every other read runs on a connection
of the reading thread, opened on its first read: in WAL mode a reader sees the last commit and
never waits for the writer's transaction, so the store can be read from many threads at once. A
thread's reader is closed when the thread ends (:class:`_Reader`): a server's worker threads come
and go, and each connection holds a file descriptor and a page cache.
Open for writing, the store holds a writer lock per role (:mod:`retrieval.memory.lock`); open
read-only it takes no lock and refuses every write. Bad files (not a database, an unknown schema
version, no permission) raise one :class:`StoreError` naming the file, and so do SQLite faults
once it is open (:mod:`retrieval.memory.faults`). The schema version is SQLite's ``PRAGMA
user_version`` (:mod:`retrieval.memory.store_contract` describes the one rule both backends keep).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from retrieval.memory.errors import StoreBusy, StoreError, StoreFault, StoreGone
from retrieval.memory.faults import GuardedConnection, outside_fault
from retrieval.memory.lock import WriterLock, other_writer
from retrieval.memory.private import private_directory, private_file
from retrieval.memory.schema import SCHEMA_VERSION, create_or_migrate
from retrieval.memory.store_contract import needs_migration

BUSY_TIMEOUT_S = 30.0
"""How long a write waits for another role's transaction (e.g. consolidation beside ingestion)."""

READER_CACHE_KIB = 256
"""The page cache of each thread's reader (SQLite's default: 2,000 KiB, which the writer keeps). A
reader reads a user's rows once to build its search state, or a page of a listing, and finds
little of it again in its cache, but filled the whole default one: a server holding a reader in
each of its 40 worker threads kept up to 80 MB of pages. The first search of a 100,000-record
user (its state built from the store) took 4.18 and 4.39 s with this cache, 4.47 and 4.54 s with
the default (a fresh process each run)."""

DB_NAME = "amus.sqlite3"
"""The store's database file in its directory."""
CODE_MARK = f"schema {SCHEMA_VERSION}"
"""What this code writes into the writer locks it takes: which schema it reads and writes, so a
migration is refused only while a writer of an earlier version holds the store open."""


Opened = TypeVar("Opened")
"""What a ``connect`` given to :func:`read_only_connection` returns."""


def file_uri(path: Path, query: str) -> str:
    """SQLite's URI of the database file at ``path`` with ``query``: the absolute path
    percent-encoded after an empty authority, so a ``?``, ``#`` or ``%`` in a directory's name stays
    part of the name rather than ending it, and a path written ``//srv/...`` is not read as a host."""
    return f"file://{quote(str(path.absolute()))}?{query}"


def read_only_connection(path: Path, connect: Callable[[str], Opened],
                         refused: type[Exception]) -> tuple[Opened, bool]:
    """``connect`` of the SQLite database at ``path`` read-only, and whether it is immutable. A
    reader needs the WAL index file (``-shm``) beside the database; on read-only media where it is
    missing and cannot be made (``connect`` raises ``refused``), a database with nothing left in its
    write-ahead log (it was closed cleanly) is opened as immutable instead: SQLite then reads it as
    a file that never changes, so its reader compares :func:`file_states` to see a change."""
    try:
        return connect(file_uri(path, "mode=ro")), False
    except refused:
        try:  # a writer may remove its WAL as this looks
            pending = path.with_name(path.name + "-wal").stat().st_size > 0
        except FileNotFoundError:
            pending = False
        if pending:
            raise
    return connect(file_uri(path, "mode=ro&immutable=1")), True


def missing_store(directory: Path | None) -> str | None:
    """Why a command that must not create a store finds none in ``directory`` (None: a database
    file is there, or the store is on a database server, ``directory`` None): no database file, or
    an empty one (truncated, or a creation killed at once)."""
    if directory is None:
        return None
    path = directory / DB_NAME
    if not path.is_file():
        return f"no store at {directory} ({DB_NAME} is missing)"
    if path.stat().st_size == 0:
        return f"no store at {directory} ({DB_NAME} is empty)"
    return None


def _identity(path: Path) -> tuple[int, int] | None:
    """The file at ``path`` (its device and inode), None where there is none."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino

class _Reader:
    """A thread's reader connection, held by the thread alone (the store keeps a weak reference,
    to close it with the store) and closed when the thread's locals go, as it ends: left to the
    cyclic collector (a connection and its statement cache form a cycle) it would stay open for as
    long as the collector waits, which in a serving process is minutes."""

    def __init__(self, connection: sqlite3.Connection, generation: int) -> None:
        self.connection, self.generation = connection, generation
        # not at interpreter exit, where a daemon thread may still be reading on it
        weakref.finalize(self, connection.close).atexit = False


def file_states(path: Path) -> tuple[tuple[int, int, int] | None, ...]:
    """Inode, size and modification time of a SQLite database and its write-ahead log (None for a
    missing one): what a commit by any process changes."""
    found: list[tuple[int, int, int] | None] = []
    for file in (path, path.with_name(path.name + "-wal")):
        try:
            status = file.stat()
            found.append((status.st_ino, status.st_size, status.st_mtime_ns))
        except FileNotFoundError:
            found.append(None)
    return tuple(found)


class SQLiteConnection:
    """The connections of the store in ``directory`` (see the module docstring).

    ``marker(db, user_id)`` is what :meth:`tracking` records of a user at the start and end of each
    transaction (the store's :meth:`~retrieval.memory.versions.StoreVersions.user_version`).
    """

    def __init__(self, directory: Path, *, read_only: bool, role: str,
                 marker: Callable[[sqlite3.Connection, str], Any]) -> None:
        self.directory = directory  # absolute (the store's): a later chdir moves no reader, no check
        self.path = directory / DB_NAME
        self.read_only = read_only
        self._marker = marker
        self._lock: WriterLock | None = None
        self._local = threading.local()
        self._writes = threading.RLock()
        self._readers: weakref.WeakSet[_Reader] = weakref.WeakSet()
        self._readers_guard = threading.Lock()
        self._writer: sqlite3.Connection | None = None
        self._snapshot: tuple[Any, ...] | None = None
        """The files as they were when the store was opened as immutable (else None)."""
        self._generation = 0
        """How many times the connections were opened again (a changed immutable store)."""
        self._found = self.path.is_file() and self.path.stat().st_size > 0  # a database was here
        if read_only:
            if not self.path.is_file():
                raise StoreError(f"no store at {self.directory} ({DB_NAME} is missing)")
            self.watch = self._watching()
        else:
            try:
                private_directory(self.directory)
                self._lock = WriterLock(self.directory, role, CODE_MARK)
                self._lock.acquire()
                private_file(self.path)
            except OSError as err:  # no permission, a read-only file system, ...
                hint = ("open it read-only" if self.path.is_file()
                        else "no store is there yet: choose a writable directory for a new one")
                raise StoreError(f"{self.directory} is not writable ({err.strerror}); {hint}") from None
            try:
                writer = self._writer = self._connect(str(self.path))
                self._identity = _identity(self.path)
                writer.execute("PRAGMA journal_mode=WAL")
                # Freed pages are zeroed, so a purged user's text leaves no trace in the file.
                writer.execute("PRAGMA secure_delete=ON")
                # WAL + NORMAL: a commit survives the process being killed (the online API acknowledges
                # each add after its commit); only a power cut may undo the last commits. One fsync
                # per checkpoint instead of one per transaction: adds are ~2x faster.
                writer.execute("PRAGMA synchronous=NORMAL")
                writer.row_factory = sqlite3.Row
                writer.execute("PRAGMA foreign_keys=ON")
                self.watch = self._connect(str(self.path))
            except BaseException:
                self._lock.release()
                raise
        self.watch_guard = threading.Lock()
        """Serialises reads of :attr:`watch`, the connection that never writes (``data_version``)."""
        self._prepare_schema()

    @property
    def holds_writer(self) -> bool:
        """Open for writing and not closed yet."""
        return self._lock is not None

    @property
    def db(self) -> sqlite3.Connection:
        """The writer inside this thread's transaction, else this thread's reader."""
        if getattr(self._local, "writing", 0):
            assert self._writer is not None
            return self._writer
        if self._snapshot is not None:
            self._reopen_if_changed()
        reader = getattr(self._local, "reader", None)
        if reader is None or reader.generation != self._generation:
            connection = self._beside_writer() if self._writer is not None else self._connect_read_only()[0]
            connection.row_factory = sqlite3.Row
            connection.execute("PRAGMA foreign_keys=ON")
            connection.execute(f"PRAGMA cache_size=-{READER_CACHE_KIB}")
            reader = self._local.reader = _Reader(connection, self._generation)
            with self._readers_guard:
                self._readers.add(reader)
        return reader.connection

    @contextmanager
    def writing(self) -> Iterator[sqlite3.Connection]:
        """This thread holds the writer connection (no transaction of its own opened)."""
        if self._writer is None:
            raise StoreError(f"{self.path} is open read-only")
        with self._writes:
            self._local.writing = getattr(self._local, "writing", 0) + 1
            try:
                yield self._writer
            finally:
                self._local.writing -= 1

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction on the writer: committed at the end of the block, rolled back on
        an error; a block inside one this thread holds joins it (the outer block commits)."""
        with self.writing() as db:
            if db.in_transaction:  # only this thread uses the writer while it is held
                yield db
                return
            db.execute("BEGIN IMMEDIATE")
            try:
                tracked = getattr(self._local, "tracked", None)
                before = None if tracked is None else self._marker(db, tracked[0])
                yield db
                if tracked is not None:
                    tracked[1].append((before, self._marker(db, tracked[0])))
                self._check_in_place()
            except BaseException:
                if db.in_transaction:  # SQLite rolls back by itself after some faults (a full disk)
                    db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def _beside_writer(self) -> sqlite3.Connection:
        """A thread's reader in the writing process, of the file the writer writes: one opened
        after the store was removed or replaced is :class:`StoreGone`, and ``mode=rw`` never
        creates a file, so a reader racing a removal cannot leave an empty database behind."""
        self._check_in_place()
        try:
            return self._connect(file_uri(self.path, "mode=rw"))
        except StoreError:
            self._check_in_place()  # removed between the check and the open
            raise

    def _check_in_place(self) -> None:
        """:class:`StoreGone` when the file this process writes is no longer the one at the store's
        path (the directory removed, the file replaced): a commit would be answered and then lost
        with the file, and a restart would make a new, empty store there."""
        if _identity(self.path) != self._identity:
            raise StoreGone(f"{self.path} was removed or replaced while this process wrote to it: nothing "
                             "more is committed; stop the process, then put the store back or restore a copy")

    @contextmanager
    def tracking(self, user_id: str) -> Iterator[list[tuple[Any, Any]]]:
        """Record, for each transaction this thread commits inside the block, the user's marker at
        its start and at its end (see :meth:`retrieval.memory.store_contract.Handle.tracking`)."""
        marks: list[tuple[Any, Any]] = []
        self._local.tracked = (user_id, marks)
        try:
            yield marks
        finally:
            self._local.tracked = None

    def _connect(self, target: str) -> sqlite3.Connection:
        try:
            # Autocommit mode: transactions are opened explicitly in transaction().
            db = sqlite3.connect(target, uri=target.startswith("file:"), isolation_level=None,
                                 timeout=BUSY_TIMEOUT_S, check_same_thread=False, factory=GuardedConnection)
            db.store_path = self.path
            db.execute("SELECT 1 FROM sqlite_master LIMIT 1")
            return db
        except (sqlite3.DatabaseError, StoreFault) as err:
            if isinstance(err, StoreFault) and outside_fault(err):
                raise  # a healthy store on a full disk or locked: the fault says so, not "unusable"
            raise StoreError(f"{self.path}: not a usable SQLite store ({err.__cause__ or err})") from None

    def _connect_read_only(self) -> tuple[sqlite3.Connection, bool]:
        """A reader, and whether it is immutable (:func:`read_only_connection`; see :meth:`version`)."""
        return read_only_connection(self.path, self._connect, StoreError)

    def _watching(self) -> sqlite3.Connection:
        """The read-only store's watching connection, noting the files if it is immutable."""
        files = file_states(self.path)
        connection, immutable = self._connect_read_only()
        self._snapshot = files if immutable else None
        return connection

    def version(self) -> int:
        """SQLite's ``PRAGMA data_version`` of the watching connection, which moves whenever any
        connection commits. An immutable store's never moves, so its files are compared with
        those it was opened on: when a writer elsewhere has changed them (a read-only mount of a
        store another process writes), every connection is opened again (as a live reader if the
        ``-shm`` file is there now) and the version moves past every earlier one, so no state
        or page read from the old file is served again."""
        self._reopen_if_changed()
        with self.watch_guard:
            (version,) = self.watch.execute("PRAGMA data_version").fetchone()
        return int(version) + (self._generation << 40)

    def _reopen_if_changed(self) -> None:
        """For a store read as immutable: when its files changed, open the watching connection
        again and have every thread open its reader again at its next read (every read checks,
        not only a search's: a listing must not show a forgotten user either)."""
        with self.watch_guard:
            if self._snapshot is not None and file_states(self.path) != self._snapshot:
                stale, self.watch = self.watch, self._watching()
                self._generation += 1
                stale.close()

    def _prepare_schema(self) -> None:
        try:
            version = self.db.execute("PRAGMA user_version").fetchone()[0]
            if version == 0 and (self._found or self.read_only):
                raise StoreError(f"{self.path} holds no store (schema version 0): an empty database, a "
                                 f"copy of the file made without its {DB_NAME}-wal while a writer had it "
                                 "open, or a store whose creation was killed; copy a store's whole "
                                 "directory after its writer closed, or remove this one to start anew")
            if needs_migration(version, SCHEMA_VERSION, where=str(self.path), read_only=self.read_only):
                assert self._lock is not None  # a read-only open was refused above: it holds the writer's
                if version and (other := other_writer(self.directory, self._lock.role, CODE_MARK)):
                    raise StoreBusy(f"{self.path} is at schema version {version}, which this code migrates, "
                                    f"but it is open for {other[0]} by another process (pid {other[1]}) of "
                                    "an earlier version: stop it first, then open the store here")
                with self.transaction() as db:  # a half-created or half-migrated schema is never left behind
                    # read again under the write lock: another process may have migrated it meanwhile
                    version = db.execute("PRAGMA user_version").fetchone()[0]
                    if needs_migration(version, SCHEMA_VERSION, where=str(self.path), read_only=False):
                        create_or_migrate(db, version)
        except sqlite3.DatabaseError as err:
            self.close()
            raise StoreError(f"{self.path}: not a usable SQLite store ({err})") from None
        except StoreError:
            self.close()
            raise

    def close(self) -> None:
        """Close every connection (the readers of all threads too) and release the writer lock."""
        with self._readers_guard:
            readers, self._readers = [reader.connection for reader in self._readers], weakref.WeakSet()
        with self.watch_guard:  # not while an immutable store's watch is being opened again
            watch = self.watch
        for connection in [*readers, watch] + ([] if self._writer is None else [self._writer]):
            connection.close()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

