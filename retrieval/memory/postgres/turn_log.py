"""Raw turns stored the moment they are added, and the reads that feed the ingestion worker (the
SQLite store's :mod:`retrieval.memory.turn_log`): the turn log is the worker's queue."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from retrieval.memory.postgres.reads import TURN_COLUMNS
from retrieval.memory.records import BacklogRead, Turn
from retrieval.memory.row_rules import (
    bind_turn_ids,
    open_turns_first,
    renumber_taken,
    turns_after,
    unchanged_since_check,
)

if TYPE_CHECKING:
    from retrieval.memory.postgres.database import Connection, Database


def insert_turns(conn: Connection, turns: Sequence[Turn]) -> None:
    """Insert raw turns in the caller's transaction."""
    conn.cursor().executemany(
        "INSERT INTO turns (user_id, session_id, turn_id, speaker, text, session_time, image_caption) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s)",
        [(t.user_id, t.session_id, t.turn_id, t.speaker, t.text,
          t.stored_time(), t.image_caption) for t in turns])


class TurnLog:
    """The online write side of raw turns and the reads that rebuild open segments."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def append_turns(self, user: str, turns: Sequence[Turn], key: str | None = None,
                     known: Collection[str] | None = None, generated: Collection[str] = ()) -> list[Turn]:
        """Store the turns the user has not stored yet and ``key`` with the ids of all ``turns``, in
        one transaction (under the user's lock); returns the turns stored now. With ``known``, the
        SQLite store's check that nothing changed since the caller's (another node's add, say), and
        its renumbering of ``generated`` ids stored meanwhile."""
        with self.db.transaction([user]) as conn:
            stored = self.stored_turn_ids(user, [turn.turn_id for turn in turns])
            used = key is not None and self.idempotent_turn_ids(user, key) is not None
            unchanged_since_check(stored - set(generated), known, used)
            turns = renumber_taken(self, user, turns, generated, stored)
            new = list({turn.turn_id: turn for turn in turns if turn.turn_id not in stored}.values())
            insert_turns(conn, new)
            if key is not None:
                conn.execute("INSERT INTO idempotency (user_id, key, turn_ids) VALUES (%s, %s, %s)",
                             (user, key, json.dumps([turn.turn_id for turn in turns])))
        return new

    def bind_turn_ids(self, user: str, session: str, turns: Sequence[Any]) -> list[Turn]:
        """The turns (checked inputs) with ids (:func:`retrieval.memory.row_rules.bind_turn_ids`)."""
        return bind_turn_ids(self, user, session, turns)

    def idempotent_turn_ids(self, user: str, key: str) -> list[str] | None:
        row = self.db.row("SELECT turn_ids FROM idempotency WHERE user_id = %s AND key = %s", (user, key))
        return None if row is None else list(json.loads(row["turn_ids"]))

    def stored_turn_ids(self, user: str, turn_ids: Sequence[str]) -> set[str]:
        rows = self.db.rows("SELECT turn_id FROM turns WHERE user_id = %s AND turn_id = ANY(%s)",
                            (user, list(turn_ids)))
        return {row["turn_id"] for row in rows}

    def last_turn_number(self, user: str, session_id: str) -> int:
        """As the SQLite store's :meth:`retrieval.memory.turn_log.TurnLog.last_turn_number`."""
        return int(self.db.value(
            "SELECT greatest((SELECT count(*) FROM turns WHERE user_id = %s AND session_id = %s), "
            "(SELECT next_turn - 1 FROM purges WHERE user_id = %s))", (user, session_id, user)))

    def uncovered_turns(self, user: str) -> list[Turn]:
        return self.backlog(user)[0]

    def uncovered_turn_ids(self, user: str) -> set[str]:
        """The ids of :meth:`uncovered_turns` (as the SQLite store's)."""
        rows = self.db.rows("SELECT turn_id FROM turns WHERE user_id = %s EXCEPT SELECT "
                            "json_array_elements_text(turn_ids::json) FROM segments WHERE user_id = %s",
                            (user, user))
        return {row["turn_id"] for row in rows}

    def backlog(self, user: str, after: int | None = None, limit: int | None = None) -> BacklogRead:
        """The user's turns to feed to its segmentation, the highest position read and the turns a
        ``limit`` left (see the SQLite store's :meth:`retrieval.memory.turn_log.TurnLog.backlog`)."""
        if after is not None:
            rows = self.db.rows(f"SELECT {TURN_COLUMNS}, (SELECT count(*) FROM turns WHERE user_id = %s AND "
                                "position > %s) AS stored FROM turns WHERE user_id = %s AND position > %s "
                                "ORDER BY position LIMIT %s", (user, after, user, after, limit))
            return turns_after(rows, after)
        rows = self.db.rows(f"SELECT {TURN_COLUMNS} FROM turns WHERE user_id = %s ORDER BY position", (user,))
        uncovered = self.uncovered_turn_ids(user)  # after the turns: one added meanwhile is not read
        return open_turns_first(rows, uncovered, limit)

    def backlog_users(self) -> list[str]:
        """Users with more stored turns than their segments list, in order of their first turn."""
        rows = self.db.rows(
            "SELECT t.user_id FROM (SELECT user_id, count(*) AS n, min(position) AS first FROM turns "
            "GROUP BY user_id) t LEFT JOIN (SELECT user_id, sum(json_array_length(turn_ids::json)) AS n "
            "FROM segments GROUP BY user_id) s ON s.user_id = t.user_id WHERE t.n != coalesce(s.n, 0) "
            "ORDER BY t.first")
        return [row["user_id"] for row in rows]

    def next_seq(self, user: str) -> int:
        """As the SQLite store's :meth:`retrieval.memory.turn_log.TurnLog.next_seq`."""
        return int(self.db.value(
            "SELECT greatest((SELECT coalesce(max(seq) + 1, 0) FROM segments WHERE user_id = %s), "
            "(SELECT next_seq FROM purges WHERE user_id = %s))", (user, user)))

    def users(self) -> list[str]:
        rows = self.db.rows("SELECT user_id FROM turns GROUP BY user_id ORDER BY min(position)")
        return [row["user_id"] for row in rows]

    def has_user(self, user: str) -> bool:
        return self.db.row("SELECT 1 AS found FROM turns WHERE user_id = %s LIMIT 1", (user,)) is not None

    def holds_turns(self) -> bool:
        """As the SQLite store's :meth:`retrieval.memory.turn_log.TurnLog.holds_turns`."""
        return self.db.row("SELECT 1 AS found FROM turns LIMIT 1") is not None

    def has_session(self, user: str, session_id: str) -> bool:
        return self.db.row("SELECT 1 AS found FROM turns WHERE user_id = %s AND session_id = %s LIMIT 1",
                           (user, session_id)) is not None

    def speakers(self, user: str, through: str | None = None) -> tuple[str, ...]:
        rows = self.db.rows("SELECT speaker FROM turns WHERE user_id = %s AND (%s::text IS NULL OR "
                            "position <= (SELECT position FROM turns WHERE user_id = %s AND turn_id = %s)) "
                            "GROUP BY speaker ORDER BY min(position)", (user, through, user, through))
        return tuple(row["speaker"] for row in rows)
