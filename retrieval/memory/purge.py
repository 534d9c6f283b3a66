"""Hard deletion (the online API's ``delete`` and ``forget``): rows are removed, not archived.

What goes, in one transaction (the no-delete triggers stand down only while it holds the
``purging`` guard row, :mod:`retrieval.memory.schema`):

* the selected raw turns, and every AMU derived from one of them (its provenance names it);
* the selected AMUs, and their history: every archived AMU whose successor chain leads to one;
* those AMUs' entity, time, FTS5 and evidence-link rows, the evidence nodes left without links,
  the event frames and progress rows of purged segments, their consolidation pointers (meta);
* for a whole user: its idempotency keys, jobs and per-user meta entries.

Then :meth:`Purge.scrub`: cached arrays of the purged texts (the caller names the texts, it knows
how they were derived), FTS5 ``optimize`` (its index keeps deleted terms until segments merge),
a WAL checkpoint that truncates the log and, with ``secure_delete`` on, zeroed free pages: the
purged text is in none of the store's files afterwards.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from retrieval.memory.cache import text_key
from retrieval.memory.reads import AMU_COLUMNS, amu_from_row, turn_from_row
from retrieval.memory.records import AMU, Turn

CHUNK = 500
"""Host parameters per ``IN (...)`` (SQLite's default limit is 999)."""


@dataclass
class Purged:
    """What a purge removed: raw turns, AMUs (archived history included) and evidence-node texts."""

    turns: list[Turn] = field(default_factory=list)
    amus: list[AMU] = field(default_factory=list)
    node_texts: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.turns and not self.amus


def _in(column: str, values: Sequence[object]) -> str:
    return f"{column} IN ({','.join('?' * len(values))})"


class Purge:
    """The purge side of the store (a mixin of :class:`retrieval.memory.store.AMUStore`)."""

    _db: sqlite3.Connection

    def purge(self, user: str, *, session_id: str | None = None, amu_ids: Sequence[str] = (),
              turn_ids: Sequence[str] = (), everything: bool = False) -> Purged:
        """Remove the user's selection (a session, AMUs, turns, or ``everything``) and what derives
        from it; returns what went. Call :meth:`scrub` afterwards."""
        with self._transaction() as db:  # type: ignore[attr-defined]
            db.execute("INSERT INTO purging (flag) VALUES (1)")
            turns = self._select_turns(db, user, session_id, turn_ids, everything)
            purged_turns = {turn.turn_id for turn in turns}
            positions = self._select_amus(db, user, session_id, amu_ids, purged_turns, everything)
            rows = self._rows(db, "SELECT position, " + AMU_COLUMNS + " FROM amus WHERE {}", "position",
                              positions)
            amus = [amu_from_row(row) for row in rows]
            nodes = self._drop_amus(db, positions)
            segments = self._drop_segments(db, user, session_id, everything)
            node_texts = self._drop_nodes(db, user, nodes, segments, everything)
            self._delete(db, "turns", "turn_id", sorted(purged_turns), user)
            db.executemany("DELETE FROM meta WHERE key = ?", [(f"consolidation:{amu.id}",) for amu in amus])
            if everything:
                for table in ("idempotency", "jobs"):
                    db.execute(f"DELETE FROM {table} WHERE conversation_id = ?", (user,))
                for prefix in ("construction:", "consolidation_plan:"):
                    db.execute("DELETE FROM meta WHERE key = ?", (prefix + user,))
            else:
                self._drop_keys(db, user, purged_turns)
            db.execute("DELETE FROM purging")
        return Purged(turns, amus, node_texts)

    def scrub(self, texts: Iterable[str]) -> None:
        """Drop the cached arrays of ``texts``, rewrite the FTS5 index without deleted terms and
        truncate the WAL (free pages are zeroed by ``secure_delete``)."""
        keys = sorted({text_key(text) for text in texts})
        with self._transaction() as db:  # type: ignore[attr-defined]
            for table in ("vectors", "codes"):
                for start in range(0, len(keys), CHUNK):
                    chunk = keys[start:start + CHUNK]
                    db.execute(f"DELETE FROM {table} WHERE {_in('item', chunk)}", chunk)
            db.execute("INSERT INTO amu_fts (amu_fts) VALUES ('optimize')")
        self._db.execute("VACUUM")
        self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    @staticmethod
    def _rows(db: sqlite3.Connection, sql: str, column: str, values: Sequence[object],
              params: Sequence[object] = ()) -> list[sqlite3.Row]:
        """``sql`` with ``{}`` replaced by ``column IN (...)`` over ``values`` in chunks, after ``params``."""
        rows: list[sqlite3.Row] = []
        for start in range(0, len(values), CHUNK):
            chunk = list(values[start:start + CHUNK])
            rows += db.execute(sql.format(_in(column, chunk)), [*params, *chunk]).fetchall()
        return rows

    @staticmethod
    def _delete(db: sqlite3.Connection, table: str, column: str, values: Sequence[object],
                user: str | None) -> None:
        scope = "conversation_id = ? AND " if user is not None else ""
        for start in range(0, len(values), CHUNK):
            chunk = list(values[start:start + CHUNK])
            db.execute(f"DELETE FROM {table} WHERE {scope}{_in(column, chunk)}",
                       ([user] if user is not None else []) + chunk)

    def _select_turns(self, db: sqlite3.Connection, user: str, session_id: str | None,
                      turn_ids: Sequence[str], everything: bool) -> list[Turn]:
        if everything or session_id is not None:
            where, params = ("", [user]) if everything else (" AND session_id = ?", [user, session_id])
            found = db.execute(f"SELECT * FROM turns WHERE conversation_id = ?{where} ORDER BY position",
                               params)
            return [turn_from_row(row) for row in found.fetchall()]
        rows = self._rows(db, "SELECT * FROM turns WHERE conversation_id = ? AND {}", "turn_id",
                          list(turn_ids), [user])
        return [turn_from_row(row) for row in rows]

    @staticmethod
    def _select_amus(db: sqlite3.Connection, user: str, session_id: str | None, amu_ids: Sequence[str],
                     purged_turns: set[str], everything: bool) -> list[int]:
        """Positions of the selected AMUs, those derived from purged turns, and their history."""
        rows = db.execute("SELECT position, id, session_id, turn_ids, successor FROM amus "
                          "WHERE conversation_id = ?",
                          (user,)).fetchall()
        wanted = set(amu_ids)
        chosen = {row["id"] for row in rows
                  if everything or row["id"] in wanted or row["session_id"] == session_id
                  or purged_turns.intersection(json.loads(row["turn_ids"]))}
        predecessors: dict[str, list[str]] = {}
        for row in rows:
            if row["successor"] is not None:
                predecessors.setdefault(row["successor"], []).append(row["id"])
        stack = list(chosen)
        while stack:  # the history: everything forwarded, directly or not, into a chosen AMU
            for previous in predecessors.get(stack.pop(), []):
                if previous not in chosen:
                    chosen.add(previous)
                    stack.append(previous)
        return sorted(row["position"] for row in rows if row["id"] in chosen)

    def _drop_amus(self, db: sqlite3.Connection, positions: Sequence[int]) -> set[int]:
        """Delete the AMUs and their index rows; returns the evidence nodes they were linked to."""
        nodes = {row[0]
                 for row in self._rows(db, "SELECT node FROM evidence_links WHERE {}", "amu", positions)}
        for table, column in (("evidence_links", "amu"), ("amu_entities", "amu"), ("amu_times", "amu"),
                              ("amu_fts", "rowid"), ("amus", "position")):
            self._delete(db, table, column, positions, None)
        return nodes

    @staticmethod
    def _drop_segments(db: sqlite3.Connection, user: str, session_id: str | None,
                       everything: bool) -> list[int]:
        """Delete the progress rows of a purged session (or of every session); returns their numbers."""
        if not everything and session_id is None:
            return []
        where, params = ("", [user]) if everything else (" AND session_id = ?", [user, session_id])
        seqs = [row[0]
                for row in db.execute(f"SELECT seq FROM segments WHERE conversation_id = ?{where}", params)]
        db.execute(f"DELETE FROM segments WHERE conversation_id = ?{where}", params)
        return seqs

    def _drop_nodes(self, db: sqlite3.Connection, user: str, nodes: set[int], segments: Sequence[int],
                    everything: bool) -> list[str]:
        """Delete the user's nodes left without links among ``nodes``, the event frames of purged
        segments (all nodes for ``everything``); returns their texts."""
        if everything:
            rows = db.execute("SELECT id, text FROM evidence_nodes WHERE conversation_id = ?",
                              (user,)).fetchall()
        else:
            orphans = [row for row in self._rows(db, "SELECT id, text FROM evidence_nodes WHERE {}", "id",
                                                 sorted(nodes))
                       if not db.execute("SELECT 1 FROM evidence_links WHERE node = ? LIMIT 1",
                                         (row[0],)).fetchone()]
            frames = self._rows(db, "SELECT id, text FROM evidence_nodes WHERE conversation_id = ? AND "
                                "node_type = 'event_frame' AND {}", "key", [str(seq) for seq in segments],
                                [user])
            rows = orphans + [row for row in frames if row[0] not in {o[0] for o in orphans}]
        ids = [row[0] for row in rows]
        self._delete(db, "evidence_links", "node", ids, None)
        self._delete(db, "evidence_nodes", "id", ids, None)
        return [row[1] for row in rows]

    @staticmethod
    def _drop_keys(db: sqlite3.Connection, user: str, purged_turns: set[str]) -> None:
        """Forget the idempotency keys that stored a purged turn (a key may name its content)."""
        for key, turn_ids in db.execute("SELECT key, turn_ids FROM idempotency WHERE conversation_id = ?",
                                        (user,)).fetchall():
            if purged_turns.intersection(json.loads(turn_ids)):
                db.execute("DELETE FROM idempotency WHERE conversation_id = ? AND key = ?", (user, key))
