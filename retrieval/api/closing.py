"""What orders the calls on one :class:`retrieval.api.memory.Memory`: a gate every call passes
(once the memory is closed it refuses them with :class:`StoreUnavailable` instead of SQLite's error
about a closed database, closing waits for the calls inside, and a store that fails under a call,
a database restart say, is the call's :class:`StoreUnavailable` too, its cause the store's error),
and three locks per user
(:class:`UserGuard`): nothing is shared between users, so different users never wait for each
other."""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterable, Iterator

from retrieval.api.errors import StoreUnavailable, refusal
from retrieval.memory.errors import StoreBusy, StoreError


class CallGate:
    """Counts the calls inside; after :meth:`close` (which waits for them) it admits none."""

    def __init__(self) -> None:
        self._idle = threading.Condition()
        self._inside = 0
        self.closed = False

    def close(self) -> None:
        with self._idle:
            self.closed = True
            self._idle.wait_for(lambda: self._inside == 0)

    def __enter__(self) -> CallGate:
        with self._idle:
            if self.closed:
                raise StoreUnavailable("the memory is closed; open it again (Memory.open)")
            self._inside += 1
        return self

    def __exit__(self, kind: object, error: BaseException | None, *_: object) -> None:
        with self._idle:
            self._inside -= 1
            self._idle.notify_all()
        if isinstance(error, StoreBusy):  # another process holds a role the call needs
            raise refusal(error) from error
        if isinstance(error, StoreError):  # every refusal a MemoryAPIError, a store failure too
            raise StoreUnavailable(f"the store failed: {error}") from error


class _GuardLock:
    """A re-entrant lock that keeps its :class:`UserGuard` alive while it is referenced: a ``with``
    on ``guards.of(user).state`` holds only the lock, and a guard collected meanwhile would let
    :class:`UserGuards` hand another thread a new guard of the same user."""

    def __init__(self, guard: UserGuard) -> None:
        self._lock = threading.RLock()
        self.guard = guard

    def __enter__(self) -> _GuardLock:
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    @contextlib.contextmanager
    def taken(self, *, wait: bool) -> Iterator[bool]:
        """Hold the lock for the block, waiting for it only when ``wait``; yields whether it is held."""
        held = self._lock.acquire(blocking=wait)
        try:
            yield held
        finally:
            if held:
                self._lock.release()


class UserGuard:
    """One user's locks. ``state`` (short holds) orders what the user's search state sees: an
    add's turns joining it, a segment's commit and state update, a search, a purge. ``log`` orders
    what the user's turn log takes: an add's bind-and-commit (which may wait for the store's one
    writer, another user's purge say: no search waits with it), the worker's read of the backlog,
    a purge. ``stream`` (held while segments are processed, which may take an LLM call) orders the
    user's ingestion: the worker's steps, a flush, a purge. Take ``stream``, then ``log``, then
    ``state``."""

    def __init__(self) -> None:
        self.state = _GuardLock(self)
        self.log = _GuardLock(self)
        self.stream = _GuardLock(self)


class UserGuards:
    """The guard of each user, created on first use and kept while someone holds it."""

    def __init__(self) -> None:
        self._guards: weakref.WeakValueDictionary[str, UserGuard] = weakref.WeakValueDictionary()
        self._mutex = threading.Lock()

    def of(self, user: str) -> UserGuard:
        with self._mutex:
            guard = self._guards.get(user)
            if guard is None:
                guard = self._guards[user] = UserGuard()
            return guard

    @contextlib.contextmanager
    def held(self, users: Iterable[str]) -> Iterator[None]:
        """Every guard of each of ``users``, taken user by user in sorted order (so two holders of
        several users never wait on each other), ``stream``, ``log``, then ``state``."""
        with contextlib.ExitStack() as stack:
            for user in sorted(set(users)):
                guard = self.of(user)
                stack.enter_context(guard.stream)
                stack.enter_context(guard.log)
                stack.enter_context(guard.state)
            yield
