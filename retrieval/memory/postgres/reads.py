"""Reading records, segments and raw turns back from the PostgreSQL store, in insertion order (the
SQLite store's :mod:`retrieval.memory.reads`; rows are read back by its converters, the
``user_id`` column named as they expect it)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from retrieval.memory.reads import amu_from_row, amus_from_rows, segment_from_row, turn_from_row
from retrieval.memory.records import AMU, SegmentRecord, Turn

if TYPE_CHECKING:
    from retrieval.memory.postgres.database import Database

AMU_FIELDS = ("id", "user_id", "session_id", "segment", "text", "memory_type", "observed_at", "timestamps",
              "entities", "tags", "turn_ids", "speakers", "fingerprint", "archived", "t_ref", "valid_from",
              "valid_to")
"""The columns of a record, in the order :func:`retrieval.memory.postgres.writes.amu_values` gives them."""

AMU_COLUMNS = ", ".join("user_id AS conversation_id" if name == "user_id" else name for name in AMU_FIELDS)
TURN_COLUMNS = ("position, user_id AS conversation_id, session_id, turn_id, speaker, text, session_time, "
                "image_caption")
SEGMENT_COLUMNS = ("user_id AS conversation_id, seq, session_id, turn_ids, reason, state, fallback, "
                   "amu_count, content_sha256, revision, flushed_after")


def turns_of(rows: list[Any]) -> list[Turn]:
    return [turn_from_row(row) for row in rows]


class Reads:
    """The read side of records, segments and raw turns."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def get(self, amu_id: str, user_id: str | None = None) -> AMU:
        sql, params = f"SELECT {AMU_COLUMNS} FROM amus WHERE id = %s", [amu_id]
        if user_id is not None:
            sql, params = sql + " AND user_id = %s", [amu_id, user_id]
        row = self.db.row(sql, params)
        if row is None:
            raise KeyError(f"no AMU with id {amu_id!r}")
        return amu_from_row(row)

    def amus(self, user_id: str | None = None, *, include_archived: bool = False) -> Iterator[AMU]:
        where, params = self.filters(user_id=user_id, include_archived=include_archived)
        return self.select(where, params)

    def successors(self, user_id: str | None = None) -> dict[str, str]:
        where, params = self.filters(user_id=user_id, include_archived=True)
        where.append("successor IS NOT NULL")
        rows = self.db.rows(f"SELECT id, successor FROM amus WHERE {' AND '.join(where)} ORDER BY position",
                            params)
        return {row["id"]: row["successor"] for row in rows}

    def by_segment(self, user_id: str, seq: int) -> list[AMU]:
        return list(self.select(["user_id = %s", "segment = %s"], [user_id, seq]))

    def count(self, user_id: str | None = None, *, include_archived: bool = True) -> int:
        where, params = self.filters(user_id=user_id, include_archived=include_archived)
        sql = "SELECT count(*) AS n FROM amus" + (" WHERE " + " AND ".join(where) if where else "")
        return int(self.db.value(sql, params))

    def users_with_segments(self) -> list[str]:
        rows = self.db.rows("SELECT user_id FROM segments GROUP BY user_id ORDER BY min(position)")
        return [row["user_id"] for row in rows]

    def segment(self, user_id: str, seq: int) -> SegmentRecord | None:
        row = self.db.row(f"SELECT {SEGMENT_COLUMNS} FROM segments WHERE user_id = %s AND seq = %s",
                          (user_id, seq))
        return None if row is None else segment_from_row(row)

    def segments(self, user_id: str) -> list[SegmentRecord]:
        rows = self.db.rows(f"SELECT {SEGMENT_COLUMNS} FROM segments WHERE user_id = %s ORDER BY seq",
                            (user_id,))
        return [segment_from_row(row) for row in rows]

    def turn(self, user_id: str, turn_id: str) -> Turn:
        row = self.db.row(f"SELECT {TURN_COLUMNS} FROM turns WHERE user_id = %s AND turn_id = %s",
                          (user_id, turn_id))
        if row is None:
            raise KeyError(f"no turn {turn_id!r} in conversation {user_id!r}")
        return turn_from_row(row)

    def turns(self, user_id: str) -> list[Turn]:
        return turns_of(self.db.rows(f"SELECT {TURN_COLUMNS} FROM turns WHERE user_id = %s ORDER BY position",
                                     (user_id,)))

    def turns_named(self, user_id: str, turn_ids: Sequence[str]) -> list[Turn]:
        """The stored turns of these ids, in the order given; ``KeyError`` naming the first unknown one."""
        rows = self.db.rows(f"SELECT {TURN_COLUMNS} FROM turns WHERE user_id = %s AND turn_id = ANY(%s)",
                            (user_id, list(turn_ids)))
        found = {turn.turn_id: turn for turn in turns_of(rows)}
        for turn_id in turn_ids:
            if turn_id not in found:
                raise KeyError(f"no turn {turn_id!r} in conversation {user_id!r}")
        return [found[turn_id] for turn_id in turn_ids]

    def source_turns(self, amu: AMU) -> list[Turn]:
        return self.turns_named(amu.source.user_id, amu.source.turn_ids)

    def page(self, user_id: str, *, session_id: str | None = None, after: int = 0,
             limit: int) -> list[tuple[int, AMU]]:
        where, params = self.filters(user_id=user_id)
        if session_id is not None:
            where, params = where + ["session_id = %s"], params + [session_id]
        rows = self.db.rows(f"SELECT position, {AMU_COLUMNS} FROM amus WHERE {' AND '.join(where)} AND "
                            "position > %s ORDER BY position LIMIT %s", [*params, after, limit])
        return [(int(row["position"]), amu_from_row(row)) for row in rows]

    def successor(self, amu_id: str) -> str | None:
        row = self.db.row("SELECT successor FROM amus WHERE id = %s", (amu_id,))
        return None if row is None else row["successor"]

    @staticmethod
    def filters(*, user_id: str | None = None, include_archived: bool = False) -> tuple[list[str], list[Any]]:
        """WHERE clauses (and their parameters) for one user's records, the active ones by default."""
        where: list[str] = []
        params: list[Any] = []
        if user_id is not None:
            where.append("user_id = %s")
            params.append(user_id)
        if not include_archived:
            where.append("NOT archived")
        return where, params

    def select(self, where: list[str], params: list[Any]) -> Iterator[AMU]:
        """The records matching ``where``, in insertion order."""
        sql = f"SELECT {AMU_COLUMNS} FROM amus" + (" WHERE " + " AND ".join(where) if where else "")
        yield from amus_from_rows(self.db.rows(sql + " ORDER BY position", params))
