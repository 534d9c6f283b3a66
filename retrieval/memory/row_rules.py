"""Rules both store backends apply to rows, written once: the ids an add's turns are bound to,
a backlog read (after a position, or the open turns a reloaded stream reads first), and the check
that a record's source pointer names its segment. (A job row read back is
:func:`retrieval.memory.job_rows.job_from_row`, beside the row's type.)"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from retrieval.memory.errors import TurnsChanged
from retrieval.memory.reads import turn_from_row
from retrieval.memory.records import BacklogRead

if TYPE_CHECKING:
    from retrieval.memory.records import AMU, SegmentRecord, Turn


class _TurnCounts(Protocol):
    def last_turn_number(self, user: str, session_id: str) -> int: ...
    def stored_turn_ids(self, user: str, turn_ids: Sequence[str]) -> set[str]: ...


def bind_turn_ids(log: _TurnCounts, user: str, session: str, turns: Sequence[Any]) -> list[Turn]:
    """The turns (checked inputs) with ids: the caller's, or ``<session>:<n>`` numbered on from
    ``log``'s :meth:`last_turn_number` (past every number a purged turn id had, so a generated id
    never names a deleted turn's successor), skipping every id stored (a caller may have chosen an
    id of that form) or given in the add."""
    generated = iter(_free_ids(log, user, session, sum(turn.turn_id is None for turn in turns),
                               {turn.turn_id for turn in turns}))
    return [turn.bind(user, session, next(generated) if turn.turn_id is None else turn.turn_id)
            for turn in turns]


def _free_ids(log: _TurnCounts, user: str, session: str, needed: int,
              given: Collection[str | None]) -> list[str]:
    """``needed`` ids ``<session>:<n>`` numbered on from ``log``'s last turn number, none of them
    stored or ``given``."""
    free: list[str] = []
    number = log.last_turn_number(user, session)
    while len(free) < needed:
        candidates = [f"{session}:{number + i + 1}" for i in range(needed - len(free))]
        number += len(candidates)
        taken = log.stored_turn_ids(user, candidates)
        free += [candidate for candidate in candidates if candidate not in taken and candidate not in given]
    return free


def renumber_taken(log: _TurnCounts, user: str, turns: Sequence[Turn], generated: Collection[str],
                   stored: set[str]) -> list[Turn]:
    """Inside an add's transaction, under the user's lock: ``turns`` with each ``generated`` id that
    another writer stored since it was bound (``stored``) numbered again; no writer can take the
    new ones before the transaction ends. A caller's id is never changed."""
    taken = [turn for turn in turns if turn.turn_id in generated and turn.turn_id in stored]
    if not taken:
        return list(turns)
    fresh = dict(zip([turn.turn_id for turn in taken],
                     _free_ids(log, user, taken[0].session_id, len(taken), {t.turn_id for t in turns}),
                     strict=True))
    return [dataclasses.replace(turn, turn_id=fresh[turn.turn_id]) if turn.turn_id in fresh else turn
            for turn in turns]


def unchanged_since_check(stored: set[str], known: Collection[str] | None, key_used: bool) -> None:
    """Inside an add's transaction: :class:`TurnsChanged` when the caller's turn ids stored now
    (``stored``, generated ones left out) are not the ``known`` ones it saw when it checked the
    add, or its idempotency key is used now, since another writer added to the user in between;
    nothing when ``known`` is None."""
    if known is not None and (stored != set(known) or key_used):
        raise TurnsChanged("another writer added turns to this user since the add was checked")


def turns_after(rows: Sequence[Any], after: int) -> BacklogRead:
    """A backlog read after position ``after`` from its rows (in log order, at most the read's limit,
    each with ``stored``, the count of the user's turns after ``after``)."""
    if not rows:
        return BacklogRead([], after)
    return BacklogRead([turn_from_row(row) for row in rows], int(rows[-1]["position"]),
                       int(rows[0]["stored"]) - len(rows))


def open_turns_first(rows: Sequence[Any], uncovered: Collection[str], limit: int | None) -> BacklogRead:
    """Of a user's turn rows in log order, those of ``uncovered`` turns (no committed segment covers
    them), as a stream loaded again reads its backlog (:meth:`retrieval.memory.store_contract.Turns.
    backlog` without ``after``): the first ``limit``, or more where more come before the last
    covered turn, so that every turn after the position read through is uncovered (the next read
    starts there); all of them without ``limit``."""
    open_rows = [row for row in rows if row["turn_id"] in uncovered]
    if limit is not None and limit < len(open_rows):  # the covered turns matter only to a cut
        covered = [int(row["position"]) for row in rows if row["turn_id"] not in uncovered]
        covered_through = max(covered, default=0)
        cut = max(limit, sum(int(row["position"]) < covered_through for row in open_rows))
        if cut < len(open_rows):
            kept = open_rows[:cut]
            return BacklogRead([turn_from_row(row) for row in kept],
                               max(covered_through, int(kept[-1]["position"])), len(open_rows) - cut)
    return BacklogRead([turn_from_row(row) for row in open_rows], int(rows[-1]["position"]) if rows else 0)


def check_sources(record: SegmentRecord, amus: Sequence[AMU]) -> None:
    """``ValueError`` when a record's source pointer names another user, session or segment."""
    for amu in amus:
        src = amu.source
        if (src.user_id, src.session_id, src.segment) != (record.user_id, record.session_id, record.seq):
            raise ValueError(f"AMU {amu.id!r} belongs to {src.user_id!r} {src.session_id!r} "
                             f"segment {src.segment}, not to {record.user_id!r} "
                             f"{record.session_id!r} segment {record.seq}")

