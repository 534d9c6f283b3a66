"""Turns an add stored that the user's search state does not hold yet.

An add commits its turns and returns without a model forward: the turns wait here, with the marks
of the add's transaction (:meth:`retrieval.memory.store_contract.Store.tracking`), and join the user's
search state (:meth:`retrieval.api.states.SearchStates.extend`) at the user's next search, or when
the ingestion worker indexes them (at the end of a step, and before it commits a segment, so that
the commit extends the state in place). Their vectors are computed first (through the store's
vector cache: the worker computes them in the background before it takes the user's guard, so its
extend finds them cached); a search computes the ones not computed yet itself. So a search still
finds every turn added before it starts, and an add costs its commit only. Where more wait than a
step of the worker computes (a user's bulk of adds), the worker computes them a step at a time and
commits without them (:meth:`UnindexedTurns.ready`): its commits then do not follow the state,
which catches up from the store when they are indexed
(:meth:`retrieval.api.states.SearchStates.refresh`) or at the user's next search, whichever comes
first. They are cached only while the user's purge count is the one read before the earliest of
those adds (a purge through another server may remove the turns before they are embedded).

:meth:`UnindexedTurns.index` and :meth:`UnindexedTurns.drop` are called under the user's ``state``
guard (:class:`retrieval.api.closing.UserGuard`), the computing of vectors before it: a search
computes the turns waiting when it starts before it takes the guard, so a bulk's vectors hold up
neither the user's adds nor the worker's steps. The table of waiting turns is shared by all users
and changes under one short lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from retrieval.api.states import SearchStates
from retrieval.index.query_batcher import kept
from retrieval.memory.records import Turn


@dataclass
class _Added:
    """One add's stored turns, its transactions' marks, the user's purge count read before them
    and how many of its turns, from the first, have their vectors computed (in the store's cache)."""

    marks: Sequence[tuple[Any, Any]]
    turns: Sequence[Turn]
    purges: int
    computed: int = 0


class UnindexedTurns:
    """The turns each user's search state is still to take in (see the module docstring);
    ``embedder`` is the memory's cached embedder."""

    def __init__(self, states: SearchStates, embedder: Any) -> None:
        self.states, self.embedder = states, embedder
        self._waiting: dict[str, list[_Added]] = {}
        self._lock = threading.Lock()

    def added(self, user: str, marks: Sequence[tuple[Any, Any]], turns: Sequence[Turn], purges: int) -> None:
        """An add stored ``turns`` in the transactions ``marks``, the user's purge count ``purges``
        before them."""
        if turns:
            with self._lock:
                self._waiting.setdefault(user, []).append(_Added(marks, turns, purges))

    def behind(self, user: str) -> int:
        """How many of the user's waiting turns have no vectors computed yet."""
        return _lacking(self._entries(user))

    def prepare(self, user: str, more: Sequence[str] = (), purges: int | None = None,
                limit: int | None = None) -> None:
        """Compute the vectors of the user's waiting turns not computed yet (the first ``limit`` of
        them; and of ``more`` texts, read after the user's purge count was ``purges``, in the same
        call) into the store's cache."""
        self._compute(user, self._entries(user), limit, more, purges)

    def prepare_unguarded(self, user: str) -> None:
        """:meth:`prepare` every waiting turn of the user before its search takes the ``state``
        guard, in forwards of the user's texts alone (they are stored): the guard is then held for
        the turns added meanwhile only, and the user's adds and the worker's steps, which take it
        too, do not wait for a bulk's vectors (seconds to minutes for thousands of turns)."""
        with kept():
            self.prepare(user)

    def preparing(self, user: str, purges: int, limit: int | None) -> Callable[[list[str]], None]:
        """What a worker's chunk of turns calls with the exchange texts of each of its runs before
        they are embedded (:meth:`retrieval.api.online.UserStream.push`): :meth:`prepare` of them,
        the first run's beside the first ``limit`` waiting turns (a chunk computes no more)."""
        taken = [limit]

        def prepare(texts: list[str]) -> None:
            self.prepare(user, texts, purges, taken.pop() if taken else 0)

        return prepare

    def ready(self, user: str, limit: int | None) -> bool:
        """:meth:`prepare` the user's waiting turns if at most ``limit`` (None: any number) lack
        their vectors; whether it did. With more, they keep waiting and are not indexed: what the
        worker commits meanwhile does not follow the user's search state (its marks do not), which
        catches up from the store when they are indexed (:meth:`index`) or the user searches."""
        if limit is not None and self.behind(user) > limit:
            return False
        self.prepare(user, limit=limit)
        return True

    def index(self, user: str, limit: int | None = None) -> None:
        """The user's waiting turns join its search state (the vectors not computed yet, in one
        call) unless more than ``limit`` (None: any number) lack them, a bulk added since the
        caller prepared them (they keep waiting); and a state that commits made while turns waited
        left behind catches up (:meth:`retrieval.api.states.SearchStates.refresh`, as bounded)."""
        with self._lock:
            entries = self._waiting.get(user, [])
            if limit is not None and _lacking(entries) > limit:
                return
            self._waiting.pop(user, None)
        with kept():  # under the user's guard (its adds and searches wait): foreground, unshared
            if entries:
                self._compute(user, entries)
            for entry in entries:
                self.states.extend(user, entry.marks, turns=entry.turns)
            self.states.refresh(user, limit)

    def drop(self, user: str) -> None:
        """Forget the user's waiting turns (its search state was dropped, or the turns purged)."""
        with self._lock:
            self._waiting.pop(user, None)

    def _entries(self, user: str) -> list[_Added]:
        with self._lock:
            return list(self._waiting.get(user, []))

    def _compute(self, user: str, entries: Sequence[_Added], limit: int | None = None,
                 more: Sequence[str] = (), purges: int | None = None) -> None:
        """One call computing the vectors of the turns of ``entries`` not computed yet (the first
        ``limit`` of them) and of ``more``, caching under ``user`` while its purge count is the
        earliest one read (of the entries taken, or ``purges``); the entries count what it computed."""
        taken: list[tuple[_Added, int]] = []  # each entry and how many of its turns are computed after
        texts: list[str] = []
        for entry in entries:
            start = entry.computed
            room = len(entry.turns) - start if limit is None else limit - len(texts)
            todo = entry.turns[start:start + room]
            if todo:
                taken.append((entry, start + len(todo)))
                texts += [turn.render() for turn in todo]
        if texts or more:
            counts = [entry.purges for entry, _ in taken] + ([] if purges is None else [purges])
            self.embedder.for_user(user, min(counts) if counts else None).encode(texts + list(more))
        with self._lock:  # a search and the worker may compute the same turns at once
            for entry, computed in taken:
                entry.computed = max(entry.computed, computed)


def _lacking(entries: Sequence[_Added]) -> int:
    """How many turns of ``entries`` have no vectors computed yet."""
    return sum(len(entry.turns) - entry.computed for entry in entries)
