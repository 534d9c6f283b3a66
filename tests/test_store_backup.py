"""``python -m retrieval.store backup``: a copy of a store taken while turns are being added is a
whole store (it passes the integrity check), holds every turn committed before the copy began and
no partial one, serves with the keys it copied, and holds nothing a delete or forget committed
before it removed; an interrupted backup leaves nothing; what it refuses, it refuses in one line."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import retrieval.memory.backup as backup_module
from benchmarks.service_process import ROOT, child_env
from retrieval.memory.backends import open_store
from retrieval.memory.store import AMUStore
from retrieval.service.keys import KeyStore
from retrieval.store import main as store_main
from tests.faults.test_small_store_faults import immutable
from tests.service_thread import open_memory
from tests.store_backends import SQLITE_BEFORE_VERSION_9

SECRET = b"quenfrith"


def holding(directory: Path, needle: bytes) -> list[str]:
    return [p.name for p in sorted(directory.rglob("*")) if p.is_file() and needle in p.read_bytes().lower()]


def one_turn_store(store: Path, text: str = "A note about the lake.") -> None:
    with open_memory(store) as memory:
        memory.add([{"speaker": "Ann", "text": text, "turn_id": "t0"}], user_id="alice", session_id="s")


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
    assert out == (f"backed up {store} to {copy}: amus.sqlite3, keys.sqlite (each passed PRAGMA "
                   "quick_check)\n"), out
    assert sorted(path.name for path in copy.iterdir()) == ["amus.sqlite3", "keys.sqlite"]
    assert copy.stat().st_mode & 0o777 == 0o700
    assert {path.stat().st_mode & 0o777 for path in copy.iterdir()} == {0o600}
    with open_store(copy, read_only=True) as copied:
        turn_ids = [turn.turn_id for turn in copied.turns("alice")]
    assert before <= len(turn_ids) <= after + 1 and turn_ids == [f"t{n}" for n in range(len(turn_ids))]
    copied_keys = KeyStore(copy, create=False, read_only=True)
    assert copied_keys.holder(key) == "alice"
    copied_keys.close()


def test_a_backup_just_after_a_forget_holds_none_of_the_forgotten_text(tmp_path: Path):
    """The forget's compaction runs a second after it; a copy taken before then would hold the
    text in its pages, so the backup waits for it."""
    store, copy = tmp_path / "store", tmp_path / "copy"
    with open_memory(store) as memory:
        memory.add([{"speaker": "Ann", "text": "My neighbour Quenfrithal repairs violins in Lisbon."},
                    {"speaker": "Bob", "text": "A walk by the lake with the dog."}],
                   user_id="alice", session_id="s")
        memory.flush(user_id="alice", session_id="s")
        memory.forget(user_id="alice")
        assert store_main(["backup", "--store", str(store), "--to", str(copy)]) == 0
    assert holding(copy, SECRET) == []


def test_a_backup_of_a_store_that_owes_a_compaction_and_has_no_writer_is_refused(tmp_path: Path, capsys,
                                                                                   monkeypatch):
    store, copy = tmp_path / "store", tmp_path / "copy"
    one_turn_store(store, "My neighbour Quenfrithal repairs violins in Lisbon.")
    with AMUStore(store) as opened:
        assert opened.purge("alice", turn_ids=["t0"]).turns  # rows deleted, the files not compacted yet
    monkeypatch.setattr(backup_module, "COMPACTED_WAIT_S", 0.5)
    assert store_main(["backup", "--store", str(store), "--to", str(copy)]) == 2
    assert "still owes the compaction of a delete or forget" in capsys.readouterr().err
    assert not copy.exists() and sorted(path.name for path in tmp_path.iterdir()) == ["store"]
    assert store_main(["compact", "--store", str(store)]) == 0
    assert store_main(["backup", "--store", str(store), "--to", str(copy)]) == 0
    assert holding(copy, SECRET) == []


def test_a_store_of_an_earlier_schema_is_backed_up_as_it_is(tmp_path: Path):
    """The copy keeps the way back an upgrade needs: not migrated, and not refused for its version."""
    store, copy = tmp_path / "store", tmp_path / "copy"
    one_turn_store(store)
    db = sqlite3.connect(store / "amus.sqlite3")
    db.executescript(SQLITE_BEFORE_VERSION_9 + "PRAGMA user_version=8;")
    db.close()
    assert store_main(["backup", "--store", str(store), "--to", str(copy)]) == 0
    assert sqlite3.connect(copy / "amus.sqlite3").execute("PRAGMA user_version").fetchone() == (8,)


def test_an_interrupted_backup_leaves_nothing(tmp_path: Path, monkeypatch):
    store, copy = tmp_path / "store", tmp_path / "copy"
    one_turn_store(store)
    KeyStore(store).close()
    copied = backup_module._copy_database

    def interrupted(path, into):
        if path.name == "keys.sqlite":
            raise KeyboardInterrupt
        copied(path, into)

    monkeypatch.setattr(backup_module, "_copy_database", interrupted)
    try:
        assert store_main(["backup", "--store", str(store), "--to", str(copy)]) == 130
    except KeyboardInterrupt:  # escaped as a traceback would, which would also end this test session
        pytest.fail("the interrupt escaped retrieval.store.main")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["store"]


def test_a_backup_ended_by_sigterm_leaves_nothing_and_one_killed_is_cleared_by_the_next(tmp_path: Path):
    """SIGTERM (timeout, systemd) while the backup waits for a compaction nobody will run: its
    staging directory goes as after Ctrl-C. One whose process was killed outright is removed by the
    next backup into the same target."""
    store, copy = tmp_path / "store", tmp_path / "copy"
    one_turn_store(store, "My neighbour Quenfrithal repairs violins in Lisbon.")
    with AMUStore(store) as opened:
        assert opened.purge("alice", turn_ids=["t0"]).turns
    backup = subprocess.Popen([sys.executable, "-m", "retrieval.store", "backup", "--store", str(store),
                               "--to", str(copy)], cwd=ROOT, env=child_env(), stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".copy.partial-*")):
        assert backup.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    backup.send_signal(signal.SIGTERM)
    assert backup.wait(30) == 143 and sorted(path.name for path in tmp_path.iterdir()) == ["store"]
    assert store_main(["compact", "--store", str(store)]) == 0
    gone = subprocess.Popen(["true"])
    gone.wait()
    (tmp_path / f".copy.partial-{gone.pid}").mkdir()
    (tmp_path / f".copy.partial-{gone.pid}" / "amus.sqlite3").write_bytes(b"an abandoned copy")
    assert store_main(["backup", "--store", str(store), "--to", str(copy)]) == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == ["copy", "store"]


def test_a_database_given_as_a_link_is_copied(tmp_path: Path):
    store, copy, elsewhere = tmp_path / "store", tmp_path / "copy", tmp_path / "elsewhere"
    one_turn_store(store)
    keys = KeyStore(elsewhere)
    key = keys.create("alice")
    keys.close()
    (store / "keys.sqlite").symlink_to(elsewhere / "keys.sqlite")
    assert store_main(["backup", "--store", str(store), "--to", str(copy)]) == 0
    assert not (copy / "keys.sqlite").is_symlink()
    copied_keys = KeyStore(copy, create=False, read_only=True)
    assert copied_keys.holder(key) == "alice"
    copied_keys.close()


def test_a_store_on_read_only_media_is_backed_up(tmp_path: Path):
    """A store closed cleanly on read-only media (a file-system snapshot) has no WAL index file and
    none can be made: the backup must read it as immutable, as every reader of the store does,
    not fail with "cannot copy ...: unable to open database file"."""
    store, copy = tmp_path / "store", tmp_path / "copy"
    one_turn_store(store, "Maria adopted a cat named Luna.")
    assert not (store / "amus.sqlite3-shm").exists()
    with immutable(store):
        assert store_main(["backup", "--store", str(store), "--to", str(copy)]) == 0
    with AMUStore(copy, read_only=True) as copied:
        assert [turn.text for turn in copied.turns("alice")] == ["Maria adopted a cat named Luna."]


def test_a_backup_refuses_in_one_line(tmp_path: Path, capsys):
    store = tmp_path / "store"
    one_turn_store(store)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("kept")
    (tmp_path / "file").write_text("kept")
    new = "back up into a new directory"
    url = "postgresql://u:secret@127.0.0.1:1/db"
    cases = {(store, tmp_path / "full"): f"is not empty: {new}",
             (store, store): "is inside the store", (store, store / "bk"): "is inside the store",
             (store, tmp_path / "file"): f"is not a directory: {new}",
             (tmp_path / "none", tmp_path / "new"): "no store at",
             (url, tmp_path / "new"): "is a PostgreSQL store: back it up with pg_dump"}
    for (source, target), said in cases.items():
        assert store_main(["backup", "--store", str(source), "--to", str(target)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and said in err and err.count("\n") == 1 and "secret" not in err, err
    assert (tmp_path / "full" / "mine.txt").read_text() == "kept" and not (tmp_path / "new").exists()
    assert sorted(path.name for path in store.iterdir() if not path.name.startswith(".")) == ["amus.sqlite3"]


def test_a_backup_the_file_system_refuses_is_one_error_line_not_a_traceback(tmp_path: Path, capsys):
    """A target under a regular file cannot be made (an OSError from the file system, not a
    StoreError of the store's own): the command exits 2 with the system's reason on one line, as
    for the refusals it checks itself, and leaves the file and the store as they were."""
    store, blocking = tmp_path / "store", tmp_path / "afile"
    one_turn_store(store)
    blocking.write_text("kept")
    assert store_main(["backup", "--store", str(store), "--to", str(blocking / "copy")]) == 2
    assert capsys.readouterr().err == f"error: [Errno 17] File exists: '{blocking}'\n"
    assert blocking.read_text() == "kept"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["afile", "store"]


def test_a_backup_of_a_damaged_store_is_refused_and_leaves_no_copy(tmp_path: Path, capsys):
    """A database whose pages copy but fail ``PRAGMA quick_check`` (here: the root page of an index
    with a b-tree header no page can have) is not backed up: a copy that looks like a backup but
    cannot be restored from is worse than none. The command says which file is damaged and leaves
    no target and no staging directory."""
    store, copy = tmp_path / "store", tmp_path / "copy"
    AMUStore(store).close()
    db = store / AMUStore.DB_NAME
    con = sqlite3.connect(db)
    page = con.execute("PRAGMA page_size").fetchone()[0]
    root = con.execute("SELECT rootpage FROM sqlite_master WHERE name = 'amus_by_position'").fetchone()[0]
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    data = bytearray(db.read_bytes())
    data[(root - 1) * page + 3:(root - 1) * page + 5] = b"\xff\xff"  # the page's cell count
    db.write_bytes(bytes(data))
    assert store_main(["backup", "--store", str(store), "--to", str(copy)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {db} is damaged (") and err.endswith("); nothing was backed up\n"), err
    assert err.count("\n") == 1, err  # SQLite's report of the page, on two lines, in one
    assert f"Page {root}: btreeInitPage() returns error code 11" in err, err
    assert not copy.exists() and sorted(path.name for path in tmp_path.iterdir()) == ["store"]


@pytest.mark.parametrize("target", ["new", "empty"])
def test_a_backup_goes_into_a_new_or_empty_directory(tmp_path: Path, target):
    store = tmp_path / "store"
    one_turn_store(store)
    if target == "empty":
        (tmp_path / target).mkdir(mode=0o755)
    into = tmp_path / target / "deeper" if target == "new" else tmp_path / target
    assert store_main(["backup", "--store", str(store), "--to", str(into)]) == 0
    assert into.stat().st_mode & 0o777 == 0o700
    with open_store(into, read_only=True) as copied:
        assert [turn.text for turn in copied.turns("alice")] == ["A note about the lake."]


def test_a_backup_never_stages_in_a_directory_planted_in_its_folder(tmp_path: Path, monkeypatch):
    """In a shared folder another user may plant a directory under the name a backup would stage
    in, one this user cannot remove (here: its removal does nothing): the copy of every user's data
    is made and moved in a directory of its own, owner-only, never in the planted one."""
    store, backups = tmp_path / "store", tmp_path / "backups"
    one_turn_store(store)
    backups.mkdir()
    for pid in range(os.getpid(), os.getpid() + 50):
        planted = backups / f".monday.partial-{pid}"
        planted.mkdir()
        (planted / "planted").touch()
        planted.chmod(0o777)
    monkeypatch.setattr(backup_module.shutil, "rmtree", lambda *args, **kwargs: None)
    assert store_main(["backup", "--store", str(store), "--to", str(backups / "monday")]) == 0
    assert sorted(path.name for path in (backups / "monday").iterdir()) == ["amus.sqlite3"]
    assert (backups / "monday").stat().st_mode & 0o777 == 0o700


def test_a_killed_backups_copy_is_removed_by_the_next_backup_into_the_same_folder(tmp_path: Path):
    """Backups into dated targets never name one twice: the staging directory of one killed outright
    (OOM, SIGKILL), holding every user's data out of every delete's reach, is removed by the next
    backup into the folder whatever its target; a directory merely named alike is not its to remove."""
    store, backups = tmp_path / "store", tmp_path / "backups"
    one_turn_store(store, "My neighbour Quenfrithal repairs violins in Lisbon.")
    with AMUStore(store) as opened:  # owes a compaction: the backup waits, its staging in place
        assert opened.purge("alice", turn_ids=["t0"]).turns
    killed = subprocess.Popen([sys.executable, "-m", "retrieval.store", "backup", "--store", str(store),
                               "--to", str(backups / "monday")], cwd=ROOT, env=child_env(),
                              stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60  # its staging marked; its copy comes and goes while it waits
    while not list(backups.glob(f".monday.partial-*/{backup_module.STAGING_MARK}")):
        assert killed.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    killed.kill()
    killed.wait(30)
    assert len(list(backups.glob(".monday.partial-*"))) == 1  # left behind by the killed backup
    gone = subprocess.Popen(["true"])
    gone.wait()
    alike = backups / f".notes.partial-{gone.pid}"  # not a backup's: no staging mark
    alike.mkdir()
    assert store_main(["compact", "--store", str(store)]) == 0
    assert store_main(["backup", "--store", str(store), "--to", str(backups / "tuesday")]) == 0
    assert sorted(path.name for path in backups.iterdir()) == [alike.name, "tuesday"]
    assert sorted(path.name for path in (backups / "tuesday").iterdir()) == ["amus.sqlite3"]


def test_a_running_backup_in_another_pid_namespace_keeps_its_staging_directory(tmp_path: Path):
    """A backup run in a container, into the host's folder, has a process id that names no process
    here: its staging directory is known to be in use by the lock on its mark, not by that id."""
    store, backups = tmp_path / "store", tmp_path / "backups"
    one_turn_store(store)
    gone = subprocess.Popen(["true"])
    gone.wait()
    running = backups / f".monday.partial-{gone.pid}"  # the id of a process of another namespace
    running.mkdir(parents=True)
    with backup_module._held(running / backup_module.STAGING_MARK):
        assert store_main(["backup", "--store", str(store), "--to", str(backups / "tuesday")]) == 0
        assert running.is_dir()
    assert store_main(["backup", "--store", str(store), "--to", str(backups / "wednesday")]) == 0
    assert sorted(path.name for path in backups.iterdir()) == ["tuesday", "wednesday"]


def test_a_backup_s_mark_is_never_seen_unlocked(tmp_path: Path, monkeypatch):
    """Another backup's clean-up, run just as this one creates its mark, finds no mark unlocked (it
    would take the running backup for an abandoned one and remove its copy)."""
    store, backups = tmp_path / "store", tmp_path / "backups"
    one_turn_store(store)
    flock = backup_module.fcntl.flock

    def cleanup_meanwhile(handle, operation):
        if operation == backup_module.fcntl.LOCK_EX:  # the running backup, about to lock its mark
            backup_module._drop_abandoned(backups / "tuesday")
        flock(handle, operation)

    monkeypatch.setattr(backup_module.fcntl, "flock", cleanup_meanwhile)
    assert store_main(["backup", "--store", str(store), "--to", str(backups / "monday")]) == 0
    assert sorted(path.name for path in backups.iterdir()) == ["monday"]
