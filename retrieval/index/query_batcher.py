"""Concurrent encoder calls batched into shared forwards by one worker thread.

A caller's ``run(texts)`` queues a request and waits; the worker takes every request queued
while its previous forward ran and serves them in arrival order, joining consecutive requests
whose ``batch_key`` is equal (and not None) into one ``compute`` call of at most
``max_texts`` texts. The encoder's key says when a joined call gives each request exactly what
it alone would (:meth:`retrieval.index.joint.JointEncoder.batch_key`: texts padded to the same
length), so results do not depend on what else was queued. Bounded: a caller waits for its own
request, so at most one request per calling thread is queued. :meth:`close` serves what is
queued, then stops the thread (started by the first call); a call after it is refused.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


class BatchableEncoder(Protocol):
    def compute(self, texts: Sequence[str]) -> Any: ...  # a result with .part(start, stop)

    def batch_key(self, texts: Sequence[str]) -> Hashable | None: ...


@dataclass
class _Request:
    texts: list[str]
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


class QueryBatcher:
    """See the module docstring. ``forwards`` counts ``compute`` calls."""

    def __init__(self, encoder: BatchableEncoder, max_texts: int) -> None:
        self.encoder, self.max_texts = encoder, max_texts
        self.forwards = 0
        self._queue: list[_Request] = []
        self._closed = False
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None  # started by the first call

    @property
    def waiting(self) -> int:
        """Requests queued and not yet taken by the worker."""
        with self._changed:
            return len(self._queue)

    def run(self, texts: Sequence[str]) -> Any:
        """The encoder's ``compute(texts)``, possibly inside a forward shared with other callers."""
        request = _Request(list(texts))
        with self._changed:
            if self._closed:
                raise RuntimeError("the query batcher is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="query-batcher", daemon=True)
                self._thread.start()
            self._queue.append(request)
            self._changed.notify()
        request.done.wait()
        if request.error is not None:
            raise request.error
        return request.result

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _work(self) -> None:
        while True:
            with self._changed:
                while not self._queue and not self._closed:
                    self._changed.wait()
                if not self._queue:
                    return
                taken, self._queue = self._queue, []
            for group in self._groups(taken):
                self._serve(group)

    def _groups(self, requests: list[_Request]) -> list[list[_Request]]:
        """Consecutive requests of one key, up to ``max_texts`` texts each; a request whose key
        is None (or cannot be computed) alone."""
        groups: list[list[_Request]] = []
        last: Hashable | None = None
        for request in requests:
            try:
                key = self.encoder.batch_key(request.texts)
            except Exception:  # noqa: BLE001 - compute raises it again, to that caller alone
                key = None
            size = sum(len(r.texts) for r in groups[-1]) if groups else 0
            if key is not None and key == last and size + len(request.texts) <= self.max_texts:
                groups[-1].append(request)
            else:
                groups.append([request])
            last = key
        return groups

    def _serve(self, group: list[_Request]) -> None:
        texts = [text for request in group for text in request.texts]
        try:
            self.forwards += 1
            result = self.encoder.compute(texts)
        except BaseException as err:  # noqa: BLE001 - handed to every waiting caller
            for request in group:
                request.error = err
                request.done.set()
            return
        start = 0
        for request in group:
            request.result = result.part(start, start + len(request.texts))
            start += len(request.texts)
            request.done.set()
