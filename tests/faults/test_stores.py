"""Fault classes 3, 4, 5 and 6 (stores and inputs): a store never mixes models or keeps stale
text, a second writer is refused, bad files and inputs end in one line naming file and field,
special-token-only queries retrieve nothing, an oversized turn is refused before any work."""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from isq.topology import CooccurrenceTopology
from retrieval import Memory
from retrieval.api.batch import IngestError, ingest_turns
from retrieval.api.errors import StoreUnavailable
from retrieval.contract import EmptyQuery, Query
from retrieval.eval.dual_path import Channel, DualPathMode, DualPathRetriever
from retrieval.eval.locomo import load_locomo
from retrieval.extract.llm_extractor import LLMExtractor
from retrieval.extract.rules import RuleExtractor
from retrieval.ingest import main as ingest_main
from retrieval.memory.errors import StoreBusy, StoreError, StoreMismatch
from retrieval.memory.records import InputFormatError, Turn
from retrieval.memory.store import AMUStore
from retrieval.store import main as store_main
from tests.fake_chat import FakeChatServer, completion_body
from tests.test_ingest import WHEN, HashEmbedder, conversation_turns

REPO = Path(__file__).resolve().parents[2]

IDENTITY = {"codebook_size": 8, "codebook_sha256": "a" * 64}


class FakeFingerprinter:
    def __init__(self, identity: dict) -> None:
        self.identity = identity

    def fingerprint(self, texts):
        return [SimpleNamespace(sequence=(len(t) % 7, 3), codes=frozenset({len(t) % 7, 3})) for t in texts]


def ingest(store: AMUStore, turns=None, **options):
    return ingest_turns(turns or conversation_turns(), store, HashEmbedder(), RuleExtractor(), progress=False,
                        **options)


# ---------------------------------------------------------------------------- 3. mixed or stale stores


def test_resuming_with_another_fingerprinter_is_refused(tmp_path: Path) -> None:
    with AMUStore(tmp_path) as store:
        ingest(store, fingerprinter=FakeFingerprinter(IDENTITY))
        before = [a.fingerprint for a in store.amus()]
        other = dict(IDENTITY, codebook_sha256="b" * 64)
        with pytest.raises(StoreMismatch, match="fingerprinter"):
            ingest(store, fingerprinter=FakeFingerprinter(other))
        with pytest.raises(StoreMismatch, match="fingerprinter"):
            ingest(store)  # no fingerprinter at all: the new AMUs would carry no codes
        assert [a.fingerprint for a in store.amus()] == before
        # the same one resumes
        assert ingest(store, fingerprinter=FakeFingerprinter(IDENTITY)).resumed_segments > 0


def test_resuming_with_another_embedder_or_extractor_is_refused(tmp_path: Path) -> None:
    class OtherEmbedder(HashEmbedder):
        name = "other"

    class OtherExtractor(RuleExtractor):
        name = "other-rules"

    with AMUStore(tmp_path) as store:
        ingest(store)
        with pytest.raises(StoreMismatch, match="embedder"):
            ingest_turns(conversation_turns(), store, OtherEmbedder(), RuleExtractor(), progress=False)
        with pytest.raises(StoreMismatch, match="extractor"):
            ingest_turns(conversation_turns(), store, HashEmbedder(), OtherExtractor(), progress=False)


def test_an_edited_conversation_is_refused_not_kept_stale(tmp_path: Path) -> None:
    turns = conversation_turns()
    with AMUStore(tmp_path) as store:
        ingest(store, turns)
        before = [(a.id, a.text) for a in store.amus()]
        edited = list(turns)
        old = edited[3]
        edited[3] = Turn(old.user_id, old.session_id, old.turn_id, old.speaker,
                         old.text + " Not really.", old.session_time)
        with pytest.raises(IngestError, match=r"'conv-a' turn 'D1:4': the input's text differs.*new store"):
            ingest(store, edited)
        assert [(a.id, a.text) for a in store.amus()] == before


# ---------------------------------------------------------------------------- 6. stores that cannot be used


def test_a_store_another_process_writes_is_refused_naming_it_and_the_ways_out(tmp_path: Path) -> None:
    """A server never finishes: the refusal says to stop the holder as well as to wait for it."""
    import subprocess
    import sys

    AMUStore(tmp_path / "store").close()
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                               "from retrieval.memory.store import AMUStore\n"
                               f"store = AMUStore({str(tmp_path / 'store')!r})\n"
                               "print('held', flush=True)\nsys.stdin.read()\n"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[2])
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        refusal = (rf"by another process \(pid {holder.pid}\): wait for it to finish or stop it "
                   r"\(a server holds its store until it stops\), or use another store")
        with pytest.raises(StoreBusy, match=refusal):
            AMUStore(tmp_path / "store")
    finally:
        holder.communicate("", timeout=60)


def test_a_second_writer_is_refused_and_a_reader_is_not(tmp_path: Path, capsys) -> None:
    path = tmp_path / "talk.jsonl"
    path.write_text("\n".join(json.dumps({"session_id": t.session_id, "session_time": WHEN.isoformat(),
                                          "speaker": t.speaker, "turn_id": t.turn_id, "text": t.text})
                              for t in conversation_turns()) + "\n")
    with AMUStore(tmp_path / "store") as writer:
        ingest(writer, conversation_turns()[:4])
        with pytest.raises(StoreBusy, match=r"open for ingest in this process already; close"):
            AMUStore(tmp_path / "store")
        assert ingest_main(["--jsonl", str(path), "--store", str(tmp_path / "store"), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert "open for ingest" in err and len(err.strip().splitlines()) == 1
        with AMUStore(tmp_path / "store", read_only=True) as reader:  # readers take no lock
            assert reader.count() == writer.count()
    with AMUStore(tmp_path / "store") as again:  # the lock went with the writer
        assert again.count() > 0


def test_a_read_only_store_refuses_writes(tmp_path: Path) -> None:
    with AMUStore(tmp_path) as store:
        ingest(store, conversation_turns()[:6])
    with AMUStore(tmp_path, read_only=True) as store:
        count = store.count()
        with pytest.raises(StoreError, match="read-only"):
            store.archive([next(store.amus()).id])
        with pytest.raises(StoreError, match="read-only"):
            store.bind("a key never bound", "value")
    with pytest.raises(StoreError, match="no store"):
        AMUStore(tmp_path / "absent", read_only=True)
    with AMUStore(tmp_path, read_only=True) as store:
        assert store.count() == count


def test_a_corrupt_store_file_is_named(tmp_path: Path, capsys) -> None:
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / AMUStore.DB_NAME).write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="amus.sqlite3: not a usable SQLite store"):
        AMUStore(tmp_path / "store")
    turns = tmp_path / "t.jsonl"  # one turn: an empty input is refused before the store is opened
    turns.write_text(json.dumps({"session_id": "s1", "session_time": "2023-05-08T13:56:00", "speaker": "Ann",
                                 "turn_id": "D1", "text": "hello"}))
    assert ingest_main(["--jsonl", str(turns), "--store", str(tmp_path / "store"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "amus.sqlite3" in err and len(err.strip().splitlines()) == 1


def test_an_unknown_schema_version_is_named(tmp_path: Path) -> None:
    with AMUStore(tmp_path) as store:
        ingest(store, conversation_turns()[:4])
    db = sqlite3.connect(tmp_path / AMUStore.DB_NAME)
    db.execute("PRAGMA user_version=99")
    db.close()
    with pytest.raises(StoreError, match="schema version 99 is unknown"):
        AMUStore(tmp_path)
    with pytest.raises(StoreError, match="schema version 99 is unknown"):
        AMUStore(tmp_path, read_only=True)


def test_a_copy_of_the_file_without_its_wal_is_named_and_never_made_a_new_store(tmp_path: Path,
                                                                              capsys) -> None:
    """While a writer is open a store's rows may all be in its -wal file: a copy of the database
    file alone is a database without the schema, refused by every opener, left as it was."""
    copy = tmp_path / "copy"
    copy.mkdir()
    with AMUStore(tmp_path / "live") as store:
        ingest(store, conversation_turns()[:4])
        shutil.copy(tmp_path / "live" / AMUStore.DB_NAME, copy / AMUStore.DB_NAME)
    before = (copy / AMUStore.DB_NAME).read_bytes()
    for read_only in (False, True):
        with pytest.raises(StoreError, match=r"holds no store \(schema version 0\).*without its amus"):
            AMUStore(copy, read_only=read_only)
    with pytest.raises(StoreUnavailable, match="holds no store"):
        Memory.open(copy, embedder=HashEmbedder())
    assert store_main(["check", "--store", str(copy)]) == 2
    assert store_main(["compact", "--store", str(copy)]) == 2
    assert capsys.readouterr().err.count("holds no store") == 2
    assert (copy / AMUStore.DB_NAME).read_bytes() == before
    assert not list(copy.glob(f"{AMUStore.DB_NAME}-*"))  # no connection was left to write one


# ---------------------------------------------------------------------------- 6. inputs


@pytest.mark.parametrize(("path", "field"), [
    (("sample_id",), "sample_id"), (("conversation", "session_1", 0, "dia_id"), "dia_id"),
    (("conversation", "session_1", 1, "speaker"), "speaker"),
])
def test_empty_identifiers_in_locomo_are_named(tmp_path: Path, capsys, path, field) -> None:
    data = [{"sample_id": "c", "qa": [], "conversation": {
        "speaker_a": "Ann", "speaker_b": "Bob", "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "Hi"},
                      {"speaker": "Bob", "dia_id": "D1:2", "text": "Hello"}]}}]
    target = data[0]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = "  "
    locomo = tmp_path / "l.json"
    locomo.write_text(json.dumps(data))
    with pytest.raises(InputFormatError, match=f"field {field!r} is empty"):
        load_locomo(locomo)
    assert ingest_main(["--locomo", str(locomo), "--store", str(tmp_path / "s"), "--no-progress"]) == 2
    assert f"field {field!r} is empty" in capsys.readouterr().err


def test_an_oversized_turn_is_refused_before_any_work(tmp_path: Path) -> None:
    huge = Turn("conv-a", "s1", "D1:1", "Ann", "Anna Met Ben At The Old Library. " * 30_000, WHEN)  # 1 MB
    with AMUStore(tmp_path) as store:
        with pytest.raises(IngestError, match="D1:1.*the limit is 20000"):
            ingest(store, [huge, *conversation_turns()[1:]])
        assert store.count() == 0


def test_entity_extraction_of_a_long_turn_is_linear() -> None:
    # The longest accepted turn, dense with capitalised runs (the old prefix scan was quadratic in it).
    text = ("Anna met Ben at The Old Library. I love my Blue Bike. " * 400)[:20_000]
    turn = Turn("conv-a", "s1", "D1:1", "Anna", text, WHEN)
    from retrieval.extract.base import ReferenceContext
    from retrieval.memory.records import Exchange, Segment

    segment = Segment("conv-a", "s1", 0, (Exchange((turn,)),), "session_flush", 0)
    (amu,) = RuleExtractor().extract(segment, ReferenceContext(["Anna", "Ben"])).amus
    assert amu.entities[:3] == ("Anna", "Ben", "Old Library")


# ---------------------------------------------------------------------------- 4. unsafe defaults and junk


def test_loading_a_topology_always_checks_identity(tmp_path: Path) -> None:
    assert (inspect.signature(CooccurrenceTopology.load).parameters["identity"].default
            is inspect.Parameter.empty)
    topology = CooccurrenceTopology(8, identity=IDENTITY)
    topology.add([{1, 2}])
    topology.save(tmp_path)
    with pytest.raises(ValueError, match="rebuild it"):
        CooccurrenceTopology.load(tmp_path, identity=dict(IDENTITY, codebook_sha256="b" * 64))


@pytest.mark.parametrize("query", ["", "   \n", "😀🎉", "?!"])
def test_queries_without_words_retrieve_nothing(query: str) -> None:
    retriever = DualPathRetriever(4, IDENTITY)
    retriever.add(["a"], ["Anna went home."], np.eye(4, dtype=np.float32)[:1], [{0, 1}],
                  [{"session_id": "s", "turn_ids": ["D1:1"]}])
    with pytest.raises(EmptyQuery, match="no letter or digit"):
        retriever.search(Query(query, np.ones(4, dtype=np.float32), frozenset({0, 1})),
                         DualPathMode(Channel.CODE, 1), 2)


# ---------------------------------------------------------------------------- 3. fallback segments


class SegmentEchoServer(FakeChatServer):
    """Down (HTTP 503) while ``down`` is set; otherwise one record per turn of the prompt's segment."""

    def __init__(self) -> None:
        self.down = True
        super().__init__(self.answer)

    def answer(self, body: dict) -> tuple:
        if self.down:
            return 503, {"error": "unavailable"}, 0.0
        turns = re.findall(r"^\[(D\d+:\d+)\] (.*)$", body["messages"][1]["content"], re.MULTILINE)
        records = [{"text": f"Fact from {turn_id}: {text}", "memory_type": "fact", "turn_ids": [turn_id]}
                   for turn_id, text in turns]
        return 200, completion_body(json.dumps({"records": records, "disambiguation": "ok"}), 10, 5), 0.0


def test_fallback_segments_are_retried_when_the_endpoint_is_back(tmp_path: Path) -> None:
    turns = conversation_turns()
    with SegmentEchoServer() as server, AMUStore(tmp_path / "store") as store:
        extractor = LLMExtractor(server.base_url, "m", cache_dir=tmp_path / "cache", max_retries=0,
                                 backoff_s=0.0)
        first = ingest_turns(turns, store, HashEmbedder(), extractor, progress=False)
        assert first.fallback_segments == first.segments and all(s.fallback for s in store.segments("conv-a"))
        raw = {a.id: a.text for a in store.amus()}
        server.down = False
        second = ingest_turns(turns, store, HashEmbedder(), extractor, progress=False)
        assert second.retried_segments == second.segments and second.fallback_segments == 0
        assert not any(s.fallback for s in store.segments("conv-a"))
        active = list(store.amus())
        assert [a.text for a in active] == [f"Fact from {t.turn_id}: {t.render()}" for t in turns]
        assert all(a.id.endswith(":r1") for a in active)
        archived = {a.id: a.text for a in store.amus(include_archived=True) if a.archived}
        assert archived == raw  # the raw-turn AMUs are kept, archived, never deleted
        third = ingest_turns(turns, store, HashEmbedder(), extractor, progress=False)
        assert third.amus == 0 and third.retried_segments == 0 and len(list(store.amus())) == len(active)


def test_ingest_against_an_endpoint_refusing_the_model_ends_in_one_error_line_and_can_rerun(
        tmp_path: Path) -> None:
    """A wrong ``ISQ_LLM_MODEL``: no traceback, one error line naming the settings, and the same
    input ingests afterwards with the rule extractor (nothing was extracted with the refused one)."""
    turns = tmp_path / "t.jsonl"
    turns.write_text(json.dumps({"session_id": "s1", "session_time": "2023-05-08T13:56:00", "speaker": "Ann",
                                 "turn_id": "D1", "text": "I adopted a cat named Miso."}))
    store = str(tmp_path / "store")
    with FakeChatServer(lambda body: (404, {"error": {"message": "no such model"}}, 0.0)) as server:
        env = {**os.environ, "ISQ_LLM_BASE_URL": server.base_url, "ISQ_LLM_MODEL": "wrong"}
        command = [sys.executable, "-m", "retrieval.ingest", "--jsonl", str(turns), "--store", store,
                   "--extractor", "llm", "--no-progress"]
        run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=300)  # a process of its own: the terminal's logging
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.count("error: ") == 1 and "ISQ_LLM_MODEL" in run.stderr
    assert ingest_main(["--jsonl", str(turns), "--store", store, "--no-progress"]) == 0
    with AMUStore(tmp_path / "store", read_only=True) as reader:
        assert reader.count() == 1 and reader.meta("extractor") == "rule"


def test_a_store_that_cannot_open_for_a_full_disk_says_so_not_that_it_is_unusable(tmp_path, monkeypatch):
    """A full disk cannot hold the WAL index file a writer opens: the open is refused naming the
    disk, not calling a healthy store "not a usable SQLite store" (which invites rebuilding it)."""
    from retrieval.memory.faults import GuardedConnection, fault

    AMUStore(tmp_path).close()
    execute = GuardedConnection.execute

    def full_disk(self, sql, *args):
        if sql.startswith("SELECT 1 FROM sqlite_master"):
            err = sqlite3.OperationalError("disk I/O error")
            err.sqlite_errorname = "SQLITE_IOERR_SHMSIZE"
            raise fault(err, self.store_path) from err
        return execute(self, sql, *args)

    monkeypatch.setattr(GuardedConnection, "execute", full_disk)
    with pytest.raises(StoreUnavailable) as refused:
        Memory.open(tmp_path, embedder=HashEmbedder())
    message = str(refused.value)
    assert "disk is probably full" in message and "not a usable" not in message


def test_a_lock_this_process_holds_is_named_so_however_threads_race_or_paths_read(tmp_path, monkeypatch):
    """Two threads taking one role's lock at once: every refusal names this process (a refusal
    read between another thread's lock and its note of it said 'another process'); and a store
    opened by a relative path, released after a change of directory, is known by its file."""
    import collections

    from retrieval.memory.lock import WriterLock
    from tests.conftest import run_together

    refusals: collections.Counter[str] = collections.Counter()

    def take_and_give_back() -> None:
        lock = WriterLock(tmp_path, "ingest")
        try:
            lock.acquire()
            lock.release()
        except StoreBusy as err:
            refusals["this process" if "in this process already" in str(err) else str(err)] += 1

    for _ in range(300):
        run_together(take_and_give_back, 2)
    assert set(refusals) <= {"this process"}
    monkeypatch.chdir(tmp_path)
    relative = WriterLock(Path("."), "ingest")
    relative.acquire()
    monkeypatch.chdir(tmp_path.parent)
    with pytest.raises(StoreBusy, match="in this process already"):
        WriterLock(tmp_path, "ingest").acquire()
    relative.release()
    again = WriterLock(tmp_path, "ingest")
    again.acquire()  # released: free again
    again.release()


def test_a_store_locked_by_another_process_at_open_is_not_called_unusable(tmp_path, monkeypatch):
    """A store another connection holds locked past the busy timeout is healthy: the open says it
    was locked, not "not a usable SQLite store" (which invites rebuilding it)."""
    AMUStore(tmp_path).close()
    monkeypatch.setattr("retrieval.memory.connection.BUSY_TIMEOUT_S", 0.2)
    holder = sqlite3.connect(tmp_path / "amus.sqlite3", isolation_level=None)
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreUnavailable) as refused:
            Memory.open(tmp_path, embedder=HashEmbedder())
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert "SQLITE_BUSY" in str(refused.value) and "not a usable" not in str(refused.value)


def test_a_forked_child_closing_its_copy_leaves_the_parents_lock_held_and_a_failed_pid_write_none(
        tmp_path, monkeypatch):
    import errno
    import os

    from retrieval.memory.lock import WriterLock

    lock = WriterLock(tmp_path, "ingest")
    lock.acquire()
    child = os.fork()
    if child == 0:  # the child inherits the object: closing it must not free the parent's lock
        lock.release()
        os._exit(0)
    os.waitpid(child, 0)
    with pytest.raises(StoreBusy, match="in this process already"):
        WriterLock(tmp_path, "ingest").acquire()
    lock.release()

    def disk_full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("retrieval.memory.lock.os.write", disk_full)
    with pytest.raises(OSError, match="No space"):
        WriterLock(tmp_path, "consolidate").acquire()
    monkeypatch.undo()
    again = WriterLock(tmp_path, "consolidate")
    again.acquire()  # the failed attempt gave the lock back
    again.release()
