"""What consolidation knows about an active AMU besides its record: the span of times its
statements were made (``observed_at``), followed back through the AMUs it replaced.

A merged AMU states one fact at its newest statement time (its ``observed_at``), but it stands
for every statement forwarded into it; the earliest of those is derived from the ``successor``
chains (no new AMU field), so the time-window gate and the "[T_start to T_end]" prefix of a
later merge see the whole span.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from retrieval.memory.records import AMU
from retrieval.memory.times import time_interval


@dataclass(frozen=True)
class Member:
    """An active AMU with its statement span: ``first`` is the earliest statement time of the AMU
    and of every AMU forwarded into it, ``last`` its own; both None for an undated AMU.
    ``forwarded``: the AMUs forwarded into it, at any depth (what a merge of it must still state,
    as the audit checks)."""

    amu: AMU
    first: datetime | None
    last: datetime | None
    forwarded: tuple[AMU, ...] = ()

    @property
    def id(self) -> str:
        return self.amu.id


def statement_time(amu: AMU) -> datetime | None:
    """When the AMU was stated (the start of its ``observed_at`` interval), or None."""
    return time_interval(amu.observed_at)[0] if amu.observed_at else None


def speaker_key(amu: AMU) -> tuple[str, ...]:
    """Who states the AMU: its source speakers, sorted (a cluster never mixes two keys)."""
    return tuple(sorted(set(amu.source.speakers)))


def members(amus: Iterable[AMU], successors: Mapping[str, str]) -> list[Member]:
    """The active AMUs of ``amus`` (a conversation's AMUs, archived included, in store order) as
    members with their statement spans; ``successors`` maps archived ids to their successors."""
    amus = list(amus)
    predecessors: dict[str, list[str]] = {}
    for old, new in successors.items():
        predecessors.setdefault(new, []).append(old)
    earliest: dict[str, datetime | None] = {}
    history: dict[str, tuple[AMU, ...]] = {}
    by_id = {amu.id: amu for amu in amus}
    # Store order: an AMU is stored after every AMU forwarded into it, so one pass sees each
    # predecessor first (a loop, not recursion: a chain grows by one link a run, without bound).
    for amu in amus:
        before = [p for p in predecessors.get(amu.id, ()) if p in earliest]  # (a corrupt cycle: not yet)
        known = [t for t in [statement_time(amu)] + [earliest[p] for p in before] if t is not None]
        earliest[amu.id] = min(known) if known else None
        history[amu.id] = tuple(old for p in before for old in (by_id[p], *history[p]))
    return [Member(amu, earliest[amu.id], statement_time(amu), history[amu.id]) for amu in amus
            if not amu.archived]
