"""An add's transaction: its turns bound to ids, checked for a replay or a conflict, then appended
to the turn log, and all of it again when another writer added to the user in between.

The ids and the checks read the store before the transaction; another server over the same
database may add to the same user meanwhile (each server orders only its own calls per user).
The append therefore passes what it saw (the ids the caller gave that are already stored, whether
its idempotency key was used) and the store's transaction, under the user's lock, refuses with
:class:`~retrieval.memory.errors.TurnsChanged` when that is no longer so: the add then binds and
checks again, so a key or turn id given on two nodes at once is one replay or one conflict. A
generated id is never a duplicate: one that another writer stored since it was bound is numbered
again inside the transaction (:func:`~retrieval.memory.row_rules.renumber_taken`), where no
writer can take the new one, so adds to one session from several nodes at once all land.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from retrieval.api.errors import MemoryBusy
from retrieval.api.replay import check_replay
from retrieval.api.results import AddResult
from retrieval.memory.errors import TurnsChanged
from retrieval.memory.records import Turn
from retrieval.memory.store_contract import Store

ADD_ATTEMPTS = 10
"""How many times an add binds and checks its turns again before it gives up (:class:`MemoryBusy`)."""


class Appended(NamedTuple):
    """The add's answer, and the turns it stored with its transaction's marks (none for a replay)
    and the user's purge count read before that transaction: arrays computed from the stored
    turns' texts are cached only while it holds (:mod:`retrieval.memory.cache`), so a purge that
    removes them before they are embedded (through another server) leaves none behind."""

    result: AddResult
    stored: list[Turn]
    marks: Sequence[tuple[Any, Any]]
    purges: int = 0


def append_add(store: Store, user: str, session: str, turns: Sequence[Any], key: str | None,
               admit: Callable[[], None] = lambda: None) -> Appended:
    """Bind ``turns`` (checked inputs) to ids, check them and append them in one transaction,
    again while another writer changes the user in between (see the module docstring). ``admit``
    runs before an add that would store a turn (a replay stores none), and may refuse it."""
    given = {turn.turn_id for turn in turns if turn.turn_id is not None}
    for _ in range(ADD_ATTEMPTS):
        bound = store.bind_turn_ids(user, session, turns)
        replayed = check_replay(store, user, bound, given, key)
        if replayed is not None:
            return Appended(AddResult((), (), replayed, replayed=True), [], [])
        known = store.stored_turn_ids(user, [turn.turn_id for turn in bound if turn.turn_id in given])
        generated = [turn.turn_id for turn in bound if turn.turn_id not in given]
        if len(known) < len(bound):
            admit()
        purges = store.purge_count(user)
        try:
            with store.tracking(user) as marks:
                stored = store.append_turns(user, bound, key, known, generated)
        except TurnsChanged:
            continue
        new = {turn.turn_id for turn in stored}
        duplicates = tuple(turn.turn_id for turn in bound
                           if turn.turn_id in given and turn.turn_id not in new)
        return Appended(AddResult(tuple(turn.turn_id for turn in stored), (), duplicates), stored, marks,
                        purges)
    raise MemoryBusy(f"other writers kept adding to user {user!r} while this add was checked ({ADD_ATTEMPTS} "
                     "times); nothing was stored: retry it", "user_id")
