"""The store's SQLite schema (version 10) and the migration of version-1 to -9 stores.

Append-only by triggers: raw turns never change; an AMU's fact never changes (only its
``archived`` flag, one way, its fingerprint, a derived index key, and its ``successor``, the
forward pointer consolidation sets, may); a segment's identity never changes (a retried
extraction may replace its ``state``, ``fallback``, ``amu_count`` and ``revision``); nothing is
deleted, except by a hard purge (:mod:`retrieval.memory.purge`): the no-delete triggers stand
down only while the purging transaction holds a row in ``purging``, so no other path can delete.
(A purge that removes an archived AMU's successor restores the AMU by deleting and inserting its
row again; archiving itself stays one-way.)

Version 3 adds the temporal scope of a record (``t_ref``, ``valid_from``, ``valid_to``) and the
structured evidence indexes of LycheeMemory section 3.4 (docs/design.md §7.1): ``amu_fts``, an FTS5
table (porter stemmer) over each active AMU's text, entities and topic tags, and the evidence
nodes (``evidence_nodes``) with their links to AMUs (``evidence_links``). Triggers keep
``amu_fts`` in step with ``amus`` inside the inserting or archiving transaction, and drop an
archived AMU's node links; the store's insert path links new AMUs to their nodes
(:mod:`retrieval.memory.indexing`). The migration builds both for the AMUs already stored.

Version 4 serves the online memory API (:mod:`retrieval.api`), whose user scope is the store's
``conversation_id`` (an existing LoCoMo conversation is the user of the same id, its sessions
that user's sessions): ``idempotency`` remembers the turns each replayed add key stored,
``jobs`` keeps the durable consolidation jobs, ``purging`` is the purge guard above, and
``turns_by_session`` serves per-session reads. Its migration only adds these.

Version 5 adds ``purges``, each user's count of purges (:mod:`retrieval.memory.purge` bumps it in
the purging transaction): a change marker of what a purge removes, which the user's other counts
may not show (a purge of a session with no closed segment leaves the user's next segment number
and record count as they were). It outlives the user's rows, a forget included: a reader that
held the user must still see the forget, so it holds the user's id and a number, nothing of what
the user said. Its migration only adds the table.

Version 6 keys the cached arrays (``vectors``, ``codes``) by user as well as by model and text:
each user's arrays are computed from its own texts and read, copied and scrubbed with it, so a
user's adds, searches and purges neither use nor remove another user's copy of the same text
(whose presence would otherwise show in how fast a text is taken in). Its migration gives each
cached array to every user whose records, raw turns (as embedded: :meth:`Turn.render`) or
evidence nodes hold the text; an array no stored text of a user names (a segmentation exchange,
a question of the evaluation) is left out and computed again when next needed.

Version 7 adds to each ``purges`` row the numbers the user's ids count on from: ``next_seq``, one
past the highest segment number the user ever had, and ``next_turn``, one past the highest number
of a purged turn id of the form ``<session>:<n>``. A purge raises them, so a record id
(``<user>:<segment>:<n>``) or a generated turn id never names new data after its old data went,
and a stale delete or read of an old id finds nothing. Its migration added the columns at 0.

Version 8 sets the marks for the purges made before version 7, which left none. No purged id is
left to read them from, so its migration raises the marks of every user the store knows (stored
turns or a ``purges`` row), purged or not, past any id the earlier numbering can have given. With
T the turns ever stored (the turns' AUTOINCREMENT counter), a generated turn number stayed at most
2T (it counted on from the session's stored turns, skipping only stored ids), and a segment number
below T (one past the highest kept, each segment covering turns no other had), save that the first
versions of the memory API used a number up at each failed commit of a segment. Both marks go to
:data:`EARLIER_IDS_BOUND`, one billion, which leaves room for those (past 500 million turns,
``next_seq`` to T and ``next_turn`` to 2T + 1 where higher): one bound for every user, since marks
drawn from the store's counts, or raised only where something was purged, would tell each user how
much the others wrote, or that one of them deleted. A store from before purging existed (versions
1 to 3) keeps its numbering. Two kinds of purged id stay unknowable: a caller's own id of the form
``<session>:<n>``, and the ids of a user forgotten whole before version 5 (nothing of it is left).

Version 9 adds to each segment ``flushed_after``, the id of the last turn the stream had fed when
a flush closed the segment: a flush's place in the turn log, which a restarted stream needs to
replay its surprise history (:mod:`retrieval.ingestion.push_order`). A purge that removes that turn
moves it to the nearest earlier turn that stays (the same place among the turns left), or empties
it, so no purged id stays behind; nothing else changes it. Its migration adds the column empty:
the segments stored before keep their flushes placed just after their own last turn.

Version 10 adds ``amus_by_position``, each user's records in store order: a page of ``list``
read and sorted all of the user's records (a walk of all pages was quadratic in them). Its
migration only builds the index.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import sqlite3
from collections.abc import Iterable, Sequence

from retrieval.memory.fts import FTS_TOKENIZER
from retrieval.memory.indexing import backfill
from retrieval.memory.records import Turn

SCHEMA_VERSION = 10

EARLIER_IDS_BOUND = 10**9
"""Where the migration to version 8 counts each known user's ids on from (see the module docstring)."""

RAISE_ID_MARKS = "next_seq = max(next_seq, excluded.next_seq), next_turn = max(next_turn, excluded.next_turn)"
"""The upsert clause that raises a ``purges`` row's id marks, never lowers them."""

TABLES = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
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
    content_sha256 TEXT,
    revision INTEGER NOT NULL DEFAULT 0,
    flushed_after TEXT,
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
    archived INTEGER NOT NULL DEFAULT 0,
    successor TEXT,
    t_ref TEXT,
    valid_from TEXT,
    valid_to TEXT
);
CREATE INDEX IF NOT EXISTS amus_by_session ON amus (conversation_id, session_id);
CREATE INDEX IF NOT EXISTS amus_by_segment ON amus (conversation_id, segment);
CREATE INDEX IF NOT EXISTS amus_by_position ON amus (conversation_id, position);
CREATE TABLE IF NOT EXISTS amu_entities (amu INTEGER NOT NULL REFERENCES amus(position), \
entity TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS amu_entities_by_entity ON amu_entities (entity);
CREATE TABLE IF NOT EXISTS amu_times (
    amu INTEGER NOT NULL REFERENCES amus(position), start TEXT NOT NULL, end TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS amu_times_by_start ON amu_times (start);
-- Derived arrays cached per user and model identity (embedder or fingerprinter) (schema 6).
CREATE TABLE IF NOT EXISTS vectors (conversation_id TEXT NOT NULL, model TEXT NOT NULL, \
item TEXT NOT NULL, vector BLOB NOT NULL, PRIMARY KEY (conversation_id, model, item));
CREATE TABLE IF NOT EXISTS codes (conversation_id TEXT NOT NULL, model TEXT NOT NULL, \
item TEXT NOT NULL, codes BLOB NOT NULL, PRIMARY KEY (conversation_id, model, item));
-- Structured evidence (schema 3): full text of the active AMUs (rowid = amus.position) ...
CREATE VIRTUAL TABLE IF NOT EXISTS amu_fts USING fts5(text, entities, topics, tokenize='{FTS_TOKENIZER}');
-- ... and evidence nodes node_type:key per conversation (event frames keep session and turns).
CREATE TABLE IF NOT EXISTS evidence_nodes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id TEXT NOT NULL,
    node_type TEXT NOT NULL,
    key TEXT NOT NULL,
    text TEXT NOT NULL,
    session_id TEXT,
    turn_ids TEXT,
    UNIQUE (conversation_id, node_type, key)
);
CREATE TABLE IF NOT EXISTS evidence_links (
    node INTEGER NOT NULL REFERENCES evidence_nodes(id), amu INTEGER NOT NULL REFERENCES amus(position),
    PRIMARY KEY (node, amu)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS evidence_links_by_amu ON evidence_links (amu);
-- Online API (schema 4): replayed add keys, durable jobs, the purge guard.
CREATE INDEX IF NOT EXISTS turns_by_session ON turns (conversation_id, session_id);
CREATE TABLE IF NOT EXISTS idempotency (
    conversation_id TEXT NOT NULL, key TEXT NOT NULL, turn_ids TEXT NOT NULL, \
PRIMARY KEY (conversation_id, key)
);
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id TEXT NOT NULL,
    session_id TEXT,
    kind TEXT NOT NULL,
    state TEXT NOT NULL,
    progress TEXT NOT NULL,
    error TEXT,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state);
CREATE TABLE IF NOT EXISTS purging (flag INTEGER PRIMARY KEY);
-- Purges per user (schema 5): bumped by every purge, kept after it, with the numbers the user's
-- ids count on from (schema 7).
CREATE TABLE IF NOT EXISTS purges (conversation_id TEXT PRIMARY KEY, count INTEGER NOT NULL,
                                   next_seq INTEGER NOT NULL DEFAULT 0, next_turn INTEGER NOT NULL DEFAULT 0);
"""

TRIGGERS = """
DROP TRIGGER IF EXISTS amus_append_only;
CREATE TRIGGER amus_append_only
BEFORE UPDATE OF id, conversation_id, session_id, segment, text, memory_type, observed_at,
                 timestamps, entities, tags, turn_ids, speakers, t_ref, valid_from, valid_to ON amus
BEGIN SELECT RAISE(ABORT, 'AMUs are append-only: only archived, fingerprint and successor may change'); END;
DROP TRIGGER IF EXISTS amus_archive_one_way;
CREATE TRIGGER amus_archive_one_way BEFORE UPDATE OF archived ON amus \
WHEN old.archived = 1 AND new.archived = 0
BEGIN SELECT RAISE(ABORT, 'archiving is one-way: an archived AMU is never restored'); END;
DROP TRIGGER IF EXISTS amus_fts_insert;
CREATE TRIGGER amus_fts_insert AFTER INSERT ON amus WHEN new.archived = 0
BEGIN INSERT INTO amu_fts (rowid, text, entities, topics) VALUES (new.position, new.text, \
(SELECT group_concat(value, ' ') FROM json_each(new.entities)), \
(SELECT group_concat(value, ' ') FROM json_each(new.tags))); END;
DROP TRIGGER IF EXISTS amus_index_archive;
CREATE TRIGGER amus_index_archive AFTER UPDATE OF archived ON amus WHEN old.archived = 0 AND new.archived = 1
BEGIN DELETE FROM amu_fts WHERE rowid = old.position; \
DELETE FROM evidence_links WHERE amu = old.position; END;
DROP TRIGGER IF EXISTS amus_no_delete;
CREATE TRIGGER amus_no_delete BEFORE DELETE ON amus WHEN NOT EXISTS (SELECT 1 FROM purging)
BEGIN SELECT RAISE(ABORT, 'AMUs are append-only: they can be archived, not deleted'); END;
DROP TRIGGER IF EXISTS turns_append_only;
CREATE TRIGGER turns_append_only BEFORE UPDATE ON turns
BEGIN SELECT RAISE(ABORT, 'raw turns are append-only'); END;
DROP TRIGGER IF EXISTS turns_no_delete;
CREATE TRIGGER turns_no_delete BEFORE DELETE ON turns WHEN NOT EXISTS (SELECT 1 FROM purging)
BEGIN SELECT RAISE(ABORT, 'raw turns are append-only'); END;
DROP TRIGGER IF EXISTS segments_append_only;
CREATE TRIGGER segments_append_only
BEFORE UPDATE OF conversation_id, seq, session_id, turn_ids, reason, content_sha256 ON segments
BEGIN SELECT RAISE(ABORT, 'a segment''s identity is append-only'); END;
DROP TRIGGER IF EXISTS segments_flush_moves_in_purge;
CREATE TRIGGER segments_flush_moves_in_purge BEFORE UPDATE OF flushed_after ON segments
WHEN NOT EXISTS (SELECT 1 FROM purging)
BEGIN SELECT RAISE(ABORT, 'a segment''s flush moves only when a purge removes its turn'); END;
DROP TRIGGER IF EXISTS segments_no_delete;
CREATE TRIGGER segments_no_delete BEFORE DELETE ON segments WHEN NOT EXISTS (SELECT 1 FROM purging)
BEGIN SELECT RAISE(ABORT, 'segment progress rows are append-only'); END;
"""

SCHEMA_OBJECTS = tuple(re.findall(r"CREATE (?:VIRTUAL )?(?:TABLE|INDEX|TRIGGER) (?:IF NOT EXISTS )?(\w+)",
                                   TABLES + TRIGGERS))
"""Every table, index and trigger of the current schema: ``retrieval.store check`` finds missing ones."""

_V1_COLUMNS = (
    "ALTER TABLE segments ADD COLUMN content_sha256 TEXT;"
    "ALTER TABLE segments ADD COLUMN revision INTEGER NOT NULL DEFAULT 0;"
    "ALTER TABLE amus ADD COLUMN successor TEXT;"
)
_V6_ID_MARKS = ("ALTER TABLE purges ADD COLUMN next_seq INTEGER NOT NULL DEFAULT 0;"
                "ALTER TABLE purges ADD COLUMN next_turn INTEGER NOT NULL DEFAULT 0;")
_V9_FLUSHES = "ALTER TABLE segments ADD COLUMN flushed_after TEXT;"
_V5_CACHE = ("ALTER TABLE vectors RENAME TO vectors_v5;"
             "ALTER TABLE codes RENAME TO codes_v5;")



def user_texts(user: str) -> str:
    """A query of every stored text of each user, as (``user``, text), where ``user`` names the
    tables' user column: the texts a cached array may derive from (a turn as
    :meth:`retrieval.memory.records.Turn.render` embeds it)."""
    return (f"SELECT {user}, text FROM amus UNION SELECT {user}, text FROM evidence_nodes "
            f"UNION SELECT {user}, speaker || ': ' || text || CASE WHEN coalesce(image_caption, '') <> '' "
            "THEN ' [shares an image: ' || image_caption || ']' ELSE '' END FROM turns")

_V2_COLUMNS = (
    "ALTER TABLE amus ADD COLUMN t_ref TEXT;"
    "ALTER TABLE amus ADD COLUMN valid_from TEXT;"
    "ALTER TABLE amus ADD COLUMN valid_to TEXT;"
)


def content_sha256(rows: Iterable[tuple[str, str, str, str | None, str | None]]) -> str:
    """What a segment says, as one checksum: (turn id, speaker, text, session time, image caption)
    of each turn, in order. Resuming compares it, so an edited input is never silently kept old."""
    return hashlib.sha256(json.dumps(list(rows), ensure_ascii=False).encode()).hexdigest()


def turns_sha256(turns: Sequence[Turn]) -> str:
    """:func:`content_sha256` of these turns."""
    return content_sha256((t.turn_id, t.speaker, t.text,
                           t.session_time.isoformat() if t.session_time else None,
                           t.image_caption) for t in turns)


def _statements(script: str) -> list[str]:
    """The statements of a script (a trigger body's inner ';' is never followed by a newline)."""
    return [statement for statement in script.split(";\n") if statement.strip()]


def create_or_migrate(db: sqlite3.Connection, version: int) -> None:
    """Bring a new (0), version-1 to -9 store to :data:`SCHEMA_VERSION`, in the caller's
    transaction (version 1 goes through version 2; versions 4 and 5 only add tables and the purge
    guard; version 6 re-keys the cache tables by user; version 7 adds the id marks to ``purges``;
    version 8 sets them for the purges made before version 7; version 9 adds the segments'
    ``flushed_after``; version 10 an index)."""
    if version == 1:
        _alter(db, _V1_COLUMNS)
        db.execute("DROP TRIGGER IF EXISTS segments_append_only")  # v1's forbade the checksum update below
        for (user_id, seq, turn_ids) in db.execute(
                "SELECT conversation_id, seq, turn_ids FROM segments").fetchall():
            rows = [db.execute("SELECT turn_id, speaker, text, session_time, image_caption FROM turns "
                               "WHERE conversation_id = ? AND turn_id = ?",
                               (user_id, turn_id)).fetchone()
                    for turn_id in json.loads(turn_ids)]
            db.execute("UPDATE segments SET content_sha256 = ? WHERE conversation_id = ? AND seq = ?",
                       (content_sha256(tuple(row) for row in rows), user_id, seq))
    if version in (1, 2):
        _alter(db, _V2_COLUMNS)
    if version in (5, 6):  # earlier versions have no purges table: the one below has the marks
        _alter(db, _V6_ID_MARKS)
    if version in range(1, 9):
        _alter(db, _V9_FLUSHES)
    for statement in _statements(TABLES) + _statements(TRIGGERS):
        db.execute(statement)
    if version in (1, 2):
        backfill(db)  # the evidence indexes of the AMUs stored before version 3
    if version in range(2, 6):  # version 1 had no cache tables
        _cache_by_user(db)
    if version in range(4, 8):  # purging came with version 4
        _mark_earlier_purges(db)
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")


FOREIGN_OBJECT_HINT = " (another program's? it may keep what a delete removes: drop it if it is not yours)"
"""What ``store check`` says after each object of a store that its schema has not (either backend)."""


@functools.cache
def schema_objects() -> dict[str, tuple[str, str | None]]:
    """Every object of a new store's ``sqlite_master`` (SQLite's own indexes and the full-text
    index's shadow tables with the schema's), by name: its type and its SQL as SQLite keeps it.
    Triggers are made again from :data:`TRIGGERS` by every migration, so a store's triggers have
    exactly this SQL; its tables may have other (columns added by a migration)."""
    db = sqlite3.connect(":memory:")
    try:
        create_or_migrate(db, 0)
        rows = db.execute("SELECT name, type, sql FROM sqlite_master").fetchall()
        return {name: (kind, sql) for name, kind, sql in rows}
    finally:
        db.close()


def _cache_by_user(db: sqlite3.Connection) -> None:
    """Give each array of the version-5 cache tables to the users whose texts hold its text
    (see the module docstring), then drop those tables; the rest of the schema is current."""
    _alter(db, _V5_CACHE)
    for statement in _statements(TABLES):  # the cache tables anew (every other one is there)
        db.execute(statement)
    db.create_function("text_sha256", 1, lambda text: hashlib.sha256(text.encode("utf-8")).hexdigest(),
                       deterministic=True)
    for table, column in (("vectors", "vector"), ("codes", "codes")):
        db.execute(f"INSERT OR IGNORE INTO {table} (conversation_id, model, item, {column}) "
                   f"SELECT u.conversation_id, c.model, c.item, c.{column} FROM "
                   "(SELECT DISTINCT conversation_id, text_sha256(text) AS item FROM "
                   f"({user_texts('conversation_id')})) AS u "
                   f"JOIN {table}_v5 AS c ON c.item = u.item")
        db.execute(f"DROP TABLE {table}_v5")


def _mark_earlier_purges(db: sqlite3.Connection) -> None:
    """Raise each known user's id marks past every id the numbering before version 7 can have
    given (version 8, see the module docstring)."""
    (ever,) = db.execute("SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'turns'), 0)"
                         ).fetchone()
    marks = (max(EARLIER_IDS_BOUND, ever), max(EARLIER_IDS_BOUND, 2 * ever + 1))
    db.execute("INSERT INTO purges (conversation_id, count, next_seq, next_turn) "
               "SELECT conversation_id, 0, ?, ? FROM "
               "(SELECT conversation_id FROM turns UNION SELECT conversation_id FROM purges) "
               f"WHERE true ON CONFLICT (conversation_id) DO UPDATE SET {RAISE_ID_MARKS}", marks)


def _alter(db: sqlite3.Connection, columns: str) -> None:
    for statement in columns.split(";"):
        if statement:
            db.execute(statement)
