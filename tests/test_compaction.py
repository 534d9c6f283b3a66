"""The compaction a purge owes runs behind the delete: the delete returns once its purge commits,
the deletes of a second share one compaction, one owed at close runs then, and compactions are
spaced so that they hold the store's writer for at most about a tenth of the time."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

import retrieval.api.compaction as compaction
import retrieval.memory.purge as sqlite_purge
from retrieval import Memory
from retrieval.api.compaction import COMPACT_SPACING, Compactions
from retrieval.api.errors import NotFound
from retrieval.memory.meta_keys import COMPACTION_OWED
from retrieval.memory.purge import Purge
from retrieval.memory.store import AMUStore
from tests.multi_route_fixtures import WordEmbedder, WordFingerprinter

SECRET = "Quenfrithal"
WAIT_S = 60.0


def in_files(path: Path, secret: int | None = None) -> bool:
    """Whether the store's database or WAL holds the secret word (numbered ``secret``, else any)."""
    word = SECRET if secret is None else f"{SECRET}{secret}"
    return word.lower().encode() in b"".join(p.read_bytes() for p in path.glob("amus.sqlite3*")).lower()


def filled(path: Path) -> Memory:
    """A memory whose user "u" has three secret turns among others, processed into records."""
    memory = Memory.open(path, embedder=WordEmbedder(), fingerprinter=WordFingerprinter())
    turns = [{"speaker": "Ann", "text": f"story number {i} about gardens and tomatoes.", "turn_id": f"t{i}"}
             for i in range(6)]
    turns += [{"speaker": "Bob", "text": f"My neighbour {SECRET}{i} repairs violins.",
               "turn_id": f"secret{i}"} for i in range(3)]
    memory.add(turns, user_id="u", session_id="s")
    memory.flush(user_id="u", session_id="s")
    return memory


class HeldCompactions:
    """Counts the store's compactions and keeps each one's result, in order (:meth:`next` waits for
    the next to end); with ``held``, each waits inside until released."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, held: bool) -> None:
        self.calls, self.entered, self.released = 0, threading.Event(), threading.Event()
        self.results: list[bool] = []
        self._ended = threading.Semaphore(0)
        if not held:
            self.released.set()
        real = Purge.compact

        def compact(store: Purge) -> bool:
            self.calls += 1
            self.entered.set()
            self.released.wait(WAIT_S)
            self.results.append(real(store))
            self._ended.release()
            return self.results[-1]

        monkeypatch.setattr(Purge, "compact", compact)

    def next(self) -> bool:
        """Whether another compaction ended within WAIT_S."""
        return self._ended.acquire(timeout=WAIT_S)


def reading(path: Path) -> sqlite3.Connection:
    """Another process's long read of the store at ``path``: a read transaction held open (its
    snapshot taken) until the caller commits it."""
    reader = sqlite3.connect(f"file:{path / 'amus.sqlite3'}?mode=ro", uri=True, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM turns").fetchone()
    return reader


def test_a_delete_returns_before_the_compaction_it_owes_which_then_runs_behind_it(tmp_path, monkeypatch):
    compactions = HeldCompactions(monkeypatch, held=True)
    memory = filled(tmp_path)
    try:
        deleting = threading.Thread(target=memory.delete, args=("u:turn:secret0",), kwargs={"user_id": "u"})
        deleting.start()
        deleting.join(WAIT_S)
        assert not deleting.is_alive()  # returned while the compaction, held, has not finished
        assert compactions.entered.wait(WAIT_S)  # it started behind the delete, on its own thread
        assert memory.store.meta(COMPACTION_OWED) is True and in_files(tmp_path, 0)
        with pytest.raises(NotFound):  # gone from the memory's answers when the delete returned
            memory.get("u:turn:secret0", user_id="u")
        compactions.released.set()
        for _ in range(int(WAIT_S * 10)):
            if memory.store.meta(COMPACTION_OWED) is None:
                break
            time.sleep(0.1)
        assert memory.store.meta(COMPACTION_OWED) is None  # done while the memory is open
        assert not in_files(tmp_path, 0) and in_files(tmp_path, 1)  # what was not deleted stays
    finally:
        compactions.released.set()
        memory.close()
    assert compactions.calls == 1


def test_the_deletes_before_a_compaction_share_it_and_one_owed_at_close_runs_then(tmp_path, monkeypatch):
    compactions = HeldCompactions(monkeypatch, held=False)
    monkeypatch.setattr(compaction, "COMPACT_AFTER_S", WAIT_S)  # none starts while the memory is open
    memory = filled(tmp_path)
    try:
        for i in range(3):
            memory.delete(f"u:turn:secret{i}", user_id="u")
        assert compactions.calls == 0 and memory.store.meta(COMPACTION_OWED) is True
    finally:
        memory.close()
    assert compactions.calls == 1
    assert not in_files(tmp_path)


class TimedStore:
    """A store whose owed compaction takes ``seconds``, and where a purge commits while it runs
    (``during``); when each ran (monotonic start, end)."""

    read_only = False

    def __init__(self, seconds: float) -> None:
        self.seconds, self.runs, self.during = seconds, [], lambda: None
        self.ran = threading.Semaphore(0)

    def compact_owed(self) -> bool:
        began = time.monotonic()
        self.during()
        time.sleep(self.seconds)
        self.runs.append((began, time.monotonic()))
        self.ran.release()
        return True


@pytest.mark.parametrize("owed_while_running", [False, True])
def test_the_next_compaction_waits_the_spacing_after_the_last_one(monkeypatch, owed_while_running):
    monkeypatch.setattr(compaction, "COMPACT_AFTER_S", 0.0)
    store = TimedStore(0.1)
    runner = Compactions(store)  # type: ignore[arg-type]
    if owed_while_running:
        store.during = runner.owed
    try:
        runner.owed()
        assert store.ran.acquire(timeout=WAIT_S)
        runner.owed()
        runner.owed()  # owed again before the second ran: one compaction for both
        assert store.ran.acquire(timeout=WAIT_S)
    finally:
        store.during = lambda: None
        runner.close()
    (first_began, first_ended), (second_began, _) = store.runs[:2]
    assert second_began - first_ended >= COMPACT_SPACING * (first_ended - first_began)
    assert len(store.runs) == 3  # the two above and the one close runs (a real store's finds none owed)


def test_a_delete_that_commits_as_a_compaction_ends_owes_the_next_and_its_words_go(tmp_path, monkeypatch):
    """The compaction holds the writer until it has removed its owed mark: a delete trying to
    commit in between waits, and owes a compaction of its own (were it to commit in the gap,
    the mark would be removed over its words, and they would survive the close)."""
    monkeypatch.setattr(compaction, "COMPACT_AFTER_S", WAIT_S)  # only the compaction run below
    memory = filled(tmp_path)
    try:
        memory.delete("u:turn:secret0", user_id="u")
        purge = memory.store._purge  # type: ignore[attr-defined]
        transaction, calls = purge._transaction, []
        delete = threading.Thread(target=memory.delete, args=("u:turn:secret1",), kwargs={"user_id": "u"})

        def deleting_before_the_mark_goes():  # the compaction's second transaction removes the mark
            calls.append(1)
            if len(calls) == 2:
                delete.start()
                delete.join(1.0)  # it waits for the writer the compaction holds
            return transaction()

        monkeypatch.setattr(purge, "_transaction", deleting_before_the_mark_goes)
        assert purge.compact()
        monkeypatch.setattr(purge, "_transaction", transaction)
        delete.join(WAIT_S)
        assert memory.store.meta(COMPACTION_OWED) is True  # owed by the delete that waited
    finally:
        memory.close()
    assert not in_files(tmp_path, 0) and not in_files(tmp_path, 1) and in_files(tmp_path, 2)


def test_a_reader_closing_runs_no_compaction(tmp_path, monkeypatch, caplog):
    compactions = HeldCompactions(monkeypatch, held=False)
    monkeypatch.setattr(compaction, "COMPACT_AFTER_S", WAIT_S)
    writer = filled(tmp_path)
    try:
        writer.delete("u:turn:secret0", user_id="u")
        Memory.open(tmp_path, embedder=WordEmbedder(), fingerprinter=WordFingerprinter(),
                    read_only=True).close()
        assert compactions.calls == 0 and "compaction" not in caplog.text
    finally:
        writer.close()
    assert compactions.calls == 1 and not in_files(tmp_path, 0)


def test_a_compaction_that_fails_behind_a_delete_is_logged_and_stays_owed(tmp_path, monkeypatch, caplog):
    def broken(store: Purge) -> bool:
        raise RuntimeError("the disk went away")

    monkeypatch.setattr(compaction, "COMPACT_AFTER_S", 0.0)
    monkeypatch.setattr(Purge, "compact", broken)
    memory = filled(tmp_path)
    try:
        memory.delete("u:turn:secret0", user_id="u")
        for _ in range(int(WAIT_S * 10)):
            if "stays owed" in caplog.text:
                break
            time.sleep(0.1)
        assert "stays owed" in caplog.text and "the disk went away" in caplog.text
        memory.delete("u:turn:secret1", user_id="u")  # the memory goes on
        assert memory.store.meta(COMPACTION_OWED) is True
    finally:
        memory.close()
    monkeypatch.undo()
    with Memory.open(tmp_path, embedder=WordEmbedder(), fingerprinter=WordFingerprinter()):
        pass  # a writer opening the store does the compaction still owed
    assert not in_files(tmp_path, 0)


def test_a_compaction_a_reader_keeps_is_tried_again_behind_without_a_vacuum(tmp_path, monkeypatch):
    """Another process's long read keeps the WAL from being truncated: the compaction stops before
    its VACUUM (which would only add the whole file to the log), stays owed, and is tried again
    behind the delete until it finishes, with no other call of the memory."""
    monkeypatch.setattr(compaction, "COMPACT_AFTER_S", 0.0)
    monkeypatch.setattr(compaction, "COMPACT_RETRY_S", 0.05)
    monkeypatch.setattr(compaction, "COMPACT_SPACING", 0.0)
    monkeypatch.setattr(sqlite_purge, "CHECKPOINT_WAIT_S", 0.05)
    tries = HeldCompactions(monkeypatch, held=False)
    memory = filled(tmp_path)
    wal = tmp_path / "amus.sqlite3-wal"
    reader = reading(tmp_path)  # an older snapshot, held
    try:
        memory.delete("u:turn:secret0", user_id="u")
        assert tries.next() and tries.results == [False]
        logged = wal.stat().st_size
        assert tries.next() and tries.results == [False, False]  # tried again, kept again
        grown = wal.stat().st_size - logged  # the owed mark written again, not the VACUUM's whole file
        assert grown < (tmp_path / "amus.sqlite3").stat().st_size // 4
        assert memory.store.meta(COMPACTION_OWED) is True
        reader.execute("COMMIT")
        while memory.store.meta(COMPACTION_OWED) is not None:
            assert tries.next()
        assert tries.results[-1] is True and not in_files(tmp_path, 0) and in_files(tmp_path, 1)
    finally:
        reader.close()
        memory.close()


def test_a_compaction_owed_at_open_that_a_reader_keeps_is_tried_again_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(compaction, "COMPACT_AFTER_S", 0.0)
    monkeypatch.setattr(compaction, "COMPACT_RETRY_S", 0.05)
    monkeypatch.setattr(sqlite_purge, "CHECKPOINT_WAIT_S", 0.05)
    filled(tmp_path).close()
    with AMUStore(tmp_path) as store:
        store.purge("u", turn_ids=["secret0"])  # owes a compaction it does not run
    reader = reading(tmp_path)
    memory = Memory.open(tmp_path, embedder=WordEmbedder(), fingerprinter=WordFingerprinter())
    try:
        assert memory.store.meta(COMPACTION_OWED) is True and in_files(tmp_path, 0)  # kept at the open
        # the reader began on a checkpointed store (it reads the database file alone): still found
        # before the VACUUM, which would have added the whole file to the log
        wal, database = tmp_path / "amus.sqlite3-wal", tmp_path / "amus.sqlite3"
        assert wal.stat().st_size < database.stat().st_size // 4
        reader.execute("COMMIT")
        for _ in range(int(WAIT_S * 20)):
            if memory.store.meta(COMPACTION_OWED) is None:
                break
            time.sleep(0.05)
        assert memory.store.meta(COMPACTION_OWED) is None and not in_files(tmp_path, 0)
    finally:
        reader.close()
        memory.close()


def test_a_delete_while_a_try_again_waits_brings_the_compaction_forward(tmp_path, monkeypatch):
    monkeypatch.setattr(compaction, "COMPACT_AFTER_S", 0.0)
    monkeypatch.setattr(compaction, "COMPACT_RETRY_S", WAIT_S * 10)
    monkeypatch.setattr(compaction, "COMPACT_SPACING", 0.0)
    monkeypatch.setattr(sqlite_purge, "CHECKPOINT_WAIT_S", 0.05)
    tries = HeldCompactions(monkeypatch, held=False)
    memory = filled(tmp_path)
    reader = reading(tmp_path)
    try:
        memory.delete("u:turn:secret0", user_id="u")
        assert tries.next() and tries.results == [False]  # tried again WAIT_S * 10 later
        reader.execute("COMMIT")
        memory.delete("u:turn:secret1", user_id="u")  # not left to that try
        assert tries.next() and tries.results == [False, True]
        assert not in_files(tmp_path, 0) and not in_files(tmp_path, 1) and in_files(tmp_path, 2)
    finally:
        reader.close()
        memory.close()
