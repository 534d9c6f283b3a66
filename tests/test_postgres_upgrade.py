"""Upgrading a PostgreSQL store: the migration waits for nodes opening beside it, and is refused,
changing nothing, while a session of an earlier version (or any other client) is connected."""

from __future__ import annotations

import psycopg
import pytest

from retrieval.memory.errors import StoreError
from retrieval.memory.postgres import schema
from retrieval.memory.postgres.schema import MIGRATIONS, SCHEMA_VERSION
from retrieval.memory.postgres.store import PostgresStore
from tests.postgres_server import ROLE
from tests.test_postgres_store import at_once


def earlier_version(url: str, version: int = SCHEMA_VERSION - 1) -> None:
    """The database as code of schema ``version`` left it, with one user's turn."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE schema_version (version integer NOT NULL)")
        for step in MIGRATIONS[:version]:
            conn.execute(step)
        conn.execute("INSERT INTO schema_version VALUES (%s)", (version,))
        conn.execute("INSERT INTO turns (user_id, session_id, turn_id, speaker, text) "
                     "VALUES ('u', 's', 't1', 'Ann', 'hello')")


def schema_version(url: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT max(version) FROM schema_version").fetchone()[0]


def test_a_migration_is_refused_while_an_earlier_nodes_session_is_connected(postgres_url, monkeypatch):
    """An older node still serving went on writing in its own layout once a newer node migrated
    the schema under it (rows missing the new columns, ids a purge had retired given out again),
    and nothing refused either: now the migration is refused, naming the session, and changes
    nothing; once that node is stopped, it goes through."""
    monkeypatch.setattr(schema, "ALONE_WAIT_S", 0.3)
    earlier_version(postgres_url)
    with psycopg.connect(postgres_url, application_name="old node") as old_node:
        old_node.execute("SELECT count(*) FROM turns")
        with pytest.raises(StoreError, match=rf"schema version {SCHEMA_VERSION - 1} would be migrated to "
                                             rf"{SCHEMA_VERSION} while other sessions .*'old node'.*"
                                             "nothing was changed"):
            PostgresStore(postgres_url)
        assert schema_version(postgres_url) == SCHEMA_VERSION - 1
    with PostgresStore(postgres_url) as store:
        assert [turn.text for turn in store.turns("u")] == ["hello"]
    assert schema_version(postgres_url) == SCHEMA_VERSION


def test_nodes_of_the_new_version_opening_together_migrate_once_without_refusing_each_other(postgres_url):
    """A node waiting for the schema's lock is a node of this version opening beside the one that
    migrates, not an earlier node: every one of them opens."""
    earlier_version(postgres_url, 1)
    stores = at_once([lambda: PostgresStore(postgres_url) for _ in range(3)])
    assert all(isinstance(store, PostgresStore) for store in stores), stores
    for store in stores:
        store.close()  # type: ignore[union-attr]
    assert schema_version(postgres_url) == SCHEMA_VERSION


def test_a_current_schema_opens_whoever_else_is_connected(postgres_url):
    PostgresStore(postgres_url).close()
    with psycopg.connect(postgres_url, application_name="another node"), PostgresStore(postgres_url) as store:
        assert store.users() == []


def test_a_session_of_a_role_the_migrating_one_may_not_see_into_is_counted(postgres_server, monkeypatch):
    """The store's owner, not a superuser, migrates while an earlier node serves as another role:
    PostgreSQL hides that session's ``backend_type`` from the owner, and the session went uncounted."""
    monkeypatch.setattr(schema, "ALONE_WAIT_S", 0.3)
    name = postgres_server.database().rsplit("/", 1)[1]
    with psycopg.connect(postgres_server.url(name), autocommit=True) as admin:
        for role in ("owner_node", "reader_node"):
            admin.execute(f"DO $$ BEGIN CREATE ROLE {role} LOGIN; "
                          "EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        admin.execute("GRANT CREATE ON SCHEMA public TO owner_node")
    owner, reader = (postgres_server.url(name).replace(f"//{ROLE}@", f"//{role}@")
                     for role in ("owner_node", "reader_node"))
    earlier_version(owner)
    with psycopg.connect(reader, application_name="old reader"):
        with pytest.raises(StoreError, match=r"while other sessions .*pid \d+ of reader_node 'old reader'"):
            PostgresStore(owner)
        assert schema_version(owner) == SCHEMA_VERSION - 1
