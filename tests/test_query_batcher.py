"""The query batcher: calls queued while a forward runs share the next one and get what a call
alone gets; calls it may not join run alone; errors reach their caller; close leaves no thread.
A fake encoder whose first forward waits for the test makes the overlap certain (order, not timing)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from isq.fingerprint import Fingerprint
from retrieval.index.joint import Encoded
from retrieval.index.query_batcher import QueryBatcher


class HeldEncoder:
    """Vectors and codes from the characters; the first ``compute`` waits for :attr:`release`."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls: list[list[str]] = []

    def batch_key(self, texts):
        return max(len(text) for text in texts)

    def compute(self, texts):
        self.calls.append(list(texts))
        if len(self.calls) == 1:
            assert self.release.wait(30)
        if "boom" in texts:
            raise ValueError("boom")
        vectors = np.array([[len(t), sum(map(ord, t))] for t in texts], dtype=np.float32)
        return Encoded(vectors, [Fingerprint.from_token_codes(np.array([ord(c) for c in t])) for t in texts])


def until(condition) -> None:
    for _ in range(3000):  # bounded: 30 s at most
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError("the condition never held")


def concurrent(batcher: QueryBatcher, encoder: HeldEncoder, requests: list[list[str]]) -> list:
    """Run the first request, then the others while it is held; release once all are queued."""
    results: list = [None] * len(requests)

    def call(i: int) -> None:
        try:
            results[i] = batcher.run(requests[i])
        except ValueError as err:
            results[i] = err

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(requests))]
    threads[0].start()
    until(lambda: len(encoder.calls) == 1)
    for thread in threads[1:]:
        thread.start()
    until(lambda: batcher.waiting == len(requests) - 1)
    encoder.release.set()
    for thread in threads:
        thread.join(30)
    return results


def test_calls_queued_during_a_forward_share_the_next_and_get_what_they_would_alone():
    encoder = HeldEncoder()
    batcher = QueryBatcher(encoder, max_texts=64)
    requests = [[f"query {i}"] for i in range(8)] + [["pair 8a", "pair 8b"]]
    results = concurrent(batcher, encoder, requests)
    batcher.close()
    assert batcher.forwards == 2 < len(requests)
    assert sorted(encoder.calls[1]) == sorted(t for r in requests[1:] for t in r)
    for request, result in zip(requests, results, strict=True):
        alone = HeldEncoder()
        alone.release.set()
        expected = alone.compute(request)
        assert np.array_equal(result.vectors, expected.vectors) and result.prints == expected.prints


def test_calls_of_other_keys_or_beyond_the_batch_run_alone_and_an_error_reaches_its_caller():
    encoder = HeldEncoder()
    batcher = QueryBatcher(encoder, max_texts=3)
    requests = [["first"], ["aa"], ["bb"], ["ccc"], ["boom"], ["dd"], ["ee"], ["ff"], ["gg"]]
    results = concurrent(batcher, encoder, requests)
    batcher.close()
    assert len(encoder.calls) == batcher.forwards < len(requests)
    assert all(len(call) <= 3 and len({len(t) for t in call}) == 1 for call in encoder.calls)
    assert isinstance(results[4], ValueError)
    assert all(not isinstance(result, ValueError) for i, result in enumerate(results) if i != 4)
    codes = [list(result.prints[0].token_codes) for result in results[5:]]
    assert codes == [[ord(c) for c in request[0]] for request in requests[5:]]


def test_close_serves_what_is_queued_then_leaves_no_thread_and_refuses_calls():
    encoder = HeldEncoder()
    encoder.release.set()
    batcher = QueryBatcher(encoder, max_texts=8)
    assert batcher.run(["one"]).prints[0].token_codes == tuple(map(ord, "one"))
    batcher.close()
    assert not any(thread.name == "query-batcher" for thread in threading.enumerate())
    with pytest.raises(RuntimeError, match="closed"):
        batcher.run(["two"])
