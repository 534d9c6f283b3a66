"""Turns an add stored that the user's search state does not hold yet.

An add commits its turns and returns without a model forward: the turns wait here, with the marks
of the add's transaction (:meth:`retrieval.memory.store_contract.Store.tracking`), and join the user's
search state (:meth:`retrieval.api.states.SearchStates.extend`) before anything else reads or
extends it: at the user's next search, or when the ingestion worker indexes them (at the end of a
step, and before it commits a segment). Their vectors are computed in one call first (through the
store's vector cache: the worker computes them in the background before it takes the user's
guard, so its extend finds them cached); a search computes the ones not cached yet itself. So a
search still finds every turn added before it starts, and an add costs its commit only.

Every call but :meth:`UnindexedTurns.prepare` is made under the user's ``state`` guard
(:class:`retrieval.api.closing.UserGuard`); the table of waiting turns is shared by all users and
changes under one short lock.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from retrieval.api.states import SearchStates
from retrieval.index.query_batcher import background
from retrieval.memory.records import Turn


class UnindexedTurns:
    """The turns each user's search state is still to take in (see the module docstring);
    ``embedder`` is the memory's cached embedder."""

    def __init__(self, states: SearchStates, embedder: Any) -> None:
        self.states, self.embedder = states, embedder
        self._waiting: dict[str, list[tuple[Sequence[tuple[Any, Any]], Sequence[Turn]]]] = {}
        self._lock = threading.Lock()

    def added(self, user: str, marks: Sequence[tuple[Any, Any]], turns: Sequence[Turn]) -> None:
        """An add stored ``turns`` in the transactions ``marks``."""
        if turns:
            with self._lock:
                self._waiting.setdefault(user, []).append((marks, turns))

    def prepare(self, user: str, more: Sequence[str] = ()) -> None:
        """Compute the vectors of the user's waiting turns (and of ``more`` texts, in the same
        call) into the store's cache."""
        texts = self._texts(self._entries(user)) + list(more)
        if texts:
            self.embedder.for_user(user).encode(texts)

    def index(self, user: str) -> None:
        """The user's waiting turns join its search state (their vectors computed in one call)."""
        with self._lock:
            entries = self._waiting.pop(user, [])
        if entries:
            with background(False):  # under the user's guard: its adds and searches wait for it
                self.embedder.for_user(user).encode(self._texts(entries))
            for marks, turns in entries:
                self.states.extend(user, marks, turns=turns)

    def drop(self, user: str) -> None:
        """Forget the user's waiting turns (its search state was dropped, or the turns purged)."""
        with self._lock:
            self._waiting.pop(user, None)

    def _entries(self, user: str) -> list[tuple[Sequence[tuple[Any, Any]], Sequence[Turn]]]:
        with self._lock:
            return list(self._waiting.get(user, []))

    @staticmethod
    def _texts(entries: Sequence[tuple[Any, Sequence[Turn]]]) -> list[str]:
        return [turn.render() for _, turns in entries for turn in turns]
