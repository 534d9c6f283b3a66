"""SQLite errors after a store is opened (a damaged page, a dropped table, a full disk) end in one
``error:`` line naming the store and what to do, in ingest, query and consolidate, never in a
traceback; ``python -m retrieval.store check`` finds the damage."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

import retrieval.query as query_module
from retrieval.consolidate import main as consolidate_main
from retrieval.ingest import main as ingest_main
from retrieval.memory.connection import SQLiteConnection
from retrieval.memory.errors import StoreFault
from retrieval.memory.store import AMUStore
from retrieval.store import main as check_main
from tests.test_consolidation import NamedHashEmbedder
from tests.test_ingest import conversation_turns

QUESTION = "What did Ann plant in the garden?"


@pytest.fixture
def cli(tmp_path: Path, monkeypatch) -> Path:
    """A JSONL stream; the command lines use the hash embedder."""
    for module in ("retrieval.ingest", "retrieval.consolidate"):
        monkeypatch.setattr(f"{module}.SentenceEmbedder", NamedHashEmbedder)
    monkeypatch.setattr(query_module, "SentenceEmbedder", NamedHashEmbedder)
    path = tmp_path / "talk.jsonl"
    path.write_text("\n".join(json.dumps({"conversation_id": t.user_id, "session_id": t.session_id,
                                          "session_time": t.session_time.isoformat(), "speaker": t.speaker,
                                          "turn_id": t.turn_id, "text": t.text})
                              for t in conversation_turns()))
    return path


def ingest(jsonl: Path, store: Path) -> int:
    return ingest_main(["--jsonl", str(jsonl), "--store", str(store), "--no-progress"])


def one_error_line(capsys, *needles: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, err
    return err


def raw(store: Path) -> sqlite3.Connection:
    return sqlite3.connect(store / AMUStore.DB_NAME, isolation_level=None)


def damage_table(store: Path, table: str) -> None:
    """Overwrite the root page of ``table`` with garbage (a damaged data page)."""
    with raw(store) as db:
        page = db.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
        size = db.execute("PRAGMA page_size").fetchone()[0]
    db.close()
    with (store / AMUStore.DB_NAME).open("r+b") as handle:
        handle.seek((page - 1) * size)
        handle.write(b"\xa5" * size)


def test_a_damaged_page_is_one_line_in_query_and_check(cli: Path, tmp_path: Path, capsys):
    store = tmp_path / "store"
    assert ingest(cli, store) == 0 and check_main(["check", "--store", str(store)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"ok: {store / AMUStore.DB_NAME}")
    damage_table(store, "vectors")
    assert query_module.main(["--store", str(store), QUESTION]) == 2
    one_error_line(capsys, str(store / AMUStore.DB_NAME), "malformed", "damaged",
                   f"python -m retrieval.store check --store {store}")
    assert check_main(["check", "--store", str(store)]) == 1
    assert capsys.readouterr().out.startswith(f"damaged: {store / AMUStore.DB_NAME}")


def test_a_dropped_table_is_one_line_in_every_command(cli: Path, tmp_path: Path, capsys):
    store = tmp_path / "store"
    assert ingest(cli, store) == 0
    capsys.readouterr()
    with raw(store) as db:
        db.execute("DROP TABLE amus")
    db.close()
    assert query_module.main(["--store", str(store), QUESTION]) == 2
    one_error_line(capsys, "no such table: amus", "schema was changed outside this code")
    assert consolidate_main(["--store", str(store)]) == 2
    one_error_line(capsys, "no such table: amus")
    assert ingest(cli, store) == 2
    one_error_line(capsys, "no such table: amus")
    assert check_main(["check", "--store", str(store)]) == 1
    assert "schema object 'amus' is missing" in capsys.readouterr().out


def test_a_full_disk_loses_nothing_and_says_so(cli: Path, tmp_path: Path, capsys, monkeypatch):
    full = tmp_path / "full"
    connect = SQLiteConnection._connect

    def small_disk(self, target):  # SQLite's own page limit stands in for a full disk
        db = connect(self, target)
        db.execute("PRAGMA max_page_count = 46")
        return db

    monkeypatch.setattr(SQLiteConnection, "_connect", small_disk)
    assert ingest(cli, full) == 2
    one_error_line(capsys, str(full / AMUStore.DB_NAME), "database or disk is full",
                   "nothing committed is lost: free space and rerun")
    with AMUStore(full, read_only=True) as store:
        stored = len(store.segments("conv-a"))
    monkeypatch.setattr(SQLiteConnection, "_connect", connect)
    assert ingest(cli, full) == 0 and "already stored" in capsys.readouterr().out
    assert ingest(cli, tmp_path / "reference") == 0
    with AMUStore(full, read_only=True) as resumed, \
            AMUStore(tmp_path / "reference", read_only=True) as reference:
        assert [a.text for a in resumed.amus()] == [a.text for a in reference.amus()]
        assert 0 < stored < len(reference.segments("conv-a"))


def test_faults_are_store_errors_and_constraint_checks_are_not(tmp_path: Path):
    with AMUStore(tmp_path) as store:
        with pytest.raises(StoreFault, match=r"amus\.sqlite3: no such table: nope"):
            store._db.execute("SELECT * FROM nope")
        with pytest.raises(sqlite3.IntegrityError):  # the append-only triggers are the code's own checks
            store._db.execute("INSERT INTO meta (key, value) VALUES (NULL, NULL)")
        with pytest.raises(sqlite3.OperationalError, match="syntax error"):  # a bug stays a bug
            store._db.execute("SELEC 1")
