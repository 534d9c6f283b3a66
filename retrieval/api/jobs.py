"""Durable consolidation jobs (docs/design.md §8, run in the background of the memory API).

A job is a row of the store's ``jobs`` table (:mod:`retrieval.memory.job_rows`) before it runs,
so a job survives its process: :class:`JobRunner` runs the unfinished ones again when the memory
opens (the engine resumes the plan it saved, so a job killed halfway ends where an uninterrupted
one would; its progress then counts what ran after the restart and says ``resumed``: true).
:data:`JOB_WORKERS` worker threads run the jobs on one handle of the store in the ``consolidate``
writer role, each job of a user no other worker is running: jobs of different users run side by
side (a user's consolidation, minutes of LLM calls perhaps, does not hold up another's), a user's
own jobs one after another. SQLite (WAL, busy timeout) serialises their short transactions with
the API's. At most one unfinished job per (user, session): asking again returns the same job.
Consolidation always covers the user's whole memory (merges may span sessions); a session id only
names the job. A delete or forget removes the user's finished jobs (their progress counts records
it may have removed); a job it overlapped finishes with ``{"resumed", "purged_meanwhile": true}``
for progress, its counts dropped. A forget removes the running job too: it stops after the pass
under way, so it never consolidates what the user stores after the forget.

Many nodes (:attr:`Store.concurrent_writers`): a job runs only while its runner holds the job's
lock in the store (:meth:`Store.job_lock`), and only if its row is not done or failed by then, so
a node that opens while another runs a job does not run it too. An idle worker looks every
:data:`~retrieval.api.backlog.POLL_S` seconds for unfinished jobs whose lock is free (those of a
node that died, whose lock died with it), and a waiter reads its job's row as often, so it sees a
job another node ran end.

A store that fails under a worker (a database restart) stops no worker and fails no job: the job
stays unfinished and runs again after :data:`~retrieval.api.backlog.FAULT_WAIT_S` (resumed, as
after a crash), and a failed poll is read again at the next.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from retrieval.api.backlog import FAULT_WAIT_S, POLL_S
from retrieval.api.errors import NotFound, StoreUnavailable
from retrieval.consolidation.engine import consolidate_user
from retrieval.index.query_batcher import background
from retrieval.llm_client import EndpointRefused
from retrieval.memory.cache import CachedEmbedder
from retrieval.memory.errors import StoreError, StoreGone
from retrieval.memory.job_rows import DONE, FAILED, RUNNING, JobRow
from retrieval.memory.store_contract import Store

CONSOLIDATE = "consolidate"
logger = logging.getLogger(__name__)
JOB_WORKERS = 4
"""Jobs run at once, each of another user."""
JOB_FAILED = "the consolidation stopped on an unexpected error (the server's log says which)"
"""A failed job's error as its user reads it: the error itself, which may name the server's files,
is logged instead."""


class JobRunner:
    """The job workers of ``store``, which run the jobs on their own handle of it
    (:meth:`~retrieval.memory.store_contract.Handle.reopen`). ``on_done(user)`` is called after
    each job (the memory drops the user's search snapshot). ``embedder`` and ``fingerprinter``
    must be safe to share between threads (:class:`retrieval.consolidation.worker.SerializedEmbedder`
    and ``SerializedFingerprinter``)."""

    def __init__(self, store: Store, embedder: Any, operator: Any, fingerprinter: Any | None,
                 on_done: Callable[[str], None]) -> None:
        self.store, self.embedder, self.operator = store, embedder, operator
        self.fingerprinter, self.on_done = fingerprinter, on_done
        self._queue: deque[JobRow] = deque()
        self._running: set[str] = set()  # users whose job a worker runs now
        self._changed = threading.Condition()  # the queue, the running users, jobs that ended
        self._threads: list[threading.Thread] = []
        self._starting = threading.Lock()
        self._handle: Store | None = None
        self._stopping = False  # the workers take no more jobs
        self._closed = False  # and have stopped: waiters of queued jobs are told
        self._ended: dict[int, JobRow] = {}  # rows of jobs that ended here while waited for, until read
        self._waiters: Counter[int] = Counter()  # the jobs waited for, by how many callers

    def start(self) -> None:
        """Queue the store's unfinished jobs (those a process that stopped left: run again, the
        engine resumes their plan); where other nodes write, start the workers even without one,
        so that they look for theirs."""
        for job in self.store.unfinished():
            self.submit(job)
        if self.store.concurrent_writers:
            self.start_workers()

    def submit(self, job: JobRow) -> None:
        self.start_workers()
        with self._changed:
            self._queue.append(job)
            self._changed.notify_all()

    def start_workers(self) -> None:
        """Take the store's consolidate role and start the workers, unless they run already
        (refused while another process holds the role: then no job should be queued for them).
        One caller at a time: two first consolidations would both take the role."""
        with self._starting:
            if self._stopping:  # the memory is closing: no role is taken after its close
                raise StoreUnavailable("the memory is closed; open it again (Memory.open)")
            if self._threads:
                return
            self._handle = self.store.reopen(role="consolidate")
            self._threads = [threading.Thread(target=self._run, args=(self._handle,), name=f"memory-jobs-{n}",
                                              daemon=True) for n in range(JOB_WORKERS)]
            for thread in self._threads:
                thread.start()

    def wait(self, store: Store, job_id: int, timeout_s: float | None = None) -> JobRow:
        """Block until the job is done or failed (or ``timeout_s`` passes); returns its row.
        Raises :class:`StoreUnavailable` when the memory closes first (the job stays queued in
        the store and runs when it opens again), :class:`NotFound` when its user is forgotten
        meanwhile (the job went with the user's data)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._changed:
            self._waiters[job_id] += 1
            try:
                while not (job_id in self._ended or self._closed or _settled(store.job_row(job_id))):
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    self._changed.wait(POLL_S if left is None else min(POLL_S, left))  # another node's end
            finally:
                self._waiters -= Counter([job_id])  # a count that reaches 0 leaves the counter
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
        """Finish the running jobs; queued ones stay queued in the store for the next open (their
        waiters are told so)."""
        with self._starting, self._changed:  # a start under way finishes first, and none follows
            self._stopping = True
            self._queue.clear()
            self._changed.notify_all()
        for thread in self._threads:
            thread.join()
        self._threads = []
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def _next(self, store: Store) -> JobRow | None:
        """The first queued job of a user no worker is running (None: closing); where other nodes
        write, an idle wait of :data:`POLL_S` queues the store's unfinished jobs (one whose lock
        another node holds is skipped when taken), read outside the lock: a store that failed (a
        database restart) holds up no other worker and stops none, the next poll reads again."""
        while True:
            with self._changed:
                if self._stopping:
                    return None
                job = next((job for job in self._queue if job.user_id not in self._running), None)
                if job is not None:
                    self._queue.remove(job)
                    self._running.add(job.user_id)
                    return job
                if self._changed.wait(POLL_S if store.concurrent_writers else None):
                    continue
            try:
                unfinished = store.unfinished()
            except StoreError as err:
                logger.warning("consolidation jobs: the store failed while polling: %s", err)
                continue
            with self._changed:
                queued = {job.id for job in self._queue}
                self._queue.extend(job for job in unfinished if job.id not in queued)

    def _run(self, store: Store) -> None:
        with background():  # behind searches
            embedder = CachedEmbedder(self.embedder, store)
            while (job := self._next(store)) is not None:
                try:
                    self._execute(store, job, embedder)
                except StoreGone as err:  # removed under the memory: nothing to retry into
                    logger.error("consolidation jobs stopped: %s", err)
                    return
                except StoreError as err:  # the store failed (a database restart): the job stays unfinished
                    logger.warning("consolidation job %s paused for %.0f s: %s", job.id, FAULT_WAIT_S, err)
                    with self._changed:
                        if not self._changed.wait_for(lambda: self._stopping, FAULT_WAIT_S):
                            self._queue.append(job)  # tried again, as after a crash ("resumed")
                finally:
                    with self._changed:
                        self._running.discard(job.user_id)
                        self._changed.notify_all()

    def _execute(self, store: Store, job: JobRow, embedder: CachedEmbedder) -> None:
        with store.job_lock(job.id) as held:
            current = store.job_row(job.id) if held else None
            if current is None or current.state in (DONE, FAILED):
                return  # another node runs it, or ran it
            resumed = current.state == RUNNING  # a process running it stopped
            store.update_job(job.id, RUNNING, {"stage": "consolidating"})
            purges = store.purge_count(job.user_id)
            try:
                report = consolidate_user(store, job.user_id, embedder, self.operator,
                                          fingerprinter=self.fingerprinter,
                                          wanted=lambda: store.job_row(job.id) is not None)
                # its counts may count what a purge meanwhile removed: then they are never shown
                # (checked before the write, so a reader does not see them in passing, and after it)
                if store.purge_count(job.user_id) == purges:
                    store.update_job(job.id, DONE, {**report.to_dict(), "resumed": resumed})
                if store.purge_count(job.user_id) != purges:
                    store.update_job(job.id, DONE, {"resumed": resumed, "purged_meanwhile": True})
            except StoreError:
                raise  # not the job's failure: it runs again once the store answers (_run)
            except EndpointRefused as err:  # what to fix, written for clients (no URL): the job's error
                logger.error("consolidation job %s failed: %s", job.id, err)
                store.update_job(job.id, FAILED, error=str(err))
            except Exception:  # noqa: BLE001 - the job ends failed; what failed goes to the log
                logger.exception("consolidation job %s failed", job.id)
                store.update_job(job.id, FAILED, error=JOB_FAILED)
        self.on_done(job.user_id)
        ended = store.job_row(job.id)
        with self._changed:
            if ended is not None and self._waiters[job.id]:  # kept for its waiters only: a row read
                self._ended[job.id] = ended  # later comes from the store (unless purged meanwhile)
            self._changed.notify_all()


def _settled(row: JobRow | None) -> bool:
    """Done, failed or gone (purged with its user)."""
    return row is None or row.state in (DONE, FAILED)
