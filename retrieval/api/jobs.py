"""Durable consolidation jobs (docs/design.md §8, run in the background of the memory API).

A job is a row of the store's ``jobs`` table (:mod:`retrieval.memory.job_rows`) before it runs,
so a job survives its process: :class:`JobRunner` runs the unfinished ones again when the memory
opens (the engine resumes the plan it saved, so a job killed halfway ends where an uninterrupted
one would; its progress then counts what ran after the restart and says ``resumed``: true). One
worker thread runs the jobs of a store one at a time on its own connection in the ``consolidate``
writer role; SQLite (WAL, busy timeout) serialises its short transactions with the API's. At most
one unfinished job per (user, session): asking again returns the same job. Consolidation always
covers the user's whole memory (merges may span sessions); a session id only names the job.

Many nodes (:attr:`Store.concurrent_writers`): a job runs only while its runner holds the job's
lock in the store (:meth:`Store.job_lock`), and only if its row is not done or failed by then, so
a node that opens while another runs a job does not run it too. An idle worker looks every
:data:`~retrieval.api.backlog.POLL_S` seconds for unfinished jobs whose lock is free (those of a
node that died, whose lock died with it), and a waiter reads its job's row as often, so it sees a
job another node ran end.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from retrieval.api.backlog import POLL_S
from retrieval.api.errors import NotFound, StoreUnavailable
from retrieval.consolidation.engine import consolidate_user
from retrieval.index.query_batcher import background
from retrieval.memory.cache import CachedEmbedder
from retrieval.memory.job_rows import DONE, FAILED, RUNNING, JobRow
from retrieval.memory.store_contract import Store

CONSOLIDATE = "consolidate"


class JobRunner:
    """The job worker of ``store``, which runs the jobs on its own handle of it
    (:meth:`~retrieval.memory.store_contract.Handle.reopen`). ``on_done(user)`` is called after
    each job (the memory drops the user's search snapshot). ``embedder`` and ``fingerprinter``
    must be safe to share with the caller's thread
    (:class:`retrieval.consolidation.worker.SerializedEmbedder`, :class:`Locked`)."""

    def __init__(self, store: Store, embedder: Any, operator: Any, fingerprinter: Any | None,
                 on_done: Callable[[str], None]) -> None:
        self.store, self.embedder, self.operator = store, embedder, operator
        self.fingerprinter, self.on_done = fingerprinter, on_done
        self._queue: queue.Queue[JobRow | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._finished = threading.Condition()
        self._closed = False
        self._ended: dict[int, JobRow] = {}  # rows of jobs that ended in this process, until waited for

    def start(self) -> None:
        """Queue the store's unfinished jobs (those a process that stopped left: run again, the
        engine resumes their plan); where other nodes write, start the worker even without one,
        so that it looks for theirs."""
        for job in self.store.unfinished():
            self.submit(job)
        if self.store.concurrent_writers:
            self._started()

    def submit(self, job: JobRow) -> None:
        self._started()
        self._queue.put(job)

    def _started(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="memory-jobs", daemon=True)
            self._thread.start()

    def wait(self, store: Store, job_id: int, timeout_s: float | None = None) -> JobRow:
        """Block until the job is done or failed (or ``timeout_s`` passes); returns its row.
        Raises :class:`StoreUnavailable` when the memory closes first (the job stays queued in
        the store and runs when it opens again), :class:`NotFound` when its user is forgotten
        meanwhile (the job went with the user's data)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._finished:
            while not (job_id in self._ended or self._closed or _settled(store.job_row(job_id))):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._finished.wait(POLL_S if left is None else min(POLL_S, left))  # another node's end
            if job_id in self._ended:
                return self._ended.pop(job_id)
            if self._closed:
                raise StoreUnavailable("the memory closed before the job ran; it runs when the memory opens "
                                       "again")
            row = store.job_row(job_id)
        if row is None:
            raise NotFound("the job is gone: its user's memory was forgotten while it ran", "id")
        return row

    def close(self) -> None:
        """Finish the running job; queued ones stay queued in the store for the next open (their
        waiters are told so)."""
        if self._thread is not None:
            with self._queue.mutex:
                self._queue.queue.clear()
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        with self._finished:
            self._closed = True
            self._finished.notify_all()

    def _next(self, store: Store) -> JobRow | None:
        """The next queued job (None: close); where other nodes write, an idle poll queues the
        store's unfinished jobs (one whose lock another node holds is skipped when taken)."""
        while True:
            try:
                return self._queue.get(timeout=POLL_S if store.concurrent_writers else None)
            except queue.Empty:
                for job in store.unfinished():
                    self._queue.put(job)

    def _run(self) -> None:
        with self.store.reopen(role="consolidate") as store, background():  # behind searches
            embedder = CachedEmbedder(self.embedder, store)
            while (job := self._next(store)) is not None:
                with store.job_lock(job.id) as held:
                    current = store.job_row(job.id) if held else None
                    if current is None or current.state in (DONE, FAILED):
                        continue  # another node runs it, or ran it
                    resumed = current.state == RUNNING  # a process running it stopped
                    store.update_job(job.id, RUNNING, {"stage": "consolidating"})
                    try:
                        report = consolidate_user(store, job.user_id, embedder, self.operator,
                                                  fingerprinter=self.fingerprinter)
                        store.update_job(job.id, DONE, {**report.to_dict(), "resumed": resumed})
                    except Exception as err:  # noqa: BLE001 - recorded in the job, which the caller reads
                        store.update_job(job.id, FAILED, error=f"{type(err).__name__}: {err}")
                self.on_done(job.user_id)
                ended = store.job_row(job.id)
                with self._finished:
                    if ended is not None:
                        self._ended[job.id] = ended
                    self._finished.notify_all()


def _settled(row: JobRow | None) -> bool:
    """Done, failed or gone (purged with its user)."""
    return row is None or row.state in (DONE, FAILED)


class Locked:
    """A fingerprinter shared by two threads: one ``fingerprint`` call at a time (its tokenizer
    refuses concurrent use); ``identity`` and ``codebook_size`` pass through."""

    def __init__(self, fingerprinter: Any, lock: threading.Lock) -> None:
        self.fingerprinter, self._lock = fingerprinter, lock
        self.identity, self.codebook_size = fingerprinter.identity, fingerprinter.codebook_size

    def fingerprint(self, texts: Any) -> Any:
        with self._lock:
            return self.fingerprinter.fingerprint(texts)
