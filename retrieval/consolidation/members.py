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
    and of every AMU forwarded into it, ``last`` its own; both None for an undated AMU."""

    amu: AMU
    first: datetime | None
    last: datetime | None

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
    by_id = {amu.id: amu for amu in amus}
    earliest: dict[str, datetime | None] = {}

    def first(unit_id: str) -> datetime | None:
        if unit_id not in earliest:
            earliest[unit_id] = None  # guards a (corrupt) cycle
            times = [statement_time(by_id[unit_id])] + [first(p) for p in predecessors.get(unit_id, ())
                                                        if p in by_id]
            known = [t for t in times if t is not None]
            earliest[unit_id] = min(known) if known else None
        return earliest[unit_id]

    return [Member(amu, first(amu.id), statement_time(amu)) for amu in amus if not amu.archived]
