"""``python -m retrieval.store backup``: a copy of a store taken while turns are being added is a
whole store (it passes the integrity check), holds every turn committed before the copy began and
no partial one, and serves with the keys it copied; what it refuses, it refuses in one line."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from retrieval.memory.backends import open_store
from retrieval.service.keys import KeyStore
from retrieval.store import main as store_main
from tests.service_thread import open_memory


def test_a_backup_taken_while_turns_are_added_is_a_whole_store_of_the_committed_turns(tmp_path: Path, capsys):
    store, copy = tmp_path / "store", tmp_path / "copy"
    keys = KeyStore(store)
    key = keys.create("alice")
    keys.close()
    added, stop, started = [], threading.Event(), threading.Event()
    with open_memory(store) as memory:
        def add() -> None:
            while not stop.is_set():
                number = len(added)
                memory.add([{"speaker": "Ann", "text": f"Note {number} about the garden and the lake.",
                             "turn_id": f"t{number}"}], user_id="alice", session_id="s")
                added.append(number)
                if number == 20:
                    started.set()

        adder = threading.Thread(target=add)
        adder.start()
        try:
            assert started.wait(60)
            before = len(added)
            assert store_main(["backup", "--store", str(store), "--to", str(copy)]) == 0
            after = len(added)
        finally:
            stop.set()
            adder.join(60)
    out = capsys.readouterr().out
    assert out.startswith(f"copied amus.sqlite3, keys.sqlite from {store} to {copy}\nok: "), out
    with open_store(copy, read_only=True) as copied:
        turn_ids = [turn.turn_id for turn in copied.turns("alice")]
    assert before <= len(turn_ids) <= after + 1 and turn_ids == [f"t{n}" for n in range(len(turn_ids))]
    copied_keys = KeyStore(copy, create=False, read_only=True)
    assert copied_keys.holder(key) == "alice"
    copied_keys.close()
    assert copy.stat().st_mode & 0o777 == 0o700
    assert {path.stat().st_mode & 0o777 for path in copy.iterdir()} == {0o600}


def test_a_backup_refuses_in_one_line(tmp_path: Path, capsys):
    store = tmp_path / "store"
    with open_memory(store) as memory:
        memory.add([{"speaker": "Ann", "text": "A note about the lake."}], user_id="alice", session_id="s")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("kept")
    (tmp_path / "file").write_text("kept")
    new = "back up into a new directory"
    url = "postgresql://u:secret@127.0.0.1:1/db"
    cases = {(store, tmp_path / "full"): f"is not empty: {new}", (store, store): f"is not empty: {new}",
             (store, tmp_path / "file"): f"is a file: {new}",
             (tmp_path / "none", tmp_path / "new"): "no store at",
             (url, tmp_path / "new"): "is a PostgreSQL store: back it up with pg_dump"}
    for (source, target), said in cases.items():
        assert store_main(["backup", "--store", str(source), "--to", str(target)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and said in err and err.count("\n") == 1 and "secret" not in err, err
    assert (tmp_path / "full" / "mine.txt").read_text() == "kept" and not (tmp_path / "new").exists()


@pytest.mark.parametrize("target", ["new", "empty"])
def test_a_backup_goes_into_a_new_or_empty_directory(tmp_path: Path, target):
    store = tmp_path / "store"
    with open_memory(store) as memory:
        memory.add([{"speaker": "Ann", "text": "A note about the lake."}], user_id="alice", session_id="s")
    if target == "empty":
        (tmp_path / target).mkdir()
    into = tmp_path / target / "deeper" if target == "new" else tmp_path / target
    assert store_main(["backup", "--store", str(store), "--to", str(into)]) == 0
    with open_store(into, read_only=True) as copied:
        assert [turn.text for turn in copied.turns("alice")] == ["A note about the lake."]
