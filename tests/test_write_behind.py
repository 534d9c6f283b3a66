"""Reads that never wait and ingestion behind the add: a search of one user completes while
another user's segment processing, consolidation or purge is held mid-way (a test of order, not of
time: the held call is still held when the search returns); an add returns before its segment is
processed and a flush waits for it; a ``kill -9`` mid-backlog resumes with every turn and segment
once; a worker error surfaces as a typed error; searches from threads equal sequential ones."""

from __future__ import annotations

import gc
import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from retrieval import Memory
from retrieval.api.backlog import Backlog
from retrieval.api.closing import UserGuards
from retrieval.api.errors import IngestFailed, MemoryBusy
from retrieval.api.states import SearchStates
from retrieval.api.unindexed import UnindexedTurns
from retrieval.consolidation.operations import OfflineOperator
from retrieval.extract.rules import RuleExtractor
from retrieval.index.model_thread import calling_thread
from retrieval.memory.errors import StoreError
from retrieval.memory.records import Turn
from retrieval.memory.store import AMUStore
from tests.multi_route_fixtures import WordEmbedder, WordFingerprinter

REPO = Path(__file__).resolve().parents[1]
WAIT_S = 60.0  # a bound on every wait, never reached when the code is right


class Hold:
    """Blocks the calls that reach :meth:`here` until released; says whether one is blocked now."""

    def __init__(self) -> None:
        self.entered, self.released = threading.Event(), threading.Event()
        self.blocked = False

    def here(self) -> None:
        self.blocked = True
        self.entered.set()
        self.released.wait(WAIT_S)
        self.blocked = False


class HeldExtractor(RuleExtractor):
    """The rule extractor, held (or failing) on the segments of one user."""

    name = "rule"

    def __init__(self, user: str) -> None:
        super().__init__()
        self.user, self.hold, self.fail = user, Hold(), False

    def extract(self, segment, context):
        if segment.user_id == self.user:
            if self.fail:
                raise RuntimeError("the extraction endpoint is down")
            self.hold.here()
        return super().extract(segment, context)


class FailingOnce(RuleExtractor):
    """The rule extractor, whose first call fails (an endpoint down for a moment); the users of
    the failed calls in :attr:`failures`."""

    name = "rule"

    def __init__(self) -> None:
        super().__init__()
        self.failures: list[str] = []

    def extract(self, segment, context):
        if not self.failures:
            self.failures.append(segment.user_id)
            raise RuntimeError("the extraction endpoint is down")
        return super().extract(segment, context)


class HeldOperator(OfflineOperator):
    def __init__(self) -> None:
        super().__init__()
        self.hold = Hold()

    def decide(self, cluster):
        self.hold.here()
        return super().decide(cluster)


def chat(prefix: str, n: int) -> list[dict]:
    return [{"speaker": ("Ann", "Bob")[i % 2], "turn_id": f"{prefix}-{i}",
             "text": f"{prefix} story {i} about {prefix} gardens and tomatoes."} for i in range(n)]


def open_memory(path: Path, **options) -> Memory:
    return Memory.open(path, embedder=WordEmbedder(), fingerprinter=WordFingerprinter(), **options)


def hit_ids(mem: Memory, query: str, user: str) -> list[tuple[str, float]]:
    return [(hit.id, round(hit.score, 9)) for hit in mem.search(query, user_id=user, k=5).hits]


def finished(mem: Memory, job_id: str, user: str):
    """The job once it is done or failed. Asking ``consolidate`` again is no wait for it: once
    the job has finished, that call queues a new job."""
    deadline = time.monotonic() + WAIT_S
    while (job := mem.job(job_id, user_id=user)).state not in ("done", "failed"):
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)
    return job


def covered_once(path: Path, user: str) -> None:
    """Every stored turn of the user in exactly one committed segment, every record once."""
    with AMUStore(path, read_only=True) as reader:
        stored = [turn.turn_id for turn in reader.turns(user)]
        covered = [turn_id for segment in reader.segments(user) for turn_id in segment.turn_ids]
        ids = [amu.id for amu in reader.amus(user, include_archived=True)]
        counts = Counter(amu.source.segment for amu in reader.amus(user, include_archived=True))
        assert {s.seq: s.amu_count for s in reader.segments(user)} == {s: counts[s] for s in counts}
    assert len(stored) == len(set(stored)) and sorted(covered) == sorted(stored)
    assert len(ids) == len(set(ids))


def test_add_returns_before_its_segment_is_processed_and_flush_waits(tmp_path):
    extractor = HeldExtractor("a")
    mem = open_memory(tmp_path, extractor=extractor)
    try:
        added = mem.add(chat("a", 30), user_id="a", session_id="s")
        assert extractor.hold.entered.wait(WAIT_S)  # the worker is inside the first segment
        assert added.turn_ids and added.amu_ids == ()
        assert mem.pending(user_id="a") == 30 and mem.pending() == 30
        assert mem.cache_gauges()["ingest_pending_turns"] == 30
        assert mem.list(user_id="a").items == ()  # no record yet ...
        assert mem.search("a story 3 gardens", user_id="a", k=3).hits[0].kind == "turn"  # ... turns found
        extractor.hold.released.set()
        flushed = mem.flush(user_id="a", session_id="s")
        assert mem.pending() == 0 and flushed.amu_ids
        records = {item.id for item in mem.list(user_id="a", limit=50).items}
        assert set(flushed.amu_ids) <= records and len(records) == 30
    finally:
        extractor.hold.released.set()
        mem.close()
    covered_once(tmp_path, "a")


def test_a_full_backlog_refuses_adds_storing_nothing_until_it_is_processed(tmp_path, monkeypatch):
    """Adds faster than the worker would hold ever more turns in memory: from MAX_PENDING_TURNS
    pending, a user's add is refused (MemoryBusy, which HTTP answers 503 with Retry-After),
    nothing of it stored; another user's adds go on; once processed, the user adds again."""
    monkeypatch.setattr("retrieval.api.backlog.MAX_PENDING_TURNS", 30)
    extractor = HeldExtractor("a")
    mem = open_memory(tmp_path, extractor=extractor)
    try:
        mem.add(chat("a", 20), user_id="a", session_id="s")
        assert extractor.hold.entered.wait(WAIT_S)  # the worker holds the first segment
        mem.add(chat("b", 20), user_id="a", session_id="s", idempotency_key="k")  # under the bound: past it
        with pytest.raises(MemoryBusy, match="40 turns not yet processed"):
            mem.add(chat("c", 1), user_id="a", session_id="s")
        assert mem.pending(user_id="a") == 40 and not mem.store.stored_turn_ids("a", ["c-0"])
        assert mem.add(chat("b", 20), user_id="a", session_id="s", idempotency_key="k").replayed  # answered
        assert len(mem.add(chat("a", 20), user_id="a", session_id="s").duplicates) == 20  # stores nothing
        assert mem.add(chat("d", 40), user_id="d", session_id="s").turn_ids  # another user's backlog
        extractor.hold.released.set()
        mem.drain(user_id="a", timeout_s=WAIT_S)
        assert mem.add(chat("c", 1), user_id="a", session_id="s").turn_ids == ("c-0",)
    finally:
        extractor.hold.released.set()
        mem.close()


class CountingEmbedder(WordEmbedder):
    """The word embedder, recording which thread embedded which texts."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, list[str]]] = []

    def encode(self, texts):
        self.calls.append((calling_thread().name, list(texts)))
        return super().encode(texts)

    def texts_of(self, thread: str) -> list[str]:
        return [text for name, texts in self.calls if name == thread for text in texts]


class HeldEmbedder(CountingEmbedder):
    """The counting embedder, held in the ingestion worker's first call."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = Hold()

    def encode(self, texts):
        if calling_thread().name == "memory-ingest" and not self.texts_of("memory-ingest"):
            self.hold.here()
        return super().encode(texts)


class ChunkHeldEmbedder(CountingEmbedder):
    """The counting embedder, held in the ingestion worker's first call on an exchange (two turns'
    text) holding ``word``."""

    def __init__(self, word: str) -> None:
        super().__init__()
        self.word, self.hold = word, Hold()

    def encode(self, texts):
        exchange = any(self.word in text and "\n" in text for text in texts)
        if calling_thread().name == "memory-ingest" and exchange:
            self.hold.here()
        return super().encode(texts)


def test_closing_stops_a_long_backlog_between_chunks_and_the_next_open_resumes_it(tmp_path, monkeypatch):
    """A step feeds a backlog STEP_TURNS turns at a time and stops between chunks once the memory
    closes, so shutdown waits for one chunk, not for the embedding of a user's whole backlog."""
    monkeypatch.setattr("retrieval.api.backlog.STEP_TURNS", 6)
    embedder = ChunkHeldEmbedder("a story 0 ")  # the first chunk's first exchange
    mem = Memory.open(tmp_path, embedder=embedder, fingerprinter=WordFingerprinter())
    closing = threading.Thread(target=mem.close)
    try:
        mem.add(chat("a", 60), user_id="a", session_id="s")
        assert embedder.hold.entered.wait(WAIT_S)  # the worker feeds its first chunk
        closing.start()
        deadline = time.monotonic() + WAIT_S
        while not mem._backlog._closed and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        embedder.hold.released.set()
        closing.join(WAIT_S)
    exchanges = [text for text in embedder.texts_of("memory-ingest") if "\n" in text]
    assert not closing.is_alive() and 0 < len(exchanges) <= 3  # the first chunk's 6 turns, paired
    with open_memory(tmp_path) as mem:
        mem.flush(user_id="a", session_id="s")
        assert mem.pending() == 0 and len(mem.list(user_id="a", limit=100).items) == 60
    covered_once(tmp_path, "a")


def test_the_pending_count_drops_chunk_by_chunk_while_a_long_backlog_is_processed(tmp_path, monkeypatch):
    """A deployer watching ``pending`` (or the metrics) sees a long backlog shrink as each chunk of
    STEP_TURNS turns is fed, not stand still until the whole backlog is done."""
    monkeypatch.setattr("retrieval.api.backlog.STEP_TURNS", 6)
    embedder = ChunkHeldEmbedder("story 6 ")  # the second chunk's first exchange
    mem = Memory.open(tmp_path, embedder=embedder, fingerprinter=WordFingerprinter())
    try:
        mem.add(chat("a", 60), user_id="a", session_id="s")
        assert embedder.hold.entered.wait(WAIT_S)
        assert mem.pending(user_id="a") == 54 and mem.pending() == 54
    finally:
        embedder.hold.released.set()
    mem.drain(user_id="a", timeout_s=WAIT_S)
    assert mem.pending() == 0
    mem.close()
    covered_once(tmp_path, "a")


def test_the_worker_takes_the_users_due_in_turn_a_step_each(tmp_path, monkeypatch):
    """A user's long backlog is fed STEP_TURNS turns a step, and a user whose turns came during one
    of its steps is taken next, before the long backlog's next step, even if the long backlog's
    user added more meanwhile: one user's bulk delays another's records by one step."""
    monkeypatch.setattr("retrieval.api.backlog.STEP_TURNS", 6)
    embedder = ChunkHeldEmbedder("a story 2 ")  # in a's first step of its long backlog
    a_turns, b_turns = chat("a", 42), chat("b", 4)
    with Memory.open(tmp_path, embedder=embedder, fingerprinter=WordFingerprinter()) as mem:
        mem.add(a_turns[:2], user_id="a", session_id="s")
        mem.add(b_turns[:2], user_id="b", session_id="s")
        mem.drain(timeout_s=WAIT_S)  # both users' streams are held
        try:
            mem.add(a_turns[2:32], user_id="a", session_id="s")  # 30 turns: five steps
            assert embedder.hold.entered.wait(WAIT_S)  # the worker is in a's first step
            mem.add(a_turns[32:], user_id="a", session_id="s")
            mem.add(b_turns[2:], user_id="b", session_id="s")
        finally:
            embedder.hold.released.set()
        mem.drain(timeout_s=WAIT_S)
        texts = embedder.texts_of("memory-ingest")
        for user in "ab":
            mem.flush(user_id=user, session_id="s")
    held = next(i for i, text in enumerate(texts) if "a story 2 " in text)
    users = [found[1] for text in texts[held:] if (found := re.search(r"\b([ab]) story", text))]
    assert [user for user, _ in itertools.groupby(users)] == ["a", "b", "a"]
    b_first = next(i for i in range(held, len(texts)) if "b story" in texts[i])
    first_step = [text for text in texts[held:b_first] if "\n" in text]
    assert len(first_step) == 3  # a's turns 2-7 paired: b came after one step of a, not two
    for user in "ab":
        covered_once(tmp_path, user)


def test_a_step_computes_the_vectors_of_a_bounded_number_of_added_turns(tmp_path, monkeypatch):
    """A step computes the vectors of at most STEP_TURNS of the turns its user added, beside its
    exchanges, so a user due behind waits for that, not for the vectors of the whole backlog; each
    vector is computed once, the search state reading back what the steps cached."""
    monkeypatch.setattr("retrieval.api.backlog.STEP_TURNS", 6)
    embedder = HeldEmbedder()
    a_turns = chat("a", 30)
    with Memory.open(tmp_path, embedder=embedder, fingerprinter=WordFingerprinter()) as mem:
        try:
            mem.add(a_turns, user_id="a", session_id="s")
            assert embedder.hold.entered.wait(WAIT_S)  # the worker's first call
            mem.add(chat("b", 4), user_id="b", session_id="s")
        finally:
            embedder.hold.released.set()
        mem.drain(timeout_s=WAIT_S)
        hits = mem.search("a story 29 gardens", user_id="a", k=3).hits
        for user in "ab":
            mem.flush(user_id=user, session_id="s")
    calls = [texts for name, texts in embedder.calls if name == "memory-ingest"]
    rendered = [f"{turn['speaker']}: {turn['text']}" for turn in a_turns]
    turns, exchanges = ([text for text in calls[0] if ("\n" in text) == pair] for pair in (False, True))
    assert turns == rendered[:6] and len(exchanges) == 3  # a's first step: six turns and their exchanges
    assert all("b story" in text for text in calls[1])  # then b's step
    computed = Counter(text for _, texts in embedder.calls for text in texts)
    assert [computed[text] for text in rendered] == [1] * 30
    assert any("a-29" in hit.turns for hit in hits)
    for user in "ab":
        covered_once(tmp_path, user)


class SearchHeldEmbedder(CountingEmbedder):
    """The counting embedder, held in a call of the thread named ``searcher`` on stored turns."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = Hold()

    def encode(self, texts):
        if calling_thread().name == "searcher" and any(text.startswith("Ann: ") for text in texts):
            self.hold.here()
        return super().encode(texts)


def test_a_search_computes_a_bulks_vectors_before_it_takes_the_users_guard(tmp_path, monkeypatch):
    """A search computes the vectors of the turns still waiting before it takes the user's
    ``state`` guard: while it computes a bulk's, the user's add (and the worker's step, which
    takes the same guard) goes on rather than waiting for the search."""
    monkeypatch.setattr("retrieval.api.backlog.STEP_TURNS", 6)  # a step computes six of the bulk
    embedder, extractor = SearchHeldEmbedder(), HeldExtractor("a")
    found: list[list[tuple[str, float]]] = []
    with Memory.open(tmp_path, embedder=embedder, extractor=extractor) as mem:
        searcher = threading.Thread(target=lambda: found.append(hit_ids(mem, "a story 29", "a")),
                                    name="searcher")
        try:
            mem.add(chat("a", 30), user_id="a", session_id="s")
            assert extractor.hold.entered.wait(WAIT_S)  # the worker in a's first segment, turns waiting
            searcher.start()
            assert embedder.hold.entered.wait(WAIT_S)  # the search computes them
            adder = threading.Thread(target=lambda: mem.add(chat("c", 1), user_id="a", session_id="s"))
            adder.start()
            adder.join(WAIT_S)
            assert not adder.is_alive() and embedder.hold.blocked
        finally:
            extractor.hold.released.set()
            embedder.hold.released.set()
        searcher.join(WAIT_S)
        mem.flush(user_id="a", session_id="s")
    assert found and found[0][0][0].endswith("a-29")
    covered_once(tmp_path, "a")


class RecordingStates:
    """A search-state table that records the turns it is given."""

    def __init__(self) -> None:
        self.turns: list[str] = []

    def extend(self, user, marks, turns=()):
        self.turns += [turn.turn_id for turn in turns]

    def refresh(self, user, most=None):
        pass


class CountingModel:
    """A cached embedder's interface, counting the texts of each call."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def for_user(self, user, purges=None):
        return self

    def encode(self, texts):
        self.calls.append(len(texts))


def test_a_bulk_added_after_the_worker_prepared_keeps_waiting_at_its_index():
    """The worker computes the vectors of a user's added turns, then indexes them under the user's
    guard (every call of the user waiting); a bulk of more than the step's bound added in between
    is not computed there: it keeps waiting for a later step or the user's search, which takes in
    everything."""
    states, model = RecordingStates(), CountingModel()
    waiting = UnindexedTurns(states, model)  # type: ignore[arg-type]
    turns = [Turn("a", "s", f"t-{i}", "Ann", f"story {i}") for i in range(303)]
    waiting.added("a", [(0, 1)], turns[:3], 0)
    assert waiting.ready("a", 6) and model.calls == [3]
    waiting.added("a", [(1, 2)], turns[3:], 0)
    waiting.index("a", 6)  # the worker, under the user's guard
    assert states.turns == [] and model.calls == [3] and waiting.behind("a") == 300
    waiting.index("a")  # the user's search
    assert states.turns == [turn.turn_id for turn in turns] and model.calls == [3, 300]


def test_a_user_adding_faster_than_a_step_computes_still_has_its_turns_fed(tmp_path, monkeypatch):
    """A user whose adds outrun the vectors one step computes (seven turns before each of its steps
    of STEP_TURNS six) still has its turns fed and its segments committed step by step, not
    only once its backlog is full and its adds refused."""
    monkeypatch.setattr("retrieval.api.backlog.STEP_TURNS", 6)
    process, covered = Backlog.process, []
    mem = open_memory(tmp_path)

    def flooding(self, user, limit=None):
        if threading.current_thread().name != "memory-ingest" or len(covered) == 12:
            return process(self, user, limit)
        start = 7 * len(covered)
        mem.add(chat(user, start + 7)[start:], user_id=user, session_id="s")
        amus = process(self, user, limit)
        covered.append(sum(len(segment.turn_ids) for segment in mem.store.segments(user)))
        return amus

    monkeypatch.setattr(Backlog, "process", flooding)
    with mem:
        mem.add(chat("start", 1), user_id="a", session_id="x")
        mem.drain(timeout_s=WAIT_S)
        assert len(covered) == 12 and covered[-1] >= 30
        mem.flush(user_id="a", session_id="s")
        mem.flush(user_id="a", session_id="x")
    covered_once(tmp_path, "a")


def test_turns_added_in_a_step_beyond_its_bound_wait_and_the_worker_then_catches_up(tmp_path, monkeypatch):
    """Turns a user adds while its step runs, more than STEP_TURNS of them, are not embedded by that
    step's commits: each worker call computes at most STEP_TURNS of them, the commits leave the
    user's search state behind, and once the turns have their vectors the worker catches the state
    up from the store (the user's search does not), finding what a memory opened afresh finds."""
    monkeypatch.setattr("retrieval.api.backlog.STEP_TURNS", 6)
    catch_up, caught = SearchStates._catch_up, []
    monkeypatch.setattr(SearchStates, "_catch_up", lambda self, *args: caught.append(
        threading.current_thread().name) or catch_up(self, *args))
    embedder, extractor = CountingEmbedder(), HeldExtractor("a")
    a_turns = chat("a", 90)
    queries = ["a story 89 gardens", "a story 2 tomatoes", "gardens and tomatoes"]
    with Memory.open(tmp_path, embedder=embedder, fingerprinter=WordFingerprinter(),
                     extractor=extractor) as mem:
        try:
            mem.add(a_turns[:30], user_id="a", session_id="s")
            mem.search("warm", user_id="a", k=3)  # a's search state is held
            assert extractor.hold.entered.wait(WAIT_S)  # the worker is inside a's first segment
            mem.add(a_turns[30:60], user_id="a", session_id="s")  # 30 turns: five steps' worth
        finally:
            extractor.hold.released.set()
        deadline = time.monotonic() + WAIT_S
        while not mem.store.segments("a") and time.monotonic() < deadline:
            time.sleep(0.01)
        mem.add(a_turns[60:], user_id="a", session_id="s")  # 30 more, after the state fell behind
        mem.drain(timeout_s=WAIT_S)
        assert set(caught) == {"memory-ingest"}
        caught_up = [hit_ids(mem, query, "a") for query in queries]
        assert set(caught) == {"memory-ingest"}
        assert any("a-89" in hit.turns for hit in mem.search(queries[0], user_id="a", k=5).hits)
    flood = {f"{turn['speaker']}: {turn['text']}" for turn in a_turns[30:]}
    per_call = [len(flood.intersection(texts)) for name, texts in embedder.calls if name == "memory-ingest"]
    assert max(per_call) == 6 and sum(per_call) == 60  # each flood turn once, six at most a call
    with open_memory(tmp_path) as fresh:
        assert [hit_ids(fresh, query, "a") for query in queries] == caught_up
        fresh.flush(user_id="a", session_id="s")
    covered_once(tmp_path, "a")


def test_an_add_embeds_nothing_and_the_next_search_embeds_and_finds_its_turns(tmp_path, monkeypatch):
    embedder, extractor = CountingEmbedder(), HeldExtractor("a")
    builds: list[str] = []
    build = Memory._build_bank
    monkeypatch.setattr(Memory, "_build_bank", lambda self, user: builds.append(user) or build(self, user))
    mem = Memory.open(tmp_path, embedder=embedder, fingerprinter=WordFingerprinter(), extractor=extractor)
    try:
        mem.add(chat("a", 30), user_id="a", session_id="s")
        assert extractor.hold.entered.wait(WAIT_S)  # the worker is held inside the first segment
        mem.search("warm", user_id="a", k=3)
        assert len(builds) == 1
        embedder.calls.clear()
        turn = {"speaker": "Ann", "turn_id": "late", "text": "The violin recital is on Friday."}
        mem.add([turn], user_id="a", session_id="s")
        assert embedder.calls == []  # no forward in the add, in any thread (the worker is held)
        hits = mem.search("violin recital Friday", user_id="a", k=3).hits
        assert hits[0].id == "a:turn:late"
        assert embedder.texts_of("MainThread")[0] == "Ann: The violin recital is on Friday."
        assert len(builds) == 1  # the search state took the turn in place
        extractor.hold.released.set()
        mem.drain(user_id="a", timeout_s=WAIT_S)
        embedder.calls.clear()
        mem.add([{**turn, "turn_id": "later", "text": "Bring the cello to the recital."}], user_id="a",
                session_id="s")
        mem.drain(user_id="a", timeout_s=WAIT_S)  # the worker embeds the turn and indexes it
        assert "Ann: Bring the cello to the recital." in embedder.texts_of("memory-ingest")
        embedder.calls.clear()
        hits = mem.search("cello recital", user_id="a", k=5).hits
        assert any("later" in hit.turns for hit in hits)  # its raw turn, or a record of it
        assert "Ann: Bring the cello to the recital." not in embedder.texts_of("MainThread")
        assert len(builds) == 1
    finally:
        extractor.hold.released.set()
        mem.close()


def test_a_search_completes_while_another_users_segment_is_held(tmp_path):
    extractor = HeldExtractor("a")
    mem = open_memory(tmp_path, extractor=extractor)
    try:
        mem.add(chat("b", 12), user_id="b", session_id="s")
        mem.flush(user_id="b", session_id="s")
        before = hit_ids(mem, "b story 5 gardens", "b")
        mem.add(chat("a", 30), user_id="a", session_id="s")
        assert extractor.hold.entered.wait(WAIT_S)
        assert hit_ids(mem, "b story 5 gardens", "b") == before
        mem.add(chat("b2", 4), user_id="b", session_id="t")  # B's writes do not wait either
        assert mem.flush(user_id="b", session_id="t").amu_ids
        assert mem.get(before[0][0], user_id="b").id == before[0][0]
        assert extractor.hold.blocked and mem.pending(user_id="a") == 30  # still held
        extractor.hold.released.set()
        mem.drain(user_id="a", timeout_s=WAIT_S)
        assert mem.pending() == 0
    finally:
        extractor.hold.released.set()
        mem.close()


def test_a_search_completes_while_another_users_consolidation_is_held(tmp_path):
    operator = HeldOperator()
    mem = open_memory(tmp_path, operator=operator)
    try:
        statements = ["I love hiking in the Alps.", "My sister bakes bread on Sundays.",
                      "We adopted a puppy named Rex.", "Tom plays the violin beautifully."]
        mem.add([{"speaker": "Ann", "text": statements[i % 4]} for i in range(24)],
                user_id="a", session_id="s")
        mem.add(chat("b", 12), user_id="b", session_id="s")
        for user in ("a", "b"):
            mem.flush(user_id=user, session_id="s")
        before = hit_ids(mem, "b story 5 gardens", "b")
        job = mem.consolidate(user_id="a")
        assert operator.hold.entered.wait(WAIT_S)
        assert hit_ids(mem, "b story 5 gardens", "b") == before
        assert operator.hold.blocked
        operator.hold.released.set()
        assert finished(mem, job.id, "a").state == "done"
    finally:
        operator.hold.released.set()
        mem.close()


class UserHeldOperator(OfflineOperator):
    """The offline operator, held on the clusters of one user."""

    def __init__(self, user: str) -> None:
        super().__init__()
        self.user, self.hold = user, Hold()

    def decide(self, cluster):
        if cluster[0].amu.source.user_id == self.user:
            self.hold.here()
        return super().decide(cluster)


def test_a_consolidation_completes_while_another_users_consolidation_is_held(tmp_path):
    """Jobs of different users run side by side: one user's long consolidation (an LLM's minutes)
    holds up no other user's."""
    operator = UserHeldOperator("a")
    mem = open_memory(tmp_path, operator=operator)
    try:
        statements = ["I love hiking in the Alps.", "My sister bakes bread on Sundays.",
                      "We adopted a puppy named Rex.", "Tom plays the violin beautifully."]
        for user in ("a", "b"):
            mem.add([{"speaker": "Ann", "text": f"{statements[i % 4]}"} for i in range(24)],
                    user_id=user, session_id="s")
            mem.flush(user_id=user, session_id="s")
        held = mem.consolidate(user_id="a")
        assert operator.hold.entered.wait(WAIT_S)
        done = mem.consolidate(user_id="b", wait=True, timeout_s=WAIT_S)
        assert done.state == "done" and done.progress["archived"] > 0 and operator.hold.blocked
        assert mem.job(held.id, user_id="a").state == "running"
        operator.hold.released.set()
        assert finished(mem, held.id, "a").state == "done"
    finally:
        operator.hold.released.set()
        mem.close()


def purges_held(monkeypatch) -> Hold:
    """Every purge holds the store's writer (its transaction open) until the hold is released."""
    import retrieval.api.memory as memory_module

    hold, real = Hold(), memory_module.hard_purge

    def held_purge(store, user, *args, **kwargs):
        with store._transaction():
            hold.here()
        return real(store, user, *args, **kwargs)

    monkeypatch.setattr(memory_module, "hard_purge", held_purge)
    return hold


def test_a_search_completes_while_another_users_purge_holds_the_writer(tmp_path, monkeypatch):
    hold = purges_held(monkeypatch)
    with open_memory(tmp_path) as mem:
        for user in ("a", "b"):
            mem.add(chat(user, 12), user_id=user, session_id="s")
            mem.flush(user_id=user, session_id="s")
    with open_memory(tmp_path) as mem:  # B's search state is built from the store while A's purge holds
        forget = threading.Thread(target=mem.forget, kwargs={"user_id": "a"})
        forget.start()
        try:
            assert hold.entered.wait(WAIT_S)
            hits = hit_ids(mem, "b story 5 gardens", "b")
            assert hits and all(hit.startswith("b") for hit, _ in hits)
            assert hold.blocked
        finally:
            hold.released.set()
            forget.join(WAIT_S)
        assert not mem.search("a story 5 gardens", user_id="a", k=3).hits


def test_a_search_completes_while_its_users_add_waits_for_another_users_purge(tmp_path, monkeypatch):
    """A's purge holds the store's writer; B's add waits for it; B's search does not wait with it
    (and finds B's add once it is stored)."""
    hold = purges_held(monkeypatch)
    with open_memory(tmp_path) as mem:
        for user in ("a", "b"):
            mem.add(chat(user, 12), user_id=user, session_id="s")
            mem.flush(user_id=user, session_id="s")
        assert hit_ids(mem, "b story 5 gardens", "b")  # B's state held
        appending, append = threading.Event(), mem.store.append_turns

        def announced_append(*args, **kwargs):
            appending.set()  # the add holds what it holds while it waits for the writer
            return append(*args, **kwargs)

        monkeypatch.setattr(mem.store, "append_turns", announced_append)
        forget = threading.Thread(target=mem.forget, kwargs={"user_id": "a"})
        add = threading.Thread(target=mem.add, args=([{"speaker": "Ann", "text": "b pumpkins grow late"}],),
                               kwargs={"user_id": "b", "session_id": "s"})
        found: list[list[tuple[str, float]]] = []
        search = threading.Thread(target=lambda: found.append(hit_ids(mem, "b story 7 gardens", "b")))
        forget.start()
        try:
            assert hold.entered.wait(WAIT_S)
            add.start()
            assert appending.wait(WAIT_S)
            search.start()
            search.join(WAIT_S)
            assert not search.is_alive() and hold.blocked and add.is_alive()
            assert found[0] and all(hit.startswith("b") for hit, _ in found[0])
        finally:
            hold.released.set()
            forget.join(WAIT_S)
            add.join(WAIT_S)
            search.join(WAIT_S)
        top = mem.search("b pumpkins grow late", user_id="b", k=1).hits[0]
        assert top.text.endswith("b pumpkins grow late")


def test_a_failing_segment_is_reported_at_drain_and_tried_again_by_flush(tmp_path):
    extractor = HeldExtractor("a")
    extractor.hold.released.set()
    extractor.fail = True
    with open_memory(tmp_path, extractor=extractor) as mem:
        mem.add(chat("a", 30), user_id="a", session_id="s")
        with pytest.raises(IngestFailed, match="endpoint is down"):
            mem.drain(user_id="a", timeout_s=WAIT_S)
        assert mem.pending(user_id="a") == 30  # nothing lost: the turns are still the backlog
        mem.add(chat("b", 4), user_id="b", session_id="s")
        mem.drain(user_id="b", timeout_s=WAIT_S)  # the worker goes on with other users
        extractor.fail = False
        mem.flush(user_id="a", session_id="s")
        assert mem.pending() == 0 and len(mem.list(user_id="a", limit=50).items) == 30
    covered_once(tmp_path, "a")


def test_a_failed_step_is_tried_again_by_the_worker_after_a_pause(tmp_path, monkeypatch):
    """The extraction endpoint fails once: a user that only adds (no drain, no flush) gets its
    records all the same, the worker trying it again after a pause; the drain after has nothing
    to report, the failure being over."""
    from retrieval.api import retries

    monkeypatch.setattr(retries, "RETRY_S", 0.05)
    extractor = FailingOnce()
    failures = extractor.failures
    with open_memory(tmp_path, extractor=extractor) as mem:
        mem.add(chat("a", 30), user_id="a", session_id="s")
        deadline = time.monotonic() + WAIT_S
        while (mem.pending(user_id="a") or not failures) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert failures == ["a"] and mem.pending(user_id="a") == 0
        mem.drain(user_id="a", timeout_s=WAIT_S)
        assert len(mem.list(user_id="a", limit=50).items) > 10
        mem.flush(user_id="a", session_id="s")
    covered_once(tmp_path, "a")


def test_a_store_that_fails_under_the_worker_pauses_it_and_nothing_is_lost(tmp_path, monkeypatch):
    """A database restart while the worker reads the user's backlog: the worker waits and tries
    again instead of dying, so the turns are processed once the store answers."""
    from retrieval.api import backlog as backlog_module
    from retrieval.memory.errors import StoreFault

    monkeypatch.setattr(backlog_module, "FAULT_WAIT_S", 0.05)
    with open_memory(tmp_path) as mem:
        read, failures = mem.store.backlog, []

        def failing_once(user, after=None, limit=None):
            if not failures:
                failures.append(user)
                raise StoreFault("the database failed (server closed the connection)")
            return read(user, after, limit)

        monkeypatch.setattr(mem.store, "backlog", failing_once)
        mem.add(chat("a", 12), user_id="a", session_id="s")
        mem.drain(user_id="a", timeout_s=WAIT_S)
        assert failures == ["a"] and mem._backlog._thread.is_alive()
        mem.flush(user_id="a", session_id="s")
        assert len(mem.list(user_id="a", limit=50).items) == 12
    covered_once(tmp_path, "a")


def test_an_error_around_a_step_is_the_users_failure_and_the_worker_goes_on(tmp_path, monkeypatch):
    """An error that is no store fault where the worker takes a user (a database's internal error
    taking the user's ingestion lock, say) is the user's failed step: a drain reports it, the
    worker goes on with the other users, and tries the user again after the drain."""
    with open_memory(tmp_path) as mem:
        lock, failures = mem.store.ingestion_lock, []

        def failing_once(user, **options):
            if user == "a" and not failures:
                failures.append(user)
                raise RuntimeError("internal error: could not read block 7")
            return lock(user, **options)

        monkeypatch.setattr(mem.store, "ingestion_lock", failing_once)
        mem.add(chat("a", 12), user_id="a", session_id="s")
        with pytest.raises(IngestFailed, match="could not read block 7"):
            mem.drain(user_id="a", timeout_s=WAIT_S)
        mem.add(chat("b", 4), user_id="b", session_id="s")
        mem.drain(timeout_s=WAIT_S)  # b's turns, and a's tried again
        assert failures == ["a"] and mem.pending() == 0 and mem._backlog._thread.is_alive()
        for user, count in (("a", 12), ("b", 4)):
            mem.flush(user_id=user, session_id="s")
            assert len(mem.list(user_id=user, limit=50).items) == count
    for user in "ab":
        covered_once(tmp_path, user)


def test_a_user_whose_rows_cannot_be_read_fails_alone_and_the_worker_goes_on(tmp_path):
    """An internal error on every read of one user's turns (a damaged page of them, say), the
    worker's count of them after the failure included: the user's drain reports it, the other
    users' turns are processed, and the user's once its rows read again."""
    with open_memory(tmp_path) as mem:
        store, damaged = mem.store, {"a"}

        def failing(read):
            def read_unless_damaged(user, *args, **options):
                if user in damaged:
                    raise RuntimeError("internal error: could not read block 7")
                return read(user, *args, **options)
            return read_unless_damaged

        for name in ("backlog", "uncovered_turns", "uncovered_turn_ids"):
            setattr(store, name, failing(getattr(store, name)))
        mem.add(chat("a", 12), user_id="a", session_id="s")
        with pytest.raises(IngestFailed, match="could not read block 7"):
            mem.drain(user_id="a", timeout_s=WAIT_S)
        mem.add(chat("b", 4), user_id="b", session_id="s")
        mem.drain(user_id="b", timeout_s=WAIT_S)
        assert mem._backlog._thread.is_alive() and mem.pending(user_id="a") == 12
        damaged.clear()
        for user, count in (("a", 12), ("b", 4)):  # a flush tries the backlog itself
            mem.flush(user_id=user, session_id="s")
            assert len(mem.list(user_id=user, limit=50).items) == count
        assert mem.pending() == 0
    for user in "ab":
        covered_once(tmp_path, user)


def test_a_store_that_fails_inside_a_step_is_no_failure_of_the_user_and_the_worker_goes_on(tmp_path,
                                                                                             monkeypatch):
    """A database restart while the worker commits a segment: not the user's failed step (that
    would stop the user's ingestion until a drain or flush); the worker pauses and processes the
    backlog, later adds included, without anyone calling drain or flush."""
    from retrieval.api import backlog as backlog_module
    from retrieval.memory.errors import StoreFault

    monkeypatch.setattr(backlog_module, "FAULT_WAIT_S", 0.05)
    with open_memory(tmp_path) as mem:
        commit, failures = mem.store.commit_stored_turns, []

        def failing_once(record, amus):
            if not failures:
                failures.append(record.user_id)
                raise StoreFault("the database failed (server closed the connection)")
            return commit(record, amus)

        monkeypatch.setattr(mem.store, "commit_stored_turns", failing_once)
        mem.add(chat("a", 40), user_id="a", session_id="s")
        deadline = time.monotonic() + WAIT_S
        while (mem.pending(user_id="a") or not failures) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert failures == ["a"] and mem.pending(user_id="a") == 0
        mem.add(chat("a-later", 4), user_id="a", session_id="s")
        mem.drain(user_id="a", timeout_s=WAIT_S)  # no IngestFailed naming a fault long over
        mem.flush(user_id="a", session_id="s")
        assert len(mem.list(user_id="a", limit=100).items) == 44
    covered_once(tmp_path, "a")


def test_a_store_that_fails_under_a_consolidation_job_pauses_it_and_the_job_completes(tmp_path, monkeypatch):
    """A database restart during a job is not the job's failure: the worker waits and runs it again
    (it resumes, as after a crash), and every worker lives on."""
    from retrieval.api import backlog as backlog_module
    from retrieval.api import jobs as jobs_module
    from retrieval.memory.errors import StoreFault

    monkeypatch.setattr(backlog_module, "FAULT_WAIT_S", 0.05)
    monkeypatch.setattr(jobs_module, "FAULT_WAIT_S", 0.05)
    consolidate, faults = jobs_module.consolidate_user, []

    def failing_once(*args, **options):
        if not faults:
            faults.append(args[1])
            raise StoreFault("the database failed (server closed the connection)")
        return consolidate(*args, **options)

    monkeypatch.setattr(jobs_module, "consolidate_user", failing_once)
    with open_memory(tmp_path) as mem:
        mem.add(chat("a", 30) + chat("a-again", 30), user_id="a", session_id="s")
        mem.flush(user_id="a", session_id="s")
        job = mem.consolidate(user_id="a", wait=True, timeout_s=WAIT_S)
        assert faults == ["a"] and job.state == "done" and job.progress["resumed"] is True
        assert all(thread.is_alive() for thread in mem._jobs._threads)
        assert mem.consolidate(user_id="a", wait=True, timeout_s=WAIT_S).state == "done"


# A memory at {store} (a directory or a PostgreSQL URL) adding 90 turns while its extractor
# hangs in the third segment: the process the kill tests end mid-backlog.
KILLED = """
import sys, time
sys.path.insert(0, {repo!r})
from retrieval import Memory
from retrieval.extract.rules import RuleExtractor
from retrieval.index.model_thread import calling_thread
from tests.multi_route_fixtures import WordEmbedder, WordFingerprinter

class Stuck(RuleExtractor):
    name = "rule"
    calls = 0
    def extract(self, segment, context):
        self.calls += 1
        if self.calls == 3:
            print("held", flush=True)
            time.sleep(600)
        return super().extract(segment, context)

mem = Memory.open({store!r}, embedder=WordEmbedder(), fingerprinter=WordFingerprinter(), extractor=Stuck())
for i in range(90):
    mem.add([{{"speaker": "AB"[i % 2], "text": f"turn {{i}} talks about gardens number {{i % 7}}",
               "turn_id": f"t{{i}}"}}], user_id="u", session_id=f"s{{i // 45}}")
print("added", flush=True)
time.sleep(600)
"""


def test_kill_mid_backlog_resumes_with_every_turn_and_segment_once(tmp_path):
    script = KILLED.format(repo=str(REPO), store=str(tmp_path))
    process = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
    assert process.stdout is not None
    said = ""
    for line in process.stdout:  # the worker's "held" and the main thread's "added" may share a line
        said += line
        if "held" in said and "added" in said:
            break
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    with AMUStore(tmp_path, read_only=True) as reader:
        before = {amu.id: amu.text for amu in reader.amus("u")}
        assert len(reader.turns("u")) == 90 and len(reader.segments("u")) == 2  # the third was held
    with open_memory(tmp_path) as mem:
        assert mem.pending() > 0  # the backlog found at open
        mem.drain(timeout_s=WAIT_S)
        for session in ("s0", "s1"):
            mem.flush(user_id="u", session_id=session)
        after = {item.id: item.text for item in mem.list(user_id="u", limit=100).items}
    assert before.items() <= after.items() and len(after) == 90
    covered_once(tmp_path, "u")


def test_concurrent_searches_of_different_users_equal_sequential_ones(tmp_path):
    users = [f"u{n}" for n in range(4)]
    queries = [f"{user} story {i} gardens" for user in users for i in (1, 4, 7)]
    with open_memory(tmp_path) as mem:
        for user in users:
            mem.add(chat(user, 16), user_id=user, session_id="s")
            mem.flush(user_id=user, session_id="s")
            mem.add(chat(user + "x", 3), user_id=user, session_id="t")  # open segment: raw turns
        sequential = [hit_ids(mem, query, query.split()[0]) for query in queries]
    with open_memory(tmp_path) as mem, ThreadPoolExecutor(8) as pool:
        parallel = list(pool.map(lambda query: hit_ids(mem, query, query.split()[0]), queries * 3))
    assert parallel == sequential * 3


def test_a_held_user_lock_keeps_its_guard_so_the_user_gets_no_second_one():
    guards = UserGuards()
    held = guards.of("u").state  # what a ``with guards.of(user).state`` keeps: the lock alone
    with held:
        gc.collect()
        assert guards.of("u").state is held  # else another thread could search the user beside this one


def test_streams_beyond_the_bound_are_dropped_and_reloaded_cutting_as_if_held(tmp_path, monkeypatch):
    """Five users, each adding to two sessions in turn, under a bound of two held streams: an idle
    user's stream is dropped once two others were fed after it, its next step loads it from the
    store (open exchanges of both sessions fed again), and every user's segments are those of a
    memory that kept every stream."""
    import random

    from retrieval.api import worker_users
    from retrieval.api.online import UserStream

    rng = random.Random(3)
    topics = [["garden", "tomatoes", "soil", "water"], ["marathon", "running", "shoes", "race"],
              ["guitar", "song", "chords", "band"], ["paris", "trip", "museum", "train"]]
    users = [f"u{n}" for n in range(5)]
    ops = []  # (user, session, turns), every user's every round before the next round
    for round_ in range(8):
        for user in users:
            session, topic = f"s{round_ % 2}", rng.choice(topics)
            turns = [{"speaker": ("Ann", "Bob")[i % 2], "turn_id": f"{session}-{round_}-{i}",
                      "text": " ".join(rng.sample(topic, 3))} for i in range(3)]
            ops.append((user, session, turns))
    loads = Counter()
    load = UserStream.load.__func__

    def counted(cls, user, *args, **kwargs):
        loads[user] += 1
        return load(cls, user, *args, **kwargs)

    monkeypatch.setattr(UserStream, "load", classmethod(counted))

    def segments(path, bound):
        monkeypatch.setattr(worker_users, "STREAMS_HELD", bound)
        held = []
        with Memory.open(path, embedder=WordEmbedder(), fingerprinter=WordFingerprinter()) as memory:
            for user, session, turns in ops:
                memory.add(turns, user_id=user, session_id=session)
                memory.drain(user_id=user)
                held.append(memory.cache_gauges()["user_streams"])
            for user in users:
                for session in ("s0", "s1"):
                    memory.flush(user_id=user, session_id=session)
            return held, {user: [(r.session_id, r.turn_ids, r.reason) for r in memory.store.segments(user)]
                          for user in users}

    held_all, kept = segments(tmp_path / "kept", 100)
    assert max(held_all) == 5 and sum(loads.values()) == 5  # one load per user: nothing dropped
    assert all(len(cut) >= 4 for cut in kept.values())
    loads.clear()
    held_two, bounded = segments(tmp_path / "bounded", 2)
    assert max(held_two) == 2
    assert min(loads.values()) >= 7  # each user's stream loaded again at almost every round
    assert bounded == kept


class StreamCountingEmbedder(CountingEmbedder):
    """The counting embedder, which at each of the ingestion worker's calls records how many user
    streams the memory holds, once :attr:`memory` is set and :attr:`go` is."""

    def __init__(self) -> None:
        super().__init__()
        self.memory, self.go, self.held = None, threading.Event(), []

    def encode(self, texts):
        if calling_thread().name == "memory-ingest":
            assert self.go.wait(WAIT_S)
            self.held.append(self.memory.cache_gauges()["user_streams"])
        return super().encode(texts)


def test_users_taken_in_turn_mid_backlog_keep_the_streams_held_within_the_bound(tmp_path, monkeypatch):
    """A user with turns left keeps its stream (it is never dropped mid-backlog), so while the
    streams held are over their bound the worker goes on with the user it has, rather than start
    another user's backlog: two streams held at the bound, at most two more (the user that just
    finished, the most recent, and the one being fed), not one per user waiting."""
    from retrieval.api import worker_users

    monkeypatch.setattr("retrieval.api.backlog.STEP_TURNS", 6)
    monkeypatch.setattr(worker_users, "STREAMS_HELD", 2)
    embedder = StreamCountingEmbedder()
    with Memory.open(tmp_path, embedder=embedder, fingerprinter=WordFingerprinter()) as mem:
        embedder.memory = mem
        for user in range(8):
            mem.add(chat(f"u{user}", 30), user_id=f"u{user}", session_id="s")
        embedder.go.set()
        mem.drain(timeout_s=WAIT_S)
        for user in range(8):
            mem.flush(user_id=f"u{user}", session_id="s")
    assert 3 <= max(embedder.held) <= 4  # over the bound by the finished user and the one fed
    for user in range(8):
        covered_once(tmp_path, f"u{user}")


def test_a_reloaded_stream_that_has_fed_every_open_turn_holds_its_history_not_the_log(tmp_path, monkeypatch):
    """A user with an old turn still waiting for its reply and a long closed session after it: its
    stream, dropped (a bound of one) and loaded again for a step that pushes nothing (a turn that
    waits too), has the history the held stream had, not the closed segments' values kept aside
    with the user's turn log until some later push; a bound of none still keeps the stream fed."""
    from retrieval.api import worker_users

    monkeypatch.setattr(worker_users, "STREAMS_HELD", 1)
    with open_memory(tmp_path) as mem:
        mem.add([{"speaker": "Ann", "text": "an early remark about my garden"}], user_id="b",
                session_id="old")
        mem.add(chat("b", 40), user_id="b", session_id="main")
        mem.flush(user_id="b", session_id="main")
        held = mem._backlog._users["b"].stream
        assert held is not None and len(held.history) > 5
        history = list(held.history)
        mem.add(chat("a", 2), user_id="a", session_id="s")
        mem.drain()
        assert "b" not in mem._backlog._users and mem.cache_gauges()["user_streams"] == 1
        mem.add([{"speaker": "Ann", "text": "a question waiting for its reply"}], user_id="b",
                session_id="new")
        mem.drain()
        reloaded = mem._backlog._users["b"].stream
        assert reloaded is not held and list(reloaded.history) == history
        monkeypatch.setattr(mem._backlog._held, "limit", 0)
        mem.add(chat("a2", 2), user_id="a", session_id="t")
        assert len(mem.flush(user_id="a", session_id="t").amu_ids) == 2


def test_a_drain_returns_after_the_streams_its_step_drops_are_dropped(tmp_path, monkeypatch):
    """The worker told a drain its step was done, then dropped the streams past the bound: a caller
    that drained could still find the dropped user held (a CI run under load did, once). Here the
    drop is slowed so that order would show every time."""
    import time

    from retrieval.api import worker_users
    from retrieval.api.backlog import Backlog

    monkeypatch.setattr(worker_users, "STREAMS_HELD", 1)
    drop = Backlog._drop_stream

    def slow_drop(self, user):
        time.sleep(0.3)
        drop(self, user)

    monkeypatch.setattr(Backlog, "_drop_stream", slow_drop)
    with open_memory(tmp_path) as mem:
        mem.add(chat("b", 4), user_id="b", session_id="main")
        mem.drain()
        mem.add(chat("a", 2), user_id="a", session_id="s")
        mem.drain()
        assert "b" not in mem._backlog._users and mem.cache_gauges()["user_streams"] == 1


def test_a_flush_that_reloads_the_stream_places_itself_after_the_turns_it_fed_not_a_later_add(
        tmp_path, monkeypatch):
    """A flush of a user whose stream was dropped loads it again from the turn log, which an add to
    another session of the user, landing after the step read its backlog, has already grown: the
    flush came after the turns the step fed (b2), not the one added meanwhile (b3), and a stream
    loaded later replays the history the stream that fed them built."""
    from retrieval.api import worker_users
    from retrieval.api.online import UserStream

    monkeypatch.setattr(worker_users, "STREAMS_HELD", 1)
    replay, added = UserStream._replay, []

    def add_during_the_load(stream, segments):
        if not added and stream.user == "u":
            added.append(mem)
            writer = threading.Thread(target=mem.add, args=([turn("b3", "Bob", "cake oven sugar")],),
                                      kwargs={"user_id": "u", "session_id": "s2"})
            writer.start()
            writer.join(10)
        return replay(stream, segments)

    def turn(turn_id, speaker, text):
        return {"turn_id": turn_id, "speaker": speaker, "text": text}

    with open_memory(tmp_path) as mem:
        mem.add([turn("a0", "Ann", "guitar song chords band"), turn("a1", "Bob", "guitar chords song"),
                 turn("a2", "Ann", "guitar band museum")], user_id="u", session_id="s1")
        mem.add([turn("b0", "Ann", "cake oven flour sugar"), turn("b1", "Bob", "cake flour oven"),
                 turn("b2", "Ann", "cake sugar train")], user_id="u", session_id="s2")
        mem.drain(user_id="u")
        mem.add([turn("v0", "Ann", "hello there")], user_id="v", session_id="x")
        mem.drain(user_id="v")
        assert mem._backlog._users.get("u") is None  # u's stream dropped
        monkeypatch.setattr(UserStream, "_replay", add_during_the_load)
        mem.flush(user_id="u", session_id="s1")
        monkeypatch.setattr(UserStream, "_replay", replay)
        assert added and [(r.session_id, r.flushed_after) for r in mem.store.segments("u")] == [("s1", "b2")]
        mem.drain(user_id="u")
        fed = list(mem._backlog._users["u"].stream.history)
    with open_memory(tmp_path) as mem:
        mem.add([turn("b4", "Ann", "cake train")], user_id="u", session_id="s2")
        mem.drain(user_id="u")
        assert list(mem._backlog._users["u"].stream.history)[:len(fed)] == fed


class ScannedStore:
    """A store other nodes write: every read of ``data_version`` finds a new commit, and a scan of
    its users takes ``scan_s`` on the test's clock."""

    def __init__(self, clock: list[float], users: int, scan_s: float) -> None:
        self.clock, self.users, self.scan_s = clock, [f"u{n}" for n in range(users)], scan_s
        self.commits, self.scans, self.fail, self.connecting_s = 0, 0, False, 0.0

    def data_version(self) -> int:
        self.clock[0] += self.connecting_s  # a wait for a connection (a database restarting)
        self.commits += 1
        return self.commits

    def backlog_users(self) -> list[str]:
        self.scans += 1
        self.clock[0] += self.scan_s
        return self.users

    def user_versions(self, users: list[str]) -> dict[str, tuple[int, ...]]:
        if self.fail:
            raise StoreError("the database restarted")
        return {user: (self.scans,) for user in users}


def test_an_idle_workers_scans_of_other_nodes_users_are_spaced_by_their_length(monkeypatch):
    """Scanning every user with turns to process takes seconds over a store of many users: the
    next scan waits SCAN_SPACING times the last one's length, whatever commits meanwhile, while
    the users found busy are looked at again at every poll."""
    from retrieval.api import worker_users

    clock = [100.0]
    monkeypatch.setattr(worker_users.time, "monotonic", lambda: clock[0])
    store, polls = ScannedStore(clock, users=3, scan_s=2.0), worker_users.Polls()
    assert polls.changed(store, {})[0] == {"u0", "u1", "u2"} and store.scans == 1  # ends at 102
    polls.busy("u1")
    clock[0] = 103.0  # a poll a second after the scan, something committed since
    assert polls.changed(store, {})[0] == set() and store.scans == 1
    assert polls.taken() == {"u1"}
    clock[0] = 102.0 + worker_users.SCAN_SPACING * 2.0
    seen = {user: (1,) for user in store.users}
    assert polls.changed(store, seen)[0] == {"u0", "u1", "u2"} and store.scans == 2  # their rows changed
    clock[0] += worker_users.SCAN_SPACING * 2.0
    assert polls.changed(store, {user: (3,) for user in store.users})[0] == set() and store.scans == 3
    store.fail = True
    clock[0] += worker_users.SCAN_SPACING * 2.0 + 2.0
    with pytest.raises(StoreError):
        polls.changed(store, {})
    store.fail, store.commits = False, store.commits - 1  # nothing committed since: still scanned
    store.connecting_s = 60.0  # the poll's first read waits a minute: not part of the scan's length
    assert polls.changed(store, {})[0] == {"u0", "u1", "u2"} and store.scans == 5
    store.connecting_s, clock[0] = 0.0, clock[0] + worker_users.SCAN_SPACING * 2.0
    assert polls.changed(store, {})[0] == {"u0", "u1", "u2"} and store.scans == 6
