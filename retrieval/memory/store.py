"""The durable, append-only AMU store (SQLite in WAL mode).

The store keeps the raw turns beside the units and records ingestion progress per
conversation: a segment's turns, its units and its progress row commit in one transaction, so
a crash loses at most the segment being processed.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from retrieval.memory.records import AMU, SegmentRecord, SourcePointer, Turn
from retrieval.memory.times import iso_text, time_interval

_SCHEMA_VERSION = 1

_DDL = """
CREATE TABLE IF NOT EXISTS turns (
    position INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    turn_id TEXT NOT NULL,
    speaker TEXT NOT NULL,
    text TEXT NOT NULL,
    session_time TEXT,
    image_caption TEXT,
    UNIQUE (conversation_id, turn_id)
);
CREATE TABLE IF NOT EXISTS segments (
    conversation_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    session_id TEXT NOT NULL,
    turn_ids TEXT NOT NULL,
    reason TEXT NOT NULL,
    state TEXT NOT NULL,
    fallback INTEGER NOT NULL,
    amu_count INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, seq)
);
CREATE TABLE IF NOT EXISTS amus (
    position INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    conversation_id TEXT NOT NULL,
    session_id TEXT NOT NULL,
    segment INTEGER,
    text TEXT NOT NULL,
    memory_type TEXT NOT NULL,
    observed_at TEXT,
    timestamps TEXT NOT NULL,
    entities TEXT NOT NULL,
    tags TEXT NOT NULL,
    turn_ids TEXT NOT NULL,
    speakers TEXT NOT NULL,
    fingerprint TEXT,
    archived INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS amus_by_session ON amus (conversation_id, session_id);
CREATE INDEX IF NOT EXISTS amus_by_segment ON amus (conversation_id, segment);
CREATE TABLE IF NOT EXISTS amu_entities (amu INTEGER NOT NULL REFERENCES amus(position), entity TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS amu_entities_by_entity ON amu_entities (entity);
CREATE TABLE IF NOT EXISTS amu_times (
    amu INTEGER NOT NULL REFERENCES amus(position), start TEXT NOT NULL, end TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS amu_times_by_start ON amu_times (start);
-- Append-only: facts never change. Only the archived flag and the fingerprint (a derived index
-- key that a newer fingerprinter may recompute) can be updated; nothing can be deleted.
CREATE TRIGGER IF NOT EXISTS amus_append_only
BEFORE UPDATE OF id, conversation_id, session_id, segment, text, memory_type, observed_at,
                 timestamps, entities, tags, turn_ids, speakers ON amus
BEGIN SELECT RAISE(ABORT, 'AMUs are append-only: only archived and fingerprint may change'); END;
CREATE TRIGGER IF NOT EXISTS amus_no_delete BEFORE DELETE ON amus
BEGIN SELECT RAISE(ABORT, 'AMUs are append-only: they can be archived, not deleted'); END;
CREATE TRIGGER IF NOT EXISTS turns_append_only BEFORE UPDATE ON turns
BEGIN SELECT RAISE(ABORT, 'raw turns are append-only'); END;
CREATE TRIGGER IF NOT EXISTS turns_no_delete BEFORE DELETE ON turns
BEGIN SELECT RAISE(ABORT, 'raw turns are append-only'); END;
CREATE TRIGGER IF NOT EXISTS segments_append_only BEFORE UPDATE ON segments
BEGIN SELECT RAISE(ABORT, 'segment progress rows are append-only'); END;
CREATE TRIGGER IF NOT EXISTS segments_no_delete BEFORE DELETE ON segments
BEGIN SELECT RAISE(ABORT, 'segment progress rows are append-only'); END;
"""

_AMU_COLUMNS = (
    "id, conversation_id, session_id, segment, text, memory_type, observed_at, timestamps, "
    "entities, tags, turn_ids, speakers, fingerprint, archived"
)


class AMUStore:
    """Durable AMU store in ``<directory>/amus.sqlite3`` (SQLite in WAL mode).

    Reads return units in insertion order (segment order, then order within the segment).
    Writes go through :meth:`commit_segment`, which stores a segment's raw turns, its units and
    its progress row in one transaction. Use as a context manager or call :meth:`close`.
    """

    DB_NAME = "amus.sqlite3"

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / self.DB_NAME
        # Autocommit mode: transactions are opened explicitly in _transaction().
        self._db = sqlite3.connect(self.path, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, _SCHEMA_VERSION):
            raise RuntimeError(f"{self.path}: store schema version {version}, expected {_SCHEMA_VERSION}")
        # One script in one transaction, so a half-created schema is never left behind.
        self._db.executescript(f"BEGIN IMMEDIATE;{_DDL}PRAGMA user_version={_SCHEMA_VERSION};COMMIT;")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> AMUStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # -- writes --------------------------------------------------------------------------------

    def commit_segment(self, record: SegmentRecord, turns: Sequence[Turn], amus: Sequence[AMU]) -> None:
        """Store one segment's raw turns, its AMUs and its progress row atomically.

        Raises ``ValueError`` if the segment was already committed (the caller checks
        :meth:`segment` first when resuming) or an AMU's source pointer names another
        conversation, session or segment.
        """
        for amu in amus:
            src = amu.source
            if (src.conversation_id, src.session_id, src.segment) != (record.conversation_id, record.session_id,
                                                                      record.seq):
                raise ValueError(f"AMU {amu.id!r} belongs to {src.conversation_id!r} {src.session_id!r} segment "
                                 f"{src.segment}, not to {record.conversation_id!r} {record.session_id!r} "
                                 f"segment {record.seq}")
        with self._transaction() as db:
            if self.segment(record.conversation_id, record.seq) is not None:
                raise ValueError(f"segment {record.seq} of {record.conversation_id!r} is already stored")
            db.executemany(
                "INSERT INTO turns (conversation_id, session_id, turn_id, speaker, text, session_time, "
                "image_caption) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(t.conversation_id, t.session_id, t.turn_id, t.speaker, t.text,
                  t.session_time.isoformat() if t.session_time else None, t.image_caption) for t in turns],
            )
            for amu in amus:
                self._insert_amu(db, amu)
            db.execute(
                "INSERT INTO segments (conversation_id, seq, session_id, turn_ids, reason, state, fallback, "
                "amu_count) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (record.conversation_id, record.seq, record.session_id, json.dumps(list(record.turn_ids)),
                 record.reason, record.state, int(record.fallback), len(amus)),
            )

    @staticmethod
    def _insert_amu(db: sqlite3.Connection, amu: AMU) -> None:
        src = amu.source
        cursor = db.execute(
            f"INSERT INTO amus ({_AMU_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (amu.id, src.conversation_id, src.session_id, src.segment, amu.text, amu.memory_type,
             amu.observed_at, json.dumps(amu.timestamps), json.dumps(amu.entities), json.dumps(amu.tags),
             json.dumps(src.turn_ids), json.dumps(src.speakers),
             None if amu.fingerprint is None else json.dumps(amu.fingerprint), int(amu.archived)),
        )
        position = cursor.lastrowid
        db.executemany("INSERT INTO amu_entities (amu, entity) VALUES (?, ?)",
                       [(position, entity.casefold()) for entity in set(amu.entities)])
        times = ([amu.observed_at] if amu.observed_at else []) + list(amu.timestamps)
        db.executemany("INSERT INTO amu_times (amu, start, end) VALUES (?, ?, ?)",
                       [(position, *map(iso_text, time_interval(value))) for value in times])

    def archive(self, amu_ids: Iterable[str]) -> None:
        """Mark units as archived (retired by consolidation); they stay readable."""
        ids = list(amu_ids)
        with self._transaction() as db:
            for unit_id in ids:
                if db.execute("UPDATE amus SET archived = 1 WHERE id = ?", (unit_id,)).rowcount != 1:
                    raise KeyError(f"no AMU with id {unit_id!r}")

    def set_fingerprints(self, fingerprints: Mapping[str, Sequence[int]]) -> None:
        """Replace the fingerprints of existing units (e.g. after exporting a new fingerprinter)."""
        with self._transaction() as db:
            for unit_id, sequence in fingerprints.items():
                value = json.dumps([int(code) for code in sequence])
                if db.execute("UPDATE amus SET fingerprint = ? WHERE id = ?", (value, unit_id)).rowcount != 1:
                    raise KeyError(f"no AMU with id {unit_id!r}")

    # -- reads ---------------------------------------------------------------------------------

    def get(self, amu_id: str) -> AMU:
        """The unit with this id; ``KeyError`` if there is none."""
        row = self._db.execute(f"SELECT {_AMU_COLUMNS} FROM amus WHERE id = ?", (amu_id,)).fetchone()
        if row is None:
            raise KeyError(f"no AMU with id {amu_id!r}")
        return _amu_from_row(row)

    def amus(self, conversation_id: str | None = None, *, include_archived: bool = False) -> Iterator[AMU]:
        """All units (of one conversation), in insertion order."""
        where, params = self._filters(conversation_id=conversation_id, include_archived=include_archived)
        return self._select(where, params)

    def by_session(self, conversation_id: str, session_id: str, *, include_archived: bool = False) -> list[AMU]:
        where, params = self._filters(conversation_id=conversation_id, include_archived=include_archived)
        return list(self._select(where + ["session_id = ?"], params + [session_id]))

    def by_segment(self, conversation_id: str, seq: int) -> list[AMU]:
        """The units extracted from one segment (LycheeMemory's event frame), archived included."""
        return list(self._select(["conversation_id = ?", "segment = ?"], [conversation_id, seq]))

    def by_entity(self, entity: str, *, include_archived: bool = False) -> list[AMU]:
        """Units listing this entity (case-insensitive exact match)."""
        where, params = self._filters(include_archived=include_archived)
        where.append("position IN (SELECT amu FROM amu_entities WHERE entity = ?)")
        return list(self._select(where, params + [entity.casefold()]))

    def in_time_range(self, start: str, end: str, *, include_archived: bool = False) -> list[AMU]:
        """Units whose observation time or any timestamp overlaps [start, end].

        ``start`` and ``end`` are ISO values of any precision: ``in_time_range("2023-05",
        "2023-05")`` is the whole of May 2023.
        """
        low, high = time_interval(start)[0], time_interval(end)[1]
        where, params = self._filters(include_archived=include_archived)
        where.append("position IN (SELECT amu FROM amu_times WHERE start <= ? AND end >= ?)")
        return list(self._select(where, params + [iso_text(high), iso_text(low)]))

    def count(self, conversation_id: str | None = None, *, include_archived: bool = True) -> int:
        where, params = self._filters(conversation_id=conversation_id, include_archived=include_archived)
        sql = "SELECT COUNT(*) FROM amus" + (" WHERE " + " AND ".join(where) if where else "")
        return self._db.execute(sql, params).fetchone()[0]

    def conversations(self) -> list[str]:
        """Conversation ids with at least one committed segment, in ingestion order."""
        rows = self._db.execute(
            "SELECT conversation_id FROM segments GROUP BY conversation_id ORDER BY MIN(rowid)"
        )
        return [row[0] for row in rows]

    def segment(self, conversation_id: str, seq: int) -> SegmentRecord | None:
        row = self._db.execute(
            "SELECT * FROM segments WHERE conversation_id = ? AND seq = ?", (conversation_id, seq)
        ).fetchone()
        return None if row is None else _segment_from_row(row)

    def segments(self, conversation_id: str) -> list[SegmentRecord]:
        rows = self._db.execute(
            "SELECT * FROM segments WHERE conversation_id = ? ORDER BY seq", (conversation_id,)
        )
        return [_segment_from_row(row) for row in rows]

    def turn(self, conversation_id: str, turn_id: str) -> Turn:
        """The stored raw turn; ``KeyError`` if unknown."""
        row = self._db.execute(
            "SELECT * FROM turns WHERE conversation_id = ? AND turn_id = ?", (conversation_id, turn_id)
        ).fetchone()
        if row is None:
            raise KeyError(f"no turn {turn_id!r} in conversation {conversation_id!r}")
        return Turn(row["conversation_id"], row["session_id"], row["turn_id"], row["speaker"], row["text"],
                    datetime.fromisoformat(row["session_time"]) if row["session_time"] else None,
                    row["image_caption"])

    def source_turns(self, amu: AMU) -> list[Turn]:
        """Resolve an AMU's source pointer to the original turns."""
        return [self.turn(amu.source.conversation_id, turn_id) for turn_id in amu.source.turn_ids]

    def _filters(self, *, conversation_id: str | None = None,
                 include_archived: bool = False) -> tuple[list[str], list[Any]]:
        where: list[str] = []
        params: list[Any] = []
        if conversation_id is not None:
            where.append("conversation_id = ?")
            params.append(conversation_id)
        if not include_archived:
            where.append("archived = 0")
        return where, params

    def _select(self, where: list[str], params: list[Any]) -> Iterator[AMU]:
        sql = f"SELECT {_AMU_COLUMNS} FROM amus"
        if where:
            sql += " WHERE " + " AND ".join(where)
        for row in self._db.execute(sql + " ORDER BY position", params).fetchall():
            yield _amu_from_row(row)


def _amu_from_row(row: sqlite3.Row) -> AMU:
    fingerprint = row["fingerprint"]
    return AMU(
        id=row["id"],
        text=row["text"],
        memory_type=row["memory_type"],
        source=SourcePointer(row["conversation_id"], row["session_id"], tuple(json.loads(row["turn_ids"])),
                             tuple(json.loads(row["speakers"])), row["segment"]),
        observed_at=row["observed_at"],
        timestamps=tuple(json.loads(row["timestamps"])),
        entities=tuple(json.loads(row["entities"])),
        tags=tuple(json.loads(row["tags"])),
        fingerprint=None if fingerprint is None else tuple(json.loads(fingerprint)),
        archived=bool(row["archived"]),
    )


def _segment_from_row(row: sqlite3.Row) -> SegmentRecord:
    return SegmentRecord(row["conversation_id"], row["seq"], row["session_id"], tuple(json.loads(row["turn_ids"])),
                         row["reason"], row["state"], bool(row["fallback"]), row["amu_count"])
