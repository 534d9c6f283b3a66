"""The durable, append-only AMU store (SQLite in WAL mode).

The store keeps the raw turns beside the records and records ingestion progress per
conversation: a segment's turns, its records and its progress row commit in one transaction, so
a crash loses at most the segment being processed. It also records which models built it
(:meth:`AMUStore.bind`: the fingerprinter whose codes it stores, the segmentation embedder, the
extractor), so a resumed run with other models is refused instead of mixing them.

Open for writing (the default) the store holds a writer lock per role (:mod:`retrieval.memory.
lock`): a second ingest into the same store is refused with a message, while a consolidation
worker (another role) may write beside it; SQLite serialises their transactions. Open with
``read_only=True`` it takes no lock and refuses every write.

Connections. Writes go through one writer connection, one transaction at a time (threads of the
process queue on a lock for it; reads inside a transaction use it too). Every other read runs
on a connection of the reading thread, opened on its first read: in WAL mode a reader sees the
last commit and never waits for the writer's transaction, so the store can be read from many
threads at once. Bad files (not a database, an
unknown schema version, no permission) raise one :class:`StoreError` naming the file, and so do
SQLite faults once it is open (a damaged page, a dropped table, a full disk:
:mod:`retrieval.memory.faults`).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from retrieval.memory.cache import ArrayCache
from retrieval.memory.errors import StoreError, StoreFault, StoreMismatch
from retrieval.memory.faults import GuardedConnection
from retrieval.memory.indexing import EvidenceReads, add_event_frame, index_amu
from retrieval.memory.job_rows import JobRows
from retrieval.memory.lock import WriterLock
from retrieval.memory.meta_keys import MERGE_KEY
from retrieval.memory.purge import Purge
from retrieval.memory.reads import AMU_COLUMNS, StoreReads
from retrieval.memory.records import AMU, SegmentRecord, Turn
from retrieval.memory.schema import SCHEMA_OBJECTS, SCHEMA_VERSION, create_or_migrate, turns_sha256
from retrieval.memory.times import iso_text, time_interval
from retrieval.memory.turn_log import TurnLog, insert_turns
from retrieval.memory.versions import StoreVersions

BUSY_TIMEOUT_S = 30.0
"""How long a write waits for another role's transaction (e.g. consolidation beside ingestion)."""


class AMUStore(StoreReads, EvidenceReads, ArrayCache, TurnLog, Purge, JobRows, StoreVersions):
    """Durable AMU store in ``<directory>/amus.sqlite3``.

    Reads return records in insertion order (segment order, then order within the segment).
    Writes go through :meth:`commit_segment`, which stores a segment's raw turns, its records and
    its progress row in one transaction. Every record is inserted by ``_insert_amu``, which also
    links it to its evidence nodes in that transaction (:mod:`retrieval.memory.indexing`;
    triggers keep the FTS5 table in step and drop what :meth:`archive` retires), so a new write
    path (consolidation) should insert through it. Use as a context manager or call :meth:`close`.

    Args:
        directory: the store directory (created when writable and missing).
        read_only: open without a lock and refuse writes (a missing store is an error).
        role: the writer role whose lock is held while open for writing ("ingest" by default,
            "consolidate" for the background worker).
    """

    DB_NAME = "amus.sqlite3"

    def __init__(self, directory: str | Path, *, read_only: bool = False, role: str = "ingest") -> None:
        self.directory = Path(directory)
        self.path = self.directory / self.DB_NAME
        self.read_only = read_only
        self._lock: WriterLock | None = None
        self._local = threading.local()
        self._writes = threading.RLock()
        self._readers: list[sqlite3.Connection] = []
        self._readers_guard = threading.Lock()
        self._writer: sqlite3.Connection | None = None
        if read_only:
            if not self.path.is_file():
                raise StoreError(f"no store at {self.directory} ({self.DB_NAME} is missing)")
            self._watch = self._connect_read_only()
        else:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                self._lock = WriterLock(self.directory, role)
                self._lock.acquire()
            except PermissionError as err:
                raise StoreError(
                    f"{self.directory} is not writable ({err.strerror}); open it read-only") from None
            try:
                writer = self._writer = self._connect(str(self.path))
                writer.execute("PRAGMA journal_mode=WAL")
                # Freed pages are zeroed, so a purged user's text leaves no trace in the file.
                writer.execute("PRAGMA secure_delete=ON")
                # WAL + NORMAL: a commit survives the process being killed (the online API acknowledges
                # each add after its commit); only a power cut may undo the last commits. One fsync
                # per checkpoint instead of one per transaction: adds are ~2x faster.
                writer.execute("PRAGMA synchronous=NORMAL")
                writer.row_factory = sqlite3.Row
                writer.execute("PRAGMA foreign_keys=ON")
                self._watch = self._connect(str(self.path))
            except BaseException:
                self._lock.release()
                raise
        self._watch_guard = threading.Lock()
        self._prepare_schema()

    @property
    def _db(self) -> sqlite3.Connection:  # type: ignore[override]  # the mixins read it as an attribute
        """The writer inside this thread's transaction, else this thread's reader."""
        if getattr(self._local, "writing", 0):
            assert self._writer is not None
            return self._writer
        reader = getattr(self._local, "reader", None)
        if reader is None:
            reader = self._connect(str(self.path)) if self._writer is not None else self._connect_read_only()
            reader.row_factory = sqlite3.Row
            reader.execute("PRAGMA foreign_keys=ON")
            with self._readers_guard:
                self._readers.append(reader)
            self._local.reader = reader
        return reader

    @contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        """This thread holds the writer connection (no transaction of its own opened)."""
        if self._writer is None:
            raise StoreError(f"{self.path} is open read-only")
        with self._writes:
            self._local.writing = getattr(self._local, "writing", 0) + 1
            try:
                yield self._writer
            finally:
                self._local.writing -= 1

    def _connect(self, target: str) -> sqlite3.Connection:
        try:
            # Autocommit mode: transactions are opened explicitly in _transaction().
            db = sqlite3.connect(target, uri=target.startswith("file:"), isolation_level=None,
                                 timeout=BUSY_TIMEOUT_S, check_same_thread=False, factory=GuardedConnection)
            db.store_path = self.path
            db.execute("SELECT 1 FROM sqlite_master LIMIT 1")
            return db
        except (sqlite3.DatabaseError, StoreFault) as err:
            raise StoreError(f"{self.path}: not a usable SQLite store ({err.__cause__ or err})") from None

    def _connect_read_only(self) -> sqlite3.Connection:
        """A reader needs the WAL index file (``-shm``) beside the store; on read-only media where
        it is missing and cannot be created, a store with nothing left in its write-ahead log (it
        was closed cleanly) is opened as immutable instead."""
        try:
            return self._connect(f"file:{self.path}?mode=ro")
        except StoreError:
            wal = self.path.with_name(self.DB_NAME + "-wal")
            if wal.exists() and wal.stat().st_size > 0:
                raise
            return self._connect(f"file:{self.path}?mode=ro&immutable=1")

    def _prepare_schema(self) -> None:
        try:
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version not in range(SCHEMA_VERSION + 1):
                raise StoreError(f"{self.path}: store schema version {version} is unknown to this code "
                                 f"(it reads versions 1 to {SCHEMA_VERSION}); use the code that wrote it")
            if version == SCHEMA_VERSION:
                return
            if self.read_only:
                raise StoreError(f"{self.path}: schema version {version} needs a migration to "
                                 f"{SCHEMA_VERSION}; open the store for writing once")
            with self._transaction() as db:  # a half-created or half-migrated schema is never left behind
                create_or_migrate(db, version)
        except sqlite3.DatabaseError as err:
            self.close()
            raise StoreError(f"{self.path}: not a usable SQLite store ({err})") from None
        except StoreError:
            self.close()
            raise

    def integrity_problems(self) -> list[str]:
        """What SQLite's ``PRAGMA quick_check`` finds wrong with the store file, and the tables,
        indexes and triggers of the schema that are missing (empty: none)."""
        try:
            rows = [row[0] for row in self._db.execute("PRAGMA quick_check").fetchall()]
            present = {row[0] for row in self._db.execute("SELECT name FROM sqlite_master")}
        except StoreFault as err:  # damage bad enough to stop the check itself
            return [str(err.__cause__)]
        missing = [f"schema object {name!r} is missing" for name in SCHEMA_OBJECTS if name not in present]
        return [row for row in rows if row != "ok"] + missing

    def close(self) -> None:
        """Close every connection (the readers of all threads too) and release the writer lock."""
        with self._readers_guard:
            readers, self._readers = self._readers, []
        for connection in [*readers, self._watch] + ([] if self._writer is None else [self._writer]):
            connection.close()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> AMUStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._writing() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                tracked = getattr(self._local, "tracked", None)
                before = None if tracked is None else self.user_version(tracked[0])
                yield db
                if tracked is not None:
                    tracked[1].append((before, self.user_version(tracked[0])))
            except BaseException:
                if db.in_transaction:  # SQLite rolls back by itself after some faults (a full disk)
                    db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    @contextmanager
    def tracking(self, user_id: str) -> Iterator[list[tuple[Any, Any]]]:
        """Record, for each transaction this thread commits inside the block, the user's
        :meth:`user_version` at its start and at its end (the writer holds the store meanwhile, so
        nothing else changed the user between them): a reader extending its copy of the user
        checks that the first start is the version it holds (:mod:`retrieval.api.states`)."""
        marks: list[tuple[Any, Any]] = []
        self._local.tracked = (user_id, marks)
        try:
            yield marks
        finally:
            self._local.tracked = None

    # -- what built the store -------------------------------------------------------------------

    def meta(self, key: str) -> Any:
        """The value bound to ``key`` (JSON), or None."""
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def put_meta(self, key: str, value: Any) -> None:
        """Set a mutable record (e.g. the construction cost so far) under ``key``."""
        with self._transaction() as db:
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, json.dumps(value)))

    def bind(self, key: str, value: Any, hint: str = "use a new store") -> None:
        """Record ``value`` under ``key`` on first use; afterwards refuse any other value
        (:class:`StoreMismatch` naming both), so one store never mixes two models."""
        saved = self.meta(key)
        if saved is None:
            with self._transaction() as db:  # refused on a read-only store
                db.execute("INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)", (key, json.dumps(value)))
            saved = self.meta(key)
        if saved != value:
            raise StoreMismatch(f"{self.directory} was built with {key} {saved!r}, not {value!r}; {hint}")

    # -- writes --------------------------------------------------------------------------------

    def commit_segment(self, record: SegmentRecord, turns: Sequence[Turn], amus: Sequence[AMU]) -> None:
        """Store one segment's raw turns, its AMUs and its progress row (with the turns' content
        checksum) atomically.

        Raises ``ValueError`` if the segment was already committed (the caller checks
        :meth:`segment` first when resuming) or an AMU's source pointer names another
        conversation, session or segment.
        """
        self.commit_segments([(record, turns, amus)])

    def commit_segments(self,
                        segments: Sequence[tuple[SegmentRecord, Sequence[Turn], Sequence[AMU]]]) -> None:
        """:meth:`commit_segment` of several segments in one transaction (a bulk build): all or none."""
        for record, _, amus in segments:
            self._check_sources(record, amus)
        with self._transaction() as db:
            for record, turns, amus in segments:
                if self.segment(record.user_id, record.seq) is not None:
                    raise ValueError(f"segment {record.seq} of {record.user_id!r} is already stored")
                insert_turns(db, turns)
                self._insert_segment(db, record, turns, amus)

    def commit_stored_turns(self, record: SegmentRecord, amus: Sequence[AMU]) -> None:
        """:meth:`commit_segment` for a segment whose raw turns the store already holds (the online
        API stores each turn when it is added): its AMUs and progress row in one transaction."""
        self._check_sources(record, amus)
        with self._transaction() as db:
            if self.segment(record.user_id, record.seq) is not None:
                raise ValueError(f"segment {record.seq} of {record.user_id!r} is already stored")
            turns = [self.turn(record.user_id, turn_id) for turn_id in record.turn_ids]
            self._insert_segment(db, record, turns, amus)

    def _insert_segment(self, db: sqlite3.Connection, record: SegmentRecord, turns: Sequence[Turn],
                        amus: Sequence[AMU]) -> None:
        add_event_frame(db, record.user_id, record.seq, record.session_id, record.turn_ids)
        for amu in amus:
            self._insert_amu(db, amu)
        db.execute(
            "INSERT INTO segments (conversation_id, seq, session_id, turn_ids, reason, state, fallback, "
            "amu_count, content_sha256, revision) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0)",
            (record.user_id, record.seq, record.session_id, json.dumps(list(record.turn_ids)),
             record.reason, record.state, int(record.fallback), len(amus), turns_sha256(turns)),
        )

    def replace_extraction(self, record: SegmentRecord, amus: Sequence[AMU]) -> None:
        """A retried extraction of a stored segment (e.g. one that fell back to raw turns while the
        LLM endpoint was down): in one transaction the segment's current AMUs are archived (never
        deleted), ``amus`` (ids of revision ``record.revision``) are inserted and the progress
        row takes the new state, fallback flag, count and revision."""
        self._check_sources(record, amus)
        stored = self.segment(record.user_id, record.seq)
        if stored is None or record.revision <= stored.revision:
            raise ValueError(f"segment {record.seq} of {record.user_id!r}: "
                             f"revision {record.revision} does not follow the stored one")
        with self._transaction() as db:
            db.execute("UPDATE amus SET archived = 1 WHERE conversation_id = ? AND segment = ? "
                       "AND archived = 0",
                       (record.user_id, record.seq))
            for amu in amus:
                self._insert_amu(db, amu)
            db.execute("UPDATE segments SET state = ?, fallback = ?, amu_count = ?, revision = ? "
                       "WHERE conversation_id = ? AND seq = ?",
                       (record.state, int(record.fallback), len(amus), record.revision,
                        record.user_id, record.seq))

    @staticmethod
    def _check_sources(record: SegmentRecord, amus: Sequence[AMU]) -> None:
        for amu in amus:
            src = amu.source
            if (src.user_id, src.session_id, src.segment) != (record.user_id,
                                                                      record.session_id, record.seq):
                raise ValueError(f"AMU {amu.id!r} belongs to {src.user_id!r} {src.session_id!r} "
                                 f"segment {src.segment}, not to {record.user_id!r} "
                                 f"{record.session_id!r} segment {record.seq}")

    @staticmethod
    def _insert_amu(db: sqlite3.Connection, amu: AMU, position: int | None = None) -> None:
        """Insert ``amu`` with its index rows, at the next position or at ``position`` (a purge
        restoring an archived AMU in place, :mod:`retrieval.memory.purge`)."""
        src = amu.source
        cursor = db.execute(
            f"INSERT INTO amus (position, {AMU_COLUMNS}) VALUES ({', '.join('?' * 18)})",
            (position, amu.id, src.user_id, src.session_id, src.segment, amu.text, amu.memory_type,
             amu.observed_at, json.dumps(amu.timestamps), json.dumps(amu.entities), json.dumps(amu.tags),
             json.dumps(src.turn_ids), json.dumps(src.speakers),
             None if amu.fingerprint is None else json.dumps(amu.fingerprint), int(amu.archived),
             amu.t_ref, amu.valid_from, amu.valid_to),
        )
        position = cursor.lastrowid
        assert position is not None  # an INSERT always sets it
        db.executemany("INSERT INTO amu_entities (amu, entity) VALUES (?, ?)",
                       [(position, entity.casefold()) for entity in set(amu.entities)])
        times = ([amu.observed_at] if amu.observed_at else []) + list(amu.timestamps)
        db.executemany("INSERT INTO amu_times (amu, start, end) VALUES (?, ?, ?)",
                       [(position, *map(iso_text, time_interval(value))) for value in times])
        index_amu(db, position, amu)

    def archive(self, amu_ids: Iterable[str]) -> None:
        """Mark records as archived (retired by consolidation); they stay readable, and leave the
        FTS5 table and their evidence nodes in the same transaction."""
        ids = list(amu_ids)
        with self._transaction() as db:
            for unit_id in ids:
                if db.execute("UPDATE amus SET archived = 1 WHERE id = ?", (unit_id,)).rowcount != 1:
                    raise KeyError(f"no AMU with id {unit_id!r}")

    def forward(self, archived_ids: Sequence[str], merged: AMU, operation: str) -> bool:
        """Pointer forwarding (consolidation, docs/design.md §8.3) in one transaction: insert ``merged``
        (through ``_insert_amu``, so the indexes follow), archive ``archived_ids`` with
        ``successor`` = ``merged.id`` and record the operation (meta ``consolidation:<id>``).
        Writes nothing and returns False when one of them is no longer active (consolidated by an
        earlier run, or archived by a retried extraction since the caller read it)."""
        ids = list(dict.fromkeys(archived_ids))
        if not ids or merged.id in ids or merged.archived:
            raise ValueError(f"forwarding {ids} to {merged.id!r}: need active AMUs other than the new one")
        with self._transaction() as db:
            marks = ", ".join("?" * len(ids))
            active = db.execute("SELECT COUNT(*) FROM amus WHERE archived = 0 AND conversation_id = ? "
                                f"AND id IN ({marks})", [merged.source.user_id, *ids]).fetchone()[0]
            if active != len(ids):
                return False
            self._insert_amu(db, merged)
            db.executemany("UPDATE amus SET archived = 1, successor = ? WHERE id = ?",
                           [(merged.id, i) for i in ids])
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                       (MERGE_KEY.format(merged.id), json.dumps({"operation": operation})))
        return True

