"""The PostgreSQL store's schema and its versioned migrations.

``schema_version`` holds the version reached; :data:`MIGRATIONS` lists the steps, the n-th taking
the schema from version n to n + 1. :func:`prepare` applies the missing steps in one transaction
under an advisory lock, so two processes opening a fresh database never race (the second waits,
then finds the schema current); a half-migrated schema is never left behind. A store in use is
migrated only while no session but the new version's nodes is connected (:func:`_wait_alone`).

The tables are the SQLite store's (:mod:`retrieval.memory.schema`), every one that holds a user's
rows keyed by ``user_id``, positions ``bigserial`` (insertion order, never reused), flags
``boolean``, JSON lists and times as text exactly as SQLite stores them. What SQLite does not need
here: no FTS5 table (the lexical route scores over each user's own in-memory table,
:mod:`retrieval.index.fts`, so the store keeps none), and dense vectors are ``bytea`` in the
cache tables (no pgvector: each node reads a user's vectors into its in-memory bank, as from
SQLite). Store-wide, as on SQLite: ``meta`` (per-user entries carry the user in their key).
Version 2 adds the API keys (``api_keys``, :mod:`retrieval.memory.postgres.keys`), which a SQLite
store keeps in a file beside it.
Version 3 adds ``purges``, each user's count of purges, as the SQLite store's version 5 does.
Version 4 keys the cache tables by user, as the SQLite store's version 6 does.
Version 5 adds the numbers each user's ids count on from to ``purges``, as the SQLite store's
version 7 does, and version 6 sets them for the purges made before it, as the SQLite store's
version 8 does (the turns' sequence counts the turns ever stored, and inserts that rolled back).
Version 7 keeps users' words out of the planner's statistics (:data:`_UNSAMPLED`).
Version 8 adds the segments' ``flushed_after``, as the SQLite store's version 9 does (unsampled).

The invariants are PostgreSQL triggers, as SQLite's are: raw turns never change; a record's fact
never changes (only ``archived``, one way, ``fingerprint`` and ``successor``), and archiving drops
its evidence links; a segment's identity never changes; nothing is deleted except by a purge,
whose transaction sets ``memory.purging`` (``SET LOCAL``: no other transaction sees it). A
violation raises an ``integrity_constraint_violation`` (psycopg's ``IntegrityError``).
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

import psycopg

from retrieval.memory.errors import StoreError
from retrieval.memory.postgres import database
from retrieval.memory.postgres.versions import COMMIT_SLOTS
from retrieval.memory.schema import EARLIER_IDS_BOUND, FOREIGN_OBJECT_HINT, user_texts
from retrieval.memory.store_contract import needs_migration

if TYPE_CHECKING:
    from retrieval.memory.postgres.database import Connection, Database

SCHEMA_LOCK = 0x49_53_51_4D_45_4D  # "ISQMEM": the advisory lock that serialises migrations

PURGING = "SET LOCAL memory.purging = 'on'"
"""What a purge's transaction runs first: the no-delete triggers stand down for it alone."""

_TABLES = f"""
CREATE TABLE meta (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE commits (slot integer PRIMARY KEY, count bigint NOT NULL);
INSERT INTO commits (slot, count) SELECT slot, 0 FROM generate_series(0, {COMMIT_SLOTS - 1}) AS slot;
CREATE TABLE turns (
    position bigserial PRIMARY KEY, user_id text NOT NULL, session_id text NOT NULL,
    turn_id text NOT NULL, speaker text NOT NULL, text text NOT NULL, session_time text,
    image_caption text, UNIQUE (user_id, turn_id));
CREATE INDEX turns_by_session ON turns (user_id, session_id);
CREATE TABLE segments (
    position bigserial UNIQUE, user_id text NOT NULL, seq integer NOT NULL, session_id text NOT NULL,
    turn_ids text NOT NULL, reason text NOT NULL, state text NOT NULL, fallback boolean NOT NULL,
    amu_count integer NOT NULL, content_sha256 text, revision integer NOT NULL DEFAULT 0,
    PRIMARY KEY (user_id, seq));
CREATE TABLE amus (
    position bigserial PRIMARY KEY, id text NOT NULL UNIQUE, user_id text NOT NULL,
    session_id text NOT NULL, segment integer, text text NOT NULL, memory_type text NOT NULL,
    observed_at text, timestamps text NOT NULL, entities text NOT NULL, tags text NOT NULL,
    turn_ids text NOT NULL, speakers text NOT NULL, fingerprint text,
    archived boolean NOT NULL DEFAULT false, successor text, t_ref text, valid_from text, valid_to text);
CREATE INDEX amus_by_user ON amus (user_id, position);
CREATE INDEX amus_by_session ON amus (user_id, session_id);
CREATE INDEX amus_by_segment ON amus (user_id, segment);
CREATE TABLE amu_entities (user_id text NOT NULL, amu bigint NOT NULL REFERENCES amus (position),
                           entity text NOT NULL);
CREATE INDEX amu_entities_by_entity ON amu_entities (user_id, entity);
CREATE INDEX amu_entities_by_amu ON amu_entities (amu);
CREATE TABLE amu_times (user_id text NOT NULL, amu bigint NOT NULL REFERENCES amus (position),
                        start_time text NOT NULL, end_time text NOT NULL);
CREATE INDEX amu_times_by_start ON amu_times (user_id, start_time);
CREATE INDEX amu_times_by_amu ON amu_times (amu);
CREATE TABLE vectors (model text NOT NULL, item text NOT NULL, vector bytea NOT NULL,
                      PRIMARY KEY (model, item));
CREATE TABLE codes (model text NOT NULL, item text NOT NULL, codes bytea NOT NULL,
                    PRIMARY KEY (model, item));
CREATE TABLE evidence_nodes (
    id bigserial PRIMARY KEY, user_id text NOT NULL, node_type text NOT NULL, key text NOT NULL,
    text text NOT NULL, session_id text, turn_ids text, UNIQUE (user_id, node_type, key));
CREATE TABLE evidence_links (
    user_id text NOT NULL, node bigint NOT NULL REFERENCES evidence_nodes (id),
    amu bigint NOT NULL REFERENCES amus (position), PRIMARY KEY (node, amu));
CREATE INDEX evidence_links_by_amu ON evidence_links (amu);
CREATE TABLE idempotency (user_id text NOT NULL, key text NOT NULL, turn_ids text NOT NULL,
                          PRIMARY KEY (user_id, key));
CREATE TABLE jobs (
    id bigserial PRIMARY KEY, user_id text NOT NULL, session_id text, kind text NOT NULL,
    state text NOT NULL, progress text NOT NULL, error text, created double precision NOT NULL,
    updated double precision NOT NULL);
CREATE INDEX jobs_by_state ON jobs (state);
CREATE INDEX jobs_by_user ON jobs (user_id);
"""

# The two triggers whose conditions name columns: a change of those columns' type must drop them first.
_AMUS_APPEND_ONLY = """
CREATE TRIGGER amus_append_only BEFORE UPDATE ON amus FOR EACH ROW
WHEN ((OLD.id, OLD.user_id, OLD.session_id, OLD.segment, OLD.text, OLD.memory_type, OLD.observed_at,
       OLD.timestamps, OLD.entities, OLD.tags, OLD.turn_ids, OLD.speakers, OLD.t_ref, OLD.valid_from,
       OLD.valid_to) IS DISTINCT FROM
      (NEW.id, NEW.user_id, NEW.session_id, NEW.segment, NEW.text, NEW.memory_type, NEW.observed_at,
       NEW.timestamps, NEW.entities, NEW.tags, NEW.turn_ids, NEW.speakers, NEW.t_ref, NEW.valid_from,
       NEW.valid_to))
EXECUTE FUNCTION refuse('AMUs are append-only: only archived, fingerprint and successor may change');
"""

_SEGMENTS_APPEND_ONLY = """
CREATE TRIGGER segments_append_only BEFORE UPDATE ON segments FOR EACH ROW
WHEN ((OLD.user_id, OLD.seq, OLD.session_id, OLD.turn_ids, OLD.reason, OLD.content_sha256)
      IS DISTINCT FROM (NEW.user_id, NEW.seq, NEW.session_id, NEW.turn_ids, NEW.reason, NEW.content_sha256))
EXECUTE FUNCTION refuse('a segment''s identity is append-only');
"""

_TRIGGERS = f"""
CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION USING MESSAGE = TG_ARGV[0], ERRCODE = 'integrity_constraint_violation'; END $$;
CREATE FUNCTION refuse_unless_purging() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF current_setting('memory.purging', true) IS DISTINCT FROM 'on' THEN
    RAISE EXCEPTION USING MESSAGE = TG_ARGV[0], ERRCODE = 'integrity_constraint_violation';
  END IF;
  RETURN OLD;
END $$;
CREATE FUNCTION drop_archived_links() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN DELETE FROM evidence_links WHERE amu = OLD.position; RETURN NULL; END $$;
{_AMUS_APPEND_ONLY}CREATE TRIGGER amus_archive_one_way BEFORE UPDATE ON amus FOR EACH ROW
WHEN (OLD.archived AND NOT NEW.archived)
EXECUTE FUNCTION refuse('archiving is one-way: an archived AMU is never restored');
CREATE TRIGGER amus_index_archive AFTER UPDATE ON amus FOR EACH ROW
WHEN (NOT OLD.archived AND NEW.archived) EXECUTE FUNCTION drop_archived_links();
CREATE TRIGGER amus_no_delete BEFORE DELETE ON amus FOR EACH ROW
EXECUTE FUNCTION refuse_unless_purging('AMUs are append-only: they can be archived, not deleted');
CREATE TRIGGER turns_append_only BEFORE UPDATE ON turns FOR EACH ROW
EXECUTE FUNCTION refuse('raw turns are append-only');
CREATE TRIGGER turns_no_delete BEFORE DELETE ON turns FOR EACH ROW
EXECUTE FUNCTION refuse_unless_purging('raw turns are append-only');
{_SEGMENTS_APPEND_ONLY}CREATE TRIGGER segments_no_delete BEFORE DELETE ON segments FOR EACH ROW
EXECUTE FUNCTION refuse_unless_purging('segment progress rows are append-only');
"""

_KEYS = """
CREATE TABLE api_keys (
    position bigserial UNIQUE, key_id text PRIMARY KEY, user_id text NOT NULL, salt bytea NOT NULL,
    digest bytea NOT NULL, created text NOT NULL, revoked text);
CREATE INDEX api_keys_by_user ON api_keys (user_id);
"""

_PURGES = """
CREATE TABLE purges (user_id text PRIMARY KEY, count bigint NOT NULL);
"""


def _cache_by_user(table: str, column: str) -> str:
    """The step that keys a cache table by user: each array given to every user whose stored
    texts hold its text (as the SQLite store's version 6 does, :mod:`retrieval.memory.schema`)."""
    return f"""
ALTER TABLE {table} RENAME TO {table}_v3;
ALTER INDEX {table}_pkey RENAME TO {table}_v3_pkey;
CREATE TABLE {table} (user_id text NOT NULL, model text NOT NULL, item text NOT NULL, {column} bytea NOT NULL,
                      PRIMARY KEY (user_id, model, item));
INSERT INTO {table} (user_id, model, item, {column})
SELECT u.user_id, c.model, c.item, c.{column}
FROM (SELECT DISTINCT user_id, encode(sha256(convert_to(text, 'UTF8')), 'hex') AS item
      FROM ({user_texts('user_id')}) AS texts) AS u
JOIN {table}_v3 AS c ON c.item = u.item;
DROP TABLE {table}_v3;
"""


_CACHE_BY_USER = _cache_by_user("vectors", "vector") + _cache_by_user("codes", "codes")

_ID_MARKS = """
ALTER TABLE purges ADD COLUMN next_seq bigint NOT NULL DEFAULT 0,
                   ADD COLUMN next_turn bigint NOT NULL DEFAULT 0;
"""

RAISE_ID_MARKS = ("next_seq = greatest(purges.next_seq, excluded.next_seq), "
                  "next_turn = greatest(purges.next_turn, excluded.next_turn)")
"""The upsert clause that raises a ``purges`` row's id marks, never lowers them."""

_EARLIER_PURGE_MARKS = f"""
INSERT INTO purges (user_id, count, next_seq, next_turn)
SELECT known.user_id, 0, greatest({EARLIER_IDS_BOUND}, ever.turns),
       greatest({EARLIER_IDS_BOUND}, 2 * ever.turns + 1)
FROM (SELECT user_id FROM turns UNION SELECT user_id FROM purges) AS known,
     (SELECT CASE WHEN is_called THEN last_value ELSE 0 END AS turns FROM turns_position_seq) AS ever
ON CONFLICT (user_id) DO UPDATE SET {RAISE_ID_MARKS};
"""

STORE_TABLES = tuple(dict.fromkeys(re.findall(r"CREATE TABLE (\w+)",
                                              _TABLES + _KEYS + _PURGES + _CACHE_BY_USER)))
"""The store's tables (``schema_version`` aside)."""

STATISTICS_OWED = "pg_statistic_owed"
"""The ``meta`` key version 7 sets where it dropped sampled words: ``pg_statistic``'s file still
holds them until ``compact`` rewrites it (:meth:`retrieval.memory.postgres.purge.Purge.compact`)."""

_UNSAMPLED = f"""
DROP TRIGGER amus_append_only ON amus;
DROP TRIGGER segments_append_only ON segments;
DO $$
DECLARE col record; sampled boolean := false;
BEGIN
  FOR col IN SELECT c.relname AS tab, a.attname AS name, format_type(a.atttypid, a.atttypmod) AS type
             FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
             WHERE c.relnamespace = current_schema()::regnamespace
               AND c.relname = ANY(ARRAY{list(STORE_TABLES)}) AND a.attnum > 0 AND NOT a.attisdropped
               AND a.atttypid IN ('text'::regtype, 'bytea'::regtype) AND a.attname <> 'user_id'
  LOOP
    sampled := sampled OR EXISTS (SELECT 1 FROM pg_stats WHERE schemaname = current_schema()
                                  AND tablename = col.tab AND attname = col.name);
    EXECUTE format('ALTER TABLE %I ALTER COLUMN %I SET STATISTICS 0, ALTER COLUMN %I TYPE %s',
                   col.tab, col.name, col.name, col.type);
  END LOOP;
  IF sampled THEN
    INSERT INTO meta (key, value) VALUES ('{STATISTICS_OWED}', 'true') ON CONFLICT (key) DO NOTHING;
  END IF;
END $$;
{_AMUS_APPEND_ONLY}{_SEGMENTS_APPEND_ONLY}"""
"""Version 7: no column that holds what users said (every text and bytea column but ``user_id``)
is sampled into PostgreSQL's planner statistics (``pg_statistic``, readable through ``pg_stats``):
ANALYZE, which autovacuum runs on its own, copies a sample of a column's values there, where no
purge reaches them. ``SET STATISTICS 0`` stops the sampling; the type set again to itself (no
rewrite of the table) drops what was sampled before, which is why the two triggers that name
columns are dropped and made again around it. Where something had been sampled, the dropped rows
stay in ``pg_statistic``'s file until a ``compact`` rewrites it (:data:`STATISTICS_OWED`)."""

_FLUSHES = """
ALTER TABLE segments ADD COLUMN flushed_after text;
ALTER TABLE segments ALTER COLUMN flushed_after SET STATISTICS 0;
CREATE TRIGGER segments_flush_moves_in_purge BEFORE UPDATE ON segments FOR EACH ROW
WHEN (OLD.flushed_after IS DISTINCT FROM NEW.flushed_after
      AND current_setting('memory.purging', true) IS DISTINCT FROM 'on')
EXECUTE FUNCTION refuse('a segment''s flush moves only when a purge removes its turn');
"""
"""Version 8: where in the turn log a flush closed each segment (:mod:`retrieval.memory.schema`,
version 9), which only a purge of that turn moves."""

MIGRATIONS: tuple[str, ...] = (_TABLES + _TRIGGERS, _KEYS, _PURGES, _CACHE_BY_USER, _ID_MARKS,
                               _EARLIER_PURGE_MARKS, _UNSAMPLED, _FLUSHES)
"""The schema's steps: ``MIGRATIONS[n]`` takes version n to n + 1."""

SCHEMA_VERSION = len(MIGRATIONS)

_TAKEN = (psycopg.errors.DuplicateTable, psycopg.errors.DuplicateObject, psycopg.errors.DuplicateFunction)
"""A name a migration creates is another application's: not a store database."""


def prepare(db: Database) -> None:
    """Bring the database's schema to :data:`SCHEMA_VERSION` (read-only: check that it is there)."""
    with db.connection() as conn:
        if db.read_only:
            version = _version(conn)
            if version == 0:
                raise StoreError(f"no store at {db.where} (no schema there); open it for writing once")
            needs_migration(version, SCHEMA_VERSION, where=db.where, read_only=True)
            return
        with conn.transaction():
            # another node's migration holds the schema's lock as long as it rewrites tables; a table's
            # lock is waited for as any write waits, since the other nodes' reads queue behind this one
            database.set_lock_timeout(conn, 0)
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
            database.set_lock_timeout(conn, database.LOCK_WAIT_S)
            conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version integer NOT NULL)")
            version = _version(conn)
            if needs_migration(version, SCHEMA_VERSION, where=db.where, read_only=False) and version:
                _wait_alone(conn, db.where, version)
            for step in MIGRATIONS[version:]:
                try:
                    conn.execute(step)  # type: ignore[arg-type]  # our own constant script
                except _TAKEN as err:
                    raise StoreError(f"{db.where} holds another application's tables ({err}); "
                                     "give the memory a database of its own") from None
            conn.execute("DELETE FROM schema_version")
            conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (SCHEMA_VERSION,))


ALONE_WAIT_S = 3.0
"""How long a migration waits for the database's other sessions to end or to queue behind its
lock (nodes starting beside it, a connection just closed) before it is refused."""


def _wait_alone(conn: Connection, where: str, version: int) -> None:
    """Refuse to migrate while another session is connected to the database: an older node still
    serving would go on writing in the layout its code knows (rows the new columns require, ids a
    later purge has retired), and nothing tells it the schema changed. Sessions waiting for the
    schema's lock and those marked as nodes of this schema (new nodes opening beside this one,
    this node's own pool: :data:`~retrieval.memory.postgres.database.NODE_LOCKS`) are not counted."""
    deadline = time.monotonic() + ALONE_WAIT_S
    while others := _other_sessions(conn):
        if time.monotonic() >= deadline:
            raise StoreError(f"{where}: schema version {version} would be migrated to {SCHEMA_VERSION} "
                             f"while other sessions are connected to the database ({'; '.join(others)}): "
                             "stop every process of the earlier version (servers, readers, "
                             "consolidations) and other clients of the database, then open it again; "
                             "nothing was changed")
        time.sleep(0.1)


def _other_sessions(conn: Connection) -> list[str]:
    """The database's other client sessions that neither wait for this one nor are marked as nodes
    of this schema, described. A session of a role whose details this one may not see (not a
    member of it, no ``pg_read_all_stats``) shows its role but a null ``backend_type``: it counts as
    a client (background workers have no role)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")  # the view is otherwise read once a transaction
    rows = conn.execute(
        "SELECT pid, usename, application_name, client_addr, backend_type FROM pg_stat_activity "
        "WHERE datname = current_database() AND usesysid IS NOT NULL "
        "AND coalesce(backend_type, 'client backend') = 'client backend' AND pid <> pg_backend_pid() "
        "AND NOT pg_backend_pid() = ANY(pg_blocking_pids(pid)) AND NOT EXISTS (SELECT 1 FROM pg_locks "
        "WHERE pg_locks.pid = pg_stat_activity.pid AND locktype = 'advisory' AND granted "
        "AND classid::bigint = %s AND objid::bigint = %s AND objsubid = 2) ORDER BY pid",
        (database.NODE_LOCKS, SCHEMA_VERSION)).fetchall()
    return [f"pid {row['pid']} of {row['usename']}"
            + (f" {row['application_name']!r}" if row["application_name"] else "")
            + (f" from {row['client_addr']}" if row["client_addr"] else
               " on a local socket" if row["backend_type"] else "") for row in rows]


def _version(conn: Connection) -> int:
    row = conn.execute("SELECT to_regclass('schema_version') IS NOT NULL AS present").fetchone()
    if row is None or not row["present"]:
        return 0
    found = conn.execute("SELECT max(version) AS version FROM schema_version").fetchone()
    return 0 if found is None else int(found["version"] or 0)



COMPACTED = STORE_TABLES + ("schema_version",)
"""Every table of the store: what ``compact`` rewrites."""

SCHEMA_OBJECTS = tuple(dict.fromkeys(re.findall(r"CREATE (?:TABLE|INDEX|TRIGGER) (\w+)",
                                                "".join(MIGRATIONS))))
"""Every table, index and trigger of the current schema: ``integrity_problems`` finds missing ones."""

_TRIGGER_FUNCTIONS = {name: (table, function) for name, table, function in re.findall(
    r"CREATE TRIGGER (\w+) [^;]*?\bON (\w+) [^;]*?EXECUTE FUNCTION (\w+)\(", "".join(MIGRATIONS))}
"""Each trigger of the schema: the table it is on and the function it runs."""

_FUNCTION_BODIES = dict(re.findall(r"CREATE FUNCTION (\w+)\(\) [^$]*?AS \$\$(.*?)\$\$", "".join(MIGRATIONS),
                                   re.S))
"""Each function of the schema: its body as PostgreSQL keeps it (``pg_proc.prosrc``)."""


def foreign_objects(db: Database) -> list[str]:
    """The tables, views and rules in the store's schema that the schema has not (an extension's
    aside: pg_stat_statements' views, say, which PostgreSQL keeps its own), and the triggers
    on its tables that are not the schema's, run another function or one whose code was changed
    (another program's: a trigger or a view may keep what a purge removes), then the schema's
    triggers that are disabled. A trigger's condition is not compared: PostgreSQL keeps it as a
    parse tree."""
    here = "current_schema()::regnamespace"
    tables = {*STORE_TABLES, "schema_version"}
    problems = [f"{_KINDS[row['kind']]} {row['name']!r} is not the store's" for row in db.rows(
        f"SELECT relname AS name, relkind AS kind FROM pg_class c WHERE relnamespace = {here} "
        "AND relkind IN ('r', 'p', 'v', 'm', 'f') AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE "
        f"d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'e') ORDER BY relname")
        if row["name"] not in tables]
    problems += [f"rule {row['name']!r} on {row['table']!r} is not the store's" for row in db.rows(
        "SELECT rulename AS name, tablename AS table FROM pg_rules WHERE schemaname = current_schema() "
        "ORDER BY rulename")]
    disabled = []
    for row in db.rows(f"SELECT t.tgname AS name, c.relname AS table, p.proname AS function, "
                       f"p.pronamespace = {here} AS own, p.prosrc AS body, t.tgenabled AS enabled "
                       "FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                       "JOIN pg_proc p ON p.oid = t.tgfoid "
                       f"WHERE NOT t.tgisinternal AND c.relnamespace = {here} ORDER BY t.tgname"):
        expected = _TRIGGER_FUNCTIONS.get(row["name"])
        if expected is None:
            problems.append(f"trigger {row['name']!r} is not the store's")
        elif (row["table"], row["function"]) != expected or not row["own"]:
            problems.append(f"trigger {row['name']!r} is not the schema's: it runs another function")
        elif row["body"] != _FUNCTION_BODIES[row["function"]]:
            problems.append(f"trigger {row['name']!r} is not the schema's: its function's code was changed")
        elif row["enabled"] not in ("O", "A"):  # D: disabled; R: fires only in a replica's sessions
            disabled.append(f"trigger {row['name']!r} is disabled: ALTER TABLE {row['table']} "
                            f"ENABLE TRIGGER {row['name']}")
    return [problem + FOREIGN_OBJECT_HINT for problem in problems] + disabled


_KINDS = {"r": "table", "p": "table", "v": "view", "m": "materialized view", "f": "foreign table"}
