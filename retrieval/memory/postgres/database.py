"""The connection side of the PostgreSQL store: one connection pool per store, the URL as the store's
name (its password hidden, :func:`retrieval.memory.targets.redacted`), write transactions and what they lock.

Reads run on a pooled connection in autocommit mode (each statement sees the last commit), or on
the connection of this thread's write transaction when one is open (so a check inside a
transaction sees its own writes), or on the connection of an advisory lock this thread holds (so
a lock holder takes one connection of the pool, not two; flushes hold locks :data:`LOCK_HOLDERS`
at a time).
Each write transaction first takes a transaction-level advisory lock per user it writes
(``pg_advisory_xact_lock``, keyed by a hash of the user id, taken in sorted order so two
transactions never wait on each other, and waiting at most :data:`LOCK_WAIT_S`): PostgreSQL
serialises the writers of one user whichever process they run in, which is what the SQLite store
gets from its one writer (a segment number allocated once, "already stored" checked once). Its
last statement bumps one of the ``commits`` counters (:mod:`retrieval.memory.postgres.versions`),
so their sum moves with every commit and only then.

A server that cannot be reached is one :class:`StoreError` naming the host, port and database;
a connection lost later is a :class:`StoreFault` naming the same (:func:`outage`). Constraint
violations (the append-only triggers, a duplicate id) and other errors of a statement that cannot
succeed pass through unchanged, as on SQLite.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, cast

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from retrieval.memory.errors import StoreError, StoreFault, StoreOutage
from retrieval.memory.postgres.versions import BUMP_COMMITS, user_version_of
from retrieval.memory.targets import redacted

OUTAGE_CLASSES = ("08", "40", "53", "57", "58")
"""SQLSTATE classes of a server that failed rather than a statement that cannot succeed: connection
exceptions, rolled-back transactions (serialization, deadlock), insufficient resources, operator
intervention (a shutdown, a cancelled query) and system errors. Another operational error (a value
over a program limit, say) fails the same way on every retry, so it is not reported as an outage."""


def outage(err: psycopg.OperationalError) -> bool:
    """Whether ``err`` is the server's or the connection's failure (worth retrying once it is back):
    one of :data:`OUTAGE_CLASSES`, or a client-side error without a SQLSTATE (a lost connection, no
    pooled connection in time)."""
    return err.sqlstate is None or err.sqlstate[:2] in OUTAGE_CLASSES


POOL_SIZE = 16
"""Connections one store may hold: one per concurrently reading or writing thread, beyond which
threads wait for a connection."""
LOCK_HOLDERS = POOL_SIZE // 2
"""Threads of one store that may hold a capped advisory lock at once: a flush's ingestion lock,
held through an extraction (an LLM's, perhaps) by as many threads as flush together. Beyond them a
flush waits for a turn before it takes the lock, holding nothing of the pool. Other holders (the
ingestion worker's one thread, a purge, a job) take no turn, so no user waits for another's
extraction to delete or be ingested; with every holder on one connection (its lock's), the pool
keeps connections for the node's searches, adds and model thread."""

CONNECT_TIMEOUT_S = 10
"""How long opening a store waits for the server before it says it cannot be reached."""
POOL_WAIT_S = 10.0
"""How long a call waits for a pooled connection before its store fault (the server's clients
get a 503 then, not a request held for a minute while the database restarts)."""
RECONNECT_S = 5.0
"""How long the pool keeps retrying a lost connection with growing pauses before it gives up
and reconnects on the next call's demand: once the database is back, a call waits for at most
one pause of these retries, not for a backoff grown to a minute."""

LOCK_WAIT_S = 30.0
"""How long a statement waits for a lock before its store fault: a write transaction for the locks
it takes (the user's, a commit counter's row), which another transaction holds only while it runs,
so a longer wait is a node that stopped inside one; a read for a table another connection locked
whole (``VACUUM FULL``, as ``retrieval.store compact`` runs it, or a migration). A wait without end
would hold the caller's thread, then the server's others behind it. The ingestion lock is waited
for without bound: another node holds it for as long as it processes the user's backlog
(:meth:`Database.advisory_lock`); so is the schema's, which a node migrating the database holds
for as long as the migration rewrites tables (:func:`retrieval.memory.postgres.schema.prepare`)."""

KEEPALIVE = {"tcp_keepalives_idle": "10", "tcp_keepalives_interval": "5", "tcp_keepalives_count": "3",
             "tcp_user_timeout": "30000"}
"""The server's checks of each connection of a store (set on each one): a node whose machine is
lost or cut off is found dead, and its locks released, in about 25-30 s, not after the system's
default of more than two hours. A node that is alive but stuck keeps them."""

INGESTION_LOCKS = 1_836_019_570
"""The seed of every user's ingestion lock key (``pg_advisory_lock(hashtextextended(user,
INGESTION_LOCKS))``)."""
JOB_LOCKS = 1_836_019_571
"""The seed of every consolidation job's lock key (``pg_try_advisory_lock(hashtextextended(id,
JOB_LOCKS))``)."""
NODE_LOCKS = 1_836_019_572
"""The first key of the mark every pooled connection holds for as long as it lives: a shared
``pg_advisory_lock_shared(NODE_LOCKS, schema version)``, which tells a migrating node the sessions
of nodes that know its schema from those of earlier code (:mod:`retrieval.memory.postgres.schema`)."""

Connection = psycopg.Connection[dict[str, Any]]

def set_lock_timeout(conn: Connection, seconds: float) -> None:
    """Bound the lock waits of the transaction open on ``conn`` (``SET LOCAL lock_timeout``; 0: no
    bound, whatever the database sets by default)."""
    conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{round(seconds * 1000)}ms",))


def _configure(conn: Connection) -> None:
    """Each new connection of the pool: its lock waits bounded by :data:`LOCK_WAIT_S` (a write
    transaction sets the same for itself, the ingestion lock's wait none), and the server's
    keepalive checks (:data:`KEEPALIVE`; a server that has no such setting, ``tcp_user_timeout``
    before PostgreSQL 12, skips it)."""
    conn.execute("SELECT set_config('lock_timeout', %s, false)", (f"{round(LOCK_WAIT_S * 1000)}ms",))
    for name, value in KEEPALIVE.items():
        try:
            conn.execute("SELECT set_config(%s, %s, false)", (name, value))
        except psycopg.errors.UndefinedObject:  # "unrecognized configuration parameter"
            continue


class Database:
    """The pool, this thread's write transaction and the tracking of a user's versions."""

    def __init__(self, url: str, *, read_only: bool, schema_version: int) -> None:
        self.where = redacted(url)
        self._schema_version = schema_version
        self.read_only = read_only
        self._local = threading.local()
        self._holders = threading.BoundedSemaphore(LOCK_HOLDERS)
        try:  # one direct attempt first: it says why the server cannot be reached
            psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S).close()
        except psycopg.Error as err:
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]  # cause, then hint
            reason = "; ".join(lines) or type(err).__name__
            raise StoreError(f"cannot connect to the store at {self.where}: {reason}") from None
        self.pool = ConnectionPool(url, min_size=1, max_size=POOL_SIZE, open=True, timeout=POOL_WAIT_S,
                                   reconnect_timeout=RECONNECT_S, configure=self._configure,
                                   check=ConnectionPool.check_connection,  # a dropped one is replaced
                                   kwargs={"autocommit": True, "row_factory": dict_row})

    def close(self) -> None:
        self.pool.close()

    def _configure(self, conn: Connection) -> None:
        """A new connection of the pool: its settings, and the mark of a node of this schema."""
        _configure(conn)
        conn.execute("SELECT pg_advisory_lock_shared(%s, %s)", (NODE_LOCKS, self._schema_version))

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """This thread's transaction connection, else a pooled one (faults as :class:`StoreFault`)."""
        locks = self._held_locks()  # the innermost one's connection serves a lock holder's reads
        open_one = getattr(self._local, "conn", None) or (locks[-1] if locks else None)
        try:
            if open_one is not None:
                yield open_one
            else:
                with self.pool.connection() as conn:
                    yield cast(Connection, conn)  # the pool's connections read rows as dicts
        except psycopg.errors.LockNotAvailable as err:
            raise StoreFault(f"{self.where}: a statement waited longer than its lock timeout "
                             f"({LOCK_WAIT_S:.0f} s) for a lock another connection holds (a node that "
                             "stopped inside a write transaction? a table being compacted?); its "
                             "transaction committed nothing: retry later") from err
        except psycopg.OperationalError as err:
            if not outage(err):
                raise
            raise StoreOutage(f"{self.where}: the database failed ({err}); "
                             "rerun when the server is back (nothing committed is lost)") from err

    def rows(self, sql: str, params: Iterable[Any] = ()) -> list[Any]:
        """Every row of ``sql`` (dicts by column name)."""
        with self.connection() as conn:
            return conn.execute(sql, tuple(params)).fetchall()  # type: ignore[arg-type]

    def row(self, sql: str, params: Iterable[Any] = ()) -> Any:
        """The first row of ``sql``, or None."""
        with self.connection() as conn:
            return conn.execute(sql, tuple(params)).fetchone()  # type: ignore[arg-type]

    def value(self, sql: str, params: Iterable[Any] = ()) -> Any:
        """The first column of the first row of ``sql``."""
        row = self.row(sql, params)
        return None if row is None else next(iter(row.values()))

    @contextmanager
    def transaction(self, users: Iterable[str] = ()) -> Iterator[Connection]:
        """One write transaction on this thread, holding the advisory lock of each of ``users`` (and
        of the user :meth:`tracking` follows); nested calls join the open one."""
        if self.read_only:
            raise StoreError(f"{self.where} is open read-only")
        if getattr(self._local, "conn", None) is not None:
            yield self._local.conn
            return
        tracked = getattr(self._local, "tracked", None)
        locked = sorted(set(users) | ({tracked[0]} if tracked is not None else set()))
        with self.connection() as conn:
            self._local.conn = conn
            try:
                with conn.transaction():
                    set_lock_timeout(conn, LOCK_WAIT_S)
                    for user in locked:
                        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (user,))
                    before = None if tracked is None else user_version_of(conn, tracked[0])
                    yield conn
                    if tracked is not None:
                        tracked[1].append((before, user_version_of(conn, tracked[0])))
                    conn.execute(BUMP_COMMITS)
            finally:
                self._local.conn = None

    def ingestion_lock(self, user_id: str, *, wait: bool,
                       capped: bool = False) -> AbstractContextManager[bool]:
        """The user's ingestion lock (:meth:`advisory_lock`)."""
        return self.advisory_lock(INGESTION_LOCKS, user_id, wait=wait, capped=capped)

    def job_lock(self, job_id: int) -> AbstractContextManager[bool]:
        """The right to run consolidation job ``job_id`` (:meth:`advisory_lock`, not waited for)."""
        return self.advisory_lock(JOB_LOCKS, str(job_id), wait=False)

    @contextmanager
    def advisory_lock(self, space: int, name: str, *, wait: bool, capped: bool = False) -> Iterator[bool]:
        """A session-level advisory lock on a pooled connection kept for the block (so it is
        released when the block ends or the process dies), this thread's connection meanwhile
        (``capped``: once one of :data:`LOCK_HOLDERS` turns is free); yields whether it is held. Its key is
        a 64-bit hash of ``name`` seeded by ``space`` (32 bits would give two users of a large store
        the same lock: among 200,000 ids several pairs collide), apart from the write
        transactions' locks, whose seed is 0."""
        key = (name, space)
        held_here = self._held_locks()
        turn = capped and not held_here  # a thread's first capped lock waits for a turn
        if turn:
            self._holders.acquire()
        try:
            with self._locked(key, wait=wait, held_here=held_here) as held:
                yield held
        finally:
            if turn:
                self._holders.release()

    def _held_locks(self) -> list[Connection]:
        """The connections of the advisory locks this thread holds, innermost last."""
        locks: list[Connection] | None = getattr(self._local, "locks", None)
        if locks is None:
            locks = self._local.locks = []
        return locks

    @contextmanager
    def _locked(self, key: tuple[str, int], *, wait: bool, held_here: list[Connection]) -> Iterator[bool]:
        with self.connection() as conn:
            if wait:  # for as long as its holder works, or until the server drops a lost holder
                with conn.transaction():  # the session's lock outlives the transaction
                    set_lock_timeout(conn, 0)
                    conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, %s))", key)
                held = True
            else:
                found = conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, %s)) AS held",
                                     key).fetchone()
                held = bool(found and found["held"])
            held_here.append(conn)  # the block's reads and transactions run on it
            try:
                yield held
            finally:
                held_here.pop()
                if held:
                    conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, %s))", key)

    @contextmanager
    def tracking(self, user_id: str) -> Iterator[list[tuple[Any, Any]]]:
        """The user's versions at the start and end of each transaction this thread commits inside
        the block (the transaction holds the user's lock, so nothing else changed it in between)."""
        marks: list[tuple[Any, Any]] = []
        self._local.tracked = (user_id, marks)
        try:
            yield marks
        finally:
            self._local.tracked = None
