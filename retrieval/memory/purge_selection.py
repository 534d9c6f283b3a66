"""What a purge removes and rewrites, decided from the user's rows as the purge reads them, one
rule for both backends (:mod:`retrieval.memory.purge` says what derives from what; each backend's
purge applies the :class:`Selection` in its own transaction): the segments touched and dropped,
the records deleted and restored, the event frames' past member texts, where the flushes that
named a purged turn move (:func:`moved_flushes`), and the numbers the user's ids count on from
after it (:func:`id_marks`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from retrieval.memory.reads import amu_from_row, json_lists
from retrieval.memory.records import AMU, SegmentRecord, Turn


@dataclass(frozen=True)
class Stored:
    """One AMU row as the purge reads it: what the selection looks at in every row, and the
    record itself, decoded when first asked for (a purge needs few of a user's records whole)."""

    position: int
    id: str
    segment: int | None
    turn_ids: tuple[str, ...]
    archived: bool
    successor: str | None
    row: Any = field(repr=False, compare=False)

    @cached_property
    def amu(self) -> AMU:
        return amu_from_row(self.row)


def stored_rows(rows: Sequence[Any]) -> list[Stored]:
    """The user's record rows (the record columns, ``position`` and ``successor``) as the purge
    reads them: decoding all of a user's records whole (100,000 of them: 2.2 s) would hold every
    other writer of the store for as long."""
    turn_ids = json_lists([row["turn_ids"] for row in rows])
    return [Stored(int(row["position"]), row["id"], row["segment"], tuple(turns), bool(row["archived"]),
                   row["successor"], row) for row, turns in zip(rows, turn_ids, strict=True)]


def frame_states(members: Sequence[Stored], position: dict[str, int]) -> list[list[str]]:
    """The member texts (store order) of a segment's event frame after each insert or archive that
    changed it, and now, from the segment's records (``members``, in store order) and every
    record's ``position`` by id: an AMU is a member from its position until its successor's
    (archived without one: until the segment's next AMU, a retried extraction)."""
    spans: list[tuple[int, int | None, str]] = []
    for row in members:
        end = None
        if row.archived:
            end = (position.get(row.successor) if row.successor is not None
                   else next((o.position for o in members if o.position > row.position), None))
        spans.append((row.position, end, row.amu.text))
    times = sorted({t for start, end, _ in spans for t in (start, end) if t is not None})
    states = [[text for start, end, text in spans if start <= t and (end is None or t < end)] for t in times]
    states.append([row.amu.text for row in members if not row.archived])
    return [state for state in states if state]


def moved_flushes(segments: Sequence[SegmentRecord], gone: set[str],
                  log: Callable[[], Iterable[str]]) -> list[tuple[str | None, int]]:
    """(new ``flushed_after``, segment number) of each of the user's ``segments`` whose flush
    names a turn that goes: the nearest earlier turn of the ``log`` (the user's turn ids in order,
    read only when needed) that stays, so the flush keeps its place among the turns left; None
    where no earlier turn stays."""
    named = {s.flushed_after for s in segments if s.flushed_after in gone}
    if not named:
        return []
    place: dict[str, str | None] = {}
    kept = None
    for turn_id in log():
        if turn_id in named:
            place[turn_id] = kept
        if turn_id not in gone:
            kept = turn_id
    return [(place.get(s.flushed_after), s.seq) for s in segments if s.flushed_after in named]


MARKED_TURN_NUMBERS = 2**63 - 1
"""Turn numbers below this are marked when purged (one past it is the largest integer both stores'
columns hold). Numbering counts on from the turns stored, so only a caller's own ids get there,
and the mark leaves them out; after a caller's purged id of 2**63 - 2, the generated 2**63 - 1
cannot be marked and is given again once purged."""


def id_marks(segments: Sequence[SegmentRecord], turns: Sequence[Turn]) -> tuple[int, int]:
    """What a purge of ``turns`` among the user's ``segments`` (all of them, before it) raises the
    user's ``purges`` row's marks to: one past its highest segment number (``next_seq``), and one
    past the highest ``<n>`` below :data:`MARKED_TURN_NUMBERS` of a purged turn id
    ``<session>:<n>`` (``next_turn``; 0 when none)."""
    numbers = [int(n) for turn in turns if turn.turn_id.startswith(f"{turn.session_id}:")
               and (n := turn.turn_id.removeprefix(f"{turn.session_id}:")).isascii() and n.isdigit()]
    return (max((s.seq + 1 for s in segments), default=0),
            max((n + 1 for n in numbers if n < MARKED_TURN_NUMBERS), default=0))


def named_records(stored: Sequence[Stored], amu_ids: Sequence[str]) -> tuple[set[str], list[str]]:
    """The ids of the stored records among ``amu_ids`` and the turn ids they were extracted from
    (a record's purge takes its source turns with it)."""
    wanted = set(amu_ids)
    named = {row.id for row in stored if row.id in wanted}
    return named, [turn for row in stored if row.id in named for turn in row.turn_ids]


@dataclass(frozen=True)
class Selection:
    """What a purge removes and rewrites, decided from the user's rows alone (one rule for every
    backend): the segments it touches, those it drops whole, the records it deletes, the archived
    records it restores (their successor goes) and the event frames' past member texts."""

    everything: bool
    segments: list[SegmentRecord]
    touched: list[SegmentRecord]
    dropped: set[int]
    chosen: list[Stored]
    restored: list[Stored]
    frames: list[list[str]]

    @property
    def chosen_ids(self) -> set[str]:
        return {row.id for row in self.chosen}

    @property
    def carried(self) -> int | None:
        """The number of the first touched segment: the extractor's disambiguation state of every
        later segment is cleared, since it was carried from segment to segment through that one
        (None: no segment touched)."""
        return min((s.seq for s in self.touched), default=None)

    @property
    def kept(self) -> list[SegmentRecord]:
        """Touched segments that keep some of their turns."""
        return [s for s in self.touched if s.seq not in self.dropped]

    @property
    def frames_kept(self) -> set[str]:
        """The event-frame keys (segment numbers) of the segments that stay."""
        return {str(s.seq) for s in self.segments if s.seq not in self.dropped}


def select(stored: Sequence[Stored], segments: list[SegmentRecord], gone: set[str], named: set[str],
           everything: bool) -> Selection:
    """The :class:`Selection` of a purge of the turns ``gone`` and the records ``named`` (or of
    ``everything``) among the user's ``stored`` records and ``segments``."""
    touched = [s for s in segments if everything or gone.intersection(s.turn_ids)]
    dropped = {s.seq for s in touched if everything or gone.issuperset(s.turn_ids)}
    chosen = [row for row in stored if everything or row.id in named
              or row.segment in dropped or gone.intersection(row.turn_ids)]
    chosen_ids = {row.id for row in chosen}
    restored = [row for row in stored if row.successor in chosen_ids and row.id not in chosen_ids]
    position = {row.id: row.position for row in stored}
    by_segment: dict[int | None, list[Stored]] = {}
    for row in stored:  # once, not once per segment: a purge of everything touches them all
        by_segment.setdefault(row.segment, []).append(row)
    frames = [state for s in touched for state in frame_states(by_segment.get(s.seq, []), position)]
    return Selection(everything, segments, touched, dropped, chosen, restored, frames)
