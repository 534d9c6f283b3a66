"""Consolidation under faults: a SIGKILL at any step, then a rerun, ends in the store an
uninterrupted run makes; ingestion and background consolidation at once lose and duplicate
nothing; a second consolidation of a store, or one with another fingerprinter, is refused."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest

from retrieval import Memory
from retrieval.api.batch import ingest_turns
from retrieval.api.errors import MemoryBusy
from retrieval.consolidate import main as consolidate_main
from retrieval.consolidation.audit import audit
from retrieval.consolidation.engine import consolidate_user
from retrieval.consolidation.worker import ConsolidationWorker, SerializedEmbedder
from retrieval.extract.rules import RuleExtractor
from retrieval.memory import record_writes
from retrieval.memory.errors import StoreBusy, StoreFault, StoreMismatch
from retrieval.memory.meta_keys import COMPACTION_OWED
from retrieval.memory.records import Turn
from retrieval.memory.store import AMUStore
from tests.multi_route_fixtures import WordEmbedder, WordFingerprinter
from tests.test_consolidation import CID, built, duplicate_turns, snapshot  # noqa: F401 - the fixture
from tests.test_ingest import HashEmbedder

REPO = Path(__file__).resolve().parents[2]


def consolidate_and_die(store_dir: str, where: str, step: int) -> None:
    """Run in a subprocess: consolidate, and SIGKILL this process at ``where``: inside the
    transaction of the ``step``-th forwarding (after its insert), right after it committed, or
    after a pass's last step, before its plan is cleared."""
    insert, forward, put_meta = record_writes.insert_amu, AMUStore.forward, AMUStore.put_meta
    done = {"forwarded": 0}

    def insert_then_die(db, amu):
        insert(db, amu)
        if where == "insert" and ":c:" in amu.id and done["forwarded"] + 1 == step:
            os.kill(os.getpid(), signal.SIGKILL)

    def forward_then_die(self, *args):
        result = forward(self, *args)
        done["forwarded"] += 1
        if where == "commit" and done["forwarded"] == step:
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    def die_before_clearing(self, key, value):
        if where == "clear" and value is None and key.startswith("consolidation_plan:"):
            os.kill(os.getpid(), signal.SIGKILL)
        put_meta(self, key, value)

    record_writes.insert_amu = insert_then_die
    AMUStore.forward = forward_then_die
    AMUStore.put_meta = die_before_clearing
    with AMUStore(store_dir, role="consolidate") as store:
        consolidate_user(store, CID, HashEmbedder())


@pytest.fixture(scope="module")
def reference(built, tmp_path_factory) -> list[tuple]:  # noqa: F811 - the imported fixture
    """The store after an uninterrupted consolidation."""
    target = tmp_path_factory.mktemp("reference") / "store"
    shutil.copytree(built, target)
    with AMUStore(target, role="consolidate") as store:
        consolidate_user(store, CID, HashEmbedder())
        return snapshot(store)


@pytest.mark.parametrize(("where", "step"), [("insert", 6), ("commit", 3), ("clear", 0)])
def test_a_killed_consolidation_reruns_to_the_uninterrupted_store(built, reference,  # noqa: F811
                                                                  tmp_path, where, step):
    store_dir = tmp_path / "store"
    shutil.copytree(built, store_dir)
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); "
            "from tests.faults import test_consolidation_faults as t; "
            f"t.consolidate_and_die({str(store_dir)!r}, {where!r}, {step})")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, timeout=300)
    assert result.returncode == -signal.SIGKILL, result.stderr.decode()[-2000:]
    with AMUStore(store_dir, role="consolidate") as store:
        assert audit(store).ok  # consistent at the kill: every archived AMU has an active successor
        interrupted = snapshot(store)
        assert interrupted != reference
        if where == "clear":
            assert store.meta(f"consolidation_plan:{CID}") is not None  # killed before the pass ended
        report = consolidate_user(store, CID, HashEmbedder())
        assert snapshot(store) == reference
        assert report.conflicts == 0
        assert len({a.id for a in store.amus(include_archived=True)}) == len(reference) - 1


def test_ingestion_and_background_consolidation_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    conversations = ("conv-x", "conv-y", "conv-z")
    turns = [turn for cid in conversations for turn in duplicate_turns(cid)]
    with AMUStore(tmp_path / "plain") as plain:
        ingest_turns(turns, plain, HashEmbedder(), RuleExtractor(), progress=False)
        segments = {cid: [(s.seq, s.turn_ids) for s in plain.segments(cid)] for cid in conversations}
        ingested = {a.id: a.text for a in plain.amus(include_archived=True)}

    class SlowExtractor(RuleExtractor):
        def extract(self, segment, context):
            time.sleep(0.02)  # leaves the worker rounds to run between commits
            return super().extract(segment, context)

    store_dir = tmp_path / "live"
    embedder = SerializedEmbedder(HashEmbedder())
    with AMUStore(store_dir) as store:
        worker = ConsolidationWorker(store_dir, embedder, interval_s=0.0)
        with worker:
            stats = ingest_turns(turns, store, embedder, SlowExtractor(), progress=False)
        assert stats.segments == sum(len(s) for s in segments.values()) and worker.rounds >= 2
    with AMUStore(store_dir, role="consolidate") as store:
        units = list(store.amus(include_archived=True))
        originals = {a.id: a.text for a in units if ":c:" not in a.id}
        assert originals == ingested  # every ingested AMU is there, once, unchanged
        assert {cid: [(s.seq, s.turn_ids) for s in store.segments(cid)] for cid in conversations} == segments
        successors = store.successors()
        assert all(a.id in successors for a in units if a.archived)
        assert audit(store).ok
        merged_at = [index for index, a in enumerate(units) if ":c:" in a.id]
        # concurrent
        assert merged_at and merged_at[0] < max(i for i, a in enumerate(units) if ":c:" not in a.id)
        summed = {cid: (r.amus_before, r.amus_active_after, r.archived, len(r.lost_turns))
                  for cid, r in worker.reports.items()}
        assert summed == {cid: (19, 13, 12, 0) for cid in conversations}  # the rounds add up
        for cid in conversations:  # the final round left nothing to do
            assert consolidate_user(store, cid, HashEmbedder()).archived == 0


def test_the_final_round_sees_a_purge_and_an_add_that_leave_the_count_alone(built,  # noqa: F811
                                                                             tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    shutil.copytree(built, store_dir)
    worker = ConsolidationWorker(store_dir, SerializedEmbedder(HashEmbedder()), interval_s=600).start()
    deadline = time.monotonic() + 120
    while worker.rounds == 0 and worker.error is None and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        with AMUStore(store_dir) as store:
            before = store.count(CID)
            when = datetime(2023, 8, 2, 9, 0)
            stamps = "I collect old stamps from Portugal and Spain."
            ingest_turns([Turn(CID, "s4", "D4:1", "Ann", stamps, when),
                          Turn(CID, "s4", "D4:2", "Ann", stamps, when)],
                         store, HashEmbedder(), RuleExtractor(), progress=False)
            store.purge(CID, amu_ids=[f"{CID}:3:1", f"{CID}:3:2"])
            assert store.count(CID) == before  # as many records as the worker's last round saw
    finally:
        reports = worker.stop()
    assert reports[CID].archived == 12 + 2  # the first round's merges, then the two new duplicates
    with AMUStore(store_dir, role="consolidate") as store:
        assert consolidate_user(store, CID, HashEmbedder()).archived == 0


def test_a_second_consolidation_of_a_store_is_refused(built, tmp_path: Path, capsys) -> None:  # noqa: F811
    store_dir = tmp_path / "store"
    shutil.copytree(built, store_dir)
    release = threading.Event()

    class BlockingEmbedder(HashEmbedder):
        def encode(self, texts):
            release.wait(30)
            return super().encode(texts)

    worker = ConsolidationWorker(store_dir, BlockingEmbedder(), interval_s=0.0).start()
    try:
        with pytest.raises(StoreBusy, match="consolidate"):
            AMUStore(store_dir, role="consolidate")
        assert consolidate_main(["--store", str(store_dir)]) == 2
        assert "open for consolidate in this process already" in capsys.readouterr().err
    finally:
        release.set()
        worker.stop(final_round=False)


def test_consolidation_with_another_fingerprinter_is_refused(built, tmp_path: Path) -> None:  # noqa: F811
    store_dir = tmp_path / "store"
    shutil.copytree(built, store_dir)

    class OtherFingerprinter:
        identity = {"codebook_sha256": "b" * 64}

    with AMUStore(store_dir, role="consolidate") as store, \
            pytest.raises(StoreMismatch, match="fingerprinter"):
        consolidate_user(store, CID, HashEmbedder(), fingerprinter=OtherFingerprinter())


def _memory(path: Path, **options) -> Memory:
    return Memory.open(path, embedder=WordEmbedder(), fingerprinter=WordFingerprinter(), **options)


def _filled(path: Path) -> None:
    with _memory(path) as memory:
        memory.add([{"speaker": "AB"[i % 2], "text": f"Story {i} about the gardens and the tomatoes."}
                    for i in range(8)], user_id="u", session_id="s")
        memory.flush(user_id="u", session_id="s")


def test_a_consolidation_refused_while_another_process_consolidates_stores_no_job(tmp_path: Path) -> None:
    """The role is taken before the job is stored: refused, the call stores nothing, and once the
    role is free the next call runs its job (a job stored first stayed queued with no worker)."""
    _filled(tmp_path)
    with _memory(tmp_path) as memory:
        with AMUStore(tmp_path, role="consolidate"), pytest.raises(MemoryBusy, match="consolidate"):
            memory.consolidate(user_id="u")
        assert not memory.store.unfinished()
        assert memory.consolidate(user_id="u", wait=True, timeout_s=120).state == "done"


def test_an_open_refused_for_an_unfinished_job_holds_nothing_back(tmp_path: Path) -> None:
    """Opening resumes unfinished jobs, which needs the consolidate role: held by another process,
    the open is one MemoryBusy, and it leaves no ingestion thread and no writer lock behind."""
    _filled(tmp_path)
    with AMUStore(tmp_path) as store:
        store.create_job("u", None, "consolidate")
    with AMUStore(tmp_path, role="consolidate"), pytest.raises(MemoryBusy, match="consolidate"):
        _memory(tmp_path)
    assert not [t for t in threading.enumerate() if t.name.startswith("memory-")]
    with _memory(tmp_path) as memory:  # the ingest role is free again; the stored job runs
        assert memory.consolidate(user_id="u", wait=True, timeout_s=120).state == "done"


def test_a_compaction_that_cannot_run_leaves_the_forget_done_and_the_store_open(tmp_path: Path,
                                                                               monkeypatch) -> None:
    """VACUUM needs about the database's size free: on a full disk the compaction a purge owes
    fails after the purge committed. The forget reports success (it is done), the compaction stays
    owed, the store still opens for writing, and a later open with room does it."""
    _filled(tmp_path)
    compact = AMUStore.compact_owed

    def disk_full(self) -> None:
        raise StoreFault(f"{tmp_path}: database or disk is full (SQLITE_FULL)")

    monkeypatch.setattr(AMUStore, "compact_owed", disk_full)
    with _memory(tmp_path) as memory:
        memory.forget(user_id="u")
        assert memory.store.meta(COMPACTION_OWED) is not None and not memory.store.count("u")
    with _memory(tmp_path):
        pass
    monkeypatch.setattr(AMUStore, "compact_owed", compact)
    with _memory(tmp_path) as memory:
        assert memory.store.meta(COMPACTION_OWED) is None


def _consolidate_at_once(memory: Memory, users: tuple[str, ...]) -> tuple[list[str], list[Exception]]:
    start, states, errors = threading.Barrier(len(users)), [], []

    def consolidate(user: str) -> None:
        start.wait()
        try:
            states.append(memory.consolidate(user_id=user).state)
        except Exception as err:  # noqa: BLE001 - the test reports what was raised
            errors.append(err)

    threads = [threading.Thread(target=consolidate, args=(user,)) for user in users]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return states, errors


def test_two_first_consolidations_at_once_both_run(tmp_path: Path) -> None:
    """The first consolidation of an open memory starts the job workers, taking the consolidate
    role: two at once must not both take it (the second was refused as 'another process')."""
    _filled(tmp_path)
    with _memory(tmp_path) as memory:
        memory.add([{"speaker": "Ann", "text": "Story about the gardens."}] * 2, user_id="v", session_id="s")
        memory.flush(user_id="v", session_id="s")
    for _ in range(5):
        with _memory(tmp_path) as memory:
            states, errors = _consolidate_at_once(memory, ("u", "v"))
            assert errors == [] and len(states) == 2


def test_a_compaction_that_finds_the_store_damaged_is_reported(tmp_path: Path, monkeypatch) -> None:
    """Only a passing fault (the disk's, another writer's) is borne as an owed compaction: a
    damaged store found by the compaction of a writing open is refused, not hidden behind a
    warning."""
    import sqlite3

    from retrieval.api.errors import StoreUnavailable
    from retrieval.memory.faults import fault

    _filled(tmp_path)

    def damaged(self) -> None:
        err = sqlite3.DatabaseError("database disk image is malformed")
        err.sqlite_errorname = "SQLITE_CORRUPT"
        raise fault(err, tmp_path / "amus.sqlite3") from err

    monkeypatch.setattr(AMUStore, "compact_owed", damaged)
    with pytest.raises(StoreUnavailable, match="damaged"):
        _memory(tmp_path)


def _sqlite_fault(name: str, path: Path) -> StoreFault:
    import sqlite3

    from retrieval.memory.faults import fault

    err = sqlite3.OperationalError(f"{name} (injected)")
    err.sqlite_errorname = name
    made = fault(err, path)
    assert made is not None
    made.__cause__ = err
    return made


@pytest.mark.parametrize("name", ["SQLITE_CANTOPEN", "SQLITE_PROTOCOL", "SQLITE_NOMEM", "SQLITE_READONLY"])
def test_a_compaction_fault_that_leaves_the_store_as_it_was_is_borne(tmp_path: Path, monkeypatch, name):
    """What a later try may not meet (no file descriptor free, a WAL lock race, low memory, a
    file system remounted read-only) leaves the compaction owed and the store opening."""
    _filled(tmp_path)

    def failing(self) -> None:
        raise _sqlite_fault(name, tmp_path / "amus.sqlite3")

    monkeypatch.setattr(AMUStore, "compact_owed", failing)
    with _memory(tmp_path) as memory:
        assert memory.store.count("u")


def test_a_store_fault_while_the_open_starts_its_workers_is_one_typed_refusal(tmp_path: Path,
                                                                             monkeypatch) -> None:
    from retrieval.api.backlog import Backlog
    from retrieval.api.errors import StoreUnavailable

    _filled(tmp_path)

    def damaged(self) -> None:
        raise _sqlite_fault("SQLITE_CORRUPT", tmp_path / "amus.sqlite3")

    monkeypatch.setattr(Backlog, "start", damaged)
    with pytest.raises(StoreUnavailable, match="damaged"):
        _memory(tmp_path)
    assert not [t for t in threading.enumerate() if t.name.startswith("memory-")]


def test_a_consolidation_that_starts_the_workers_as_the_memory_closes_takes_no_role(tmp_path: Path) -> None:
    """The job workers are not started after the memory's close began: the consolidate role stays
    free (it was taken by a call already inside and never given back)."""
    from retrieval.api.errors import StoreUnavailable

    _filled(tmp_path)
    memory = _memory(tmp_path)
    memory._jobs.close()  # the memory's close has stopped the workers; a call inside goes on
    with pytest.raises(StoreUnavailable, match="closed"):
        memory._jobs.start_workers()
    memory.close()
    with AMUStore(tmp_path, role="consolidate"):  # free
        pass
