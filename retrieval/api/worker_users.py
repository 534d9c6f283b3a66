"""What the ingestion worker (:mod:`retrieval.api.backlog`) keeps of each user between steps: its
progress (:class:`UserProgress`), where other nodes write, whether to look at it again
(:class:`Polls`) and, for the users it fed last, its stream
(:class:`HeldStreams`: at most :data:`STREAMS_HELD`, the least recently fed dropped first; a
stream with turns still to feed is kept, and while the streams held are over the bound the worker
finishes the user it has before it starts another's backlog, so they pass it by two at most).

A stream (:class:`retrieval.api.online.UserStream`) is what a user's open segments and surprise
history are in memory; the turn log holds the same, so a dropped stream is loaded again from the
store at the user's next step, as after a restart (:meth:`retrieval.api.online.UserStream.load`:
it cuts as the stream that never stopped, :mod:`retrieval.ingestion.push_order`). Without a bound
a server would keep one stream for every user that ever wrote, for as long as it runs.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass

from retrieval.api.online import UserStream
from retrieval.memory.store_contract import Store

SCAN_SPACING = 9.0
"""A scan of the rows of every user with turns still to process (:meth:`Polls.changed`) starts no
sooner after the last one ended than this many times as long as its reads took. Over PostgreSQL a scan
took 0.4 s at 1,000 users and 2.5-3.8 s at 10,000 when it read a user at a time, 0.4-0.6 s at
10,000 in batches (``docs/performance.md``); repeated whenever anything committed, it would fill an
idle worker's time (its own users' steps waiting behind it) and the database's: spaced, scans hold
the worker at most a tenth of the time."""

STREAMS_HELD = 1024
"""The most users' streams one memory keeps between steps. A stream with one open session of a
few exchanges held about 20 KiB (tracemalloc over 50 users with all-MiniLM-L6-v2 vectors), so
the bound is about 20 MiB at one open session a user (each open session a user keeps adds about
10 KiB; a user keeps at most :data:`retrieval.api.limits.MAX_OPEN_SESSIONS` open, so each
stream is bounded too); a user beyond it pays a reload from the store at its next step (its
turns and segments read: 4 ms for a user of a thousand turns, 0.2 s at ten thousand)."""


@dataclass
class UserProgress:
    """What the worker knows of one user: its stream and the last turn position fed to it, the
    turns stored but not yet fed or being fed, and the error of its last step."""

    pending: int = 0
    stream: UserStream | None = None
    fed: int = 0
    error: str | None = None
    failures: int = 0
    seen: tuple[int, ...] = ()
    marks: tuple[int, ...] = ()

    @property
    def after(self) -> int | None:
        """Where a step reads the user's turn log from: after the last turn fed to the held stream,
        or, with none held, from the start (:meth:`Store.backlog` then reads the open turns)."""
        return None if self.stream is None else self.fed

    def remember(self, store: Store, user: str) -> None:
        """Where several nodes write the store: what this node left of the user after its own
        commits, so that only another node's changes make the next step reload the stream."""
        if store.concurrent_writers:
            self.seen, self.marks = store.user_version(user), store.ingestion_marks(user)


class HeldStreams:
    """The users whose streams are held, least recently fed first (thread-safe)."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = STREAMS_HELD if limit is None else limit
        self._order: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def fed(self, user: str) -> Iterator[str]:
        """``user``'s stream was just fed: it is the most recent; yields, while the streams held
        are over the bound (:meth:`full`), the others, least recently fed first, for the caller to
        drop (:meth:`dropped`) where it can (never ``user``: the stream being fed is kept, even
        alone over the bound)."""
        with self._lock:
            self._order[user] = None
            self._order.move_to_end(user)
            others = list(itertools.islice(self._order, len(self._order) - 1)) if self._over() else []
        return itertools.takewhile(lambda _: self.full(), others)

    def full(self) -> bool:
        """More streams held than the bound (those of users with turns to feed are not dropped)."""
        with self._lock:
            return self._over()

    def _over(self) -> bool:
        return len(self._order) > max(self.limit, 1)

    def dropped(self, user: str) -> None:
        """``user``'s stream is no longer held."""
        with self._lock:
            self._order.pop(user, None)


class Polls:
    """Where other nodes write the store, the users an idle worker looks at again: those whose
    ingestion lock (or stream guard) it found taken, and those whose rows another node changed
    (found by scans :data:`SCAN_SPACING` apart). Not thread-safe: the worker's own thread calls
    :meth:`changed`, the others run under its lock."""

    def __init__(self) -> None:
        self._busy: set[str] = set()
        self._version: int | None = None
        self._rested = 0.0  # the earliest start the last scan's spacing allows

    def busy(self, user: str) -> None:
        """``user``'s ingestion lock or stream guard was taken: look again at the next poll."""
        self._busy.add(user)

    def taken(self) -> set[str]:
        """The users found busy since the last call."""
        users, self._busy = self._busy, set()
        return users

    def changed(self, store: Store, seen: Mapping[str, tuple[int, ...]],
                held: Collection[str] = ()) -> tuple[set[str], dict[str, tuple[int, ...]]]:
        """The users whose turn log or records changed since this node's last step of them (``seen``:
        their rows then), of those with turns to process and of ``held`` (the users this node
        holds a stream or a search state of) those another node purged, with the rows the scan
        read of both. The store is scanned only when anything committed since the last scan,
        and once the last one's spacing has passed (until then: none). A scan that raised (the
        database restarting) counts for neither: the next poll scans. The spacing is measured
        from the scan's own reads, after ``data_version`` (the first read after a database restart
        waits for a connection)."""
        if time.monotonic() < self._rested:
            return set(), {}
        version = store.data_version()
        if version == self._version:
            return set(), {}
        began = time.monotonic()
        backlog = set(store.backlog_users())
        versions = store.user_versions(sorted(backlog | set(held)))
        users = {user for user, rows in versions.items() if (user in backlog and rows != seen.get(user, ()))
                 or purged_since(seen.get(user, ()), rows)}
        ended = time.monotonic()
        self._version, self._rested = version, ended + SCAN_SPACING * (ended - began)
        return users, versions


def purged_since(then: tuple[int, ...], now: tuple[int, ...]) -> bool:
    """Whether the user's rows ``now`` count a purge that its rows ``then`` did not (the purge
    count is the last of :meth:`retrieval.memory.store_contract.Versions.user_version`); False
    where ``then`` is unknown (empty)."""
    return bool(then) and then[-1] != now[-1]
