"""The users' search states (:class:`retrieval.multi_route.bank.MemoryBank`) a memory keeps between
searches: always the store's latest commit, and bounded in memory.

Fresh. A state remembers the user's rows it reflects (:meth:`retrieval.memory.store.AMUStore.
user_version`). Before a search, the store's ``data_version`` says whether any connection
committed since the user's state was last checked (this memory's writer, another process's, the
job worker's); when one has, the user's rows are read again. A user whose rows only grew (another
node's adds and segments) has its state caught up from the store: the turns and active records
stored after the last ones it holds join it, as this memory's own would, when they account for
the whole change (:meth:`SearchStates._catch_up`); any other change (a purge, an archive, a
fingerprint set later) drops the state, to be built again from the store by the search that
needs it; where other nodes write, the worker's scans of the store drop the states of users
another node purged (:meth:`SearchStates.drop_purged`) without waiting for their next search.
The memory's own writes extend a state in place (:meth:`SearchStates.extend`): their
transactions report the user's rows at their start and end
(:meth:`retrieval.memory.store.AMUStore.tracking`), and a state extends only when the first start
is the rows it holds and each start is the previous end; else another writer committed between
(or the memory committed turns the state had not taken in yet), and the state is left as it was,
for the next search to catch up from the store, or the memory's next step of the user
(:meth:`SearchStates.refresh`). A state's rows
are read before and after it is built: a commit that lands during the build may be in the state
in part, so such a state serves its search and is built again for the next one.

Threads. The memory holds the user's ``state`` guard (:class:`retrieval.api.closing.UserGuard`)
around every call for that user; the table of held states and its byte count are shared by all
users and change under one short lock, so users never wait for each other's builds or searches.

Bounded. The states are kept in least-recently-searched order within :data:`SEARCH_STATE_BYTES`
(the sum of :meth:`retrieval.multi_route.bank.MemoryBank.size_bytes`, an estimate): the least recently
used are dropped first; each is rebuilt from the store when its user searches again. The state
in use is always kept, even alone over the bound.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from retrieval.api.worker_users import purged_since
from retrieval.memory.records import AMU, Turn
from retrieval.memory.store_contract import Store
from retrieval.multi_route.bank import MemoryBank

SEARCH_STATE_BYTES = 4 * 2**30
"""The bound on the estimated bytes of all users' search states of one memory, sized by what a
user costs: a user of a few records is estimated at 0.1 MiB (0.1 MiB measured with the tests'
word embedder, 0.12 MiB with MiniLM: mostly the lexical index's in-memory database,
:data:`retrieval.index.fts.CONNECTION_BYTES`), one of 100 records at 2.1 MiB (1.7 MiB measured:
the vectors, the topology's co-occurrences, the Python objects), one of 100,000 records at
0.8 GiB, so the bound holds 2,000 users of 100 records or four large ones. Below what a
memory's users search in turn, every search rebuilds a state from the store (1,000 users of 100
records under 512 MiB did)."""


@dataclass
class _Held:
    bank: MemoryBank
    rows: tuple[int, ...]
    size: int
    checked: int
    behind: bool = False  # an extend by the memory's own write was refused
    refused: set[str] = field(default_factory=set)  # the ids of those writes' turns (vectors computed)


class SearchStates:
    """The users' search states of one memory (see the module docstring); ``build(user)`` makes
    one from the store. Calls for one user are serialised by the caller (its user guard)."""

    def __init__(self, store: Store, build: Callable[[str], MemoryBank], limit: int | None = None) -> None:
        self.store, self.build = store, build
        self.limit = SEARCH_STATE_BYTES if limit is None else limit
        self._held: OrderedDict[str, _Held] = OrderedDict()
        self._bytes = 0
        self._guard = threading.Lock()

    def get(self, user: str) -> MemoryBank:
        """The user's state as of the store's latest commit, most recently used from now on."""
        held, version = self._checked(user)
        if held is None:
            held = _Held(*self._built(user, version), 0, version)
            with self._guard:
                self._held[user] = held
            self._resize(user, held)
        else:  # unchanged since it was last measured: only its place in the order moves
            with self._guard:
                if user in self._held:
                    self._held.move_to_end(user)
        return held.bank

    def refresh(self, user: str, most: int | None = None) -> None:
        """Bring the user's held state up to the store's latest commit, as its next search would,
        if the memory's own writes left it behind (:meth:`extend` refused them) and it takes in at
        most ``most`` turns of other writers so (None: any number; another node's may have no
        vectors yet): caught up from the store, or dropped if it cannot be. No state is built."""
        held = self._held.get(user)
        if held is not None and held.behind:
            self._checked(user, most)

    def _checked(self, user: str, most: int | None = None) -> tuple[_Held | None, int]:
        """The user's held state, checked against the store's latest commit (caught up where rows
        were only appended, unless that takes in more than ``most`` turns of other writers: then
        left as it was), or None: none held, or the one held dropped; and the store's
        ``data_version`` read before."""
        version = self.store.data_version()
        held = self._held.get(user)
        if held is not None and held.checked != version:
            rows = self.store.user_version(user)
            caught = bool(held.rows) and (rows == held.rows or self._catch_up(user, held, rows, most))
            if caught is None:
                return held, version
            if caught:
                held.checked, held.behind, held.refused = version, False, set()
            else:
                self.drop(user)
                return None, version
        return held, version

    def _built(self, user: str, version: int) -> tuple[MemoryBank, tuple[int, ...]]:
        """A state built from the store and the user's rows it reflects: read before and after the
        build (``version``, the store's ``data_version`` read before the first, unchanged after the
        build means nothing committed meanwhile, and spares the second read, a count over the
        user's rows). When they differ, another writer committed for the user during the build,
        and the state may hold part of that commit: its rows are then unknown (empty), so the next
        search builds it again rather than catching up (which would add the rows it holds a second
        time) and the memory's own writes leave it as it is."""
        rows = self.store.user_version(user)
        bank = self.build(user)
        unchanged = self.store.data_version() == version or self.store.user_version(user) == rows
        return bank, (rows if unchanged else ())

    def extend(self, user: str, marks: Sequence[tuple[Any, Any]], turns: Sequence[Turn] = (),
               amus: Sequence[AMU] = (), closed: Sequence[str] = ()) -> None:
        """The memory's own write (its transactions' ``marks``) stored ``turns`` or committed a
        segment of the turns ``closed`` with its records ``amus``: they join the user's held state
        (the segment's turns are no longer open), unless the marks show another writer's change of
        the user between: then it is left as it was, for :meth:`get` to catch up from the store
        (the memory's own rows are stored there too)."""
        held = self._held.get(user)
        if held is None or not marks:
            return
        starts, ends = [start for start, _ in marks], [held.rows] + [end for _, end in marks[:-1]]
        if starts != ends:
            held.behind = True
            held.refused.update(turn.turn_id for turn in turns)
            return
        held.bank.add_turns(turns)
        held.bank.add_records(self.store, amus)
        held.bank.close_turns(closed)
        held.rows = marks[-1][1]
        self._resize(user, held)

    def _catch_up(self, user: str, held: _Held, rows: tuple[int, ...],
                  most: int | None = None) -> bool | None:
        """Extend ``held`` by the user's turns and active records stored after the last ones it
        holds, if they are the whole difference between its rows and ``rows`` (the user's rows
        now, :meth:`retrieval.memory.store_contract.Versions.user_version`: counts and highest
        positions of turns and active records, how many of those carry a fingerprint, the
        segments' count and the purges'), as they are when writers only appended, and its open
        turns those the store's segments leave uncovered (segments are no items: they only close
        turns); whether it did. Positions only grow and a user's writers commit one at a time, so
        appended rows are exactly those after the held positions; a purge raises the purge count,
        an archive lowers a count, a later fingerprint raises one that nothing appended explains,
        and a commit landing meanwhile adds rows ``rows`` does not count. None, leaving it as it
        was, where the turns it read hold more than ``most`` that are not the memory's own it
        refused (another node's bulk, perhaps without vectors yet: the worker leaves it to the
        user's search)."""
        turn_count, last_turn, record_count, last_record, printed, _, purges = held.rows
        turns, turn_seen, _ = self.store.backlog(user, last_turn)
        if most is not None and sum(turn.turn_id not in held.refused for turn in turns) > most:
            return None
        more = rows[2] - record_count
        found = self.store.page(user, after=last_record, limit=more + 1) if more > 0 else []
        amus = [amu for _, amu in found]
        appended = (turn_count + len(turns), turn_seen, record_count + len(amus),
                    found[-1][0] if found else last_record,
                    printed + sum(amu.fingerprint is not None for amu in amus), rows[5], purges)
        if appended != rows:
            return False
        held.bank.add_turns(turns)
        held.bank.add_records(self.store, amus)
        held.bank.open_only(self.store.uncovered_turn_ids(user))  # the segments committed meanwhile
        held.rows = rows
        self._resize(user, held)
        return True

    def users(self) -> list[str]:
        """The users whose states are held."""
        with self._guard:
            return list(self._held)

    def drop_purged(self, versions: Mapping[str, tuple[int, ...]]) -> None:
        """Drop the state of each user of ``versions`` (their rows now) purged since the state's
        rows were read: where other nodes write, a user another node forgot leaves this memory at
        the worker's next scan, not at the user's next search here. A search holding the state
        meanwhile finishes with it; the next one builds it again."""
        with self._guard:
            stale = [user for user, held in self._held.items()
                     if user in versions and (not held.rows or purged_since(held.rows, versions[user]))]
        for user in stale:
            self.drop(user)

    def drop(self, user: str) -> None:
        with self._guard:
            held = self._held.pop(user, None)
            if held is not None:
                self._bytes -= held.size

    def gauges(self) -> dict[str, float]:
        """``search_states`` (users held) and ``search_state_bytes`` (their estimated size)."""
        with self._guard:
            return {"search_states": len(self._held), "search_state_bytes": self._bytes}

    def _resize(self, user: str, held: _Held) -> None:
        """Measure the user's state again, make it the most recent and drop the least recent ones
        while the bound is exceeded."""
        size = held.bank.size_bytes()
        with self._guard:
            if self._held.get(user) is not held:  # dropped meanwhile
                return
            self._bytes += size - held.size
            held.size = size
            self._held.move_to_end(user)
            while self._bytes > self.limit and len(self._held) > 1:
                _, evicted = self._held.popitem(last=False)
                self._bytes -= evicted.size
