"""When an ``add`` is a replay, and when it is a conflict.

An idempotency key names one add: given again with the same turns (speaker, text, time, image
caption, and the turn ids the caller gave) on the same session, the add stores nothing and
answers ``replayed`` with the turn ids of the first one; given with anything else it is a
:class:`Conflict`. A turn id names one turn: a stored id given again with the same session,
speaker, text, time and caption is a duplicate (skipped, listed in ``duplicates``); with anything
else it is a :class:`Conflict` naming the turn. Nothing of a conflicting add is stored.
"""

from __future__ import annotations

from collections.abc import Sequence

from retrieval.api.errors import Conflict
from retrieval.memory.records import Turn
from retrieval.memory.store_contract import Store

COMPARED = ("session_id", "speaker", "text", "session_time", "utc_offset", "image_caption")
"""A turn's fields that make it the same turn. The time is the instant (``session_time``, UTC) and
the offset it was given in: the same instant at another offset is another local date, from which
"yesterday" is read."""
CALLED = {"session_time": "time", "utc_offset": "time", "session_id": "session"}
"""The caller's names of the compared fields that differ from the turn's own."""


def difference(stored: Turn, turn: Turn) -> str | None:
    """The first field in which ``turn`` differs from the stored one, as the caller names it."""
    for name in COMPARED:
        if getattr(stored, name) != getattr(turn, name):
            return CALLED.get(name, name)
    return None


def _stored(store: Store, user: str, turn_id: str) -> Turn | None:
    try:
        return store.turn(user, turn_id)
    except KeyError:
        return None


def _same_add(store: Store, user: str, original: Sequence[str], turns: Sequence[Turn],
              given: set[str]) -> bool:
    if len(original) != len(turns):
        return False
    for turn_id, turn in zip(original, turns, strict=True):
        stored = _stored(store, user, turn_id)
        if stored is None or difference(stored, turn) is not None or (turn.turn_id in given
                                                                      and turn.turn_id != turn_id):
            return False
    return True


def check_replay(store: Store, user: str, turns: Sequence[Turn], given: set[str],
                 key: str | None) -> tuple[str, ...] | None:
    """The turn ids the first add of ``key`` stored when this add replays it, None when it is a new
    add; raises :class:`Conflict` for a key or a stored turn id given with another body. ``turns``
    carry their ids (``given``: those the caller chose)."""
    if key is not None:
        original = store.idempotent_turn_ids(user, key)
        if original is not None:
            if not _same_add(store, user, original, turns, given):
                raise Conflict(f"idempotency_key {key!r} was used by an add of other turns or another "
                               "session; a key names one add: use a new key", "idempotency_key")
            return tuple(original)
    for index, turn in enumerate(turns):
        stored = _stored(store, user, turn.turn_id) if turn.turn_id in given else None
        if stored is not None and (changed := difference(stored, turn)) is not None:
            raise Conflict(f"turns[{index}]: turn_id {turn.turn_id!r} is stored with another {changed} "
                           f"(in session {stored.session_id!r}); a turn id names one turn: give this one "
                           "a new turn_id", f"turns.{index}.turn_id")
    return None
