"""Turns an add stored that the user's search state does not hold yet.

An add commits its turns and returns without a model forward: the turns wait here, with the marks
of the add's transaction (:meth:`retrieval.memory.store_contract.Store.tracking`), and join the user's
search state (:meth:`retrieval.api.states.SearchStates.extend`) before anything else reads or
extends it: at the user's next search, or when the ingestion worker indexes them (at the end of a
step, and before it commits a segment). Their vectors are computed in one call first (through the
store's vector cache: the worker computes them in the background before it takes the user's
guard, so its extend finds them cached); a search computes the ones not cached yet itself. So a
search still finds every turn added before it starts, and an add costs its commit only. They are
cached only while the user's purge count is the one read before the earliest of those adds (a
purge through another server may remove the turns before they are embedded).

Every call but :meth:`UnindexedTurns.prepare` is made under the user's ``state`` guard
(:class:`retrieval.api.closing.UserGuard`); the table of waiting turns is shared by all users and
changes under one short lock.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

from retrieval.api.states import SearchStates
from retrieval.index.query_batcher import kept
from retrieval.memory.records import Turn


class _Added(NamedTuple):
    """One add's stored turns, its transactions' marks and the user's purge count read before them."""

    marks: Sequence[tuple[Any, Any]]
    turns: Sequence[Turn]
    purges: int


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

    def prepare(self, user: str, more: Sequence[str] = (), purges: int | None = None) -> None:
        """Compute the vectors of the user's waiting turns (and of ``more`` texts, read after the
        user's purge count was ``purges``, in the same call) into the store's cache."""
        entries = self._entries(user)
        texts = self._texts(entries) + list(more)
        if texts:
            self._embedder(user, entries, purges).encode(texts)

    def index(self, user: str) -> None:
        """The user's waiting turns join its search state (their vectors computed in one call)."""
        with self._lock:
            entries = self._waiting.pop(user, [])
        if entries:
            with kept():  # under the user's guard (its adds and searches wait): foreground, unshared
                self._embedder(user, entries).encode(self._texts(entries))
            for entry in entries:
                self.states.extend(user, entry.marks, turns=entry.turns)

    def drop(self, user: str) -> None:
        """Forget the user's waiting turns (its search state was dropped, or the turns purged)."""
        with self._lock:
            self._waiting.pop(user, None)

    def _entries(self, user: str) -> list[_Added]:
        with self._lock:
            return list(self._waiting.get(user, []))

    def _embedder(self, user: str, entries: Sequence[_Added], purges: int | None = None) -> Any:
        """The embedder caching under ``user`` while its purge count is the earliest one read."""
        counts = [entry.purges for entry in entries] + ([] if purges is None else [purges])
        return self.embedder.for_user(user, min(counts) if counts else None)

    @staticmethod
    def _texts(entries: Sequence[_Added]) -> list[str]:
        return [turn.render() for entry in entries for turn in entry.turns]
