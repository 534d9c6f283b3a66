"""The model queue: foreground calls queued while a forward runs share the next one, whatever
their lengths, and each gets its own rows, except a kept call (stored results), which runs alone;
foreground calls go ahead of queued background work, which runs in forwards of a bounded size, one
forward per background call in turn, and still gets one forward after four foreground rounds in a
row; a call finding the model idle skips
the worker; every forward runs on the model thread; errors reach their caller only; close leaves no
thread. Fake encoders whose forwards wait for the test make the overlaps certain (order, not
timing)."""

from __future__ import annotations

import contextlib
import threading
import time

import numpy as np
import pytest

from isq.codes import Fingerprint
from retrieval.index.joint import Encoded
from retrieval.index.model_thread import on_model_thread
from retrieval.index.query_batcher import QueryBatcher, background, kept, queue_clock


class HeldEncoder:
    """Vectors and codes from the characters (one token per character); the first ``compute``
    waits for :attr:`release`."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls: list[list[str]] = []
        self.threads: set[str] = set()

    def token_counts(self, texts):
        return [len(text) for text in texts]

    def compute(self, texts):
        self.calls.append(list(texts))
        self.threads.add(threading.current_thread().name)
        if len(self.calls) == 1:
            assert self.release.wait(30)
        if "boom" in texts:
            raise ValueError("boom")
        vectors = np.array([[len(t), sum(map(ord, t))] for t in texts], dtype=np.float32).reshape(-1, 2)
        return Encoded(vectors, [Fingerprint.from_token_codes(np.array([ord(c) for c in t])) for t in texts])


def alone(texts: list[str]) -> Encoded:
    encoder = HeldEncoder()
    encoder.release.set()
    return encoder.compute(texts)


def same(result: Encoded, expected: Encoded) -> bool:
    return np.array_equal(result.vectors, expected.vectors) and result.prints == expected.prints


def until(condition) -> None:
    for _ in range(3000):  # bounded: 30 s at most
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError("the condition never held")


def call(batcher: QueryBatcher, texts: list[str], results: dict, key: object, behind: bool = False,
         mark=contextlib.nullcontext):
    """A thread calling ``batcher.run(texts)`` inside ``mark()`` (:func:`background` when
    ``behind``); its result or error lands in ``results[key]``."""
    def run() -> None:
        try:
            with background() if behind else mark():
                results[key] = batcher.run(texts)
        except ValueError as err:
            results[key] = err

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def concurrent(batcher: QueryBatcher, encoder: HeldEncoder, requests: list[list[str]],
               marks: dict | None = None) -> list:
    """Run the first request, then the others while it is held (request i inside ``marks[i]()``
    where given); release once all are queued."""
    results: dict = {}
    marks = marks or {}
    threads = [call(batcher, requests[0], results, 0)]
    until(lambda: len(encoder.calls) == 1)
    for i, request in enumerate(requests[1:], start=1):
        threads.append(call(batcher, request, results, i, mark=marks.get(i, contextlib.nullcontext)))
        until(lambda i=i: batcher.waiting == i)  # queued in this order
    encoder.release.set()
    for thread in threads:
        thread.join(30)
    return [results[i] for i in range(len(requests))]


def test_calls_queued_during_a_forward_share_the_next_whatever_their_lengths():
    encoder = HeldEncoder()
    batcher = QueryBatcher(encoder, max_texts=64)
    requests = [["first"]] + [["q" * (i + 1)] for i in range(8)] + [["pair 9a", "a longer pair 9b"]]
    results = concurrent(batcher, encoder, requests)
    batcher.close()
    assert batcher.forwards == 2 < len(requests)
    assert encoder.calls[1] == [t for r in requests[1:] for t in r]  # in arrival order, one forward
    for request, result in zip(requests, results, strict=True):
        assert same(result, alone(request))


def test_a_kept_call_shares_no_forward_so_what_is_stored_holds_no_other_callers_text():
    """A kept call's results are stored (a search embedding its user's waiting turns): queued among
    other users' queries, it runs in a forward of its own texts, and the queries around it still
    share theirs."""
    encoder = HeldEncoder()
    batcher = QueryBatcher(encoder, max_texts=64)
    requests = [["first"], ["a query"], ["the user's turn", "and another"], ["a much longer query"],
                ["q"]]
    results = concurrent(batcher, encoder, requests, marks={2: kept})
    batcher.close()
    assert encoder.calls[1:] == [["a query"], ["the user's turn", "and another"],
                                 ["a much longer query", "q"]]
    for request, result in zip(requests, results, strict=True):
        assert same(result, alone(request))


def test_beyond_the_batch_a_new_forward_starts_and_an_error_reaches_its_caller_only():
    encoder = HeldEncoder()
    batcher = QueryBatcher(encoder, max_texts=3)
    requests = [["first"], ["aa"], ["bbb"], ["c"], ["boom"], ["dd"], ["e", "f", "g", "h"], ["ii"]]
    results = concurrent(batcher, encoder, requests)
    batcher.close()
    # aa bbb c | boom dd (fails) | boom alone | dd alone | e f g h (over the batch: alone) | ii
    assert encoder.calls[1:] == [["aa", "bbb", "c"], ["boom", "dd"], ["boom"], ["dd"], ["e", "f", "g", "h"],
                                 ["ii"]]
    assert isinstance(results[4], ValueError)
    for i, (request, result) in enumerate(zip(requests, results, strict=True)):
        if i != 4:
            assert same(result, alone(request))


def test_a_foreground_call_goes_ahead_of_queued_background_work_which_runs_in_small_forwards():
    encoder = HeldEncoder()
    batcher = QueryBatcher(encoder, max_texts=64, background_tokens=12)
    backlog = ["a" * n for n in (5, 1, 3, 6, 2, 4, 3)]
    results: dict = {}
    threads = [call(batcher, ["held"], results, "held", behind=True)]
    until(lambda: len(encoder.calls) == 1)  # a background forward runs (held)
    threads.append(call(batcher, backlog, results, "backlog", behind=True))
    until(lambda: batcher.waiting == 1)
    threads.append(call(batcher, ["the query"], results, "query"))
    until(lambda: batcher.waiting == 2)
    encoder.release.set()
    for thread in threads:
        thread.join(30)
    batcher.close()
    assert encoder.calls[1] == ["the query"]  # queued last, served first
    chunks = encoder.calls[2:]
    # the backlog in token-length order, each forward at most 12 padded tokens
    assert chunks == [["a", "aa", "aaa", "aaa"], ["aaaa", "aaaaa"], ["aaaaaa"]]
    assert all(len(chunk) * max(map(len, chunk)) <= 12 for chunk in chunks)
    assert same(results["backlog"], alone(backlog))  # in the caller's order
    assert same(results["query"], alone(["the query"]))
    assert encoder.threads == {"model-forwards"}


@pytest.mark.parametrize("long_call", ["background", "kept"])
def test_a_foreground_call_arriving_between_the_forwards_of_a_long_call_runs_before_the_next(long_call):
    """Background work runs in forwards of a bounded size, and so does a kept call of as many texts
    (a search embedding many waiting turns of its user: an add, then a search): a query queued
    during one of its forwards waits for that one, not for all of them. Each result is its own
    texts' alone."""
    encoder = HeldEncoder()
    batcher = QueryBatcher(encoder, max_texts=64, background_tokens=4)
    results: dict = {}
    texts = ["aa", "bb", "cc", "dd", "ee", "ff"]
    threads = [call(batcher, texts, results, "long", behind=long_call == "background",
                    mark=kept if long_call == "kept" else contextlib.nullcontext)]
    until(lambda: len(encoder.calls) == 1)  # the first of three forwards, held
    threads.append(call(batcher, ["query"], results, "query"))
    until(lambda: batcher.waiting == 1)
    encoder.release.set()
    for thread in threads:
        thread.join(30)
    batcher.close()
    assert encoder.calls == [["aa", "bb"], ["query"], ["cc", "dd"], ["ee", "ff"]]
    assert same(results["long"], alone(texts)) and same(results["query"], alone(["query"]))


def test_background_calls_take_one_forward_each_in_turn():
    """One user's long backlog holds another's flush up by one forward, not by the whole
    backlog (else the flush's time would tell how much the other user had just stored)."""
    encoder = HeldEncoder()
    batcher = QueryBatcher(encoder, max_texts=64, background_tokens=4)
    backlog = ["aa", "ab", "ac", "ad", "ae", "af"]  # three forwards of two texts
    results: dict = {}
    threads = [call(batcher, ["held"], results, "held", behind=True)]
    until(lambda: len(encoder.calls) == 1)
    threads.append(call(batcher, backlog, results, "backlog", behind=True))
    until(lambda: batcher.waiting == 1)
    threads.append(call(batcher, ["bo"], results, "flush", behind=True))
    until(lambda: batcher.waiting == 2)
    encoder.release.set()
    for thread in threads:
        thread.join(30)
    batcher.close()
    assert encoder.calls == [["held"], ["aa", "ab"], ["bo"], ["ac", "ad"], ["ae", "af"]]
    assert same(results["backlog"], alone(backlog)) and same(results["flush"], alone(["bo"]))


class SteppedEncoder(HeldEncoder):
    """Every ``compute`` waits for one :meth:`step` (until :attr:`free` is set)."""

    def __init__(self) -> None:
        super().__init__()
        self.steps, self.free = threading.Semaphore(0), threading.Event()
        self.release.set()

    def compute(self, texts):
        self.calls.append(list(texts))
        assert self.free.is_set() or self.steps.acquire(timeout=30)
        return alone(texts)

    def step(self) -> None:
        self.steps.release()


def test_background_work_gets_one_forward_after_four_foreground_rounds_in_a_row():
    encoder = SteppedEncoder()
    batcher = QueryBatcher(encoder, max_texts=64, background_tokens=2)
    results: dict = {}
    threads = [call(batcher, ["q0"], results, 0)]
    until(lambda: len(encoder.calls) == 1)
    threads.append(call(batcher, ["aa", "bb", "cc"], results, "backlog", behind=True))
    until(lambda: batcher.waiting == 1)
    for i in range(1, 7):  # a foreground call is always queued when a forward ends
        threads.append(call(batcher, [f"q{i}"], results, i))
        until(lambda: batcher.waiting == 2)
        encoder.step()
        until(lambda i=i: len(encoder.calls) == i + 1)
    encoder.free.set()
    encoder.step()
    for thread in threads:
        thread.join(30)
    batcher.close()
    assert encoder.calls == [["q0"], ["q1"], ["q2"], ["q3"], ["q4"], ["aa"], ["q5", "q6"], ["bb"], ["cc"]]
    assert same(results["backlog"], alone(["aa", "bb", "cc"]))


def test_background_texts_that_fit_one_forward_are_computed_as_given():
    encoder = HeldEncoder()
    encoder.release.set()
    batcher = QueryBatcher(encoder, max_texts=64, background_tokens=100)
    with background():
        result = batcher.run(["ccc", "a", "bb"])
    batcher.close()
    assert encoder.calls == [["ccc", "a", "bb"]] and same(result, alone(["ccc", "a", "bb"]))


def test_close_serves_what_is_queued_then_leaves_no_thread_and_refuses_calls():
    encoder = HeldEncoder()
    encoder.release.set()
    batcher = QueryBatcher(encoder, max_texts=8)
    assert batcher.run(["one"]).prints[0].token_codes == tuple(map(ord, "one"))
    batcher.close()
    assert not any(thread.name == "query-batcher" for thread in threading.enumerate())
    with pytest.raises(RuntimeError, match="closed"):
        batcher.run(["two"])


def test_close_waits_for_a_callers_own_forward():
    encoder, results, closed = HeldEncoder(), {}, threading.Event()
    batcher = QueryBatcher(encoder, max_texts=8)
    caller = call(batcher, ["held"], results, 0)  # the model is idle: the forward runs on the caller
    until(lambda: len(encoder.calls) == 1)
    closer = threading.Thread(target=lambda: (batcher.close(), closed.set()))
    closer.start()
    until(lambda: batcher._closed)
    closer.join(0.5)  # a close that did not wait would be over by now
    assert closer.is_alive() and not closed.is_set() and 0 not in results  # the forward is held
    encoder.release.set()
    caller.join(30)
    closer.join(30)
    assert closed.is_set() and same(results[0], alone(["held"]))


def test_a_call_finding_the_model_idle_skips_the_worker_and_calls_meanwhile_queue():
    class Threads(HeldEncoder):
        """Records the thread of each forward and whether the batcher's worker had started."""

        def compute(self, texts):
            seen = (threading.current_thread().name, batcher._thread is None)
            self.seen = [*getattr(self, "seen", []), seen]
            return super().compute(texts)

    encoder = Threads()
    batcher = QueryBatcher(encoder, max_texts=64)
    results = concurrent(batcher, encoder, [["first"], ["second"], ["third"]])
    batcher.close()
    assert encoder.calls == [["first"], ["second", "third"]]
    assert encoder.seen == [("model-forwards", True), ("model-forwards", False)]  # every forward there
    for request, result in zip([["first"], ["second"], ["third"]], results, strict=True):
        assert same(result, alone(request))


def test_a_call_made_on_the_model_thread_runs_there_at_once_while_the_worker_is_busy():
    """A serialized joint half calls the batcher from the model thread: queued for the worker, whose
    forward waits for the model thread, it would never return."""
    encoder = HeldEncoder()
    batcher = QueryBatcher(encoder, max_texts=64)
    results: dict = {}
    threads = [call(batcher, ["first"], results, 0)]  # alone, held on the model thread
    until(lambda: len(encoder.calls) == 1)
    threads.append(call(batcher, ["second"], results, 1))  # queued for the worker
    until(lambda: batcher.waiting == 1)
    inner = threading.Thread(target=lambda: results.update(inner=on_model_thread(
        lambda: batcher.run(["inner"]))), daemon=True)  # queued on the model thread behind "first"
    inner.start()
    encoder.release.set()
    for thread in [*threads, inner]:
        thread.join(10)
    assert not inner.is_alive(), "the model thread's own call waited for the worker"
    batcher.close()
    assert same(results["inner"], alone(["inner"])) and same(results[1], alone(["second"]))


def test_the_queue_clock_counts_a_calls_wait_behind_a_forward_not_its_own_forward():
    """The first call finds the model idle: it waits about nothing, however long its forward is
    held. The second queues behind that forward: its wait is at least the time it was held after
    queueing, and ends where its own forward starts (not where it ends: that forward sleeps)."""
    class Timed(HeldEncoder):
        def __init__(self) -> None:
            super().__init__()
            self.starts: list[float] = []

        def compute(self, texts):
            self.starts.append(time.perf_counter())
            if len(self.calls) == 1:  # the second forward, of the queued call
                time.sleep(0.1)
            return super().compute(texts)

    encoder = Timed()
    batcher = QueryBatcher(encoder, max_texts=64)
    waits: dict[str, list[float]] = {}
    called: dict[str, float] = {}

    def clocked(name: str, texts: list[str]) -> threading.Thread:
        def run() -> None:
            with queue_clock() as clock:
                called[name] = time.perf_counter()
                batcher.run(texts)
            waits[name] = clock

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    first = clocked("first", ["held"])
    until(lambda: len(encoder.calls) == 1)
    second = clocked("second", ["queued"])
    until(lambda: batcher.waiting == 1)
    time.sleep(0.05)  # a lower bound on the second call's wait, not a measure of anything
    encoder.release.set()
    first.join(30)
    second.join(30)
    batcher.close()
    assert len(waits["first"]) == 1 and waits["first"][0] <= encoder.starts[0] - called["first"]
    assert len(waits["second"]) == 1
    assert 0.05 <= waits["second"][0] <= encoder.starts[1] - called["second"]
    with queue_clock() as outside:
        pass
    assert outside == []  # only calls made inside are counted


def test_the_queue_clock_counts_a_wait_for_the_model_thread_busy_with_other_work():
    """A call that finds the batcher idle still waits while the model thread runs something else
    (a reranker's forward, another model's call): that is waiting for the model too."""
    encoder = HeldEncoder()
    encoder.release.set()
    batcher = QueryBatcher(encoder, max_texts=64)
    busy, free = threading.Event(), threading.Event()

    def other_work() -> None:
        busy.set()
        assert free.wait(30)

    holder = threading.Thread(target=lambda: on_model_thread(other_work))
    holder.start()
    assert busy.wait(30)
    waits: list[float] = []

    def run() -> None:
        with queue_clock() as clock:
            batcher.run(["x"])
        waits.extend(clock)

    caller = threading.Thread(target=run)
    caller.start()
    time.sleep(0.05)  # a lower bound on the wait, as above
    free.set()
    holder.join(30)
    caller.join(30)
    batcher.close()
    assert len(waits) == 1 and waits[0] >= 0.05
