"""``python -m retrieval.store compact``: after a purge, no file of the store directory holds the
purged text (the FTS5 index keeps a deleted record's terms until it is rewritten); a backend that
cannot compact says so."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from retrieval import Memory
from retrieval.memory.meta_keys import COMPACTION_OWED
from retrieval.memory.records import Turn
from retrieval.memory.store import AMUStore
from retrieval.store import main as store_main
from tests.multi_route_fixtures import WordEmbedder, WordFingerprinter

SECRET = "Quenfrithal"
STEM = b"quenfrith"  # what the FTS5 index (porter stemmer) keeps of it


def holding(directory: Path, needle: bytes) -> list[str]:
    """The files under ``directory`` whose bytes contain ``needle`` (case-insensitive)."""
    return [p.name for p in sorted(directory.rglob("*")) if p.is_file() and needle in p.read_bytes().lower()]


def test_compact_leaves_no_purged_text_in_any_file(tmp_path, capsys):
    turns = [{"speaker": "AB"[i % 2], "text": f"story number {i} about gardens and tomatoes.",
              "turn_id": f"t{i}"} for i in range(8)]
    turns.insert(4, {"speaker": "Ann", "text": f"My neighbour {SECRET} repairs old violins in Lisbon.",
                     "turn_id": "secret"})
    with Memory.open(tmp_path, embedder=WordEmbedder(), fingerprinter=WordFingerprinter()) as mem:
        mem.add(turns, user_id="u", session_id="s")
        mem.flush(user_id="u", session_id="s")
    with AMUStore(tmp_path) as store:
        purged = store.purge("u", turn_ids=["secret"])  # rows deleted, files not yet compacted
        assert [turn.turn_id for turn in purged.turns] == ["secret"] and store.count("u") > 0
    assert holding(tmp_path, STEM) == ["amus.sqlite3"]
    assert store_main(["compact", "--store", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"compacted: {tmp_path / AMUStore.DB_NAME}\n"
    assert holding(tmp_path, STEM) == [] and holding(tmp_path, SECRET.lower().encode()) == []
    with AMUStore(tmp_path, read_only=True) as store:  # the rest is intact
        assert store.integrity_problems() == [] and len(store.turns("u")) == 8
        count = store.count()
    assert store_main(["check", "--store", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"ok: {tmp_path / AMUStore.DB_NAME} (users: 1, AMUs: {count})\n"
    with AMUStore(tmp_path) as store:  # a user whose turns no segment holds yet counts too
        store.append_turns("v", [Turn("v", "s", "t1", "Ann", "Just added.")])
    assert store_main(["check", "--store", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"ok: {tmp_path / AMUStore.DB_NAME} (users: 2, AMUs: {count})\n"


def test_a_compaction_a_reader_kept_from_finishing_says_so_and_stays_owed(tmp_path, capsys):
    with Memory.open(tmp_path, embedder=WordEmbedder(), fingerprinter=WordFingerprinter()) as mem:
        mem.add([{"speaker": "Ann", "text": f"{SECRET} repairs violins."}], user_id="u", session_id="s")
    reader = sqlite3.connect(f"file:{tmp_path / AMUStore.DB_NAME}?mode=ro", uri=True, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM turns").fetchone()  # another process's long read
    assert store_main(["compact", "--store", str(tmp_path)]) == 1
    assert capsys.readouterr().out.startswith(f"not finished: {tmp_path / AMUStore.DB_NAME}: a reader")
    with AMUStore(tmp_path, read_only=True) as store:
        assert store.meta(COMPACTION_OWED) is True
    reader.execute("COMMIT")
    assert store_main(["compact", "--store", str(tmp_path)]) == 0
    with AMUStore(tmp_path, read_only=True) as store:
        assert store.meta(COMPACTION_OWED) is None
    reader.close()


@pytest.mark.parametrize("where", ["missing/store", "a_file"])
def test_compact_of_a_path_without_a_store_creates_none_and_says_so(tmp_path, capsys, where):
    target = tmp_path / where
    if where == "a_file":
        target.write_text("not a store")
    assert store_main(["compact", "--store", str(target)]) == 2
    assert capsys.readouterr().err == f"error: no store at {target} ({AMUStore.DB_NAME} is missing)\n"
    assert sorted(p.name for p in tmp_path.rglob("*")) == (["a_file"] if where == "a_file" else [])


def test_check_names_a_table_or_trigger_the_schema_has_not(tmp_path, capsys):
    """A store handed over may hold another program's trigger copying every turn into its own
    table, which no purge empties, under a name like the schema's or in place of one of its
    triggers: check names each, and passes the schema's own objects (SQLite's, and the full-text
    index's shadow tables)."""
    AMUStore(tmp_path).close()
    assert store_main(["check", "--store", str(tmp_path)]) == 0
    db = sqlite3.connect(tmp_path / AMUStore.DB_NAME)
    db.executescript("CREATE TABLE amu_fts_kept (text TEXT); CREATE TRIGGER amu_fts_keep AFTER INSERT ON "
                     "turns BEGIN INSERT INTO amu_fts_kept VALUES (NEW.text); END; "
                     "DROP TRIGGER turns_no_delete; CREATE TRIGGER turns_no_delete AFTER INSERT ON turns "
                     "BEGIN INSERT INTO amu_fts_kept VALUES (NEW.text); END;")
    db.close()
    capsys.readouterr()
    assert store_main(["check", "--store", str(tmp_path)]) == 1
    why = " (another program's? it may keep what a delete removes: drop it if it is not yours)"
    assert capsys.readouterr().out.splitlines()[1:] == [
        "  trigger 'amu_fts_keep' is not the store's" + why,
        "  table 'amu_fts_kept' is not the store's" + why,
        "  trigger 'turns_no_delete' is not the schema's: its SQL was changed" + why]


def test_check_passes_a_store_an_operator_ran_analyze_on(tmp_path, capsys):
    """``ANALYZE`` (an operator tuning the query planner) adds SQLite's ``sqlite_stat1``, which
    holds row counts, no user's text: check passes the store."""
    AMUStore(tmp_path).close()
    db = sqlite3.connect(tmp_path / AMUStore.DB_NAME)
    db.execute("ANALYZE")
    db.commit()
    added = [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE name LIKE 'sqlite_stat%'")]
    db.close()
    assert "sqlite_stat1" in added, added
    capsys.readouterr()
    assert store_main(["check", "--store", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"ok: {tmp_path / AMUStore.DB_NAME} (users: 0, AMUs: 0)\n"


def test_an_emptied_database_file_is_no_store_to_compact_consolidate_or_check(tmp_path, capsys):
    """A store file truncated to nothing is reported, never made a new empty store that passes."""
    from retrieval.consolidate import main as consolidate_main

    AMUStore(tmp_path).close()
    (tmp_path / AMUStore.DB_NAME).write_bytes(b"")
    assert store_main(["compact", "--store", str(tmp_path)]) == 2
    assert consolidate_main(["--store", str(tmp_path)]) == 2
    assert store_main(["check", "--store", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[:2] == [f"error: no store at {tmp_path} ({AMUStore.DB_NAME} is empty)",
                       f"error: no store at {tmp_path} ({AMUStore.DB_NAME} is empty); ingest into it first"]
    assert "holds no store (schema version 0)" in err[2] and len(err) == 3
    assert (tmp_path / AMUStore.DB_NAME).stat().st_size == 0


def test_forgotten_words_are_in_no_file_even_where_sqlite_moved_rows_between_pages(tmp_path):
    """secure_delete zeroes deleted cells and freed pages, but a page SQLite rebalances keeps stale
    copies of moved rows in the gap between its cell pointers and its cells; only rebuilding the
    file (the VACUUM of a purge's compaction) leaves none of the purged words behind. Six users
    write sessions of unique words (some turns long enough for overflow pages); one user's
    sessions are forgotten round by round, another user entirely."""
    rng = random.Random(1)
    filler = "the quick brown fox jumps over the lazy dog near gardens and tomatoes "
    words: dict[tuple[str, str], list[str]] = {}
    with Memory.open(tmp_path, embedder=WordEmbedder(), fingerprinter=WordFingerprinter()) as mem:
        for round_ in range(3):
            for user in (f"user{n}" for n in range(6)):
                for session in (f"r{round_}a", f"r{round_}b"):
                    turns = []
                    for n in range(25):
                        said = ["qx" + "".join(rng.choice("bcdfghjklmnpvwz") for _ in range(12))
                                for _ in range(3 if n % 7 else 1)]
                        text = filler * (60 if n % 9 == 0 else 1) + " ".join(said)
                        if n % 9 == 0:
                            text += " " + filler * 40 + " ".join(said)
                        words.setdefault((user, session), []).extend(said)
                        turns.append({"speaker": "AB"[n % 2], "text": text, "turn_id": f"{session}-{n}"})
                    mem.add(turns, user_id=user, session_id=session)
                    mem.flush(user_id=user, session_id=session)
            mem.forget(user_id="user4", session_id=f"r{round_}a")
        mem.forget(user_id="user5")
    gone = {w for (user, session), said in words.items()
            if user == "user5" or (user == "user4" and session.endswith("a")) for w in said}
    files = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file()).lower()
    kept = [w for (user, _), said in words.items() if user == "user0" for w in said]
    assert all(w.encode() in files for w in kept[:20])  # the check can see words that stay
    assert [w for w in sorted(gone) if w.encode() in files] == []
