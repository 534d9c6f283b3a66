"""Committing segments and records to the PostgreSQL store (the SQLite store's write side,
:class:`retrieval.memory.store.AMUStore`): a segment's turns, records, event frame and progress row
in one transaction under its user's lock, so "already stored" is checked once however many
processes commit; archiving and pointer forwarding the same way. Every record is inserted by
:func:`insert_amu`, with its entity, time and evidence rows."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from retrieval.memory.meta_keys import MERGE_KEY
from retrieval.memory.postgres.evidence import add_event_frame, index_amu
from retrieval.memory.postgres.reads import AMU_FIELDS, Reads
from retrieval.memory.postgres.turn_log import insert_turns
from retrieval.memory.records import AMU, SegmentRecord, Turn
from retrieval.memory.row_rules import check_sources
from retrieval.memory.schema import turns_sha256
from retrieval.memory.times import iso_text, time_interval

if TYPE_CHECKING:
    from retrieval.memory.postgres.database import Connection, Database

_FIELDS, _MARKS = ", ".join(AMU_FIELDS), ", ".join(["%s"] * len(AMU_FIELDS))
_INSERT_AMU = f"INSERT INTO amus ({_FIELDS}) VALUES ({_MARKS}) RETURNING position"
_INSERT_AMU_AT = f"INSERT INTO amus (position, {_FIELDS}) VALUES (%s, {_MARKS}) RETURNING position"


def amu_values(amu: AMU) -> tuple[Any, ...]:
    """The record's column values, in :data:`AMU_FIELDS` order."""
    src = amu.source
    return (amu.id, src.user_id, src.session_id, src.segment, amu.text, amu.memory_type, amu.observed_at,
            json.dumps(amu.timestamps), json.dumps(amu.entities), json.dumps(amu.tags),
            json.dumps(src.turn_ids), json.dumps(src.speakers),
            None if amu.fingerprint is None else json.dumps(amu.fingerprint), amu.archived,
            amu.t_ref, amu.valid_from, amu.valid_to)


def insert_amu(conn: Connection, amu: AMU, position: int | None = None) -> None:
    """Insert ``amu`` with its index rows, at the next position or at ``position`` (a purge
    restoring an archived record in place)."""
    if position is None:
        found = conn.execute(_INSERT_AMU, amu_values(amu)).fetchone()  # type: ignore[arg-type]
    else:
        found = conn.execute(_INSERT_AMU_AT, (position, *amu_values(amu))).fetchone()  # type: ignore[arg-type]
    assert found is not None  # RETURNING gives the row
    position = int(found["position"])
    user = amu.source.user_id
    cursor = conn.cursor()
    cursor.executemany("INSERT INTO amu_entities (user_id, amu, entity) VALUES (%s, %s, %s)",
                       [(user, position, entity.casefold()) for entity in dict.fromkeys(amu.entities)])
    times = ([amu.observed_at] if amu.observed_at else []) + list(amu.timestamps)
    cursor.executemany("INSERT INTO amu_times (user_id, amu, start_time, end_time) VALUES (%s, %s, %s, %s)",
                       [(user, position, *map(iso_text, time_interval(value))) for value in times])
    index_amu(conn, position, amu)


class Writes:
    """Segments, records, archiving and pointer forwarding."""

    def __init__(self, db: Database, reads: Reads) -> None:
        self.db, self.reads = db, reads

    def commit_segment(self, record: SegmentRecord, turns: Sequence[Turn], amus: Sequence[AMU]) -> None:
        """:meth:`commit_segments` of one segment."""
        self.commit_segments([(record, turns, amus)])

    def commit_segments(self,
                        segments: Sequence[tuple[SegmentRecord, Sequence[Turn], Sequence[AMU]]]) -> None:
        """Several segments (their turns, records and progress rows) in one transaction: all or none."""
        for record, _, amus in segments:
            check_sources(record, amus)
        with self.db.transaction({record.user_id for record, _, _ in segments}) as conn:
            for record, turns, amus in segments:
                self._refuse_stored(record)
                insert_turns(conn, turns)
                self._insert_segment(conn, record, turns, amus)

    def commit_stored_turns(self, record: SegmentRecord, amus: Sequence[AMU]) -> None:
        """A segment whose raw turns the store holds already: its records and progress row."""
        check_sources(record, amus)
        with self.db.transaction([record.user_id]) as conn:
            self._refuse_stored(record)
            turns = self.reads.turns_named(record.user_id, record.turn_ids)
            self._insert_segment(conn, record, turns, amus)

    def _refuse_stored(self, record: SegmentRecord) -> None:
        if self.reads.segment(record.user_id, record.seq) is not None:
            raise ValueError(f"segment {record.seq} of {record.user_id!r} is already stored")

    @staticmethod
    def _insert_segment(conn: Connection, record: SegmentRecord, turns: Sequence[Turn],
                        amus: Sequence[AMU]) -> None:
        add_event_frame(conn, record.user_id, record.seq, record.session_id, record.turn_ids)
        for amu in amus:
            insert_amu(conn, amu)
        conn.execute("INSERT INTO segments (user_id, seq, session_id, turn_ids, reason, state, fallback, "
                     "amu_count, content_sha256, revision, flushed_after) "
                     "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, 0, %s)",
                     (record.user_id, record.seq, record.session_id, json.dumps(list(record.turn_ids)),
                      record.reason, record.state, record.fallback, len(amus), turns_sha256(turns),
                      record.flushed_after))

    def replace_extraction(self, record: SegmentRecord, amus: Sequence[AMU]) -> None:
        """A retried extraction: the segment's current records archived, ``amus`` inserted and the
        progress row updated, in one transaction."""
        check_sources(record, amus)
        with self.db.transaction([record.user_id]) as conn:
            stored = self.reads.segment(record.user_id, record.seq)
            if stored is None or record.revision <= stored.revision:
                raise ValueError(f"segment {record.seq} of {record.user_id!r}: "
                                 f"revision {record.revision} does not follow the stored one")
            conn.execute("UPDATE amus SET archived = true WHERE user_id = %s AND segment = %s "
                         "AND NOT archived", (record.user_id, record.seq))
            for amu in amus:
                insert_amu(conn, amu)
            conn.execute("UPDATE segments SET state = %s, fallback = %s, amu_count = %s, revision = %s "
                         "WHERE user_id = %s AND seq = %s",
                         (record.state, record.fallback, len(amus), record.revision, record.user_id,
                          record.seq))

    def archive(self, amu_ids: Iterable[str]) -> None:
        """Mark records as archived (they stay readable and leave their evidence nodes)."""
        ids = list(amu_ids)
        rows = self.db.rows("SELECT user_id FROM amus WHERE id = ANY(%s)", (ids,))
        users = {row["user_id"] for row in rows}
        with self.db.transaction(users) as conn:
            for unit_id in ids:
                if conn.execute("UPDATE amus SET archived = true WHERE id = %s", (unit_id,)).rowcount != 1:
                    raise KeyError(f"no AMU with id {unit_id!r}")

    def forward(self, archived_ids: Sequence[str], merged: AMU, operation: str) -> bool:
        """Pointer forwarding in one transaction (see the SQLite store's ``forward``); False, writing
        nothing, when one of ``archived_ids`` is no longer active."""
        ids = list(dict.fromkeys(archived_ids))
        if not ids or merged.id in ids or merged.archived:
            raise ValueError(f"forwarding {ids} to {merged.id!r}: need active AMUs other than the new one")
        with self.db.transaction([merged.source.user_id]) as conn:
            active = conn.execute("SELECT count(*) AS n FROM amus WHERE NOT archived AND user_id = %s "
                                  "AND id = ANY(%s)", (merged.source.user_id, ids)).fetchone()
            if active is None or active["n"] != len(ids):
                return False
            insert_amu(conn, merged)
            conn.cursor().executemany("UPDATE amus SET archived = true, successor = %s WHERE id = %s",
                                      [(merged.id, i) for i in ids])
            conn.execute("INSERT INTO meta (key, value) VALUES (%s, %s) ON CONFLICT (key) DO UPDATE "
                         "SET value = excluded.value",
                         (MERGE_KEY.format(merged.id), json.dumps({"operation": operation})))
        return True
