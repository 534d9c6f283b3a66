"""Reading memory records back from the store: records by conversation or segment, segments, raw
turns and source pointers. A part of :class:`retrieval.memory.store.AMUStore` (over its
connection); every read returns records in insertion order.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from retrieval.memory.records import AMU, SegmentRecord, SourcePointer, Turn
from retrieval.memory.sqlite_part import SQLitePart

AMU_COLUMNS = (
    "id, conversation_id, session_id, segment, text, memory_type, observed_at, timestamps, "
    "entities, tags, turn_ids, speakers, fingerprint, archived, t_ref, valid_from, valid_to"
)

USER_POSITIONS = "position IN (SELECT position FROM amus WHERE conversation_id = ?)"
"""A conversation's records by position: its positions listed first (through the index on the
conversation), then its rows read by rowid in order; filtered through that index directly, the
rows would come in the index's order and be sorted again whole."""


class StoreReads(SQLitePart):
    """The read side of the AMU store."""


    def get(self, amu_id: str, user_id: str | None = None) -> AMU:
        """The record with this id (of ``user_id`` when given); ``KeyError`` if there is none. The
        user is part of the lookup, so another user's record costs what a missing one does: the
        time of a call tells nobody whether it exists."""
        sql, params = f"SELECT {AMU_COLUMNS} FROM amus WHERE id = ?", [amu_id]
        if user_id is not None:
            sql, params = sql + " AND conversation_id = ?", [amu_id, user_id]
        row = self._db.execute(sql, params).fetchone()
        if row is None:
            raise KeyError(f"no AMU with id {amu_id!r}")
        return amu_from_row(row)

    def amus(self, user_id: str | None = None, *, include_archived: bool = False) -> Iterator[AMU]:
        """All records (of one conversation, :data:`USER_POSITIONS`), in insertion order."""
        where, params = self._filters(include_archived=include_archived)
        if user_id is not None:
            where = [USER_POSITIONS, *where]
            params = [user_id, *params]
        return self._select(where, params)

    def successors(self, user_id: str | None = None) -> dict[str, str]:
        """Archived id -> the id of the AMU consolidation forwarded it to (pointer forwarding)."""
        where, params = self._filters(user_id=user_id, include_archived=True)
        where.append("successor IS NOT NULL")
        rows = self._db.execute(f"SELECT id, successor FROM amus WHERE {' AND '.join(where)} "
                                "ORDER BY position", params)
        return {row[0]: row[1] for row in rows.fetchall()}

    def by_segment(self, user_id: str, seq: int) -> list[AMU]:
        """The records extracted from one segment (LycheeMemory's event frame), archived included."""
        return list(self._select(["conversation_id = ?", "segment = ?"], [user_id, seq]))

    def count(self, user_id: str | None = None, *, include_archived: bool = True) -> int:
        where, params = self._filters(user_id=user_id, include_archived=include_archived)
        sql = "SELECT COUNT(*) FROM amus" + (" WHERE " + " AND ".join(where) if where else "")
        return self._db.execute(sql, params).fetchone()[0]

    def users_with_segments(self) -> list[str]:
        """Conversation ids with at least one committed segment, in ingestion order."""
        rows = self._db.execute(
            "SELECT conversation_id FROM segments GROUP BY conversation_id ORDER BY MIN(rowid)"
        )
        return [row[0] for row in rows]

    def segment(self, user_id: str, seq: int) -> SegmentRecord | None:
        row = self._db.execute(
            "SELECT * FROM segments WHERE conversation_id = ? AND seq = ?", (user_id, seq)
        ).fetchone()
        return None if row is None else segment_from_row(row)

    def segments(self, user_id: str) -> list[SegmentRecord]:
        rows = self._db.execute(
            "SELECT * FROM segments WHERE conversation_id = ? ORDER BY seq", (user_id,)
        )
        return [segment_from_row(row) for row in rows]

    def turn(self, user_id: str, turn_id: str) -> Turn:
        """The stored raw turn; ``KeyError`` if unknown."""
        row = self._db.execute(
            "SELECT * FROM turns WHERE conversation_id = ? AND turn_id = ?", (user_id, turn_id)
        ).fetchone()
        if row is None:
            raise KeyError(f"no turn {turn_id!r} in conversation {user_id!r}")
        return turn_from_row(row)

    def turns(self, user_id: str) -> list[Turn]:
        """The stored raw turns of a conversation, verbatim, in ingestion order."""
        rows = self._db.execute("SELECT * FROM turns WHERE conversation_id = ? ORDER BY position",
                                (user_id,))
        return [turn_from_row(row) for row in rows.fetchall()]

    def source_turns(self, amu: AMU) -> list[Turn]:
        """Resolve an AMU's source pointer to the original turns."""
        return [self.turn(amu.source.user_id, turn_id) for turn_id in amu.source.turn_ids]

    def page(self, user_id: str, *, session_id: str | None = None, after: int = 0,
             limit: int) -> list[tuple[int, AMU]]:
        """Up to ``limit`` active records of a conversation (one session) stored after position
        ``after``, with their positions: a stable cursor for paging."""
        where, params = self._filters(user_id=user_id)
        if session_id is not None:
            where, params = where + ["session_id = ?"], params + [session_id]
        rows = self._db.execute(f"SELECT position, {AMU_COLUMNS} FROM amus WHERE {' AND '.join(where)} AND "
                                "position > ? ORDER BY position LIMIT ?", [*params, after, limit]).fetchall()
        return [(row["position"], amu_from_row(row)) for row in rows]

    def successor(self, amu_id: str) -> str | None:
        row = self._db.execute("SELECT successor FROM amus WHERE id = ?", (amu_id,)).fetchone()
        return None if row is None else row[0]

    def _filters(self, *, user_id: str | None = None,
                 include_archived: bool = False) -> tuple[list[str], list[Any]]:
        where: list[str] = []
        params: list[Any] = []
        if user_id is not None:
            where.append("conversation_id = ?")
            params.append(user_id)
        if not include_archived:
            where.append("archived = 0")
        return where, params

    def _select(self, where: list[str], params: list[Any]) -> Iterator[AMU]:
        sql = f"SELECT {AMU_COLUMNS} FROM amus"
        if where:
            sql += " WHERE " + " AND ".join(where)
        yield from amus_from_rows(self._db.execute(sql + " ORDER BY position", params).fetchall())


def amu_from_row(row: Any) -> AMU:
    """The stored record of ``row`` (:func:`amus_from_rows` of one row)."""
    return amus_from_rows([row])[0]


JSON_LISTS = ("timestamps", "entities", "tags", "turn_ids", "speakers")
"""The record columns stored as JSON lists (besides ``fingerprint``, which may be NULL)."""


def amus_from_rows(rows: Sequence[Any]) -> list[AMU]:
    """The stored records of ``rows`` (each with the :data:`AMU_COLUMNS`), in order. Their fields
    were validated when they were constructed before insertion (the store writes only :class:`AMU`
    values), so reading them back skips the schema check, and each JSON column is decoded for all
    rows in one parse: a user's first search reads every record of the user."""
    if not rows:
        return []
    # A sqlite3.Row is a sequence of its values; a PostgreSQL row (psycopg's dict_row) a mapping.
    values = rows if isinstance(rows[0], sqlite3.Row) else [tuple(row.values()) for row in rows]
    column = dict(zip(rows[0].keys(), zip(*values, strict=True), strict=True))
    lists = {name: json_lists(column[name]) for name in JSON_LISTS}
    printed = iter(json_lists([codes for codes in column["fingerprint"] if codes is not None]))
    fingerprints = [None if codes is None else tuple(next(printed)) for codes in column["fingerprint"]]
    sources = [SourcePointer(user, session, tuple(turn_ids), tuple(speakers), segment)
               for user, session, turn_ids, speakers, segment in zip(
                   column["conversation_id"], column["session_id"], lists["turn_ids"], lists["speakers"],
                   column["segment"], strict=True)]
    return [stored_amu(id=amu_id, text=text, memory_type=memory_type, source=source, observed_at=observed_at,
                       timestamps=tuple(timestamps), entities=tuple(entities), tags=tuple(tags),
                       fingerprint=fingerprint, archived=bool(archived), t_ref=t_ref, valid_from=valid_from,
                       valid_to=valid_to)
            for (amu_id, text, memory_type, source, observed_at, timestamps, entities, tags, fingerprint,
                 archived, t_ref, valid_from, valid_to) in zip(
                column["id"], column["text"], column["memory_type"], sources, column["observed_at"],
                lists["timestamps"], lists["entities"], lists["tags"], fingerprints, column["archived"],
                column["t_ref"], column["valid_from"], column["valid_to"], strict=True)]


def json_lists(texts: Sequence[str]) -> list[Any]:
    """The JSON values ``texts`` hold (one JSON text each), parsed as one JSON array."""
    return json.loads("[" + ",".join(texts) + "]") if texts else []


def stored_amu(**fields: Any) -> AMU:
    """An :class:`AMU` of already validated, already frozen field values (every field given),
    made without running its validation."""
    amu = object.__new__(AMU)
    amu.__dict__.update(fields)
    return amu


def turn_from_row(row: sqlite3.Row) -> Turn:
    return Turn(row["conversation_id"], row["session_id"], row["turn_id"], row["speaker"], row["text"],
                datetime.fromisoformat(row["session_time"]) if row["session_time"] else None,
                row["image_caption"])


def segment_from_row(row: sqlite3.Row) -> SegmentRecord:
    return SegmentRecord(row["conversation_id"], row["seq"], row["session_id"],
                         tuple(json.loads(row["turn_ids"])),
                         row["reason"], row["state"], bool(row["fallback"]), row["amu_count"],
                         row["content_sha256"], row["revision"], row["flushed_after"])
