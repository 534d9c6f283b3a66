"""Pointer forwarding (MemCode key design 4): the AMU that replaces a cluster's members.

- Its id is derived from the sorted ids of the AMUs it replaces, so a rerun after a crash
  builds the same AMU again instead of a duplicate (and the store's unique ids refuse one).
- Its source pointer is the union of the members' turn ids, in conversation order, so every
  source turn stays reachable; it carries the session of its newest statement (the state it
  keeps) and no segment: it belongs to no single segment, so a retried extraction of one of its
  members' segments never archives it.
- It is stated at the newest member's ``observed_at``; when the members' statements span more
  than the configured minutes, its text starts with "[T_start to T_end]".

The store then archives the members with ``successor`` = this id in one transaction
(:meth:`retrieval.memory.store.AMUStore.forward`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from retrieval.consolidation.members import Member
from retrieval.consolidation.operations import Draft, newest
from retrieval.consolidation.prefix import strip_prefix, time_prefix
from retrieval.memory.records import AMU, SourcePointer, names

MERGED_MARK = "c"
"""Merged AMU ids read ``<conversation>:c:<16 hex digits>``."""


def merged_id(user_id: str, member_ids: Sequence[str]) -> str:
    """The deterministic id of the AMU that replaces ``member_ids``."""
    digest = hashlib.sha256("\n".join(sorted(member_ids)).encode()).hexdigest()[:16]
    return f"{user_id}:{MERGED_MARK}:{digest}"


def merged_amu(members: Sequence[Member], draft: Draft, turn_order: Mapping[str, int],
               prefix_min_span: timedelta, offsets: Mapping[str, timedelta]) -> AMU:
    """The AMU ``draft`` makes of the members it names (``turn_order``: turn id -> position in
    the conversation). Its time prefix is on the speaker's clock: shifted by the UTC offset its
    newest turn was given with (``offsets``: turn id -> offset; a turn without one: UTC). Raises
    ``AMUValidationError`` for an invalid draft."""
    chosen = [m for m in members if m.id in set(draft.member_ids)]
    if len(chosen) < 2 or len(chosen) != len(set(draft.member_ids)):
        raise ValueError("a draft must name two or more members of its cluster, "
                         f"not {list(draft.member_ids)}")
    last = newest(chosen)
    firsts = [m.first for m in chosen if m.first is not None]
    user_id = last.amu.source.user_id
    turns = dict.fromkeys(turn_id for m in chosen for turn_id in m.amu.source.turn_ids)
    ordered = tuple(sorted(turns, key=lambda turn_id: turn_order.get(turn_id, len(turn_order))))
    speakers = tuple(dict.fromkeys(speaker for m in chosen for speaker in m.amu.source.speakers))
    source = SourcePointer(user_id, last.amu.source.session_id, ordered, speakers, None)
    shift = next((offsets[turn_id] for turn_id in reversed(last.amu.source.turn_ids) if turn_id in offsets),
                 timedelta(0))
    start, end = _clocked(min(firsts) if firsts else None, last.last, shift)
    text = time_prefix(start, end, prefix_min_span) + strip_prefix(draft.text).strip()
    return AMU(id=merged_id(user_id, [m.id for m in chosen]), text=text,
               memory_type=draft.memory_type,
               source=source, observed_at=last.amu.observed_at, timestamps=draft.timestamps,
               entities=names(draft.entities), tags=names(draft.tags), t_ref=draft.t_ref,
               valid_from=draft.valid_from, valid_to=draft.valid_to)


def _clocked(start: datetime | None, end: datetime | None,
             shift: timedelta) -> tuple[datetime | None, datetime | None]:
    """``start`` and ``end`` on the speaker's clock (``shift``: its UTC offset); both in UTC where
    that clock's time leaves the calendar (an hour before 0001-01-01 00:00 UTC)."""
    try:
        return (None if start is None else start + shift), (None if end is None else end + shift)
    except OverflowError:
        return start, end
