"""Hard deletion on PostgreSQL: the SQLite store's purge (:mod:`retrieval.memory.purge`, whose
module docstring says what derives from what and what goes), in one transaction under the user's
lock; the no-delete triggers stand down for that transaction alone (``memory.purging``).

:meth:`Purge.scrub` drops the cached arrays of the purged texts. What it does not do on PostgreSQL is
what SQLite's ``VACUUM`` does: the deleted rows stay in the table files as dead tuples until a
vacuum rewrites them (:meth:`Purge.compact`, ``VACUUM FULL`` then ``CHECKPOINT``: minutes on a
large database, and it locks each table while it rewrites it), and in the write-ahead log until
the server recycles it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from retrieval.memory.cache import text_key
from retrieval.memory.errors import StoreError
from retrieval.memory.evidence_keys import node_text
from retrieval.memory.indexing import frame_label
from retrieval.memory.job_rows import UNFINISHED
from retrieval.memory.meta_keys import MERGE_KEY, USER_KEYS
from retrieval.memory.postgres.reads import AMU_COLUMNS, SEGMENT_COLUMNS, TURN_COLUMNS
from retrieval.memory.postgres.schema import COMPACTED, PURGING, RAISE_ID_MARKS, STATISTICS_OWED
from retrieval.memory.postgres.writes import insert_amu
from retrieval.memory.purge import Purged
from retrieval.memory.purge_selection import (
    Stored,
    id_marks,
    moved_flushes,
    named_records,
    select,
    stored_rows,
)
from retrieval.memory.reads import segment_from_row, turn_from_row
from retrieval.memory.records import SegmentRecord, Turn
from retrieval.memory.schema import turns_sha256

if TYPE_CHECKING:
    from retrieval.memory.postgres.database import Connection, Database


_MAY_VACUUM_CATALOG = ("SELECT rolsuper OR pg_has_role(current_user, (SELECT datdba FROM pg_database "
                       "WHERE datname = current_database()), 'USAGE') AS may FROM pg_roles "
                       "WHERE rolname = current_user")
"""Whether this role may vacuum the database's catalogs (``pg_statistic``): a superuser or one
with the database owner's privileges."""

_COUNT_PURGE = ("INSERT INTO purges (user_id, count, next_seq, next_turn) VALUES (%s, 1, %s, %s) "
                f"ON CONFLICT (user_id) DO UPDATE SET count = purges.count + 1, {RAISE_ID_MARKS}")
"""One more purge of the user, raising its ids' marks (as the SQLite store's ``COUNT_PURGE``)."""


def _delete(conn: Connection, table: str, column: str, values: Sequence[object], user: str) -> None:
    conn.execute(f"DELETE FROM {table} WHERE user_id = %s AND {column} = ANY(%s)",  # type: ignore[arg-type]
                 (user, list(values)))


def _linked_nodes(conn: Connection, user: str, positions: Sequence[int]) -> list[int]:
    """The evidence nodes the user's records at ``positions`` link to, other than event frames."""
    rows = conn.execute("SELECT DISTINCT l.node FROM evidence_links l JOIN evidence_nodes n ON n.id = l.node "
                        "WHERE l.user_id = %s AND l.amu = ANY(%s) AND n.node_type != 'event_frame' "
                        "ORDER BY 1", (user, list(positions))).fetchall()
    return [row["node"] for row in rows]


def _retext_nodes(conn: Connection, user: str, node_ids: Sequence[int],
                  records: Mapping[int, Stored]) -> list[str]:
    """Give each of the nodes still held the text of the first record still linked to it
    (:func:`retrieval.memory.evidence_keys.node_text`; ``records``: the user's records by position,
    as the purge read them); returns the texts replaced."""
    replaced = []
    nodes = conn.execute("SELECT n.id, n.node_type, n.key, n.text, (SELECT min(l.amu) FROM evidence_links l "
                         "WHERE l.node = n.id) AS first FROM evidence_nodes n WHERE n.user_id = %s AND "
                         "n.id = ANY(%s) ORDER BY n.id", (user, list(node_ids))).fetchall()
    for node in nodes:
        if node["first"] is None:
            continue
        text = node_text(records[node["first"]].amu, node["node_type"], node["key"])
        if text is not None and text != node["text"]:
            conn.execute("UPDATE evidence_nodes SET text = %s WHERE id = %s", (text, node["id"]))
            replaced.append(node["text"])
    return replaced


def _drop_cached(conn: Connection, user: str, texts: Iterable[str]) -> None:
    """Delete the user's cached arrays of ``texts``."""
    keys = sorted({text_key(text) for text in texts})
    for table in ("vectors", "codes"):
        conn.execute(f"DELETE FROM {table} WHERE user_id = %s AND item = ANY(%s)",  # type: ignore[arg-type]
                     (user, keys))


class Purge:
    """The purge side of the store."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def purge(self, user: str, *, session_id: str | None = None, amu_ids: Sequence[str] = (),
              turn_ids: Sequence[str] = (), everything: bool = False,
              derived: Callable[[Purged], Iterable[str]] | None = None) -> Purged:
        """Remove the user's selection (a session, records, turns, or ``everything``) and what derives
        from it, with the cached arrays of the texts ``derived`` names, in one transaction;
        returns what went."""
        with self.db.transaction([user]) as conn:
            conn.execute(PURGING)
            rows = self.db.rows(f"SELECT position, successor, {AMU_COLUMNS} FROM amus WHERE user_id = %s "
                                "ORDER BY position", (user,))
            stored = stored_rows(rows)
            named, sources = named_records(stored, amu_ids)
            turns = self._select_turns(user, session_id, [*turn_ids, *sources], everything)
            gone = {turn.turn_id for turn in turns}
            total = self.db.value("SELECT count(*) FROM turns WHERE user_id = %s", (user,))
            segments = [segment_from_row(row) for row in self.db.rows(
                f"SELECT {SEGMENT_COLUMNS} FROM segments WHERE user_id = %s ORDER BY seq", (user,))]
            conn.execute(_COUNT_PURGE, (user, *id_marks(segments, turns)))
            picked = select(stored, segments, gone, named, everything or total == len(gone))
            positions = [row.position for row in picked.chosen + picked.restored]
            touched = _linked_nodes(conn, user, [row.position for row in picked.chosen])
            for table in ("evidence_links", "amu_entities", "amu_times"):
                _delete(conn, table, "amu", positions, user)
            _delete(conn, "amus", "position", positions, user)
            for row in picked.restored:  # through the one insert path, so the indexes follow
                insert_amu(conn, dataclasses.replace(row.amu, archived=False), row.position)
            self._rewrite_segments(conn, picked.kept, gone)
            if picked.carried is not None:
                conn.execute("UPDATE segments SET state = '' WHERE user_id = %s AND seq > %s AND state != ''",
                             (user, picked.carried))
            _delete(conn, "segments", "seq", sorted(picked.dropped), user)
            for after, seq in moved_flushes(segments, gone, lambda: [row["turn_id"] for row in self.db.rows(
                    "SELECT turn_id FROM turns WHERE user_id = %s ORDER BY position", (user,))]):
                conn.execute("UPDATE segments SET flushed_after = %s WHERE user_id = %s AND seq = %s",
                             (after, user, seq))
            node_texts = self._drop_nodes(conn, user, picked.frames_kept, picked.everything)
            node_texts += [frame_label(s.session_id, s.turn_ids) for s in picked.kept]  # their old own texts
            node_texts += _retext_nodes(conn, user, touched, {row.position: row for row in stored})
            _delete(conn, "turns", "turn_id", sorted(gone), user)
            conn.execute("DELETE FROM meta WHERE key = ANY(%s)",
                         ([MERGE_KEY.format(amu_id) for amu_id in sorted(picked.chosen_ids)],))
            if picked.everything:
                for table in ("idempotency", "jobs", "vectors", "codes"):
                    conn.execute(f"DELETE FROM {table} WHERE user_id = %s", (user,))  # type: ignore[arg-type]
                conn.execute("DELETE FROM meta WHERE key = ANY(%s)",
                             ([key.format(user) for key in USER_KEYS],))
            else:
                self._drop_keys(conn, user, gone)
                conn.execute("DELETE FROM jobs WHERE user_id = %s AND state <> ALL(%s)",
                             (user, list(UNFINISHED)))
            purged = Purged(turns, [row.amu for row in picked.chosen], node_texts, picked.frames,
                            [row.id for row in picked.restored])
            if derived is not None:
                _drop_cached(conn, user, derived(purged))
        return purged

    def scrub(self, user: str, texts: Iterable[str]) -> None:
        """Drop the user's cached arrays of ``texts`` (see the module docstring for what stays on disk)."""
        with self.db.transaction([user]) as conn:
            _drop_cached(conn, user, texts)

    def compact_owed(self) -> bool:
        """Nothing (none is owed): the files' dead tuples go with ``VACUUM FULL``, the operator's
        :meth:`compact`."""
        return True

    def compact(self) -> bool:
        """``VACUUM FULL`` of the store's tables (each rewritten without its dead tuples; needs the
        tables' owner) and, where the role may (the database's owner or a superuser), of
        ``pg_statistic``, then a ``CHECKPOINT`` (a superuser or ``pg_checkpoint`` member), outside
        any transaction. A store whose migration to version 7 dropped sampled words
        (:data:`retrieval.memory.postgres.schema.STATISTICS_OWED`) needs ``pg_statistic`` rewritten:
        another role is refused before anything runs."""
        if self.db.read_only:
            raise StoreError(f"{self.db.where} is open read-only")
        with self.db.connection() as conn:
            owed = conn.execute("SELECT 1 FROM meta WHERE key = %s", (STATISTICS_OWED,)).fetchone()
            role = conn.execute(_MAY_VACUUM_CATALOG).fetchone()
            catalog = role is not None and bool(role["may"])
            if owed is not None and not catalog:
                raise StoreError(f"{self.db.where}: not compacted: pg_statistic still holds words sampled "
                                 "before schema version 7, and only the database's owner or a superuser "
                                 "may rewrite it (compact as one of them)")
            for table in COMPACTED:
                conn.execute(f"VACUUM FULL {table}")  # type: ignore[arg-type]
            if catalog:
                conn.execute("VACUUM FULL pg_statistic")
                conn.execute("DELETE FROM meta WHERE key = %s", (STATISTICS_OWED,))
            conn.execute("CHECKPOINT")
        return True

    def _select_turns(self, user: str, session_id: str | None, turn_ids: Sequence[str],
                      everything: bool) -> list[Turn]:
        """The user's turns selected: all, a session's, and those named (without repeats)."""
        rows = []
        if everything or session_id is not None:
            where = "" if everything else " AND session_id = %s"
            rows = self.db.rows(f"SELECT {TURN_COLUMNS} FROM turns WHERE user_id = %s{where} "
                                "ORDER BY position", [user] if everything else [user, session_id])
        rows += self.db.rows(f"SELECT {TURN_COLUMNS} FROM turns WHERE user_id = %s AND turn_id = ANY(%s) "
                             "ORDER BY turn_id COLLATE \"C\"", (user, sorted(set(turn_ids))))
        return list({row["turn_id"]: turn_from_row(row) for row in rows}.values())

    def _rewrite_segments(self, conn: Connection, segments: Sequence[SegmentRecord], gone: set[str]) -> None:
        """Segments that keep some turns: their rows and event frames without the purged ones (the
        identity triggers forbid an update, so the row is replaced), the extractor's state cleared."""
        for record in segments:
            user, seq = record.user_id, record.seq
            left = [turn_id for turn_id in record.turn_ids if turn_id not in gone]
            turns = [turn_from_row(self.db.row(f"SELECT {TURN_COLUMNS} FROM turns WHERE user_id = %s "
                                               "AND turn_id = %s", (user, turn_id))) for turn_id in left]
            count = self.db.value("SELECT count(*) FROM amus WHERE user_id = %s AND segment = %s",
                                  (user, seq))
            conn.execute("DELETE FROM segments WHERE user_id = %s AND seq = %s", (user, seq))
            conn.execute("INSERT INTO segments (user_id, seq, session_id, turn_ids, reason, state, fallback, "
                         "amu_count, content_sha256, revision, flushed_after) "
                         "VALUES (%s, %s, %s, %s, %s, '', %s, %s, %s, %s, %s)",
                         (user, seq, record.session_id, json.dumps(left), record.reason, record.fallback,
                          count, turns_sha256(turns), record.revision, record.flushed_after))
            conn.execute("UPDATE evidence_nodes SET text = %s, turn_ids = %s WHERE user_id = %s "
                         "AND node_type = 'event_frame' AND key = %s",
                         (frame_label(record.session_id, left), json.dumps(left), user, str(seq)))

    @staticmethod
    def _drop_nodes(conn: Connection, user: str, frames_kept: set[str], everything: bool) -> list[str]:
        """Delete the user's nodes (``everything``) or those left without links, except the event
        frames of segments kept (``frames_kept``: their numbers); returns their texts."""
        rows = [row for row in conn.execute(
            "SELECT id, node_type, key, text FROM evidence_nodes n WHERE user_id = %s AND "
            "(%s OR NOT EXISTS (SELECT 1 FROM evidence_links l WHERE l.node = n.id)) ORDER BY id",
            (user, everything)).fetchall()
                if everything or not (row["node_type"] == "event_frame" and row["key"] in frames_kept)]
        ids = [row["id"] for row in rows]
        _delete(conn, "evidence_links", "node", ids, user)
        _delete(conn, "evidence_nodes", "id", ids, user)
        return [row["text"] for row in rows]

    @staticmethod
    def _drop_keys(conn: Connection, user: str, purged_turns: set[str]) -> None:
        """Forget the idempotency keys that stored a purged turn (a key may name its content)."""
        keys = conn.execute("SELECT key, turn_ids FROM idempotency WHERE user_id = %s", (user,)).fetchall()
        for row in keys:
            if purged_turns.intersection(json.loads(row["turn_ids"])):
                conn.execute("DELETE FROM idempotency WHERE user_id = %s AND key = %s", (user, row["key"]))
