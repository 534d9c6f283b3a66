"""Raw turns stored the moment they are added (the online API, :mod:`retrieval.api`): each add
commits its new turns and its idempotency key (with the ids of every turn of that add) in one
transaction, before any segment closes, so an acknowledged turn survives a crash and is
searchable at once. A turn that no committed segment
covers yet belongs to an open segment or to the memory's ingestion backlog: the turn log is the
ingestion worker's queue (:mod:`retrieval.api.backlog`), :meth:`TurnLog.backlog` reads it and
:meth:`TurnLog.uncovered_turns` finds the turns of open segments after a restart.

A part of :class:`retrieval.memory.store.AMUStore` (over its connection). The store's
``conversation_id`` is the API's user scope (schema 4, :mod:`retrieval.memory.schema`).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Collection, Sequence
from typing import Any

from retrieval.memory.in_chunks import in_chunks
from retrieval.memory.records import BacklogRead, Turn
from retrieval.memory.row_rules import (
    bind_turn_ids,
    open_turns_first,
    renumber_taken,
    turns_after,
    unchanged_since_check,
)
from retrieval.memory.sqlite_part import SQLitePart


def insert_turns(db: sqlite3.Connection, turns: Sequence[Turn]) -> None:
    """Insert raw turns in the caller's transaction."""
    db.executemany(
        "INSERT INTO turns (conversation_id, session_id, turn_id, speaker, text, session_time, "
        "image_caption) VALUES (?, ?, ?, ?, ?, ?, ?)",
        [(t.user_id, t.session_id, t.turn_id, t.speaker, t.text,
          t.stored_time(), t.image_caption) for t in turns],
    )


class TurnLog(SQLitePart):
    """The online write side of raw turns and the reads that rebuild open segments."""


    def append_turns(self, user: str, turns: Sequence[Turn], key: str | None = None,
                     known: Collection[str] | None = None, generated: Collection[str] = ()) -> list[Turn]:
        """Store the turns whose id ``user`` has not stored yet and, when given, ``key`` with the ids of
        all ``turns`` (the add it names), in one transaction; returns the turns stored now. Whether
        the add replays or conflicts with a stored one is the caller's check (:mod:`retrieval.api.replay`);
        with ``known`` (the caller's ids among ``turns`` stored when it checked) the transaction
        raises :class:`~retrieval.memory.errors.TurnsChanged` and stores nothing when the check is
        stale (:func:`~retrieval.memory.row_rules.unchanged_since_check`); a ``generated`` id
        stored meanwhile is numbered again (:func:`~retrieval.memory.row_rules.renumber_taken`)."""
        with self._transaction() as db:
            stored = self.stored_turn_ids(user, [turn.turn_id for turn in turns])
            used = key is not None and self.idempotent_turn_ids(user, key) is not None
            unchanged_since_check(stored - set(generated), known, used)
            turns = renumber_taken(self, user, turns, generated, stored)
            new = list({turn.turn_id: turn for turn in turns if turn.turn_id not in stored}.values())
            insert_turns(db, new)
            if key is not None:
                db.execute("INSERT INTO idempotency (conversation_id, key, turn_ids) VALUES (?, ?, ?)",
                           (user, key, json.dumps([turn.turn_id for turn in turns])))
        return new

    def bind_turn_ids(self, user: str, session: str, turns: Sequence[Any]) -> list[Turn]:
        """The turns (checked inputs) with ids (:func:`retrieval.memory.row_rules.bind_turn_ids`)."""
        return bind_turn_ids(self, user, session, turns)

    def idempotent_turn_ids(self, user: str, key: str) -> list[str] | None:
        """The turn ids of the add ``key`` named, or None when the user has not used ``key``."""
        row = self._db.execute("SELECT turn_ids FROM idempotency WHERE conversation_id = ? AND key = ?",
                               (user, key)).fetchone()
        return None if row is None else json.loads(row[0])

    def stored_turn_ids(self, user: str, turn_ids: Sequence[str]) -> set[str]:
        """Which of ``turn_ids`` the user has stored."""
        found: set[str] = set()
        for marks, chunk in in_chunks(turn_ids):
            rows = self._db.execute(f"SELECT turn_id FROM turns WHERE conversation_id = ? AND turn_id IN "
                                    f"({marks})", [user, *chunk])
            found.update(row[0] for row in rows)
        return found

    def last_turn_number(self, user: str, session_id: str) -> int:
        """The number the session's generated turn ids count on from: how many turns it has stored,
        or, when higher, the highest number a purged turn id of the user had (``purges.next_turn``)."""
        return self._db.execute(
            "SELECT max((SELECT COUNT(*) FROM turns WHERE conversation_id = ? AND session_id = ?), "
            "coalesce((SELECT next_turn - 1 FROM purges WHERE conversation_id = ?), 0))",
            (user, session_id, user)).fetchone()[0]

    def uncovered_turns(self, user: str) -> list[Turn]:
        """The user's stored turns that no committed segment covers (its open segments), in order."""
        return self.backlog(user)[0]

    def uncovered_turn_ids(self, user: str) -> set[str]:
        """The ids of :meth:`uncovered_turns`, the set difference taken in SQL: a search state
        built over many turns reads the few open ones, not every turn again."""
        rows = self._db.execute("SELECT turn_id FROM turns WHERE conversation_id = ? EXCEPT "
                                "SELECT j.value FROM segments AS s, json_each(s.turn_ids) AS j "
                                "WHERE s.conversation_id = ?", (user, user))
        return {row[0] for row in rows}

    def backlog(self, user: str, after: int | None = None, limit: int | None = None) -> BacklogRead:
        """The user's turns to feed to its segmentation, in order, and the highest turn position
        read (``after`` when none), at most ``limit`` of them, and how many the limit left
        (``unread``): without ``after``, the stored turns no committed segment covers (those before
        the last covered turn all, :func:`~retrieval.memory.row_rules.open_turns_first`); with it,
        the turns stored after position ``after`` (the caller fed the others)."""
        if after is not None:
            rows = self._db.execute("SELECT *, (SELECT count(*) FROM turns WHERE conversation_id = ?1 AND "
                                    "position > ?2) AS stored FROM turns WHERE conversation_id = ?1 AND "
                                    "position > ?2 ORDER BY position LIMIT ?3",
                                    (user, after, -1 if limit is None else limit)).fetchall()
            return turns_after(rows, after)
        rows = self._db.execute("SELECT * FROM turns WHERE conversation_id = ? ORDER BY position",
                                (user,)).fetchall()
        uncovered = self.uncovered_turn_ids(user)  # after the turns: one added meanwhile is not read
        return open_turns_first(rows, uncovered, limit)

    def backlog_users(self) -> list[str]:
        """Users that may have turns no committed segment covers (more stored turns than their
        segments list), in order of their first turn."""
        rows = self._db.execute(
            "SELECT t.conversation_id FROM (SELECT conversation_id, COUNT(*) AS n, MIN(position) AS first "
            "FROM turns GROUP BY conversation_id) t LEFT JOIN (SELECT conversation_id, "
            "SUM(json_array_length(turn_ids)) AS n FROM segments GROUP BY conversation_id) s "
            "ON s.conversation_id = t.conversation_id WHERE t.n != COALESCE(s.n, 0) ORDER BY t.first")
        return [row[0] for row in rows]

    def next_seq(self, user: str) -> int:
        """The number of the user's next segment: past every segment it has, and every one it had
        (``purges.next_seq``), so a record id never names new data after a purge."""
        return self._db.execute(
            "SELECT max(coalesce((SELECT max(seq) + 1 FROM segments WHERE conversation_id = ?), 0), "
            "coalesce((SELECT next_seq FROM purges WHERE conversation_id = ?), 0))",
            (user, user)).fetchone()[0]

    def users(self) -> list[str]:
        """Users (conversation ids) with at least one stored turn, in order of their first turn."""
        rows = self._db.execute("SELECT conversation_id FROM turns GROUP BY conversation_id "
                                "ORDER BY MIN(position)")
        return [row[0] for row in rows]

    def has_user(self, user: str) -> bool:
        return (self._db.execute("SELECT 1 FROM turns WHERE conversation_id = ? LIMIT 1",
                                 (user,)).fetchone() is not None)

    def holds_turns(self) -> bool:
        """Whether any user has a stored turn (records are made of turns: none, nothing is built)."""
        return self._db.execute("SELECT 1 FROM turns LIMIT 1").fetchone() is not None

    def has_session(self, user: str, session_id: str) -> bool:
        return self._db.execute("SELECT 1 FROM turns WHERE conversation_id = ? AND session_id = ? LIMIT 1",
                                (user, session_id)).fetchone() is not None

    def speakers(self, user: str, through: str | None = None) -> tuple[str, ...]:
        """The user's speakers in order of their first turn (the extractor's participants); with
        ``through`` (a turn id), only those of the turns stored up to that turn."""
        rows = self._db.execute(
            "SELECT speaker FROM turns WHERE conversation_id = ? AND (? IS NULL OR position <= (SELECT "
            "position FROM turns WHERE conversation_id = ? AND turn_id = ?)) GROUP BY speaker "
            "ORDER BY MIN(position)", (user, through, user, through))
        return tuple(row[0] for row in rows)
