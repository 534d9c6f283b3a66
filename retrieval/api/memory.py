"""``retrieval.Memory``: a memory an agent uses — turns added as they happen, searched at once,
scoped to a user, forgotten completely.

    with Memory.open("stores/agent", fingerprinter="checkpoints/isq_minilm_dailydialog_cpu") as mem:
        mem.add([{"speaker": "Maria", "text": "I adopted a cat."}], user_id="alice", session_id="s1")
        hits = mem.search("What pet does Maria have?", user_id="alice", k=10).hits

Scoping: the store's ``conversation_id`` is the user; every read names it, so another user's id finds
nothing (:class:`NotFound`). One :class:`Memory` writes a store (another writer, process or
``Memory``, is refused at open: :class:`MemoryBusy`, naming its pid); ``read_only`` ones read too.

Ingestion behind the add: ``add`` validates, stores its turns in one transaction and returns with no
forward (they join the user's search state before its next search, :mod:`retrieval.api.unindexed`);
the ingestion worker embeds them and closes segments from the turn log, each user's turns in order
(:mod:`retrieval.api.backlog`: :meth:`Memory.pending`, :meth:`Memory.drain`; :meth:`Memory.flush`
processes the user's backlog first). ``kill -9`` loses and duplicates nothing: the backlog is replayed.

What runs in parallel and what is serialised (:mod:`retrieval.api.closing`):

* Users never wait for each other: each has its own guards, search state and stream; searches,
  gets and lists read the store on their thread's own SQLite connection (WAL), which never waits
  for a write transaction, another user's add or segment, a consolidation or a purge.
* A user's guards (:class:`retrieval.api.closing.UserGuard`): ``state`` orders what its search
  state sees (one commit or one search at a time, never an extraction), ``log`` its adds' commits
  (its searches do not wait while they wait for the writer), ``stream`` its ingestion.
* All writes share the store's writer connection, one short transaction at a time (but for the
  compaction a purge owes, run behind the delete: :mod:`retrieval.api.compaction`). The models
  run one forward at a time: searches arriving during one share the next, ahead of ingestion's
  small forwards (:mod:`retrieval.index.query_batcher`); every forward runs on the process's
  model thread (:mod:`retrieval.index.model_thread`), models that cannot be joined one call at a
  time there too (their tokenizers refuse concurrent use).

Trust holds per user: a search scores only the user's own state, sees every commit made before
it starts (:mod:`retrieval.api.states`) and filters by session before the cut. :meth:`close` waits
for the calls inside and stops the worker after its step; later calls get :class:`StoreUnavailable`.
"""

from __future__ import annotations

import builtins  # Memory.list shadows the builtin inside the class
import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from retrieval.api.appending import append_add
from retrieval.api.backlog import Backlog
from retrieval.api.closing import CallGate, UserGuards
from retrieval.api.compaction import Compactions, compact_owed
from retrieval.api.counted import CountedExtractor
from retrieval.api.errors import InvalidInput, NotFound, ReadOnly, StoreUnavailable, refusal
from retrieval.api.inputs import (
    check_flag,
    check_id,
    check_k,
    check_limit,
    check_memory_id,
    check_query,
    check_timeout,
    check_turns,
    optional_id,
)
from retrieval.api.jobs import CONSOLIDATE, JobRunner
from retrieval.api.limits import DEFAULT_K, DEFAULT_PAGE
from retrieval.api.loading import MemoryModels, load_models
from retrieval.api.online import StreamModels
from retrieval.api.purge import hard_purge
from retrieval.api.results import AddResult, Job, MemoryItem, Page, SearchResult
from retrieval.api.search import run_search
from retrieval.api.states import SearchStates
from retrieval.api.tokens import CURSOR, JOB, Tokens, store_secret
from retrieval.ingestion.segmenter import SegmenterConfig
from retrieval.memory.backends import open_store
from retrieval.memory.cache import CachedEmbedder
from retrieval.memory.errors import StoreBusy, StoreError
from retrieval.memory.fresh_store import discard_if_fresh, fresh_paths, remove_if_created
from retrieval.memory.records import AMU, Turn, shown, turn_id_of
from retrieval.memory.store_contract import Store
from retrieval.memory.targets import local_directory
from retrieval.multi_route.bank import MemoryBank


class Memory:
    """See the module docstring; open with :meth:`open`."""

    def __init__(self, store: Store, models: MemoryModels, segmenter: SegmenterConfig) -> None:
        self.store, self.models, self.segmenter = store, models, segmenter
        self._gate, self._guards = CallGate(), UserGuards()
        self._tokens = Tokens(store_secret(store))
        shared, fingerprinter = models.shared()
        self._embedder = CachedEmbedder(shared, store)
        self.extraction = CountedExtractor(models.extractor)  # what its segments' extraction counted
        self._online = StreamModels(self._embedder, self.extraction, fingerprinter, segmenter)
        self._query_embedder, self._fingerprinter = shared, fingerprinter
        self._states = SearchStates(store, self._build_bank)
        self._backlog = Backlog(store, self._online, self._guards, self._states)
        self._jobs = JobRunner(store, shared, models.operator, fingerprinter, self._forget_state)
        self._compactions = Compactions(store)

    @classmethod
    def open(cls, path: str | Path, *, fingerprinter: Any = None, embedder: Any = None,
             extractor: Any = "rule", planner: Any = "rule", operator: Any = "offline", reranker: Any = None,
             read_only: bool = False, segmenter: SegmenterConfig | None = None) -> Memory:
        """Open (or create) the memory at ``path``, a store directory or a PostgreSQL URL
        (:mod:`retrieval.memory.backends`; a URL is never taken as a directory). Models are
        names/paths or loaded objects (:mod:`retrieval.api.loading`); ``embedder`` defaults to the
        offline all-MiniLM-L6-v2. The store is bound to the embedder, extractor and fingerprinter
        that built it: other ones are refused (:class:`StoreUnavailable`). Unfinished
        consolidation jobs resume."""
        if not isinstance(path, (str, Path)) or not str(path).strip():
            raise InvalidInput(f"path must name a store directory, got {path!r}", "path")
        read_only, directory = check_flag("read_only", read_only), local_directory(path)
        if directory is not None and directory.exists() and not directory.is_dir():
            raise StoreUnavailable(f"{directory} is a file, not a store directory", "path")
        created = fresh_paths(directory, read_only)
        try:
            store = open_store(path, read_only=read_only)
        except StoreError as err:
            if not isinstance(err, StoreBusy):
                remove_if_created(created)
            raise refusal(err) from None
        try:
            options = {} if embedder is None else {"embedder": embedder}
            # A reader writes nothing into the store, LLM answers included: its planner caches none.
            models = load_models(None if read_only else store.local_files, fingerprinter=fingerprinter,
                                 extractor=extractor, planner=planner, operator=operator, reranker=reranker,
                                 **options)
            memory = cls(store, models, segmenter or SegmenterConfig())
            models.bind(store, read_only)
            if not read_only and not compact_owed(store):  # what a purge killed after its commit left
                memory._compactions.kept()  # kept by a reader: tried again behind
        except BaseException as err:
            discard_if_fresh(store, created)
            if isinstance(err, StoreError):  # a fault the compaction found: one typed refusal
                raise refusal(err) from None
            raise
        if not read_only:
            try:
                memory._backlog.start()
                memory._jobs.start()  # takes the consolidate role for unfinished jobs
            except BaseException as err:
                memory.close()
                if isinstance(err, StoreError):
                    raise refusal(err) from None
                raise
        return memory

    def close(self) -> None:
        """Finish the running job and ingestion step (queued jobs and the rest of the backlog
        resume at the next open), wait for the calls inside, run an owed compaction and close the
        store; open segments stay open (their turns are stored)."""
        if self._gate.closed:
            return
        self._jobs.close()
        self._backlog.close()
        self._gate.close()
        self._compactions.close()
        self.store.close()
        self.models.close()

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writes ---------------------------------------------------------------------------------

    def add(self, turns: Sequence[dict[str, Any] | Turn], *, user_id: str, session_id: str,
            idempotency_key: str | None = None) -> AddResult:
        """Store the turns (searchable as raw turns when this returns) for the ingestion worker to
        embed and feed to the user's open segment of ``session_id``; ``amu_ids`` is empty (the
        records of segments the turns close come later: :meth:`flush`, :meth:`drain`). Replaying
        ``idempotency_key`` or a stored turn id adds nothing, giving either again with another
        body is a :class:`Conflict` (:mod:`retrieval.api.replay`); a full backlog refuses it."""
        user, session = check_id("user_id", user_id), check_id("session_id", session_id)
        key = optional_id("idempotency_key", idempotency_key)
        checked = check_turns(turns, user, session)
        guard = self._guards.of(user)
        with self._gate, guard.log:
            self._writable()
            # refused while the user's backlog is full (a replay, which stores nothing, is answered)
            appended = append_add(self.store, user, session, checked, key, lambda: self._backlog.admit(user))
            with guard.state:
                self._backlog.added(user, appended.marks, appended.stored, appended.purges)
            return appended.result

    def flush(self, *, user_id: str, session_id: str) -> AddResult:
        """Process the user's backlog, then close the open segment of (user, session); returns the
        records of the session's segments this call closed (not the worker's before it, nor other
        sessions'), or raises :class:`retrieval.api.errors.IngestFailed` (turns kept, tried again)."""
        user, session = check_id("user_id", user_id), check_id("session_id", session_id)
        with self._gate:
            self._writable()
            self._require_session(user, session)
            guard = self._guards.of(user)
            with guard.stream:
                amus = self._backlog.flush(user, session)
            return AddResult((), tuple(a.id for a in amus))

    def pending(self, user_id: str | None = None) -> int:
        """Turns stored but not yet processed by the ingestion worker, of the user or of all."""
        user = optional_id("user_id", user_id)
        with self._gate:
            return self._backlog.pending(user)

    def drain(self, *, user_id: str | None = None, timeout_s: float | None = None) -> None:
        """Wait until the ingestion worker has processed the user's (or every user's) stored
        turns; raises :class:`retrieval.api.errors.IngestFailed` for a failed segment (once; it is
        tried again) and :class:`TimeoutError` when ``timeout_s`` passes first."""
        user, timeout_s = optional_id("user_id", user_id), check_timeout(timeout_s)
        with self._gate:
            self._backlog.wait(user, timeout_s)

    def delete(self, id: str, *, user_id: str) -> None:
        """Hard-purge one record or one raw turn of this user and everything derived from it;
        returns once the purge commits (the compaction of the store's files follows it,
        :mod:`retrieval.api.compaction`).

        A record's words are those of the turns it names, so deleting a record deletes those turns;
        deleting turns deletes every record, active or archived, that names one of them (a merged
        record included), the segments left without turns, their evidence nodes, FTS5 rows and
        cached arrays. Archived records that name no deleted turn and were merged into a deleted
        record are restored (active again): deleting one turn of a merged record keeps what the
        other turns stated. Deleting the user's last turn is ``forget(user_id=)``
        (:mod:`retrieval.memory.purge`, :mod:`retrieval.api.purge`)."""
        user, item = check_id("user_id", user_id), check_memory_id(id)
        guard = self._guards.of(user)
        with self._gate, guard.stream, guard.log, guard.state:
            self._writable()
            turn_id = turn_id_of(user, item)
            if turn_id is not None:
                if not self.store.stored_turn_ids(user, [turn_id]):
                    raise NotFound(f"no turn {item!r} for user {user!r}", "id")
                self._purge(user, turn_ids=[turn_id])
            else:
                self._amu(user, item)
                self._purge(user, amu_ids=[item])

    def forget(self, *, user_id: str, session_id: str | None = None) -> None:
        """Hard-purge everything of the user, or one of its sessions: the session's turns and what
        derives from them, as :meth:`delete` of each turn does."""
        user, session = check_id("user_id", user_id), optional_id("session_id", session_id)
        guard = self._guards.of(user)
        with self._gate, guard.stream, guard.log, guard.state:
            self._writable()
            if session is not None:
                self._require_session(user, session)
                self._purge(user, session_id=session)
            elif self.store.has_user(user) or self.store.count(user):
                self._purge(user, everything=True)

    def consolidate(self, *, user_id: str, session_id: str | None = None, wait: bool = False,
                    timeout_s: float | None = None) -> Job:
        """Queue a durable consolidation job of the user's memory (the unfinished one if there is
        one); with ``wait``, return when it is done or failed."""
        user, session = check_id("user_id", user_id), optional_id("session_id", session_id)
        wait, timeout_s = check_flag("wait", wait), check_timeout(timeout_s)
        with self._gate:
            self._writable()
            if session is not None:
                self._require_session(user, session)
            if not self.store.count(user):
                raise NotFound(f"user {user!r} has no records to consolidate", "user_id")
            self._jobs.start_workers()  # before the job is stored: a refused role leaves no job behind
            row, created = self.store.create_job(user, session, CONSOLIDATE)
            if created:
                self._jobs.submit(row)
        if wait:
            row = self._jobs.wait(self.store, row.id, timeout_s)
        return self._job(row)

    # -- reads ----------------------------------------------------------------------------------

    def search(self, query: str, *, user_id: str, session_id: str | None = None, k: int = DEFAULT_K,
               explain: bool = False) -> SearchResult:
        """The user's k best items for ``query`` by plan-guided multi-route retrieval, with the
        codebook channel when a fingerprinter is set (:mod:`retrieval.api.search`)."""
        user, session = check_id("user_id", user_id), optional_id("session_id", session_id)
        text, k, explain = check_query(query), check_k(k), check_flag("explain", explain)
        with self._gate:
            self._backlog.unindexed.prepare_unguarded(user)
            with self._guards.of(user).state:
                if session is not None:
                    self._require_session(user, session)
                self._backlog.unindexed.index(user)
                bank = self._states.get(user)
                return run_search(bank, text, k, session=session, explain=explain,
                                  planner=self.models.planner, reranker=self.models.reranker)

    def get(self, id: str, *, user_id: str) -> MemoryItem:
        """One record (active or archived) or raw turn of this user."""
        user, item = check_id("user_id", user_id), check_memory_id(id)
        with self._gate:
            turn_id = turn_id_of(user, item)
            if turn_id is not None:
                try:
                    return MemoryItem.of_turn(self.store.turn(user, turn_id), user)
                except KeyError:
                    raise NotFound(f"no turn {item!r} for user {user!r}", "id") from None
            return MemoryItem.of_record(self._amu(user, item), self.store.successor(item))

    def list(self, *, user_id: str, session_id: str | None = None, limit: int = DEFAULT_PAGE,
             cursor: str | None = None) -> Page:
        """The user's active records in the order they were stored, ``limit`` at a time; the page's
        cursor (None on the last page) is an opaque token of this user (:mod:`retrieval.api.tokens`)."""
        user, session = check_id("user_id", user_id), optional_id("session_id", session_id)
        limit = check_limit(limit)
        with self._gate:
            after = 0 if cursor is None else self._tokens.open(CURSOR, user, cursor)
            if after is None:
                raise InvalidInput(f"cursor {shown(cursor)} is not one a previous list returned", "cursor")
            if session is not None:
                self._require_session(user, session)
            rows = self.store.page(user, session_id=session, after=after, limit=limit + 1)
            items = tuple(MemoryItem.of_record(amu, None) for _, amu in rows[:limit])
            more = len(rows) > limit
            return Page(items, self._tokens.seal(CURSOR, user, rows[limit - 1][0]) if more else None)

    def history(self, id: str, *, user_id: str) -> builtins.list[MemoryItem]:
        """What consolidation forwarded into this record, directly or not (oldest first, in store order)."""
        user, item = check_id("user_id", user_id), check_memory_id(id)
        with self._gate:
            self._amu(user, item)
            predecessors: dict[str, builtins.list[str]] = {}
            for archived, successor in self.store.successors(user).items():
                predecessors.setdefault(successor, []).append(archived)
            found, stack = [], [item]
            while stack:
                found += (previous := predecessors.get(stack.pop(), []))
                stack += previous
            order = {amu.id: n for n, amu in enumerate(self.store.amus(user, include_archived=True))}
            return [MemoryItem.of_record(self.store.get(i), self.store.successor(i))
                    for i in sorted(set(found), key=order.__getitem__)]

    def job(self, id: str, *, user_id: str) -> Job:
        """A job of this user."""
        user = check_id("user_id", user_id)
        number = self._tokens.open(JOB, user, check_id("job id", id, "id"))
        with self._gate:
            row = None if number is None else self.store.job_row(number)
            if row is None or row.user_id != user:
                raise NotFound(f"no job {id!r} for user {user!r}", "id")
            return self._job(row)

    def users(self) -> builtins.list[str]:
        """Every user with stored turns (for operators and command lines, not for agents)."""
        with self._gate:
            return self.store.users()

    @contextlib.contextmanager
    def writes_held(self, *user_ids: str) -> Iterator[None]:
        """A block in which no add, segment, delete, forget or search of these users runs in this
        process, for work beside the memory's calls (:func:`retrieval.api.user_copy.copy_user`)."""
        with self._gate, self._guards.held(check_id("user_id", user) for user in user_ids):
            self._writable()
            yield

    # -- internals ------------------------------------------------------------------------------

    def _writable(self) -> None:
        if self.store.read_only:
            raise ReadOnly()

    def _build_bank(self, user: str) -> MemoryBank:
        return MemoryBank.build(self.store, user, self._embedder.for_user(user),
                                query_embedder=self._query_embedder, fingerprinter=self._fingerprinter)

    def _forget_state(self, user: str) -> None:
        with self._guards.of(user).state:
            self._states.drop(user)

    def cache_gauges(self) -> dict[str, float]:
        """The per-user caches' sizes for ``/metrics``: search states held and their estimated
        bytes (:mod:`retrieval.api.states`), user streams held, and the ingestion backlog (turns
        stored but not yet processed). Waits for no user."""
        return {**self._states.gauges(), "user_streams": self._backlog.streams(),
                "ingest_pending_turns": self._backlog.pending()}

    def _purge(self, user: str, **selection: Any) -> None:
        """The caller holds every guard of the user, so no add or segment of a purged turn commits."""
        hard_purge(self.store, user, self.models.answer_caches(self.store.local_files), **selection)
        self._states.drop(user)
        self._backlog.reset(user)  # an open segment may have held a purged turn: reload it
        self._compactions.owed()

    def _require_session(self, user: str, session: str) -> None:
        if not self.store.has_session(user, session):
            raise NotFound(f"user {user!r} has no session {session!r}", "session_id")

    def _amu(self, user: str, item: str) -> AMU:
        try:
            return self.store.get(item, user)  # another user's record is read as a missing one
        except KeyError:
            raise NotFound(f"no record {item!r} for user {user!r}", "id") from None

    def _job(self, row: Any) -> Job:
        return Job(self._tokens.seal(JOB, row.user_id, row.id), row.user_id, row.session_id, row.kind,
                   row.state, row.progress, row.error)

