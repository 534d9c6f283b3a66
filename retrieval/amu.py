"""Atomic memory units (AMUs) and their durable, append-only SQLite store.

An AMU (MemCode key design 1, record schema of LycheeMemory Table 12; SPEC section 5) is one
self-contained fact: pronouns and relative dates already resolved, absolute times attached,
and a source pointer back to the original dialogue turns (MemCode's Lambda_src), so that the
raw context can always be recovered. The store keeps the raw turns beside the units and records
ingestion progress per conversation: a segment's turns, its units and its progress row commit
in one transaction, so a crash loses at most the segment being processed.
"""

from __future__ import annotations

import calendar
import json
import re
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

MEMORY_TYPES = (
    "fact", "preference", "event", "constraint", "procedure", "failure_pattern", "tool_affordance",
)
"""The finite memory-type schema of LycheeMemory section 3.3 / Table 12."""


class AMUValidationError(ValueError):
    """A record does not satisfy the AMU schema; the message names the offending field."""


class InputFormatError(ValueError):
    """An input file (LoCoMo JSON, JSONL turn stream) is malformed; the message names file and place."""


# ---------------------------------------------------------------------------------------------
# Time values
# ---------------------------------------------------------------------------------------------

_YEAR = re.compile(r"^(\d{4})$")
_MONTH = re.compile(r"^(\d{4})-(\d{2})$")
_WEEK = re.compile(r"^(\d{4})-W(\d{2})$")
_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def time_interval(value: str) -> tuple[datetime, datetime]:
    """The closed interval of naive (UTC) datetimes an ISO 8601 time value covers.

    Accepted forms: year ``2023``, month ``2023-05``, ISO week ``2023-W18``, day ``2023-05-07``,
    datetime ``2023-05-08T13:56:00`` (an offset is converted to UTC), and intervals ``A/B`` of
    those. Reduced precision is how an AMU says "last month" without inventing a day.
    Raises ``ValueError`` for anything else.
    """
    if "/" in value:
        first, _, second = value.partition("/")
        start, end = time_interval(first)[0], time_interval(second)[1]
        if end < start:
            raise ValueError(f"interval {value!r} ends before it starts")
        return start, end
    try:
        if match := _YEAR.match(value):
            year = int(match[1])
            return datetime(year, 1, 1), _end_of_day(date(year, 12, 31))
        if match := _MONTH.match(value):
            year, month = int(match[1]), int(match[2])
            last = calendar.monthrange(year, month)[1]
            return datetime(year, month, 1), _end_of_day(date(year, month, last))
        if match := _WEEK.match(value):
            monday = date.fromisocalendar(int(match[1]), int(match[2]), 1)
            return datetime.combine(monday, datetime.min.time()), _end_of_day(monday + timedelta(days=6))
        if _DAY.match(value):
            day = date.fromisoformat(value)
            return datetime.combine(day, datetime.min.time()), _end_of_day(day)
        moment = datetime.fromisoformat(value)
    except ValueError as err:
        raise ValueError(f"{value!r} is not a valid ISO 8601 time value ({err})") from None
    if moment.tzinfo is not None:
        moment = moment.astimezone(timezone.utc).replace(tzinfo=None)
    return moment, moment


def _end_of_day(day: date) -> datetime:
    return datetime.combine(day, datetime.max.time())


def _iso(moment: datetime) -> str:
    # Fixed-width strings compare in time order, which the SQL range query relies on.
    return moment.isoformat(timespec="microseconds")


# ---------------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """One raw dialogue turn, as ingested and as stored for source-pointer lookups."""

    conversation_id: str
    session_id: str
    turn_id: str
    speaker: str
    text: str
    session_time: datetime | None = None
    image_caption: str | None = None

    def render(self) -> str:
        """``"Speaker: text [shares an image: caption]"``: the raw-turn form used for embedding,
        prompts and the raw-turn fallback AMUs."""
        caption = f" [shares an image: {self.image_caption}]" if self.image_caption else ""
        return f"{self.speaker}: {self.text}{caption}"


@dataclass(frozen=True)
class SourcePointer:
    """Where an AMU came from (MemCode Lambda_src): conversation, session, turn ids (LoCoMo
    dia_ids), the speakers of those turns (their role in the dialogue) and the segment index."""

    conversation_id: str
    session_id: str
    turn_ids: tuple[str, ...]
    speakers: tuple[str, ...] = ()
    segment: int | None = None


_STRING_LIST = {"type": "array", "items": {"type": "string", "minLength": 1}}

AMU_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["id", "text", "memory_type", "source", "timestamps", "entities", "tags", "archived"],
    "properties": {
        "id": {"type": "string", "minLength": 1},
        "text": {"type": "string", "minLength": 1, "pattern": r"\S"},
        "memory_type": {"enum": list(MEMORY_TYPES)},
        "observed_at": {"type": ["string", "null"]},
        "timestamps": _STRING_LIST,
        "entities": _STRING_LIST,
        "tags": _STRING_LIST,
        "source": {
            "type": "object",
            "required": ["conversation_id", "session_id", "turn_ids", "speakers"],
            "properties": {
                "conversation_id": {"type": "string", "minLength": 1},
                "session_id": {"type": "string", "minLength": 1},
                "turn_ids": {**_STRING_LIST, "minItems": 1},
                "speakers": _STRING_LIST,
                "segment": {"type": ["integer", "null"], "minimum": 0},
            },
        },
        "fingerprint": {"type": ["array", "null"], "items": {"type": "integer", "minimum": 0}},
        "archived": {"type": "boolean"},
    },
}
"""JSON schema of :meth:`AMU.to_dict`; every AMU is checked against it on construction."""

_AMU_VALIDATOR = Draft202012Validator(AMU_SCHEMA)


def amu_id(conversation_id: str, segment: int, index: int) -> str:
    """Deterministic AMU id: the k-th unit of a conversation's n-th segment."""
    return f"{conversation_id}:{segment}:{index}"


@dataclass(frozen=True)
class AMU:
    """An atomic memory unit.

    ``observed_at`` is when the fact was stated (the session time, ISO datetime); ``timestamps``
    are the absolute event or validity times it mentions (ISO values of :func:`time_interval`).
    ``fingerprint`` is the ISQ code sequence S_fp(text) when a fingerprinter was used.
    Sequences may be passed as lists; they are stored as tuples. Invalid values raise
    :class:`AMUValidationError` naming the field.
    """

    id: str
    text: str
    memory_type: str
    source: SourcePointer
    observed_at: str | None = None
    timestamps: tuple[str, ...] = ()
    entities: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    fingerprint: tuple[int, ...] | None = None
    archived: bool = False

    def __post_init__(self) -> None:
        error = best_match(_AMU_VALIDATOR.iter_errors(self.to_dict()))
        if error is not None:
            where = ".".join(str(part) for part in error.path) or "(record)"
            raise AMUValidationError(f"AMU {self.id!r}: field {where!r}: {error.message}")
        for name in ("observed_at", "timestamps"):
            values = getattr(self, name)
            for value in [values] if isinstance(values, str) else values or ():
                try:
                    time_interval(value)
                except ValueError as err:
                    raise AMUValidationError(f"AMU {self.id!r}: field {name!r}: {err}") from None
        # Freeze the sequences only after validation, so a bare string is rejected, not split.
        for name in ("timestamps", "entities", "tags"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.fingerprint is not None:
            object.__setattr__(self, "fingerprint", tuple(int(code) for code in self.fingerprint))
        source = self.source
        object.__setattr__(self, "source", SourcePointer(
            source.conversation_id, source.session_id, tuple(source.turn_ids), tuple(source.speakers),
            source.segment,
        ))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready form (lists for sequences)."""
        source = self.source
        return {
            "id": self.id,
            "text": self.text,
            "memory_type": self.memory_type,
            "observed_at": self.observed_at,
            "timestamps": _listed(self.timestamps),
            "entities": _listed(self.entities),
            "tags": _listed(self.tags),
            "source": {
                "conversation_id": source.conversation_id,
                "session_id": source.session_id,
                "turn_ids": _listed(source.turn_ids),
                "speakers": _listed(source.speakers),
                "segment": source.segment,
            },
            "fingerprint": None if self.fingerprint is None else _listed(self.fingerprint),
            "archived": self.archived,
        }


def _listed(value: Any) -> Any:
    """Lists for list/tuple values; anything else unchanged, so the schema can reject it."""
    return list(value) if isinstance(value, (list, tuple)) else value


@dataclass(frozen=True)
class SegmentRecord:
    """The progress marker of one ingested segment. ``state`` is the extractor's disambiguation
    state after the segment (LycheeMemory eq. 5), kept so that a resumed run rebuilds the same
    reference context."""

    conversation_id: str
    seq: int
    session_id: str
    turn_ids: tuple[str, ...]
    reason: str
    state: str = ""
    fallback: bool = False
    amu_count: int = 0


# ---------------------------------------------------------------------------------------------
# Store
# ---------------------------------------------------------------------------------------------

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
                       [(position, *map(_iso, time_interval(value))) for value in times])

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
        return list(self._select(where, params + [_iso(high), _iso(low)]))

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


__all__ = [
    "AMU", "AMUStore", "AMUValidationError", "AMU_SCHEMA", "InputFormatError", "MEMORY_TYPES", "SegmentRecord",
    "SourcePointer", "Turn", "amu_id", "time_interval",
]
