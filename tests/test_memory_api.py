"""The memory API: turns searchable at once, users kept apart, replays idempotent,
hard deletion that leaves no trace in the store's files, durable jobs, typed errors, migration."""

from __future__ import annotations

import errno
import logging
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from retrieval import Memory
from retrieval.api.backlog import Backlog
from retrieval.api.errors import (
    IngestFailed,
    InvalidInput,
    MemoryAPIError,
    MemoryBusy,
    NotFound,
    StoreUnavailable,
)
from retrieval.extract.rules import RuleExtractor
from retrieval.memory.fingerprinter_source import PATH_KEY as FINGERPRINTER_PATH
from retrieval.memory.records import MAX_TURN_CHARS
from retrieval.memory.schema import SCHEMA_VERSION
from retrieval.memory.store import AMUStore
from tests.multi_route_fixtures import WordEmbedder, WordFingerprinter
from tests.store_backends import SQLITE_BEFORE_VERSION_9

CANARY = "Zorblaxian"


def open_memory(path: Path, **options) -> Memory:
    return Memory.open(path, embedder=WordEmbedder(), fingerprinter=WordFingerprinter(), **options)


def chat(prefix: str, n: int) -> list[dict]:
    speakers = ("Ann", "Bob")
    return [{"speaker": speakers[i % 2], "text": f"{prefix} story number {i} about gardens and tomatoes.",
             "time": "2023-05-08T10:00:00", "turn_id": f"{prefix}-{i}"} for i in range(n)]


def store_bytes(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file())


def texts(result) -> list[str]:
    return [hit.text for hit in result.hits]


def test_a_turn_is_found_by_the_next_search_and_segments_commit_records(tmp_path):
    with open_memory(tmp_path) as mem:
        added = mem.add([{"speaker": "Maria", "text": "I adopted a cat called Pickle.",
                          "time": "2023-05-08T10:00:00"}], user_id="alice", session_id="s1")
        assert added.turn_ids == ("s1:1",) and added.amu_ids == ()
        hits = mem.search("adopted cat Pickle", user_id="alice", k=5).hits
        assert [(h.id, h.kind, h.turns) for h in hits] == [("alice:turn:s1:1", "turn", ("s1:1",))]
        mem.add(chat("alpha", 30), user_id="alice", session_id="s1")
        flushed = mem.flush(user_id="alice", session_id="s1")
        page = mem.list(user_id="alice", limit=100)
        assert len(page.items) >= 20 and page.next_cursor is None
        assert set(flushed.amu_ids) <= {item.id for item in page.items}
        found = mem.search("cat called Pickle", user_id="alice", k=3).hits[0]
        assert "Pickle" in found.text and found.kind == "record" and found.turns == ("s1:1",)
        assert mem.get(found.id, user_id="alice").text == found.text
        assert mem.get("alice:turn:s1:1", user_id="alice").text == "Maria: I adopted a cat called Pickle."


def test_a_flush_answers_the_records_of_its_own_session(tmp_path, monkeypatch):
    """A flush first processes the user's whole backlog, which commits other sessions' segments too:
    those are stored, but the answer lists only the flushed session's records (an agent that deletes
    the ids a flush returned, to undo a conversation, deleted another session's records)."""
    monkeypatch.setattr(Backlog, "_run", lambda self: None)  # no worker: the flush processes the backlog
    with open_memory(tmp_path) as mem:
        mem.add(chat("alpha", 3), user_id="u", session_id="s1")
        mem.add(chat("beta", 60), user_id="u", session_id="s2")
        flushed = mem.flush(user_id="u", session_id="s1")
        page = mem.list(user_id="u", limit=100)
        records = {item.id: item for item in page.items}
        assert page.next_cursor is None
        assert flushed.amu_ids and {records[i].session_id for i in flushed.amu_ids} == {"s1"}
        assert {item.session_id for item in records.values()} == {"s1", "s2"}  # s2's committed all the same


def test_the_incremental_snapshot_matches_a_fresh_build(tmp_path):
    queries = ["gardens story number 3", "tomatoes", "story number 17 about gardens"]
    with open_memory(tmp_path) as mem:
        mem.add(chat("first", 8), user_id="u", session_id="s1")
        mem.search("tomatoes", user_id="u", k=5)  # builds the snapshot; later adds extend it
        mem.add(chat("second", 24), user_id="u", session_id="s1")
        mem.flush(user_id="u", session_id="s1")
        mem.add(chat("third", 9), user_id="u", session_id="s2")
        incremental = [[(h.id, round(h.score, 6)) for h in mem.search(q, user_id="u", k=8).hits]
                       for q in queries]
    with open_memory(tmp_path) as mem:
        fresh = [[(h.id, round(h.score, 6)) for h in mem.search(q, user_id="u", k=8).hits] for q in queries]
    assert incremental == fresh and all(len(hits) == 8 for hits in fresh)


def test_a_turn_added_a_moment_ago_ranks_first_before_its_segment_commits(tmp_path):
    """Until its segment commits, a turn is listed by the raw-turn channel alone: open, it stands
    in for its records, so the records that several channels list do not bury it (explain says it
    is open); flushed, its record answers in its place."""
    garden = [{"speaker": "AB"[i % 2], "text": f"Ann rode the bike number {i} to the garden.",
               "turn_id": f"g-{i}"} for i in range(40)]
    with open_memory(tmp_path) as mem:
        mem.add(garden, user_id="u", session_id="s1")
        mem.flush(user_id="u", session_id="s1")
        mem.add([{"speaker": "Bob", "text": "My bike is green and has a bell."},
                 {"speaker": "Ann", "text": "Okay, thanks!"}], user_id="u", session_id="s2")
        first = mem.search("Whose bike is green with a bell?", user_id="u", k=5, explain=True).hits[0]
        assert (first.id, first.kind, first.explain["open"]) == ("u:turn:s2:1", "turn", True), first
        mem.flush(user_id="u", session_id="s2")
        first = mem.search("Whose bike is green with a bell?", user_id="u", k=5).hits[0]
        assert first.kind == "record" and first.turns == ("s2:1",) and "green" in first.text
        hits = mem.search("okay thanks", user_id="u", k=40, explain=True).hits  # no record of it: a raw turn
        thanks = next(hit for hit in hits if hit.id == "u:turn:s2:2")
        assert thanks.explain["open"] is False and thanks.explain["channels"]["turns"]["rank"] == 1, thanks


def test_a_store_holding_no_turn_takes_the_models_it_is_opened_with(tmp_path):
    """A server started and stopped before any add leaves its models recorded; opened with others
    (a fingerprinter added) the empty store takes those, and once it holds a turn it refuses any
    other, naming the way out."""
    with Memory.open(tmp_path, embedder=WordEmbedder()) as mem:
        mem.store.put_meta(FINGERPRINTER_PATH, "/where/ingest/found/it")  # as ingest records one
    with open_memory(tmp_path) as mem:
        mem.add([{"speaker": "Ann", "text": "A first turn."}], user_id="u", session_id="s")
        assert mem.store.meta("fingerprinter") == WordFingerprinter.identity
        assert mem.store.meta(FINGERPRINTER_PATH) is None  # it named the fingerprinter replaced
    with pytest.raises(StoreUnavailable, match="built with fingerprinter .* or use a new store"):
        Memory.open(tmp_path, embedder=WordEmbedder())


def test_a_store_whose_turns_no_extraction_committed_takes_another_extractor(tmp_path):
    """An extractor that failed on the first segment (an LLM endpoint refusing the model) binds
    the store to nothing it wrote: opened with another, the store takes it; once a segment is
    committed, another extractor is refused."""

    class Refusing(RuleExtractor):
        name = "llm:wrong-model"

        def extract(self, segment, context):
            raise RuntimeError("the endpoint refused the model")

    with Memory.open(tmp_path, embedder=WordEmbedder(), extractor=Refusing()) as mem:
        mem.add([{"speaker": "Ann", "text": "I adopted a cat named Miso."}], user_id="u", session_id="s")
        with pytest.raises(IngestFailed):
            mem.flush(user_id="u", session_id="s")
    with Memory.open(tmp_path, embedder=WordEmbedder()) as mem:
        assert mem.store.meta("extractor") == "rule"
        assert mem.flush(user_id="u", session_id="s").amu_ids
    with pytest.raises(StoreUnavailable, match="built with extractor 'rule'"):
        Memory.open(tmp_path, embedder=WordEmbedder(), extractor=Refusing())


def test_a_fingerprinter_path_that_is_not_a_directory_says_where_the_committed_ones_are(tmp_path):
    with pytest.raises(InvalidInput, match="a source checkout's checkpoints/; a relative path is read from "
                       "the current directory") as refused:
        Memory.open(tmp_path, embedder=WordEmbedder(), fingerprinter="checkpoints/no-such-fingerprinter")
    assert refused.value.field == "fingerprinter"


def test_users_are_kept_apart(tmp_path):
    with open_memory(tmp_path) as mem:
        mem.add(chat("alice", 12) + [{"speaker": "Ann", "text": f"My secret word is {CANARY}."}],
                user_id="alice", session_id="s1")
        mem.flush(user_id="alice", session_id="s1")
        mem.add(chat("bob", 12), user_id="bob", session_id="s1")
        hits = mem.search(f"secret word {CANARY} gardens", user_id="bob", k=20).hits
        assert hits and all(CANARY not in h.text and h.id.startswith("bob:") for h in hits)
        alice_record = mem.list(user_id="alice", limit=1).items[0]
        with pytest.raises(NotFound, match="no record"):
            mem.get(alice_record.id, user_id="bob")
        with pytest.raises(NotFound):
            mem.delete(alice_record.id, user_id="bob")
        with pytest.raises(NotFound):
            mem.history(alice_record.id, user_id="bob")
        assert mem.list(user_id="carol").items == ()
        with pytest.raises(NotFound, match="no records to consolidate") as refused:
            mem.consolidate(user_id="carol")
        assert refused.value.field == "user_id"


def test_replays_add_nothing(tmp_path):
    with open_memory(tmp_path) as mem:
        first = mem.add([{"speaker": "Ann", "text": "Hello there."}], user_id="u", session_id="s",
                        idempotency_key="req-1")
        again = mem.add([{"speaker": "Ann", "text": "Hello there."}], user_id="u", session_id="s",
                        idempotency_key="req-1")
        assert first.turn_ids == ("s:1",) and again.replayed and again.turn_ids == ()
        mem.add(chat("x", 3), user_id="u", session_id="s")
        replay = mem.add(chat("x", 4), user_id="u", session_id="s")
        assert replay.turn_ids == ("x-3",) and replay.duplicates == ("x-0", "x-1", "x-2")
        with AMUStore(tmp_path, read_only=True) as store:
            assert len(store.turns("u")) == 5


def test_forget_leaves_no_trace_and_other_users_results_do_not_change(tmp_path):
    with open_memory(tmp_path) as mem:
        mem.add(chat("bob", 14), user_id="bob", session_id="s1")
        mem.flush(user_id="bob", session_id="s1")
        before = mem.search("gardens tomatoes story", user_id="bob", k=10)
        for session in ("s1", "s2"):
            mem.add(chat(f"alice{session}", 10) + [{"speaker": "Ann", "text": f"{CANARY} is my password."}],
                    user_id="alice", session_id=session)
        mem.flush(user_id="alice", session_id="s1")
        assert mem.search(CANARY, user_id="alice", k=3).hits
        assert CANARY.encode() in store_bytes(tmp_path) or CANARY.lower().encode() in store_bytes(tmp_path)
        mem.forget(user_id="alice", session_id="s1")
        assert all(h.session_id == "s2" for h in mem.search(CANARY, user_id="alice", k=30).hits)
        mem.forget(user_id="alice")
        assert mem.search(CANARY, user_id="alice", k=3).hits == ()
        after = mem.search("gardens tomatoes story", user_id="bob", k=10)
        assert [(h.id, h.score) for h in after.hits] == [(h.id, h.score) for h in before.hits]
    data = store_bytes(tmp_path)
    for needle in (CANARY, CANARY.lower(), "zorblaxian"[:8], "alices1"):
        assert needle.encode() not in data, needle


def test_delete_removes_a_record_with_its_history_or_a_turn_with_its_records(tmp_path):
    with open_memory(tmp_path) as mem:
        mem.add(chat("u", 10) + [{"speaker": "Ann", "text": f"My {CANARY} is blue.", "turn_id": "secret"}],
                user_id="u", session_id="s")
        mem.flush(user_id="u", session_id="s")
        derived = [item for item in mem.list(user_id="u", limit=100).items if "secret" in item.turns]
        assert derived
        mem.delete("u:turn:secret", user_id="u")
        with pytest.raises(NotFound):
            mem.get(derived[0].id, user_id="u")
        with pytest.raises(NotFound):
            mem.get("u:turn:secret", user_id="u")
        victim = mem.list(user_id="u", limit=1).items[0]
        mem.delete(victim.id, user_id="u")
        assert victim.id not in {item.id for item in mem.list(user_id="u", limit=100).items}
        assert all(CANARY not in h.text for h in mem.search(f"{CANARY} blue", user_id="u", k=10).hits)
    assert CANARY.lower().encode() not in store_bytes(tmp_path).lower()


def test_consolidation_is_a_durable_job(tmp_path):
    with open_memory(tmp_path) as mem:
        same = [{"speaker": "Ann", "text": "I love hiking in the Alps every summer."} for _ in range(6)]
        mem.add(same, user_id="u", session_id="s")
        mem.flush(user_id="u", session_id="s")
        job = mem.consolidate(user_id="u", wait=True, timeout_s=60)
        assert job.state == "done" and mem.job(job.id, user_id="u") == job
        with pytest.raises(NotFound):
            mem.job(job.id, user_id="other")
        merged = [item for item in mem.list(user_id="u", limit=100).items
                  if mem.history(item.id, user_id="u")]
        assert job.progress["created"] == len(merged) >= 1
        assert job.progress["user_id"] == "u" and "conversation_id" not in job.progress  # one word
        assert all(h.archived and h.successor for h in mem.history(merged[0].id, user_id="u"))


def test_an_ended_job_nobody_waits_for_leaves_nothing_held(tmp_path):
    """A served consolidation is never waited for (HTTP and MCP answer the job at once): its row,
    once it ends, is read from the store, not kept in the memory (a loop of them grew it)."""
    with open_memory(tmp_path) as mem:
        same = [{"speaker": "Ann", "text": "I love hiking in the Alps every summer."} for _ in range(6)]
        mem.add(same, user_id="u", session_id="s")
        mem.flush(user_id="u", session_id="s")
        for session in (None, "s", None):
            started = mem.consolidate(user_id="u", session_id=session)
            deadline = time.monotonic() + 60
            while (state := mem.job(started.id, user_id="u").state) not in ("done", "failed"):
                assert time.monotonic() < deadline, state
                time.sleep(0.01)
            assert state == "done"
        assert mem._jobs._ended == {} and not mem._jobs._waiters
        waited = mem.consolidate(user_id="u", wait=True, timeout_s=60)  # a waiter reads its row once
        assert waited.state == "done" and mem._jobs._ended == {} and not mem._jobs._waiters


def test_a_failed_job_tells_its_user_it_failed_and_the_log_what_failed(tmp_path, monkeypatch, caplog):
    """What failed may name the server's files: the job's user reads that it failed, the log reads why."""
    from retrieval.api.jobs import JOB_FAILED
    from retrieval.consolidation.operations import OfflineOperator

    def broken(self, cluster):
        raise RuntimeError(f"cannot read {tmp_path}/amus.sqlite3")

    monkeypatch.setattr(OfflineOperator, "decide", broken)
    with open_memory(tmp_path) as mem:
        mem.add([{"speaker": "Ann", "text": "I love hiking in the Alps every summer."} for _ in range(4)],
                user_id="u", session_id="s")
        mem.flush(user_id="u", session_id="s")
        job = mem.consolidate(user_id="u", wait=True, timeout_s=60)
    assert (job.state, job.error) == ("failed", JOB_FAILED) and str(tmp_path) not in JOB_FAILED
    assert f"cannot read {tmp_path}/amus.sqlite3" in caplog.text


def test_a_waiter_is_told_when_its_jobs_user_is_forgotten(tmp_path, monkeypatch):
    """The job went with the user's data: its waiter gets NotFound naming the job, not a crash."""
    import threading

    from retrieval.consolidation.operations import OfflineOperator

    entered, release, real = threading.Event(), threading.Event(), OfflineOperator.decide

    def held(self, cluster):
        entered.set()
        release.wait(30)
        return real(self, cluster)

    monkeypatch.setattr(OfflineOperator, "decide", held)
    outcome: list[object] = []
    with open_memory(tmp_path) as mem:
        mem.add([{"speaker": "Ann", "text": "I love hiking in the Alps every summer."} for _ in range(4)],
                user_id="u", session_id="s")
        mem.flush(user_id="u", session_id="s")

        def wait() -> None:
            try:
                outcome.append(mem.consolidate(user_id="u", wait=True, timeout_s=30))
            except MemoryAPIError as error:
                outcome.append(error)

        waiter = threading.Thread(target=wait)
        waiter.start()
        assert entered.wait(30)
        mem.forget(user_id="u")
        release.set()
        waiter.join(30)
    (error,) = outcome
    assert isinstance(error, NotFound) and error.field == "id" and "forgotten" in str(error)


def test_a_resumed_job_says_so(tmp_path):
    """A job its process left running runs again at the next open; its progress says it resumed."""
    with open_memory(tmp_path) as mem:
        mem.add([{"speaker": "Ann", "text": "I love hiking in the Alps every summer."} for _ in range(4)],
                user_id="u", session_id="s")
        mem.flush(user_id="u", session_id="s")
        fresh = mem.consolidate(user_id="u", wait=True, timeout_s=60)
    assert fresh.progress["resumed"] is False
    with AMUStore(tmp_path) as store:
        row, _ = store.create_job("u", "s", "consolidate")
        store.update_job(row.id, "running", {"stage": "consolidating"})  # as a killed process left it
    with open_memory(tmp_path) as mem:
        ended = mem._jobs.wait(mem.store, row.id, timeout_s=60)
    assert ended.state == "done" and ended.progress["resumed"] is True


@pytest.mark.parametrize(("call", "message"), [
    (lambda m: m.add([{"speaker": "A", "text": "hi"}], user_id="", session_id="s"), "user_id is required"),
    (lambda m: m.add([{"speaker": "A", "text": "hi"}], user_id=None, session_id="s"), "user_id is required"),
    (lambda m: m.add([{"speaker": "A", "text": "  "}], user_id="u", session_id="s"),
     r"turns\[0\]: field 'text'"),
    (lambda m: m.add([{"speaker": "A", "text": " \u200b "}], user_id="u", session_id="s"),
     r"turns\[0\]: field 'text' must be a non-empty string"),
    (lambda m: m.add([{"speaker": "A", "text": "x" * (MAX_TURN_CHARS + 1)}], user_id="u", session_id="s"),
     "limit is"),
    (lambda m: m.add([{"speaker": "A", "text": "hi", "time": "yesterday"}], user_id="u", session_id="s"),
     "not an ISO 8601"),
    (lambda m: m.add([{"speaker": "A", "txt": "hi"}], user_id="u", session_id="s"), "unknown field"),
    (lambda m: m.add([], user_id="u", session_id="s"), "non-empty list"),
    (lambda m: m.flush(user_id="u", session_id="nope"), "has no session"),
    (lambda m: m.search("hi", user_id="u", session_id="nope"), "has no session"),
    (lambda m: m.forget(user_id="u", session_id="nope"), "has no session"),
    (lambda m: m.search("", user_id="u"), "has no letter or digit"),
    (lambda m: m.search(None, user_id="u"), "query must be"),
    (lambda m: m.search("hi", user_id="u", k=0), "k must be"),
    (lambda m: m.list(user_id="u", cursor="abc"), "cursor"),
])
def test_bad_input_raises_one_typed_error(tmp_path, call, message):
    with open_memory(tmp_path) as mem:
        with pytest.raises(MemoryAPIError, match=message) as caught:
            call(mem)
        assert isinstance(caught.value, (InvalidInput, NotFound))


def test_a_second_writer_is_refused_naming_the_pid_and_readers_may_read(tmp_path):
    with open_memory(tmp_path) as mem:
        mem.add(chat("u", 4), user_id="u", session_id="s")
        script = ("import sys; sys.path.insert(0, '.');\nfrom retrieval import Memory\n"
                  "from tests.multi_route_fixtures import WordEmbedder\n"
                  f"try:\n    Memory.open({str(tmp_path)!r}, embedder=WordEmbedder())\n"
                  "except Exception as err:\n    print(type(err).__name__, err)\n")
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parents[1], timeout=120).stdout
        assert out.startswith("MemoryBusy") and "pid" in out
        with pytest.raises(MemoryBusy):
            open_memory(tmp_path)
        with open_memory(tmp_path, read_only=True) as reader:
            assert reader.search("gardens", user_id="u", k=2).hits
            with pytest.raises(MemoryAPIError, match="read-only"):
                reader.add(chat("v", 1), user_id="u", session_id="s")


def test_a_version_3_store_migrates_its_conversations_become_users(tmp_path):
    with open_memory(tmp_path) as mem:
        mem.add(chat("conv-26", 6), user_id="conv-26", session_id="session_1")
        mem.flush(user_id="conv-26", session_id="session_1")
    db = sqlite3.connect(tmp_path / AMUStore.DB_NAME)
    db.executescript(SQLITE_BEFORE_VERSION_9)
    for table in ("idempotency", "jobs", "purging"):
        db.execute(f"DROP TABLE {table}")
    db.execute("PRAGMA user_version=3")
    db.commit()
    db.close()
    with open_memory(tmp_path) as mem:
        assert mem.users() == ["conv-26"]
        assert mem.search("story number 2", user_id="conv-26", session_id="session_1", k=3).hits
        mem.forget(user_id="conv-26")
        assert mem.users() == []


def test_a_version_4_store_migrates_and_counts_its_purges(tmp_path):
    with open_memory(tmp_path) as mem:
        mem.add(chat("u", 4), user_id="u", session_id="s")
        mem.flush(user_id="u", session_id="s")
    db = sqlite3.connect(tmp_path / AMUStore.DB_NAME)
    db.execute("DROP TABLE purges")
    db.executescript(SQLITE_BEFORE_VERSION_9 + "PRAGMA user_version=4;")
    db.commit()
    db.close()
    with pytest.raises(MemoryAPIError, match=f"migration to {SCHEMA_VERSION}.*retrieval.store compact"):
        open_memory(tmp_path, read_only=True)  # the reader is told a command that migrates
    with open_memory(tmp_path) as mem:
        assert mem.search("story number 2", user_id="u", k=3).hits
        assert mem.store.integrity_problems() == []
        mem.forget(user_id="u")
        assert mem.users() == [] and mem.store.ingestion_marks("u") == (0, 0, 1)


@pytest.mark.parametrize("version", [6, 7])
def test_ids_purged_before_the_id_marks_are_never_given_again_after_the_upgrade(tmp_path, version):
    """Purges before version 7 left no marks of the ids they took (a version-7 store migrated from
    an earlier one has them at 0): after the upgrade a new turn took the deleted turn's generated id
    and a new segment the forgotten session's record ids, so a stale delete or read reached them."""
    def unnamed(n: int) -> list[dict]:
        return [{"speaker": "Ann", "text": f"turn {i} about gardens and tomatoes."} for i in range(n)]

    with open_memory(tmp_path) as mem:
        mem.add(unnamed(3), user_id="u", session_id="s1")
        mem.flush(user_id="u", session_id="s1")
        mem.add(chat("u", 4), user_id="u", session_id="s2")
        mem.flush(user_id="u", session_id="s2")
        forgotten = {item.id for item in mem.list(user_id="u", session_id="s2", limit=100).items}
        mem.delete("u:turn:s1:3", user_id="u")
        mem.forget(user_id="u", session_id="s2")
    db = sqlite3.connect(tmp_path / AMUStore.DB_NAME)  # what the purges of earlier code left
    earlier = ("ALTER TABLE purges DROP COLUMN next_seq; ALTER TABLE purges DROP COLUMN next_turn; "
               "PRAGMA user_version=6;" if version == 6 else
               "UPDATE purges SET next_seq = 0, next_turn = 0; PRAGMA user_version=7;")
    db.executescript(SQLITE_BEFORE_VERSION_9 + earlier)
    db.close()
    with open_memory(tmp_path) as mem:
        added = mem.add(unnamed(1), user_id="u", session_id="s1")
        mem.add(chat("v", 4), user_id="u", session_id="s3")
        mem.flush(user_id="u", session_id="s3")
        since = {item.id for item in mem.list(user_id="u", session_id="s3", limit=100).items}
        # segments and generated turn numbers count on from EARLIER_IDS_BOUND
        assert added.turn_ids == ("s1:1000000000",) and mem.get("u:turn:s1:1000000000", user_id="u")
        assert forgotten and since and all(item.startswith("u:1000000000:") for item in since)
        for stale in ["u:turn:s1:3", *forgotten]:
            with pytest.raises(NotFound):
                mem.get(stale, user_id="u")
        assert mem.store.integrity_problems() == []


def version_6_store(directory: Path) -> None:
    """A store in ``directory`` as version 6 left it: one user's flushed records."""
    with open_memory(directory) as mem:
        mem.add(chat("u", 4), user_id="u", session_id="s")
        mem.flush(user_id="u", session_id="s")
    db = sqlite3.connect(directory / AMUStore.DB_NAME)
    db.executescript(SQLITE_BEFORE_VERSION_9 + "ALTER TABLE purges DROP COLUMN next_seq; "
                     "ALTER TABLE purges DROP COLUMN next_turn;"
                     "PRAGMA user_version=6;")
    db.close()


def test_two_processes_opening_an_old_store_at_once_migrate_it_once(tmp_path, monkeypatch):
    """The version read before the migration's transaction may be stale: another process (here a
    consolidation's store, opened in between) migrated the store meanwhile. The second migration
    is skipped; run again it failed ('duplicate column name') or re-keyed the cache twice."""
    import retrieval.memory.connection as connection
    from retrieval.memory.backends import open_store

    version_6_store(tmp_path)
    needs, raced = connection.needs_migration, []

    def another_process_first(found, current, **where):
        if needs(found, current, **where) and not raced:
            raced.append(found)
            open_store(tmp_path, role="consolidate").close()  # migrates the store to the current version
        return needs(found, current, **where)

    monkeypatch.setattr(connection, "needs_migration", another_process_first)
    with open_memory(tmp_path) as mem:
        assert raced == [6] and mem.store.integrity_problems() == []
        assert mem.search("story number 2", user_id="u", k=3).hits


def test_an_old_store_another_process_writes_is_not_migrated_under_it(tmp_path):
    """A consolidation still running the code that wrote the store holds it open for its role:
    migrating then would change the schema under that code (a server of an older version failed
    every search after a newer consolidate migrated its store). The migration waits for it to end,
    refused naming its pid; a holder of this version (its lock says so) is no reason to wait: two
    processes of this version opening the old store at once refused each other."""
    from retrieval.memory.connection import CODE_MARK

    version_6_store(tmp_path)

    def holding(mark: str) -> subprocess.Popen:
        """Another process holding the consolidation's lock, as code of ``mark`` writes it."""
        script = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
                  "fcntl.flock(fd, fcntl.LOCK_EX); "
                  "os.write(fd, f'{os.getpid()} {sys.argv[2]}'.strip().encode()); "
                  "print('held', flush=True); sys.stdin.read()")
        holder = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / ".consolidate.lock"), mark],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        return holder

    for earlier in ("", "schema 6"):  # a version without marks, and one with
        holder = holding(earlier)
        try:
            with pytest.raises(MemoryAPIError, match=f"schema version 6.*open for consolidate by another "
                                                     f"process \\(pid {holder.pid}\\) of an earlier version"):
                open_memory(tmp_path)
            with sqlite3.connect(tmp_path / AMUStore.DB_NAME) as db:
                assert db.execute("PRAGMA user_version").fetchone() == (6,)  # not migrated under it
        finally:
            holder.communicate("")
    holder = holding(CODE_MARK)
    try:
        with open_memory(tmp_path) as mem:
            assert mem.search("story number 2", user_id="u", k=3).hits
            assert mem.store.integrity_problems() == []
    finally:
        holder.communicate("")


def test_an_old_store_that_newer_code_migrated_meanwhile_is_refused_not_marked_older(tmp_path, monkeypatch):
    """The version read again under the write lock is checked as the first was: a store newer code
    migrated in between is refused, and keeps its version."""
    import retrieval.memory.connection as connection

    with open_memory(tmp_path) as mem:
        mem.add(chat("u", 4), user_id="u", session_id="s")
    db = sqlite3.connect(tmp_path / AMUStore.DB_NAME)
    db.executescript(SQLITE_BEFORE_VERSION_9 + "ALTER TABLE purges DROP COLUMN next_seq; "
                     "ALTER TABLE purges DROP COLUMN next_turn;"
                     "PRAGMA user_version=6;")
    db.close()
    needs = connection.needs_migration

    def newer_code_first(found, current, **where):
        if found == 6:
            with sqlite3.connect(tmp_path / AMUStore.DB_NAME) as newer:
                newer.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
        return needs(found, current, **where)

    monkeypatch.setattr(connection, "needs_migration", newer_code_first)
    with pytest.raises(MemoryAPIError, match=f"schema version {SCHEMA_VERSION + 1} is unknown"):
        open_memory(tmp_path)
    with sqlite3.connect(tmp_path / AMUStore.DB_NAME) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1


def test_an_unnamed_turn_never_takes_the_id_of_a_stored_turn(tmp_path: Path) -> None:
    """Generated ids are ``<session>:<n>`` after the session's count (and past every purged
    number): a deleted turn's place, or a caller's id of that form in another session, must not
    make a new turn a 'duplicate'."""
    with Memory.open(tmp_path / "m", embedder=WordEmbedder(), fingerprinter=WordFingerprinter()) as memory:
        first = memory.add([{"speaker": "A", "text": f"turn {i} about bees"} for i in range(4)],
                           user_id="u", session_id="s1")
        for turn_id in first.turn_ids[:2]:
            memory.delete(f"u:turn:{turn_id}", user_id="u")
        after_delete = memory.add([{"speaker": "A", "text": "A brand new turn about violins."}],
                                  user_id="u", session_id="s1")
        memory.add([{"speaker": "B", "text": f"chosen {n}", "turn_id": f"s3:{n}"} for n in (2, 3)],
                   user_id="v", session_id="s2")
        beside_chosen = memory.add([{"speaker": "A", "text": f"unnamed {n}"} for n in range(2)],
                                   user_id="v", session_id="s3")
        texts = [memory.get(f"u:turn:{turn_id}", user_id="u").text for turn_id in after_delete.turn_ids]
        texts += [memory.get(f"v:turn:{turn_id}", user_id="v").text for turn_id in beside_chosen.turn_ids]
    assert (after_delete.turn_ids, after_delete.duplicates) == (("s1:5",), ())  # past the deleted s1:1, s1:2
    assert (beside_chosen.turn_ids, beside_chosen.duplicates) == (("s3:1", "s3:4"), ())
    assert texts == ["A: A brand new turn about violins.", "A: unnamed 0", "A: unnamed 1"]


def test_a_consolidation_waiter_is_told_when_the_memory_closes(tmp_path: Path, monkeypatch) -> None:
    """Closing finishes the running job (its waiter gets it) and leaves the queued one (the same
    user's, which waits for it) for the next open: its waiters get StoreUnavailable, with or
    without a timeout, instead of waiting for good."""
    import threading
    import time

    import retrieval.api.jobs as jobs
    from retrieval.api.errors import StoreUnavailable

    real, started, release = jobs.consolidate_user, threading.Event(), threading.Event()

    def held(*args, **kw):
        started.set()
        release.wait(30)
        return real(*args, **kw)

    monkeypatch.setattr(jobs, "consolidate_user", held)
    memory = Memory.open(tmp_path / "m", embedder=WordEmbedder(), fingerprinter=WordFingerprinter())
    for user in ("u1", "u2"):
        memory.add([{"speaker": "AB"[i % 2], "text": f"{user} story {i} about gardens"} for i in range(6)],
                   user_id=user, session_id="s1")
        memory.flush(user_id=user, session_id="s1")
    outcome: dict[str, object] = {}

    def wait(name: str, session: str | None, timeout_s: float | None) -> None:
        try:
            outcome[name] = memory.consolidate(user_id="u1", session_id=session, wait=True,
                                               timeout_s=timeout_s).state
        except Exception as error:  # noqa: BLE001 - the outcome is what the test reads
            outcome[name] = error

    waiters = [threading.Thread(target=wait, args=args, daemon=True)
               for args in (("running", None, None), ("queued", "s1", None), ("queued, timed", "s1", 30.0))]
    waiters[0].start()
    assert started.wait(30)  # u1's first job runs (held), so its second waits in the queue
    waiters[1].start()
    while len(memory._jobs._queue) < 1:
        time.sleep(0.01)
    waiters[2].start()
    threading.Timer(0.3, release.set).start()
    memory.close()  # finishes u1's job once released
    for waiter in waiters:
        waiter.join(timeout=30)
    assert not [waiter for waiter in waiters if waiter.is_alive()]
    assert outcome["running"] == "done", outcome
    assert all(isinstance(outcome[name], StoreUnavailable) for name in ("queued", "queued, timed")), outcome


def test_history_lists_what_was_merged_oldest_first(tmp_path: Path) -> None:
    """Records u:2:0, u:10:0 and u:11:0 merged: their history is in store order, not id order."""
    hike = "I love hiking in the Alps every summer."
    others = iter(["Bob sails boats.", "Cara bakes bread.", "Dan repairs violins.", "Eve paints murals.",
                   "Fay grows tomatoes.", "Gus collects stamps.", "Hal brews coffee.", "Ivy knits scarves.",
                   "Jon rides horses."])
    with Memory.open(tmp_path / "m", embedder=WordEmbedder(), fingerprinter=WordFingerprinter()) as memory:
        for n in range(12):
            text = hike if n in (2, 10, 11) else next(others)
            memory.add([{"speaker": "Ann", "text": text, "turn_id": f"t{n}"}], user_id="u",
                       session_id=f"s{n}")
            memory.flush(user_id="u", session_id=f"s{n}")
        stored = [item.id for item in memory.list(user_id="u", limit=100).items if "hiking" in item.text]
        memory.consolidate(user_id="u", wait=True)
        (merged,) = [item for item in memory.list(user_id="u").items if memory.history(item.id, user_id="u")]
        history = [item.id for item in memory.history(merged.id, user_id="u")]
    assert stored == ["u:2:0", "u:10:0", "u:11:0"] and history == stored


@pytest.mark.parametrize("value", ["false", "no", 0, None])
def test_read_only_must_be_true_or_false(tmp_path: Path, value: object) -> None:
    with pytest.raises(InvalidInput) as refused:
        Memory.open(tmp_path / "m", embedder=WordEmbedder(), read_only=value)  # type: ignore[arg-type]
    assert refused.value.field == "read_only" and not (tmp_path / "m").exists()


def test_each_record_is_dated_by_its_own_turn(tmp_path: Path) -> None:
    """One segment, turns said on different days (or undated): a record takes its turn's time, an
    undated turn's record the segment's first dated time."""
    turns = [{"speaker": "Ann", "text": "I painted the fence blue.", "time": None},
             {"speaker": "Ann", "text": "I went to the dentist.", "time": "2023-04-10T09:00:00"},
             {"speaker": "Ann", "text": "I baked sourdough bread.", "time": "2023-06-15T10:00:00"}]
    with Memory.open(tmp_path / "m", embedder=WordEmbedder(), fingerprinter=WordFingerprinter()) as memory:
        memory.add([{key: value for key, value in turn.items() if value is not None} for turn in turns],
                   user_id="u", session_id="s1")
        memory.flush(user_id="u", session_id="s1")
        dated = {item.text: item.time for item in memory.list(user_id="u").items}
    assert dated == {"Ann painted the fence blue.": "2023-04-10", "Ann went to the dentist.": "2023-04-10",
                     "Ann baked sourdough bread.": "2023-06-15"}, dated


@pytest.mark.parametrize("error", [PermissionError(errno.EACCES, "Permission denied"),
                                   OSError(errno.EROFS, "Read-only file system")])
def test_a_directory_that_cannot_be_written_is_a_typed_refusal(tmp_path, monkeypatch, error):
    """No permission, or a read-only file system (which is no PermissionError), to write the
    writer's lock file: StoreUnavailable saying to open it read-only, and the CLI's one line."""
    from retrieval.api.errors import StoreUnavailable
    from retrieval.memory.lock import WriterLock
    from retrieval.store import main as store_main

    with open_memory(tmp_path):
        pass

    def refuse(self):
        raise error

    monkeypatch.setattr(WriterLock, "acquire", refuse)
    with pytest.raises(StoreUnavailable, match=f"not writable \\({error.strerror}\\); open it read-only"):
        open_memory(tmp_path)
    assert store_main(["compact", "--store", str(tmp_path)]) == 2
    with open_memory(tmp_path, read_only=True) as reader:
        assert reader.users() == []


def test_a_turn_added_as_a_turn_keeps_its_offset(tmp_path):
    from datetime import datetime

    from retrieval.memory.records import Turn

    given = datetime.fromisoformat("2023-05-08T01:00:00+09:00")
    with open_memory(tmp_path) as mem:
        mem.add([Turn("u", "s", "t1", "Aiko", "I went hiking.", given)], user_id="u", session_id="s")
        stored = mem.store.turn("u", "t1")
    assert stored.local_time == datetime(2023, 5, 8, 1, 0)
    assert stored.session_time == datetime(2023, 5, 7, 16, 0)


def test_a_merged_records_time_prefix_is_on_the_speakers_clock(tmp_path):
    """Three statements between 01:00 and 09:00 on 8 May in Tokyo (7 May 16:00 to 8 May 00:00
    UTC): the merge says so, not a span over two UTC days."""
    hike = "I love hiking in the Alps every summer."
    times = ["2023-05-08T01:00:00+09:00", "2023-05-08T08:00:00+09:00", "2023-05-08T09:00:00+09:00"]
    with open_memory(tmp_path) as mem:
        turns = [{"speaker": "Ann", "text": hike, "time": at, "turn_id": f"k{n}"}
                 for n, at in enumerate(times)]
        mem.add(turns, user_id="u", session_id="s")
        mem.flush(user_id="u", session_id="s")
        assert mem.consolidate(user_id="u", wait=True, timeout_s=60).state == "done"
        (merged,) = mem.list(user_id="u").items
    assert merged.text.startswith("[2023-05-08 01:00 to 2023-05-08 09:00] Ann loves hiking"), merged.text


def test_a_merge_whose_speakers_clock_leaves_the_calendar_is_prefixed_in_utc(tmp_path):
    """At 0001-01-01 02:00 UTC, a speaker five hours behind UTC is before the calendar's first day:
    the merge is made all the same, its prefix in UTC (the job failed, and every rerun with it)."""
    hike = "I love hiking in the Alps every summer."
    times = ["0001-01-01T02:00:00", "0001-01-01T12:00:00-05:00"]
    with open_memory(tmp_path) as mem:
        for n, at in enumerate(times):
            mem.add([{"speaker": "Ann", "text": hike, "time": at}], user_id="u", session_id=f"s{n}")
            mem.flush(user_id="u", session_id=f"s{n}")
        assert mem.consolidate(user_id="u", wait=True, timeout_s=60).state == "done"
        (merged,) = mem.list(user_id="u").items
    assert merged.text.startswith("[0001-01-01 02:00 to 0001-01-01 17:00] Ann loves hiking"), merged.text


def test_a_new_store_on_a_read_only_file_system_is_one_typed_refusal(tmp_path, monkeypatch):
    """Nothing can be made there, not even removed (a read-only file system refuses to unlink a
    missing file too): one StoreUnavailable that says a new store needs a writable directory."""
    from pathlib import Path

    from retrieval.api.errors import StoreUnavailable

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr("retrieval.memory.connection.private_directory", read_only)
    monkeypatch.setattr(Path, "unlink", read_only)
    with pytest.raises(StoreUnavailable, match="no store is there yet: choose a writable directory"):
        open_memory(tmp_path / "new")


def test_a_second_open_in_the_same_process_names_this_process(tmp_path):
    from retrieval.api.errors import MemoryBusy

    with open_memory(tmp_path):
        with pytest.raises(MemoryBusy, match="open for ingest in this process already; close that memory"):
            open_memory(tmp_path)


def test_a_memory_whose_store_was_removed_writes_nothing_and_makes_no_new_one(tmp_path):
    """The store's directory removed under a running memory: adds are refused (a 503 over HTTP),
    and a consolidation does not open a new, empty store where the old one was (a restart would
    have come up on it)."""
    import shutil

    from retrieval.api.errors import StoreUnavailable

    store = tmp_path / "store"
    with open_memory(store) as mem:
        mem.add([{"speaker": "Ann", "text": "I adopted a dog named Max."}], user_id="ann", session_id="s1")
        mem.flush(user_id="ann", session_id="s1")
        # the ingestion worker may still be reading as the directory empties: SQLite then opens the
        # write-ahead log again by its name, and an empty one may be left (never the store itself)
        shutil.rmtree(store, ignore_errors=True)
        with pytest.raises(StoreUnavailable, match="was removed or replaced while this process wrote to it"):
            mem.add([{"speaker": "Ann", "text": "Max likes the park."}], user_id="ann", session_id="s1")
        with pytest.raises(StoreUnavailable, match="the store was removed while this process had it open"):
            mem.consolidate(user_id="ann")
    assert not (store / "amus.sqlite3").exists()


def test_the_ingestion_worker_stops_once_on_a_removed_store(tmp_path, monkeypatch, caplog):
    """No retry mends a removed store: the worker logs it once and ends, where it retried every
    second, encoding its backlog's texts again each time."""
    from retrieval.api.backlog import Backlog
    from retrieval.memory.errors import StoreGone

    steps = []

    def gone(self, user):
        steps.append(user)
        raise StoreGone("amus.sqlite3 was removed or replaced while this process wrote to it")

    monkeypatch.setattr(Backlog, "_take", gone)
    with caplog.at_level(logging.WARNING, logger="retrieval"), open_memory(tmp_path / "store") as mem:
        mem.add([{"speaker": "Ann", "text": "I adopted a dog named Max."}], user_id="ann", session_id="s1")
        mem._backlog._thread.join(timeout=30)
        assert not mem._backlog._thread.is_alive() and steps == ["ann"]
    said = [record.getMessage() for record in caplog.records if "ingestion" in record.getMessage()]
    assert said == ["ingestion stopped: amus.sqlite3 was removed or replaced while this process wrote to it"]
