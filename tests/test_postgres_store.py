"""What only the PostgreSQL store has to show: a URL that does not connect, its schema versions and
their migration by several processes at once, and writers of one user in several processes (here:
several stores, each with its own pool) that PostgreSQL serialises."""

from __future__ import annotations

import threading
from collections.abc import Callable

import psycopg
import pytest

from retrieval.memory.cache import text_key
from retrieval.memory.errors import StoreError
from retrieval.memory.postgres.schema import MIGRATIONS, SCHEMA_VERSION, STATISTICS_OWED, STORE_TABLES
from retrieval.memory.postgres.store import PostgresStore
from retrieval.memory.records import SegmentRecord, Turn
from tests.postgres_server import ROLE, free_port
from tests.test_amu_store import WHEN, commit, make_amu


def at_once(jobs: list[Callable[[], object]]) -> list[object]:
    """Run the jobs in threads released together; each one's result or exception."""
    results: list[object] = [None] * len(jobs)
    start = threading.Barrier(len(jobs))

    def run(index: int) -> None:
        start.wait()
        try:
            results[index] = jobs[index]()
        except Exception as err:  # noqa: BLE001 - the caller inspects what each raised
            results[index] = err

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


def test_a_url_that_does_not_connect_is_one_error_naming_the_server_not_the_password():
    port = free_port()
    with pytest.raises(StoreError, match=rf"cannot connect to the store at postgresql://alice:\*\*\*@127.0.0.1:{port}/mem"
                       ) as raised:
        PostgresStore(f"postgresql://alice:s3cret-word@127.0.0.1:{port}/mem")
    assert "s3cret-word" not in str(raised.value) and "\n" not in str(raised.value)
    assert "Connection refused" in str(raised.value)  # the cause, not only the hint after it
    with pytest.raises(StoreError, match="notaport/mem: .*invalid integer value") as raised:
        PostgresStore("postgresql://alice:s3cret-word@127.0.0.1:notaport/mem")
    assert "s3cret-word" not in str(raised.value)


def test_schema_versions_read_only_opening_and_missing_objects(postgres_url):
    with pytest.raises(StoreError, match="no store at postgresql://postgres@127.0.0.1:.*for writing once"):
        PostgresStore(postgres_url, read_only=True)
    with PostgresStore(postgres_url) as store:
        assert store.integrity_problems() == []
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute("DROP TRIGGER turns_no_delete ON turns")
        assert store.integrity_problems() == ["schema object 'turns_no_delete' is missing"]
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("UPDATE schema_version SET version = %s", (SCHEMA_VERSION + 1,))
    for read_only in (False, True):
        with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1} is unknown to this code"):
            PostgresStore(postgres_url, read_only=read_only)


def test_check_names_what_another_program_added_to_the_schema(postgres_url):
    """A database handed over may hold another program's trigger copying every turn into its own
    table, a view or rule over the store's tables, one of the schema's triggers made to run other
    code, or one disabled: each keeps what a purge removes or lets a delete through, and check
    names it. The schema's own objects (sequences and indexes PostgreSQL makes) pass, and so do an
    extension's (pg_stat_statements' views, routine on managed servers, which only dropping the
    extension removes)."""
    with PostgresStore(postgres_url) as store:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
        assert store.integrity_problems() == []
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute("""
                CREATE TABLE kept (text text);
                CREATE FUNCTION keep() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN INSERT INTO kept VALUES (NEW.text); RETURN NEW; END $$;
                CREATE TRIGGER turns_kept AFTER INSERT ON turns FOR EACH ROW EXECUTE FUNCTION keep();
                CREATE MATERIALIZED VIEW said AS SELECT text FROM turns;
                CREATE RULE keep_amus AS ON INSERT TO amus DO ALSO INSERT INTO kept VALUES (NEW.text);
                DROP TRIGGER amus_no_delete ON amus;
                CREATE TRIGGER amus_no_delete AFTER INSERT ON amus FOR EACH ROW EXECUTE FUNCTION keep();
                CREATE OR REPLACE FUNCTION drop_archived_links() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN INSERT INTO kept SELECT text FROM amus WHERE position = OLD.position; RETURN NULL;
                END $$;
                ALTER TABLE turns DISABLE TRIGGER turns_no_delete;
                ALTER TABLE segments ENABLE REPLICA TRIGGER segments_no_delete;""")
        why = " (another program's? it may keep what a delete removes: drop it if it is not yours)"
        assert store.integrity_problems() == [
            "table 'kept' is not the store's" + why, "materialized view 'said' is not the store's" + why,
            "rule 'keep_amus' on 'amus' is not the store's" + why,
            "trigger 'amus_index_archive' is not the schema's: its function's code was changed" + why,
            "trigger 'amus_no_delete' is not the schema's: it runs another function" + why,
            "trigger 'turns_kept' is not the store's" + why,
            "trigger 'segments_no_delete' is disabled: ALTER TABLE segments ENABLE TRIGGER "
            "segments_no_delete",
            "trigger 'turns_no_delete' is disabled: ALTER TABLE turns ENABLE TRIGGER turns_no_delete"]


def test_processes_opening_a_fresh_database_at_once_migrate_it_once(postgres_url):
    stores = at_once([lambda: PostgresStore(postgres_url) for _ in range(4)])
    assert all(isinstance(store, PostgresStore) for store in stores), stores
    for store in stores:
        store.close()  # type: ignore[union-attr]
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]


def test_a_node_opening_while_another_migrates_waits_for_it_past_the_lock_timeout(postgres_url, monkeypatch):
    """A migration rewriting the tables of a large store holds the schema's lock longer than any
    lock timeout: a node opening meanwhile waits for it, then opens, rather than failing."""
    from retrieval.memory.postgres import database
    from retrieval.memory.postgres.schema import SCHEMA_LOCK

    monkeypatch.setattr(database, "LOCK_WAIT_S", 0.5)
    PostgresStore(postgres_url).close()
    opened: list[object] = []

    def open_store() -> None:
        try:
            with PostgresStore(postgres_url) as store:
                opened.append(store.users())
        except Exception as err:  # noqa: BLE001 - the assertion below shows it
            opened.append(err)

    with psycopg.connect(postgres_url) as migrating:
        migrating.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
        node = threading.Thread(target=open_store)
        node.start()
        node.join(6 * database.LOCK_WAIT_S)
        assert node.is_alive() and not opened  # waiting, not refused
        migrating.rollback()
    node.join(60)
    assert opened == [[]]


def test_a_migration_waits_a_bounded_time_for_a_table_another_transaction_reads(postgres_url, monkeypatch):
    """Past the schema's lock, a migration's steps wait for a table's lock as any write does: a
    long transaction reading it (a client that connected after the migration found the database
    otherwise idle) fails the migration after the lock timeout, committing nothing, rather than
    queueing every node's reads behind it for as long."""
    from retrieval.memory.postgres import database, schema

    monkeypatch.setattr(database, "LOCK_WAIT_S", 0.5)
    PostgresStore(postgres_url).close()
    monkeypatch.setattr(schema, "_other_sessions", lambda conn: [])  # it connects after the check
    later = "ALTER TABLE amus ADD COLUMN later integer;"
    monkeypatch.setattr(schema, "MIGRATIONS", (*schema.MIGRATIONS, later))
    monkeypatch.setattr(schema, "SCHEMA_VERSION", schema.SCHEMA_VERSION + 1)
    with psycopg.connect(postgres_url) as reading:
        reading.execute("SELECT count(*) FROM amus")  # its transaction holds the table's share lock
        with pytest.raises(StoreError, match="waited longer than its lock timeout"):
            PostgresStore(postgres_url)
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT max(version) FROM schema_version").fetchone() == (SCHEMA_VERSION,)
    with PostgresStore(postgres_url) as store:  # nothing reads it now: the migration goes through
        assert store.users() == []


def test_writers_of_one_user_in_several_processes_are_serialised(postgres_url):
    stores = [PostgresStore(postgres_url) for _ in range(4)]
    try:
        turns = [Turn("u", "s", f"s:{i}", "Ann", f"text {i}", WHEN) for i in range(1, 6)]
        added = at_once([lambda store=store: store.append_turns("u", turns) for store in stores])
        assert sorted(len(new) for new in added) == [0, 0, 0, 5]  # type: ignore[arg-type]
        record = SegmentRecord("u", 0, "s", tuple(t.turn_id for t in turns), "session_end")
        closed = at_once([lambda store=store: store.commit_stored_turns(record, []) for store in stores])
        assert sorted(type(result).__name__ for result in closed) == ["NoneType"] + ["ValueError"] * 3
        assert all("segment 0 of 'u' is already stored" in str(r) for r in closed if r is not None)
        jobs = at_once([lambda store=store: store.create_job("u", None, "consolidate") for store in stores])
        assert [created for _, created in jobs].count(True) == 1  # type: ignore[misc]
        assert stores[0].turns("u") == turns and len(stores[0].unfinished()) == 1
    finally:
        for store in stores:
            store.close()


def test_users_whose_ids_share_a_32_bit_hash_do_not_share_an_ingestion_lock(postgres_url):
    """``hashtext`` is 32 bits: among 200,000 ids several pairs collide, as these two do. Each user's
    ingestion lock is its own, so one user's long ingestion step never holds up the other's."""
    first, second = "user5865", "user189872"
    with PostgresStore(postgres_url) as store, PostgresStore(postgres_url) as other:
        assert store.db.value("SELECT hashtext(%s) = hashtext(%s)", (first, second)) is True
        with store.ingestion_lock(first, wait=True) as held:
            assert held
            with other.ingestion_lock(second, wait=False) as also:
                assert also
            with other.ingestion_lock(first, wait=False) as again:
                assert not again  # the same user's lock is still exclusive


def test_the_commit_counter_moves_only_when_something_commits(postgres_url):
    with PostgresStore(postgres_url) as store:
        commit(store, 0, [make_amu(0, 0)])
        before = store.data_version()
        with pytest.raises(ValueError, match="already stored"):
            commit(store, 0, [make_amu(0, 1)])
        assert store.data_version() == before
        with pytest.raises(psycopg.IntegrityError, match="append-only"):  # outside a purge, in autocommit
            store.db.rows("DELETE FROM turns RETURNING 1")
        assert store.data_version() == before and store.count() == 1


def test_another_handle_and_no_local_files(postgres_url):
    with PostgresStore(postgres_url) as store:
        commit(store, 0, [make_amu(0, 0)])
        assert store.location == postgres_url and store.local_files is None
        with store.reopen(read_only=True, role="consolidate") as reader:
            assert [a.id for a in reader.amus()] == ["conv-x:0:0"] and reader.read_only


def test_after_a_purge_and_compact_no_table_file_holds_the_text(postgres_server, postgres_url):
    secret = "Vormquistel"
    with psycopg.connect(postgres_url) as conn:  # this database's directory: base/<its oid>
        found = conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()
    assert found is not None
    files = postgres_server.data / "base" / str(found[0])

    def in_table_files() -> bool:
        return any(secret.lower().encode() in path.read_bytes().lower()
                   for path in files.iterdir() if path.is_file())

    def checkpoint() -> None:  # what the server holds in memory written to the table files
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")

    with PostgresStore(postgres_url) as store:
        commit(store, 0, [make_amu(0, 0, f"My neighbour {secret} repairs violins.", entities=[secret])])
        commit(store, 1, [make_amu(1, 0, "Melanie runs.")])
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute("ANALYZE")  # what autovacuum runs on its own: it samples columns into pg_statistic
        checkpoint()
        assert in_table_files()
        store.purge("conv-x", amu_ids=["conv-x:0:0"])
        store.scrub("conv-x", [f"My neighbour {secret} repairs violins."])
        checkpoint()
        assert in_table_files()  # dead tuples: deleted, still on disk
        store.compact()
        assert not in_table_files()
        assert [a.id for a in store.amus()] == ["conv-x:1:0"]
        with PostgresStore(postgres_url, read_only=True) as reader:
            with pytest.raises(StoreError, match="read-only"):
                reader.compact()


def sampled_columns(conn: psycopg.Connection) -> list[tuple[str, str]]:
    """The store's text and bytea columns, ``user_id`` aside, that PostgreSQL's statistics sampled
    (a ``pg_stats`` row)."""
    return conn.execute("SELECT s.tablename::text, s.attname::text FROM pg_stats s JOIN pg_attribute a "
                        "ON a.attrelid = s.tablename::regclass AND a.attname = s.attname "
                        "WHERE s.schemaname = current_schema() AND s.tablename = ANY(%s) "
                        "AND s.attname <> 'user_id' AND a.atttypid IN ('text'::regtype, 'bytea'::regtype) "
                        "ORDER BY 1, 2", (list(STORE_TABLES),)).fetchall()


def test_no_column_of_what_users_said_is_sampled_into_the_planner_statistics(postgres_url):
    with PostgresStore(postgres_url) as store:
        for seq in range(3):
            commit(store, seq, [make_amu(seq, i, f"Ann said {word}.", entities=[word])
                                for i, word in enumerate(["Vormquistel", "Vormquistel", "Pelliharn"])])
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("ANALYZE")
        assert sampled_columns(conn) == []
        columns = conn.execute(
            "SELECT c.relname::text, a.attname::text, a.attstattarget FROM pg_attribute a "
            "JOIN pg_class c ON c.oid = a.attrelid WHERE c.relname = ANY(%s) AND a.attnum > 0 "
            "AND NOT a.attisdropped AND a.atttypid IN ('text'::regtype, 'bytea'::regtype) "
            "AND a.attname <> 'user_id'", (list(STORE_TABLES),)).fetchall()
    assert ("turns", "text", 0) in columns and ("amu_entities", "entity", 0) in columns
    assert [column for column in columns if column[2] != 0] == []  # a column added later must say so too


def test_words_sampled_before_version_7_are_compacted_away_by_a_role_that_may_rewrite_pg_statistic(
        postgres_server):
    """A version-6 store owned by a role that does not own the database, its words sampled by
    ANALYZE: the migration drops the samples, whose rows stay in pg_statistic's file; that role's
    compact is refused before it runs, the superuser's leaves no file holding them, and then the
    role's own compact has nothing owed."""
    secret, name = "Pelliharnquist", postgres_server.database().rsplit("/", 1)[1]
    with psycopg.connect(postgres_server.url(name), autocommit=True) as admin:
        admin.execute("DO $$ BEGIN CREATE ROLE tenant LOGIN; "
                      "EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        admin.execute("GRANT pg_checkpoint TO tenant")
        admin.execute("GRANT CREATE ON SCHEMA public TO tenant")
        files = postgres_server.data / "base" / str(admin.execute(
            "SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()[0])
    tenant = postgres_server.url(name).replace(f"//{ROLE}@", "//tenant@")
    with psycopg.connect(tenant, autocommit=True) as conn:  # what version-6 code left behind
        conn.execute("CREATE TABLE schema_version (version integer NOT NULL)")
        for step in MIGRATIONS[:6]:
            conn.execute(step)
        conn.execute("INSERT INTO schema_version VALUES (6)")
        conn.execute("INSERT INTO turns (user_id, session_id, turn_id, speaker, text) "
                     "VALUES ('u', 's', 't1', 'Ann', %s), ('u', 's', 't2', 'Ann', %s)", (secret, secret))
        conn.execute("ANALYZE")
    with PostgresStore(tenant) as store:  # migrated to version 7
        store.purge("u", everything=True)
        with pytest.raises(StoreError, match=r"not compacted: pg_statistic still holds words sampled before "
                                             r"schema version 7.*database's owner or a superuser"):
            store.compact()
    with PostgresStore(postgres_server.url(name)) as store:
        assert store.compact() and store.meta(STATISTICS_OWED) is None
    assert not [path.name for path in files.iterdir()
                if path.is_file() and secret.encode() in path.read_bytes()]
    with PostgresStore(tenant) as store:
        assert store.compact()


def test_api_key_rows_are_shared_by_every_handle(postgres_url):
    with PostgresStore(postgres_url) as store, PostgresStore(postgres_url) as other:
        store.add_key("k1", "alice", b"salt", b"digest", "2026-01-01T00:00:00+00:00")
        store.add_key("k2", "bob", b"s2", b"d2", "2026-01-02T00:00:00+00:00")
        assert other.live_key("k1") == ("alice", b"salt", b"digest") and other.live_key("nope") is None
        assert [row[0] for row in other.key_rows()] == ["k1", "k2"]
        assert other.key_rows("bob") == [("k2", "bob", "2026-01-02T00:00:00+00:00", None)]
        assert other.revoke_key("k1", "later") == ("k1", "alice", "2026-01-01T00:00:00+00:00", "later")
        assert store.revoke_key("k1", "again")[3] == "later" and store.live_key("k1") is None
        assert store.revoke_key("k9", "now") is None
        with pytest.raises(psycopg.IntegrityError):
            store.add_key("k2", "carol", b"s", b"d", "now")
        store.purge("alice", everything=True)
        assert [row[0] for row in store.key_rows("alice")] == ["k1"]


def test_a_version_1_database_migrates_keeping_its_rows(postgres_url):
    with psycopg.connect(postgres_url, autocommit=True) as conn:  # what version-1 code left behind
        conn.execute("CREATE TABLE schema_version (version integer NOT NULL)")
        conn.execute(MIGRATIONS[0])
        conn.execute("INSERT INTO schema_version VALUES (1)")
        conn.execute("INSERT INTO turns (user_id, session_id, turn_id, speaker, text) "
                     "VALUES ('u', 's', 't1', 'Ann', 'hello')")
        conn.execute("INSERT INTO vectors (model, item, vector) VALUES ('m', %s, 'v'), ('m', %s, 'q')",
                     (text_key("Ann: hello"), text_key("a question nobody stored")))
        conn.execute("INSERT INTO turns (user_id, session_id, turn_id, speaker, text) "
                     "VALUES ('u', 's', 't2', 'Ann', 'hello')")  # twice: a common value, sampled
        conn.execute("ANALYZE")
        assert ("turns", "text") in sampled_columns(conn)
    with pytest.raises(StoreError, match=f"schema version 1 needs a migration to {SCHEMA_VERSION}"):
        PostgresStore(postgres_url, read_only=True)
    with PostgresStore(postgres_url) as store:
        assert [t.text for t in store.turns("u")] == ["hello", "hello"] and store.integrity_problems() == []
        # version 4's cache by user: the array of the turn as embedded is the user's, the other gone
        assert store.cached("vectors", "m", "u", [text_key("Ann: hello")]) == [b"v"]
        assert store.cached("vectors", "m", "u", [text_key("a question nobody stored")]) == [None]
        store.add_key("k1", "u", b"s", b"d", "now")
        store.purge("u", everything=True)
        assert store.ingestion_marks("u") == (0, 0, 1)  # version 3's purge count
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
        assert sampled_columns(conn) == []  # version 7 dropped what was sampled before it


def test_pooled_connections_the_server_dropped_are_replaced_not_reported(postgres_url):
    """A server restart (here: every connection of the database terminated) leaves the pool's
    idle connections dead; each is checked when taken, so no read fails once the server is back."""
    from contextlib import ExitStack

    with PostgresStore(postgres_url) as store:
        with ExitStack() as held:  # the pool grows to four connections, then they go idle
            for _ in range(4):
                held.enter_context(store.db.pool.connection())
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        assert [store.turns("u") for _ in range(6)] == [[]] * 6


def test_a_database_of_another_application_is_refused_naming_it(postgres_url):
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE meta (k int)")
    with pytest.raises(StoreError, match="holds another application's tables .*meta.*a database of its own"):
        PostgresStore(postgres_url)
