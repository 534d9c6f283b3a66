"""Rules both store backends apply to rows, written once: the ids an add's turns are bound to,
the check that a record's source pointer names its segment, and a job row read back."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from retrieval.memory.job_rows import JobRow
    from retrieval.memory.records import AMU, SegmentRecord, Turn


class _TurnCounts(Protocol):
    def session_turn_count(self, user: str, session_id: str) -> int: ...
    def stored_turn_ids(self, user: str, turn_ids: Sequence[str]) -> set[str]: ...


def bind_turn_ids(log: _TurnCounts, user: str, session: str, turns: Sequence[Any]) -> list[Turn]:
    """The turns (checked inputs) with ids: the caller's, or ``<session>:<n>`` numbered after the
    session's turns stored in ``log``."""
    count = log.session_turn_count(user, session)
    taken = log.stored_turn_ids(user, [f"{session}:{count + i + 1}" for i in range(len(turns))])
    bound, number, given = [], count, {turn.turn_id for turn in turns}
    for turn in turns:
        turn_id = turn.turn_id
        while turn_id is None:
            number += 1
            candidate = f"{session}:{number}"
            if candidate not in taken and candidate not in given:
                turn_id = candidate
        bound.append(turn.bind(user, session, turn_id))
    return bound


def check_sources(record: SegmentRecord, amus: Sequence[AMU]) -> None:
    """``ValueError`` when a record's source pointer names another user, session or segment."""
    for amu in amus:
        src = amu.source
        if (src.user_id, src.session_id, src.segment) != (record.user_id, record.session_id, record.seq):
            raise ValueError(f"AMU {amu.id!r} belongs to {src.user_id!r} {src.session_id!r} "
                             f"segment {src.segment}, not to {record.user_id!r} "
                             f"{record.session_id!r} segment {record.seq}")


def job_from_row(row: Mapping[str, Any], user_column: str) -> JobRow:
    """A stored job from its row (the user's id in ``user_column``)."""
    from retrieval.memory.job_rows import JobRow

    return JobRow(int(row["id"]), row[user_column], row["session_id"], row["kind"], row["state"],
                  json.loads(row["progress"]), row["error"], row["created"], row["updated"])
