"""Writing records and segments (a part of :class:`retrieval.memory.store.AMUStore`): a
segment's raw turns, its records and its progress row commit in one transaction, so a crash loses
at most the segment being processed; a retried extraction archives what it replaces; archiving and
consolidation's pointer forwarding. Every record is inserted by :func:`insert_amu`, which also
links it to its evidence nodes in that transaction (:mod:`retrieval.memory.indexing`; triggers
keep the FTS5 table in step and drop what :meth:`RecordWrites.archive` retires), so a new write
path should insert through it.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence

from retrieval.memory.connection import SQLiteConnection
from retrieval.memory.indexing import add_event_frame, index_amu
from retrieval.memory.meta_keys import MERGE_KEY
from retrieval.memory.reads import AMU_COLUMNS, StoreReads
from retrieval.memory.records import AMU, SegmentRecord, Turn
from retrieval.memory.row_rules import check_sources
from retrieval.memory.schema import turns_sha256
from retrieval.memory.sqlite_part import SQLitePart
from retrieval.memory.times import iso_text, time_interval
from retrieval.memory.turn_log import insert_turns


def insert_amu(db: sqlite3.Connection, amu: AMU, position: int | None = None) -> None:
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
                   [(position, entity.casefold()) for entity in dict.fromkeys(amu.entities)])
    times = ([amu.observed_at] if amu.observed_at else []) + list(amu.timestamps)
    db.executemany("INSERT INTO amu_times (amu, start, end) VALUES (?, ?, ?)",
                   [(position, *map(iso_text, time_interval(value))) for value in times])
    index_amu(db, position, amu)


class RecordWrites(SQLitePart):
    """The write side of records and segments; ``reads`` checks what is stored already."""

    def __init__(self, connection: SQLiteConnection, reads: StoreReads) -> None:
        super().__init__(connection)
        self._reads = reads

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
            check_sources(record, amus)
        with self._transaction() as db:
            for record, turns, amus in segments:
                if self._reads.segment(record.user_id, record.seq) is not None:
                    raise ValueError(f"segment {record.seq} of {record.user_id!r} is already stored")
                insert_turns(db, turns)
                self._insert_segment(db, record, turns, amus)

    def commit_stored_turns(self, record: SegmentRecord, amus: Sequence[AMU]) -> None:
        """:meth:`commit_segment` for a segment whose raw turns the store already holds (the online
        API stores each turn when it is added): its AMUs and progress row in one transaction."""
        check_sources(record, amus)
        with self._transaction() as db:
            if self._reads.segment(record.user_id, record.seq) is not None:
                raise ValueError(f"segment {record.seq} of {record.user_id!r} is already stored")
            turns = [self._reads.turn(record.user_id, turn_id) for turn_id in record.turn_ids]
            self._insert_segment(db, record, turns, amus)

    def _insert_segment(self, db: sqlite3.Connection, record: SegmentRecord, turns: Sequence[Turn],
                        amus: Sequence[AMU]) -> None:
        add_event_frame(db, record.user_id, record.seq, record.session_id, record.turn_ids)
        for amu in amus:
            insert_amu(db, amu)
        db.execute(
            "INSERT INTO segments (conversation_id, seq, session_id, turn_ids, reason, state, fallback, "
            "amu_count, content_sha256, revision, flushed_after) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?)",
            (record.user_id, record.seq, record.session_id, json.dumps(list(record.turn_ids)),
             record.reason, record.state, int(record.fallback), len(amus), turns_sha256(turns),
             record.flushed_after),
        )

    def replace_extraction(self, record: SegmentRecord, amus: Sequence[AMU]) -> None:
        """A retried extraction of a stored segment (e.g. one that fell back to raw turns while the
        LLM endpoint was down): in one transaction the segment's current AMUs are archived (never
        deleted), ``amus`` (ids of revision ``record.revision``) are inserted and the progress
        row takes the new state, fallback flag, count and revision."""
        check_sources(record, amus)
        stored = self._reads.segment(record.user_id, record.seq)
        if stored is None or record.revision <= stored.revision:
            raise ValueError(f"segment {record.seq} of {record.user_id!r}: "
                             f"revision {record.revision} does not follow the stored one")
        with self._transaction() as db:
            db.execute("UPDATE amus SET archived = 1 WHERE conversation_id = ? AND segment = ? "
                       "AND archived = 0",
                       (record.user_id, record.seq))
            for amu in amus:
                insert_amu(db, amu)
            db.execute("UPDATE segments SET state = ?, fallback = ?, amu_count = ?, revision = ? "
                       "WHERE conversation_id = ? AND seq = ?",
                       (record.state, int(record.fallback), len(amus), record.revision,
                        record.user_id, record.seq))

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
        (through :func:`insert_amu`, so the indexes follow), archive ``archived_ids`` with
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
            insert_amu(db, merged)
            db.executemany("UPDATE amus SET archived = 1, successor = ? WHERE id = ?",
                           [(merged.id, i) for i in ids])
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                       (MERGE_KEY.format(merged.id), json.dumps({"operation": operation})))
        return True

