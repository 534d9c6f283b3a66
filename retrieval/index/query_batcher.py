"""The model queue: one worker thread decides the forwards of the joint encoder, foreground
calls before background ones; every forward runs on the process's model thread
(:mod:`retrieval.index.model_thread`), which the worker hands it to.

Foreground and background. A call is foreground (a search's query texts: someone is waiting for
it) unless its thread is inside :func:`background` (the ingestion worker's steps, a flush's
processing, consolidation jobs). Inside :func:`kept` a call is foreground but shares no forward:
its results are stored (a search embedding its user's turns the worker has not embedded yet), so
they must come from forwards of the caller's texts only, never padded beside another user's query;
one of more texts than a background forward takes runs as such forwards, each queued afresh, so
the queries queued meanwhile go between them (else another user's query waited for the whole of
one user's add-then-search: up to 10.7 s measured).
Before each forward the worker looks at the queue again: while a foreground call is queued no
background forward starts, except one after every :data:`FOREGROUND_ROUNDS` foreground rounds in a
row (so ingestion still moves under a steady stream of searches). A
background call runs as forwards of at most :data:`BACKGROUND_TOKENS` padded tokens each (its
texts in token-length order, so a forward pads little), so a foreground call queued behind
background work waits for one such forward at most. Background calls take one forward each in
turn (round robin), so one caller's long call (a user's ingestion backlog) holds up another's (a
flush, a consolidation job) by one forward per call queued, not by the whole of it.

Joining. The foreground calls queued while a forward runs share the next forward (up to
``max_texts`` texts in all, in arrival order; a call of more texts, or a kept call, runs alone),
padded to their longest text. A call that runs alone gets exactly what ``encoder.compute`` gives
it. A call that shares a forward with calls of other lengths gets floats that differ from its own forward's in
the last bits (a text's floats depend on the length it is padded to; the bound and the codes are
tested in ``tests/test_query_batcher.py``), the price of one forward instead of several.

Alone. A foreground call that finds the queue empty and no forward running hands its forward to
the model thread itself, without the hand-off to the worker and back (two thread wake-ups more,
which on a busy machine wait for the scheduler); calls arriving meanwhile queue for the worker as
they would behind any forward. Its result is the same either way: ``encoder.compute`` of its
texts alone.

Waiting. A caller may ask how long its calls waited before their forwards started on the model
thread (:func:`queue_clock`): the model's queue, behind other callers' forwards, background work
and whatever else the model thread runs, as distinct from the forwards themselves. A call made on
the model thread itself waited 0.

Bounded: a caller waits for its own call, so at most one call per calling thread is queued.
:meth:`close` serves what is queued, then stops the thread (started by the first call); a call
after it is refused.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from retrieval.index.joint import Encoded
from retrieval.index.model_thread import is_model_thread, on_model_thread

BACKGROUND_TOKENS = 256
"""The most padded tokens (texts x the longest text's tokens) of one background forward."""
FOREGROUND_ROUNDS = 4
"""Foreground rounds in a row after which waiting background work gets one forward."""
CLOSED = "the query batcher is closed"


class BatchableEncoder(Protocol):
    def compute(self, texts: Sequence[str]) -> Encoded: ...

    def token_counts(self, texts: Sequence[str]) -> list[int]: ...


class _Marks(threading.local):
    background = False
    kept = False
    waits: list[float] | None = None  # the open queue clock's, see queue_clock


_MARKS = _Marks()


@contextmanager
def background() -> Iterator[None]:
    """The calls this thread makes inside are background calls."""
    with _marked(background=True, kept=False):
        yield


@contextmanager
def kept() -> Iterator[None]:
    """The calls this thread makes inside are foreground calls whose results are stored: each
    runs in forwards of its own texts only (see the module docstring)."""
    with _marked(background=False, kept=True):
        yield


@contextmanager
def queue_clock() -> Iterator[list[float]]:
    """A list that gathers, for each call this thread makes inside to any batcher, the seconds
    from the call to the start of its first forward on the model thread: its wait behind other
    forwards, background work and whatever else the model thread runs (about 0 for a call that
    found the model idle). A clock opened inside another gathers its calls for itself alone."""
    previous = _MARKS.waits
    waits: list[float] = []
    _MARKS.waits = waits
    try:
        yield waits
    finally:
        _MARKS.waits = previous


def _waited(seconds: float) -> None:
    if _MARKS.waits is not None:
        _MARKS.waits.append(seconds)


@contextmanager
def _marked(*, background: bool, kept: bool) -> Iterator[None]:
    previous = _MARKS.background, _MARKS.kept
    _MARKS.background, _MARKS.kept = background, kept
    try:
        yield
    finally:
        _MARKS.background, _MARKS.kept = previous


@dataclass
class _Request:
    texts: list[str]
    kept: bool = False  # shares no forward with other calls
    chunks: deque[list[int]] | None = None  # background: positions per forward left, once started
    parts: list[tuple[list[int], Encoded]] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    result: Encoded | None = None
    error: BaseException | None = None
    queued_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None  # its first forward's start

    def start(self) -> None:
        if self.started_at is None:
            self.started_at = time.perf_counter()

    def waited(self) -> float:
        """Seconds from queueing to the first forward's start on the model thread; for a call that
        failed before any forward, to now."""
        return (self.started_at or time.perf_counter()) - self.queued_at

    def finish(self, result: Encoded | None, error: BaseException | None) -> None:
        self.result, self.error = result, error
        self.done.set()


class QueryBatcher:
    """See the module docstring. ``forwards`` counts ``compute`` calls."""

    def __init__(self, encoder: BatchableEncoder, max_texts: int,
                 background_tokens: int = BACKGROUND_TOKENS) -> None:
        self.encoder, self.max_texts, self.background_tokens = encoder, max_texts, background_tokens
        self.forwards = 0
        self._foreground: list[_Request] = []
        self._background: deque[_Request] = deque()
        self._closed = False
        self._running = False  # a forward runs (the worker's or a caller's own)
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None  # started by the first call

    @property
    def waiting(self) -> int:
        """Calls queued whose first forward has not started."""
        with self._changed:
            return len(self._foreground) + sum(request.chunks is None for request in self._background)

    def run(self, texts: Sequence[str]) -> Encoded:
        """The encoder's ``compute(texts)``: in a forward shared with other foreground callers, or
        (a background call) in forwards of its own, after every foreground call queued."""
        if is_model_thread():
            _waited(0.0)
            return self._run_inline(list(texts))
        if _MARKS.kept and len(texts) > 1 and len(chunks := self._chunks(texts)) > 1:  # each queued anew
            return _assembled([(part, self.run([texts[i] for i in part])) for part in chunks], len(texts))
        request = _Request(list(texts), kept=_MARKS.kept)
        with self._changed:
            if self._closed:
                raise RuntimeError(CLOSED)
            alone = not (_MARKS.background or self._running or self._foreground or self._background)
            if alone:
                self._running = True
            else:
                self._queue(request)
        if alone:
            try:
                return self._run_alone(request)
            finally:
                _waited(request.waited())
        request.done.wait()
        _waited(request.waited())
        if request.error is not None:
            raise request.error
        assert request.result is not None
        return request.result

    def _run_inline(self, texts: list[str]) -> Encoded:
        """A call made on the model thread itself (a serialized joint half's, say): queued, it would
        wait for the worker, whose forward waits for the model thread. It runs at once: no other
        forward runs while the model thread runs this call."""
        if self._closed:
            raise RuntimeError(CLOSED)
        return self._forward(texts)

    def _forward(self, texts: list[str], starting: Sequence[_Request] = ()) -> Encoded:
        """One forward of ``texts``, on the model thread (at once when called there); the
        ``starting`` requests' forwards start when the model thread takes it up (it may be busy
        with other work: a reranker, another model's call)."""
        self.forwards += 1

        def compute() -> Encoded:
            for request in starting:
                request.start()
            return self.encoder.compute(texts)

        return on_model_thread(compute)

    def _queue(self, request: _Request) -> None:
        """Queue ``request`` for the worker (started by the first call queued); under the lock."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="query-batcher", daemon=True)
            self._thread.start()
        if _MARKS.background:
            self._background.append(request)
        else:
            self._foreground.append(request)
        self._changed.notify()

    def _run_alone(self, request: _Request) -> Encoded:
        """The forward of a foreground call that found the model idle, handed straight to the
        model thread; then the worker may serve what queued meanwhile."""
        try:
            return self._forward(request.texts, [request])
        finally:
            with self._changed:
                self._running = False
                self._changed.notify_all()  # the worker, and a close waiting for this forward

    def close(self) -> None:
        """Refuse new calls; return once the forward running (the worker's or a caller's own) and
        the calls queued are done and the worker has stopped."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
            thread = self._thread
            if thread is None:  # no worker to join: wait for a caller's own forward here
                while self._running:
                    self._changed.wait()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _work(self) -> None:
        rounds = 0  # foreground rounds served in a row while background work waited
        while True:
            with self._changed:
                while self._running or not (self._foreground or self._background):
                    if self._closed and not self._running:
                        return
                    self._changed.wait()
                self._running = True
                starved = bool(self._background) and rounds >= FOREGROUND_ROUNDS
                taken, self._foreground = ([], self._foreground) if starved else (self._foreground, [])
                behind = None if taken else self._background[0]
                rounds = rounds + 1 if taken and self._background else 0
            finished = False
            if behind is None:
                for group in self._groups(taken):
                    self._serve(group)
            else:
                finished = self._forward_of(behind)
            with self._changed:
                if finished:
                    self._background.popleft()
                elif behind is not None and len(self._background) > 1:
                    self._background.rotate(-1)  # one forward per background call in turn
                self._running = False

    def _groups(self, requests: list[_Request]) -> list[list[_Request]]:
        """Consecutive requests of up to ``max_texts`` texts in all; a kept request, or one of none
        or of more than ``max_texts`` texts, alone."""
        groups: list[list[_Request]] = []
        size = 0
        for request in requests:
            joinable = 0 < len(request.texts) <= self.max_texts and not request.kept
            if joinable and groups and 0 < size and size + len(request.texts) <= self.max_texts:
                groups[-1].append(request)
                size += len(request.texts)
            else:
                groups.append([request])
                size = len(request.texts) if joinable else 0
        return groups

    def _serve(self, group: list[_Request]) -> None:
        """One forward for the group; when it fails, each call again alone, so an error reaches
        only the caller whose texts raise it."""
        texts = [text for request in group for text in request.texts]
        try:
            result = self._forward(texts, group)
        except BaseException as err:  # noqa: BLE001 - handed to the caller(s) that raise it
            if len(group) == 1:
                group[0].finish(None, err)
            else:
                for request in group:
                    self._serve([request])
            return
        start = 0
        for request in group:
            request.finish(result.part(start, start + len(request.texts)), None)
            start += len(request.texts)

    def _forward_of(self, request: _Request) -> bool:
        """Run the background request's next forward; True when it is finished (or failed)."""
        try:
            if request.chunks is None:
                request.chunks = deque(self._chunks(request.texts))
            positions = request.chunks.popleft()
            request.parts.append((positions, self._forward([request.texts[i] for i in positions], [request])))
        except BaseException as err:  # noqa: BLE001 - handed to its caller
            request.finish(None, err)
            return True
        if request.chunks:
            return False
        request.finish(_assembled(request.parts, len(request.texts)), None)
        return True

    def _chunks(self, texts: Sequence[str]) -> list[list[int]]:
        """Text positions in token-length order, cut into forwards of at most
        ``background_tokens`` padded tokens (and ``max_texts`` texts; at least one text each);
        texts that fit one forward stay as given, so they get exactly ``compute(texts)``."""
        counts = self.encoder.token_counts(texts)
        if len(texts) <= self.max_texts and len(texts) * max(counts, default=0) <= self.background_tokens:
            return [list(range(len(texts)))]
        chunks: list[list[int]] = [[]]
        for position in sorted(range(len(texts)), key=counts.__getitem__):
            chunk = chunks[-1]
            padded = (len(chunk) + 1) * counts[position]
            fits = padded <= self.background_tokens and len(chunk) < self.max_texts
            if chunk and not fits:
                chunks.append([position])
            else:
                chunk.append(position)
        return chunks


def _assembled(parts: list[tuple[list[int], Encoded]], count: int) -> Encoded:
    """One result, in the texts' order, from the results of forwards over some of the positions."""
    if len(parts) == 1 and parts[0][0] == list(range(count)):
        return parts[0][1]
    order = np.argsort(np.concatenate([np.asarray(positions, dtype=np.int64) for positions, _ in parts]),
                       kind="stable")
    vectors = np.concatenate([part.vectors for _, part in parts])[order]
    prints = [fingerprint for _, part in parts for fingerprint in part.prints]
    return Encoded(vectors, [prints[i] for i in order])
