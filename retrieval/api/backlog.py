"""Ingestion behind the add: one worker thread per memory closes the segments of the turns that
:meth:`retrieval.api.memory.Memory.add` stored (exchange embeddings, segmentation, extraction, fingerprints,
records, index rows, the user's search state), each user's turns strictly in order.

The turn log is the queue. An add commits its turns and tells the worker; the worker reads the user's turns
stored since the last it fed, :data:`STEP_TURNS` at most (one read), and feeds them to the user's
:class:`retrieval.api.online.UserStream`; a user with turns left is due again after the users due meanwhile.
Nothing else records the queue: after a crash (a ``kill -9`` anywhere) the turns no committed segment covers
are the backlog, and at open the worker replays every user that has some, so no turn is lost or fed twice and
no segment is committed twice (a segment's records, index rows and progress row commit in one transaction).

A step holds the user's ``stream`` guard (:class:`retrieval.api.closing.UserGuard`) while it processes, the
``log`` and ``state`` guards only to read the log (no add commits between that read and the count of what it
fed), and the ``state`` guard to commit each closed segment with its search-state update and to add the turns
of the user's adds to its search state (their vectors computed before, :mod:`retrieval.api.unindexed`), so the
user's adds and searches wait at most for one commit, and other users never wait. Its model calls are
background calls (:func:`retrieval.index.query_batcher.background`): searches go first. A flush runs
:meth:`Backlog.process` over the user's whole backlog in the caller's thread.

Many nodes. Where several processes write the store (:attr:`Store.concurrent_writers`: one PostgreSQL database
served by several nodes), a step runs only while it holds the user's ingestion lock in the store
(:meth:`Store.ingestion_lock`; a purge takes it too, :mod:`retrieval.api.purge`), so two nodes never close the
same segment. A node that finds the lock taken leaves the user to its holder and looks again later. A stream
whose user another node changed (the store's next segment number, record count or purge count of the user,
:meth:`Store.ingestion_marks`, is not what this node left) is reloaded from the store: a purge through another
node may have removed turns of its open segment without closing or removing any segment. While idle the worker
looks every :data:`POLL_S` seconds at the users whose lock it found taken, and scans the store for users with
turns to process whose rows changed since its last step (another node's adds, or the backlog of a node that
died, whose lock died with it), the scans spaced by their length (:class:`retrieval.api.worker_users.Polls`).

Errors. A step that raises (an extractor's error, a full disk, a database's internal error) does not stop the
worker, nor does an error of the worker's own around a step: the user's stream is dropped (reloaded at its
next step: the failed segment's turns are fed again) and the error is kept; the worker tries the user again
after a pause that grows with each failure in a row (:mod:`retrieval.api.retries`), so a user that only adds
and searches gets its records once the cause is gone. Until a step succeeds the error is surfaced, as
:class:`retrieval.api.errors.IngestFailed`, by :meth:`Backlog.wait` (a drain, after which the worker tries at
once) or by the next flush, which tries the backlog again itself. A store that fails under the worker (a
:class:`~retrieval.memory.errors.StoreError`: a PostgreSQL restart while it polls, reads the user's marks or
commits a segment) is no failure of the user's: it pauses the worker for :data:`FAULT_WAIT_S` with one
warning, the user kept due and its stream reloaded; a store removed under it (``StoreGone``) stops it.

Bounded. The worker keeps the streams of the users it fed last (:mod:`retrieval.api.worker_users`); an add is
refused while its user's backlog, held in memory, is full (:meth:`Backlog.admit`).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from retrieval.api.closing import UserGuard, UserGuards
from retrieval.api.errors import IngestFailed, MemoryBusy, StoreUnavailable
from retrieval.api.limits import MAX_PENDING_TURNS
from retrieval.api.online import StreamModels, UserStream
from retrieval.api.retries import Retries
from retrieval.api.states import SearchStates
from retrieval.api.unindexed import UnindexedTurns
from retrieval.api.worker_users import HeldStreams, Polls, UserProgress
from retrieval.index.query_batcher import background
from retrieval.memory.errors import StoreError, StoreGone
from retrieval.memory.records import AMU, SegmentRecord, Turn
from retrieval.memory.store_contract import Store

STEP_TURNS = 512
"""The most turns a step embeds and feeds in one call, and the most a step of the worker takes: a
closing memory stops between such chunks (10,000 turns took 52 s as one call), and the users due take
turns, a chunk each (and the vectors of at most this many turns the user added, :meth:`Backlog.process`),
so a user waits for one step of each user ahead of it, not for their whole backlogs; a recorded session
(:mod:`retrieval.api.bulk`) is one chunk."""
POLL_S = 1.0
"""How often an idle worker over a store that other processes write looks for their users' work
(the users found busy; a scan of the store when its spacing allows)."""
FAULT_WAIT_S = 1.0
"""How long the worker waits after the store failed under it (say, a database restart) before it
tries the same work again: a fault stops no worker (a store removed under it aside)."""

logger = logging.getLogger(__name__)


class Backlog:
    """The ingestion worker of one writable memory (see the module docstring)."""

    def __init__(self, store: Store, models: StreamModels, guards: UserGuards,
                 states: SearchStates) -> None:
        self.store, self.models, self.guards, self.states = store, models, guards, states
        self.unindexed = UnindexedTurns(states, models.embedder)
        self._users: dict[str, UserProgress] = {}
        self._due: OrderedDict[str, None] = OrderedDict()
        self._changed = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._retries = Retries()
        self._polls = Polls()
        self._held = HeldStreams()

    def start(self) -> None:
        """Count each user's unprocessed turns in the store and start the worker on them."""
        for user in self.store.backlog_users():
            if count := len(self.store.uncovered_turn_ids(user)):
                self._users[user], self._due[user] = UserProgress(pending=count), None
        self._thread = threading.Thread(target=self._run, name="memory-ingest", daemon=True)
        self._thread.start()

    def added(self, user: str, marks: Sequence[tuple[Any, Any]], turns: Sequence[Turn], purges: int) -> None:
        """An add stored ``turns`` of ``user`` in the transactions ``marks``, the user's purge count
        ``purges`` before them (the caller holds the user's ``state`` guard): they wait for the
        user's search state and for the worker."""
        if not turns:
            return
        self.unindexed.added(user, marks, turns, purges)
        with self._changed:
            self._users.setdefault(user, UserProgress()).pending += len(turns)
            if self._users[user].error is None:
                self._due[user] = None
            self._changed.notify_all()

    def admit(self, user: str) -> None:
        """Refuse an add (:class:`MemoryBusy`) while the user's backlog is full (MAX_PENDING_TURNS)."""
        if (pending := self.pending(user)) >= MAX_PENDING_TURNS:
            raise MemoryBusy(f"user {user!r} has {pending:,} turns not yet processed, the most held for one "
                             "user: retry once they are (a flush waits for them, or says why they cannot be)")

    def pending(self, user: str | None = None) -> int:
        """Turns stored but not yet processed, of ``user`` or of all users."""
        with self._changed:
            if user is not None:
                return self._users[user].pending if user in self._users else 0
            return sum(state.pending for state in self._users.values())

    def streams(self) -> int:
        """How many users' streams are held."""
        with self._changed:
            return sum(state.stream is not None for state in self._users.values())

    def wait(self, user: str | None, timeout_s: float | None) -> None:
        """Until the user's (or every user's) backlog is processed; raises the error of a failed
        step (:class:`IngestFailed`, once: the worker then tries again), :class:`TimeoutError`
        after ``timeout_s``, :class:`StoreUnavailable` when the memory closes meanwhile."""
        def settled() -> bool:
            states = list(self._users.values()) if user is None else [self._users.get(user, UserProgress())]
            return self._closed or all(s.pending == 0 or s.error is not None for s in states)

        with self._changed:
            done = self._changed.wait_for(settled, timeout_s)
            failed = [(name, s) for name, s in self._users.items()
                      if s.error is not None and user in (None, name)]
            if failed:
                name, state = failed[0]
                error, state.error = state.error, None
                self._retries.cancel(name)
                self._due[name] = None
                self._changed.notify_all()
                raise IngestFailed(f"processing the turns of user {name!r} failed: {error}", "user_id")
            if self._closed and self.pending(user):
                raise StoreUnavailable("the memory closed before its backlog was processed; "
                                       "it resumes when the memory opens again")
            if not done:
                raise TimeoutError(f"{self.pending(user)} turns still pending after {timeout_s} s")

    def process(self, user: str, limit: int | None = None) -> list[AMU]:
        """Feed the user's turns stored so far to its stream, :data:`STEP_TURNS` at a time (its pending
        count dropping chunk by chunk), all or the first ``limit`` (a stream loaded again maybe more:
        :meth:`Store.backlog`); returns the records of the segments that closed, or raises
        :class:`IngestFailed`. Beside its exchanges it computes the vectors of at most ``limit`` of the
        turns the user added, and while more lack theirs its commits leave those waiting
        (:meth:`UnindexedTurns.ready`): a bounded step. The caller holds the ``stream`` guard."""
        guard = self.guards.of(user)
        with self._changed:
            state = self._users.setdefault(user, UserProgress())
        with self._step(user, state), background():
            if self.store.concurrent_writers and state.stream is not None \
                    and state.marks != self.store.ingestion_marks(user):
                state.stream = None  # another node closed segments of the user or purged: reload
            with guard.log, guard.state:  # no add between the backlog read and its count
                purges = self.store.purge_count(user)  # before the turns: their arrays cached while it holds
                turns, last, unread = self.store.backlog(user, state.after, limit)
                with self._changed:
                    state.pending = len(turns) + unread  # whichever node added them
            amus: list[AMU] = []
            counted = 0  # turns of this step already taken off the user's pending count
            if state.stream is None:
                state.stream, amus = UserStream.load(user, self.store, self.models, (), self._publish, purges)
            for start in range(0, len(turns), STEP_TURNS):
                self._refuse_if_closed()
                chunk = turns[start:start + STEP_TURNS]
                amus += state.stream.push(chunk, self.unindexed.preparing(user, purges, limit))
                if start + len(chunk) < len(turns):  # the last chunk counts once the step is done
                    with self._changed:
                        state.pending -= len(chunk)
                        self._changed.notify_all()
                    counted += len(chunk)
            if self.unindexed.ready(user, limit):
                with guard.state:
                    self.unindexed.index(user, limit)
        state.fed = last
        state.remember(self.store, user)
        for other in self._held.fed(user):  # before the step's waiters are told: a drain sees it done
            self._drop_stream(other)
        with self._changed:
            state.pending -= len(turns) - counted
            state.error, state.failures = None, 0
            self._retries.cancel(user)
            self._changed.notify_all()
        return amus

    def _drop_stream(self, user: str) -> None:
        """Drop ``user``'s stream unless the streams held are within bound, a step or flush of it runs,
        or it has turns to feed or a failure to report; where no other node writes, forget the user."""
        with self.guards.of(user).stream.taken(wait=False) as free, self._changed:
            state = self._users.get(user)
            if not free or not self._held.full() or (state is not None and (state.pending or state.error)):
                return
            if state is not None:
                state.stream = None
                if not self.store.concurrent_writers:
                    del self._users[user]
            self._held.dropped(user)

    def flush(self, user: str, session: str) -> list[AMU]:
        """:meth:`process`, then close the session's open segment; returns the records of the
        session's segments so closed (the backlog's other sessions' segments commit too, but are
        not this answer's; the caller holds the user's ``stream`` guard)."""
        with self.store.ingestion_lock(user, wait=True, capped=True):
            amus = [amu for amu in self.process(user) if amu.source.session_id == session]
            state = self._users[user]
            assert state.stream is not None
            with self._step(user, state), background():
                amus += state.stream.flush(session)
            state.remember(self.store, user)
            return amus

    def reset(self, user: str) -> None:
        """Forget the user's stream and waiting turns after its turns changed (a purge; the caller
        holds every guard of the user): the next step reloads the stream from the store."""
        self.unindexed.drop(user)
        with self._changed:
            state = self._users.get(user)
        if state is not None:
            self._reset(user, state, None)

    def close(self) -> None:
        """Stop before the running step commits its next segment (as a crash would, but between
        transactions); the rest of the backlog stays in the turn log for the next open."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join()

    @contextmanager
    def _step(self, user: str, state: UserProgress) -> Iterator[None]:
        """Around a step's work: closing leaves the unfinished segments' turns the backlog (the
        stream is dropped); so does a store that failed under the step (a database restart), which
        is no failure of the user's: the user stays due, and the worker pauses
        (:data:`FAULT_WAIT_S`) and tries again; any other error is the user's failed step
        (:meth:`_failed`)."""
        try:
            yield
        except StoreUnavailable:
            state.stream = None
            raise
        except StoreError:
            state.stream = None
            with self._changed:
                self._due[user] = None
                self._changed.notify_all()
            raise
        except Exception as err:
            raise self._failed(user, state, err) from err

    def _failed(self, user: str, state: UserProgress, err: Exception) -> IngestFailed:
        logger.warning("processing the turns of user %r failed (tried again later)", user, exc_info=err)
        guard = self.guards.of(user)
        with guard.log, guard.state:
            self._reset(user, state, f"{type(err).__name__}: {err}")
        return IngestFailed(f"processing the turns of user {user!r} failed: {state.error}", "user_id")

    def _reset(self, user: str, state: UserProgress, error: str | None) -> None:
        try:
            count = len(self.store.uncovered_turn_ids(user))
        except Exception:
            if error is None:
                raise  # a purge's reset: its caller reports the store's error
            count = state.pending  # the user's rows fail this read too: counted again at the retry
        with self._changed:
            state.stream, state.fed, state.error, state.pending = None, 0, error, count
            if count and error is None:
                self._due[user] = None
            if error is None:  # a purge: the user starts afresh
                state.failures = 0
                self._retries.cancel(user)
            else:
                state.failures += 1
                self._retries.failed(user, state.failures)
            self._changed.notify_all()

    def _publish(self, stream: UserStream, record: SegmentRecord, amus: list[AMU]) -> None:
        """Commit a closed segment and add its records to the user's search state, under the
        user's ``state`` guard; refused once the memory closes, which ends the step."""
        self._refuse_if_closed()
        ready = self.unindexed.ready(stream.user, STEP_TURNS)
        with self.guards.of(stream.user).state:
            if ready:
                self.unindexed.index(stream.user, STEP_TURNS)
            with self.store.tracking(stream.user) as marks:
                stream.store_segment(record, amus)
            self.states.extend(stream.user, marks, amus=amus, closed=record.turn_ids)

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise StoreUnavailable("the memory is closed; its backlog resumes when it opens again")

    def _run(self) -> None:
        poll_s = POLL_S if self.store.concurrent_writers else None
        while True:
            with self._changed:
                retry_s = self._retries.release(self._due)
                waits = [wait for wait in (poll_s, retry_s) if wait is not None]
                self._changed.wait_for(lambda: self._closed or bool(self._due), min(waits, default=None))
                self._retries.release(self._due)
                if self._closed:
                    return
                user = self._due.popitem(last=False)[0] if self._due else None
            if user is None and poll_s is None:
                continue  # a failed user's pause ended early: no store of other writers to poll
            try:
                if user is None:
                    self._poll()
                else:
                    self._take(user)
            except StoreGone as err:  # removed under the memory: nothing to retry into
                logger.error("ingestion stopped: %s", err)
                return
            except StoreError as err:  # the store failed (a database restart): keep the work, wait
                logger.warning("ingestion paused for %.0f s: %s", FAULT_WAIT_S, err)
                with self._changed:
                    if user is not None:
                        self._due[user] = None
                    self._changed.wait_for(lambda: self._closed, FAULT_WAIT_S)
            except Exception as err:  # outside a step (a database's internal error): the worker goes on
                if user is None:
                    logger.exception("looking for other nodes' work failed; looking again in %.0f s", POLL_S)
                else:
                    with self._changed:
                        state = self._users.setdefault(user, UserProgress())
                    self._failed(user, state, err)

    def _take(self, user: str) -> None:
        """One step of ``user`` (:data:`STEP_TURNS` turns; with more it is due again: last, or first
        while the streams held are over their bound, as users mid-backlog keep theirs) unless another
        node holds its ingestion lock. Where other nodes write, a call of this node holding the user's
        ``stream`` guard may be waiting for another node's step (a flush, a purge): the worker leaves
        the user for the next poll rather than wait behind it, which would stop all other ingestion."""
        guard: UserGuard = self.guards.of(user)
        with guard.stream.taken(wait=not self.store.concurrent_writers) as free:
            if not free:
                self._later(user)
                return
            with self.store.ingestion_lock(user, wait=False) as held:
                if not held:
                    self._later(user)  # another node is at it
                    return
                try:
                    self.process(user, STEP_TURNS)
                except (IngestFailed, StoreUnavailable):
                    return  # a failure is kept in the user's state, for the next drain or flush
        with self._changed:
            if user in self._users and self._users[user].pending:  # even if its adds queued it meanwhile
                self._due[user] = None
                self._due.move_to_end(user, last=not self._held.full())

    def _later(self, user: str) -> None:
        """Look at ``user`` again at the next poll (a failed user, whose polls skip it: at its
        retry's next turn, else its retry would be lost)."""
        with self._changed:
            state = self._users.get(user)
            if state is not None and state.error is not None:
                self._retries.after(user, POLL_S)
            else:
                self._polls.busy(user)

    def _poll(self) -> None:
        """Make due every user whose lock was taken, whose pending turns this node has not seen
        settled, or whose turn log or records changed since this node's last step (:class:`Polls`)."""
        with self._changed:
            due = self._polls.taken() | {name for name, s in self._users.items() if s.pending and not s.error}
            seen = {name: s.seen for name, s in self._users.items()}
            streams = [name for name, s in self._users.items() if s.stream is not None]
        changed, versions = self._polls.changed(self.store, seen, [*streams, *self.states.users()])
        due |= changed  # a stream of a user another node purged is loaded again by its step
        self.states.drop_purged(versions)
        with self._changed:
            for user in due:
                if self._users.setdefault(user, UserProgress()).error is None:
                    self._due[user] = None
