"""Hard deletion (the online API's ``delete`` and ``forget``): rows are removed, not archived.

What derives from what. A raw turn is the source of everything else: a record derives from the
turns its source pointer names (a merged record from the union of its members' turns), a
segment from its turns, an evidence node from the records it links, a cached array from the
text it was computed from. Purging a selection of turns therefore removes, in one transaction
(the no-delete triggers stand down only while it holds the ``purging`` guard row,
:mod:`retrieval.memory.schema`):

* the turns, and every AMU, active or archived, that names one of them, with its entity, time,
  FTS5 and evidence-link rows and its consolidation pointer (meta);
* the segments left without a turn, with their event frames and every AMU extracted from them;
  a segment that keeps turns keeps its number, its remaining turns and its records, and forgets
  the purged ones (turn list, content checksum, event frame; the extractor's state, which may
  quote a purged turn, is cleared, and so is the state of every later segment of the user: the
  state is carried from segment to segment, so a later one may restate the turn);
* a segment's ``flushed_after`` that names a purged turn moves to the nearest earlier turn that
  stays, so the flush keeps its place among the turns left, or is emptied
  (:func:`retrieval.memory.purge_selection.moved_flushes`);
* the evidence nodes left without links (an event frame lives as long as its segment); a node
  kept that a purged record linked to takes its text from the first record still linked to it
  (a node keeps the text of the record that made it, which may be the purged one's spelling);
* the idempotency keys that stored a purged turn;
* the user's finished consolidation jobs: a job consolidates the user's whole memory, so its
  progress counts every session's records, and it names a session (an unfinished one finishes
  without counts, :mod:`retrieval.api.jobs`);

and counts the purge in the user's ``purges`` row (:mod:`retrieval.memory.schema`), which stays.
The row also keeps the numbers the user's ids count on from
(:func:`retrieval.memory.purge_selection.id_marks`): a record id or a generated turn id is never
given again, so a stale delete or read of a purged one finds nothing. What goes and what is
rewritten is decided from the user's rows alone, by one rule for both backends
(:mod:`retrieval.memory.purge_selection`).

Consolidation history that does not derive from a purged turn is kept: an archived AMU whose
successor is purged, and that names no purged turn itself, is restored in place (active again,
at its old position, without a successor). So deleting one turn of a merged record keeps what
the other turns stated, as the records consolidation had merged.

Selections: turns by id, a session's turns, AMUs by id (a record stands for the turns it names:
its words are theirs), or everything. When no turn of the user is left the purge is the whole
user's: also its jobs, idempotency keys, cached arrays and per-user meta entries, whichever path
led there.

The same transaction drops the cached arrays of the texts derived from what went (the caller
names them, it knows how they were derived) and records that a compaction is owed; then
:meth:`Purge.compact_owed` runs :meth:`Purge.compact` (the memory runs it behind the delete,
``retrieval.api.compaction``; also ``python -m retrieval.store compact``; a writer opening the
store runs the one a killed process still owed):
FTS5 ``optimize`` (its index keeps deleted terms until segments merge), VACUUM, a WAL checkpoint
that truncates the log and, with ``secure_delete`` on, zeroed free pages: the purged text is in
none of the store's files afterwards. A reader that holds an older snapshot open (another
process's long read: a backup, a ``sqlite3`` shell) keeps the log's frames: the checkpoint then
waits :data:`CHECKPOINT_WAIT_S` at most (holding the writer, so every user's writes wait as long)
and the compaction stays owed, tried again by the memory a while later
(:data:`retrieval.api.compaction.COMPACT_RETRY_S`), at the next purge, when the memory closes or
opens, and by ``retrieval.store compact``.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from retrieval.memory.cache import text_key
from retrieval.memory.connection import BUSY_TIMEOUT_S
from retrieval.memory.evidence_keys import node_text
from retrieval.memory.in_chunks import in_chunks
from retrieval.memory.indexing import frame_label
from retrieval.memory.job_rows import UNFINISHED
from retrieval.memory.meta_keys import COMPACTION_OWED, MERGE_KEY, USER_KEYS
from retrieval.memory.purge_selection import (
    Stored,
    id_marks,
    moved_flushes,
    named_records,
    select,
    stored_rows,
)
from retrieval.memory.reads import AMU_COLUMNS, segment_from_row, turn_from_row
from retrieval.memory.record_writes import insert_amu
from retrieval.memory.records import AMU, SegmentRecord, Turn
from retrieval.memory.schema import RAISE_ID_MARKS, turns_sha256
from retrieval.memory.sqlite_part import SQLitePart

CHECKPOINT_WAIT_S = 1.0
"""How long a compaction's WAL checkpoint waits for readers of older snapshots to finish."""

COUNT_PURGE = ("INSERT INTO purges (conversation_id, count, next_seq, next_turn) VALUES (?, 1, ?, ?) "
               f"ON CONFLICT (conversation_id) DO UPDATE SET count = count + 1, {RAISE_ID_MARKS}")
"""One more purge of the user (a change marker of it:
:meth:`retrieval.memory.versions.StoreVersions.ingestion_marks`), raising the numbers its ids
count on from to :func:`retrieval.memory.purge_selection.id_marks`."""


@dataclass
class Purged:
    """What a purge removed: raw turns, AMUs (archived history included), evidence-node texts and,
    for each segment it touched, the member texts its event frame had at each point of its
    history (what a search snapshot embedded); and the ids of the AMUs it restored."""

    turns: list[Turn] = field(default_factory=list)
    amus: list[AMU] = field(default_factory=list)
    node_texts: list[str] = field(default_factory=list)
    frames: list[list[str]] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.turns and not self.amus


def _linked_nodes(db: sqlite3.Connection, positions: Sequence[int]) -> list[int]:
    """The evidence nodes the AMUs at ``positions`` link to, other than event frames."""
    found: set[int] = set()
    for marks, chunk in in_chunks(sorted(positions)):
        found.update(row[0] for row in db.execute(
            f"SELECT DISTINCT l.node FROM evidence_links l JOIN evidence_nodes n ON n.id = l.node "
            f"WHERE l.amu IN ({marks}) AND n.node_type != 'event_frame'", chunk))
    return sorted(found)


def _retext_nodes(db: sqlite3.Connection, node_ids: Sequence[int],
                  records: Mapping[int, Stored]) -> list[str]:
    """Give each of the nodes still held the text of the first AMU still linked to it
    (:func:`retrieval.memory.evidence_keys.node_text`; ``records``: the user's records by position,
    as the purge read them); returns the texts replaced."""
    replaced = []
    for marks, chunk in in_chunks(list(node_ids)):
        for node in db.execute(f"SELECT n.id, n.node_type, n.key, n.text, (SELECT min(l.amu) FROM "
                               f"evidence_links l WHERE l.node = n.id) AS first FROM evidence_nodes n "
                               f"WHERE n.id IN ({marks})", chunk).fetchall():
            if node["first"] is None:
                continue
            text = node_text(records[node["first"]].amu, node["node_type"], node["key"])
            if text is not None and text != node["text"]:
                db.execute("UPDATE evidence_nodes SET text = ? WHERE id = ?", (text, node["id"]))
                replaced.append(node["text"])
    return replaced


def _owe_compaction(db: sqlite3.Connection) -> None:
    db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, 'true')", (COMPACTION_OWED,))


def _turn_ids(db: sqlite3.Connection, user: str) -> list[str]:
    """The user's turn ids in log order."""
    rows = db.execute("SELECT turn_id FROM turns WHERE conversation_id = ? ORDER BY position", (user,))
    return [row[0] for row in rows]


def _drop_cached(db: sqlite3.Connection, user: str, texts: Iterable[str]) -> None:
    """Delete the user's cached arrays of ``texts``."""
    keys = sorted({text_key(text) for text in texts})
    for table in ("vectors", "codes"):
        for marks, chunk in in_chunks(keys):
            db.execute(f"DELETE FROM {table} WHERE conversation_id = ? AND item IN ({marks})", [user, *chunk])


def _truncated(db: sqlite3.Connection) -> bool:
    """Checkpoint the WAL and truncate it, waiting :data:`CHECKPOINT_WAIT_S` at most for readers
    of older snapshots; whether it was (False: a reader still holds frames)."""
    db.execute(f"PRAGMA busy_timeout = {round(CHECKPOINT_WAIT_S * 1000)}")
    try:
        busy, _, _ = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        db.execute(f"PRAGMA busy_timeout = {round(BUSY_TIMEOUT_S * 1000)}")
    return not busy


class Purge(SQLitePart):
    """The purge side of the store (a part of :class:`retrieval.memory.store.AMUStore`);
    ``kept_by_reader``: its last compaction could not truncate the log (a reader held it)."""

    kept_by_reader = False

    def purge(self, user: str, *, session_id: str | None = None, amu_ids: Sequence[str] = (),
              turn_ids: Sequence[str] = (), everything: bool = False,
              derived: Callable[[Purged], Iterable[str]] | None = None) -> Purged:
        """Remove the user's selection (a session, AMUs, turns, or ``everything``) and what derives
        from it (see the module docstring), with the cached arrays of the texts ``derived`` names,
        and owe a compaction, all in one transaction; returns what went. Call
        :meth:`compact_owed` afterwards (a writer opening the store does it too)."""
        with self._transaction() as db:
            db.execute("INSERT INTO purging (flag) VALUES (1)")
            stored = stored_rows(db.execute(f"SELECT position, successor, {AMU_COLUMNS} FROM amus WHERE "
                                            "conversation_id = ? ORDER BY position", (user,)).fetchall())
            named, sources = named_records(stored, amu_ids)
            turns = self._select_turns(db, user, session_id, [*turn_ids, *sources], everything)
            gone = {turn.turn_id for turn in turns}
            total = db.execute("SELECT COUNT(*) FROM turns WHERE conversation_id = ?", (user,)).fetchone()[0]
            segments = [segment_from_row(row) for row in db.execute(
                "SELECT * FROM segments WHERE conversation_id = ? ORDER BY seq", (user,)).fetchall()]
            db.execute(COUNT_PURGE, (user, *id_marks(segments, turns)))
            picked = select(stored, segments, gone, named, everything or total == len(gone))
            touched = _linked_nodes(db, [row.position for row in picked.chosen])
            self._drop_amus(db, [row.position for row in picked.chosen + picked.restored])
            for row in picked.restored:  # through the store's one insert path, so the indexes follow
                insert_amu(db, dataclasses.replace(row.amu, archived=False), row.position)
            self._rewrite_segments(db, picked.kept, gone)
            if picked.carried is not None:
                db.execute("UPDATE segments SET state = '' WHERE conversation_id = ? AND seq > ? "
                           "AND state != ''", (user, picked.carried))
            self._delete(db, "segments", "seq", sorted(picked.dropped), user)
            db.executemany("UPDATE segments SET flushed_after = ? WHERE conversation_id = ? AND seq = ?",
                           [(after, user, seq) for after, seq in moved_flushes(segments, gone,
                                                                               lambda: _turn_ids(db, user))])
            node_texts = self._drop_nodes(db, user, picked.frames_kept, picked.everything)
            node_texts += [frame_label(s.session_id, s.turn_ids) for s in picked.kept]  # their old own texts
            node_texts += _retext_nodes(db, touched, {row.position: row for row in stored})
            self._delete(db, "turns", "turn_id", sorted(gone), user)
            db.executemany("DELETE FROM meta WHERE key = ?",
                           [(MERGE_KEY.format(amu_id),) for amu_id in sorted(picked.chosen_ids)])
            if picked.everything:
                for table in ("idempotency", "jobs", "vectors", "codes"):
                    db.execute(f"DELETE FROM {table} WHERE conversation_id = ?", (user,))
                db.executemany("DELETE FROM meta WHERE key = ?", [(key.format(user),) for key in USER_KEYS])
            else:
                self._drop_keys(db, user, gone)
                db.execute(f"DELETE FROM jobs WHERE conversation_id = ? AND state NOT IN {UNFINISHED}",
                           (user,))
            db.execute("DELETE FROM purging")
            purged = Purged(turns, [row.amu for row in picked.chosen], node_texts, picked.frames,
                            [row.id for row in picked.restored])
            if derived is not None:
                _drop_cached(db, user, derived(purged))
            _owe_compaction(db)
        return purged

    def scrub(self, user: str, texts: Iterable[str]) -> None:
        """Drop the user's cached arrays of ``texts``, then :meth:`compact`."""
        with self._transaction() as db:
            _drop_cached(db, user, texts)
        self.compact()

    def compact_owed(self) -> bool:
        """:meth:`compact` if a purge owes it; whether none is owed afterwards."""
        if self._db.execute("SELECT 1 FROM meta WHERE key = ?", (COMPACTION_OWED,)).fetchone():
            return self.compact()
        return True

    def compact(self) -> bool:
        """Leave no deleted data in the store's files: rewrite the FTS5 index without deleted terms,
        rebuild the database file (VACUUM; free pages are zeroed by ``secure_delete``) and
        truncate the WAL; then no compaction is owed. False when a reader kept the WAL from
        being truncated: the compaction stays owed (see the module docstring). The owed mark is
        written first (a kill or a reader leaves the compaction owed) and the log truncated behind
        it, so a reader holding any snapshot (the mark's frame is in none it began before) is found
        before the VACUUM, which would only add the whole file to a log it cannot truncate. It
        holds the writer from start to end, so no purge of this process commits between the
        rewrite and the owed mark's removal (its trace would stay in the files, owed by nothing)."""
        with self._writing() as db:
            with self._transaction() as tx:
                _owe_compaction(tx)
            done = _truncated(db)
            if done:
                with self._transaction() as tx:
                    tx.execute("INSERT INTO amu_fts (amu_fts) VALUES ('optimize')")
                db.execute("VACUUM")
                done = _truncated(db)
            if done:
                with self._transaction() as tx:
                    tx.execute("DELETE FROM meta WHERE key = ?", (COMPACTION_OWED,))
        self.kept_by_reader = not done
        return done

    @staticmethod
    def _rows(db: sqlite3.Connection, sql: str, column: str, values: Sequence[object],
              params: Sequence[object] = ()) -> list[sqlite3.Row]:
        """``sql`` with ``{}`` replaced by ``column IN (...)`` over ``values`` in chunks, after ``params``."""
        rows: list[sqlite3.Row] = []
        for marks, chunk in in_chunks(values):
            rows += db.execute(sql.format(f"{column} IN ({marks})"), [*params, *chunk]).fetchall()
        return rows

    @staticmethod
    def _delete(db: sqlite3.Connection, table: str, column: str, values: Sequence[object],
                user: str | None) -> None:
        scope = "conversation_id = ? AND " if user is not None else ""
        for marks, chunk in in_chunks(values):
            db.execute(f"DELETE FROM {table} WHERE {scope}{column} IN ({marks})",
                       ([user] if user is not None else []) + chunk)

    def _select_turns(self, db: sqlite3.Connection, user: str, session_id: str | None,
                      turn_ids: Sequence[str], everything: bool) -> list[Turn]:
        """The user's turns selected: all, a session's, and those named (without repeats)."""
        where = "" if everything else " AND session_id = ?"
        rows = [] if not everything and session_id is None else db.execute(
            f"SELECT * FROM turns WHERE conversation_id = ?{where} ORDER BY position",
            [user] if everything else [user, session_id]).fetchall()
        rows += self._rows(db, "SELECT * FROM turns WHERE conversation_id = ? AND {}", "turn_id",
                           sorted(set(turn_ids)), [user])
        return list({row["turn_id"]: turn_from_row(row) for row in rows}.values())

    def _drop_amus(self, db: sqlite3.Connection, positions: Sequence[int]) -> None:
        """Delete the AMUs at ``positions`` and their index rows."""
        for table, column in (("evidence_links", "amu"), ("amu_entities", "amu"), ("amu_times", "amu"),
                              ("amu_fts", "rowid"), ("amus", "position")):
            self._delete(db, table, column, positions, None)

    @staticmethod
    def _rewrite_segments(db: sqlite3.Connection, segments: Sequence[SegmentRecord], gone: set[str]) -> None:
        """Segments that keep some turns: their rows and event frames without the purged ones (the
        identity triggers forbid an update, so the row is replaced), the extractor's state cleared."""
        for record in segments:
            user, seq = record.user_id, record.seq
            left = [turn_id for turn_id in record.turn_ids if turn_id not in gone]
            turns = [turn_from_row(db.execute("SELECT * FROM turns WHERE conversation_id = ? AND turn_id = ?",
                                              (user, turn_id)).fetchone()) for turn_id in left]
            count = db.execute("SELECT COUNT(*) FROM amus WHERE conversation_id = ? AND segment = ?",
                               (user, seq)).fetchone()[0]
            db.execute("DELETE FROM segments WHERE conversation_id = ? AND seq = ?", (user, seq))
            db.execute("INSERT INTO segments (conversation_id, seq, session_id, turn_ids, reason, state, "
                       "fallback, amu_count, content_sha256, revision, flushed_after) "
                       "VALUES (?, ?, ?, ?, ?, '', ?, ?, ?, ?, ?)",
                       (user, seq, record.session_id, json.dumps(left), record.reason, int(record.fallback),
                        count, turns_sha256(turns), record.revision, record.flushed_after))
            db.execute("UPDATE evidence_nodes SET text = ?, turn_ids = ? WHERE conversation_id = ? "
                       "AND node_type = 'event_frame' AND key = ?",
                       (frame_label(record.session_id, left), json.dumps(left), user, str(seq)))

    def _drop_nodes(self, db: sqlite3.Connection, user: str, frames_kept: set[str],
                    everything: bool) -> list[str]:
        """Delete the user's nodes (``everything``) or those left without links, except the event
        frames of segments kept (``frames_kept``: their numbers); returns their texts."""
        rows = [row for row in db.execute(
            "SELECT id, node_type, key, text FROM evidence_nodes n WHERE conversation_id = ? AND "
            "(? OR NOT EXISTS (SELECT 1 FROM evidence_links l WHERE l.node = n.id))",
            (user, everything)).fetchall()
                if everything or not (row["node_type"] == "event_frame" and row["key"] in frames_kept)]
        ids = [row["id"] for row in rows]
        self._delete(db, "evidence_links", "node", ids, None)
        self._delete(db, "evidence_nodes", "id", ids, None)
        return [row["text"] for row in rows]

    @staticmethod
    def _drop_keys(db: sqlite3.Connection, user: str, purged_turns: set[str]) -> None:
        """Forget the idempotency keys that stored a purged turn (a key may name its content)."""
        for key, turn_ids in db.execute("SELECT key, turn_ids FROM idempotency WHERE conversation_id = ?",
                                        (user,)).fetchall():
            if purged_turns.intersection(json.loads(turn_ids)):
                db.execute("DELETE FROM idempotency WHERE conversation_id = ? AND key = ?", (user, key))
