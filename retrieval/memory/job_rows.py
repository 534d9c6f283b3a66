"""Durable background jobs kept in the store (schema 4, table ``jobs``): one row per job with
its user, optional session, kind, state (queued, running, done, failed), progress (JSON) and
error. A job left queued or running by a process that died is found by :meth:`JobRows.unfinished`
and run again (the consolidation engine resumes its saved plan). A part of
:class:`retrieval.memory.store.AMUStore`.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from retrieval.memory.sqlite_part import SQLitePart

QUEUED, RUNNING, DONE, FAILED = "queued", "running", "done", "failed"
UNFINISHED = (QUEUED, RUNNING)


@dataclass(frozen=True)
class JobRow:
    """One stored job."""

    id: int
    user_id: str
    session_id: str | None
    kind: str
    state: str
    progress: dict[str, Any]
    error: str | None
    created: float
    updated: float


def job_from_row(row: Any, user_column: str) -> JobRow:
    """A stored job from its row (read by column name, either backend's; the user's id in
    ``user_column``)."""
    return JobRow(int(row["id"]), row[user_column], row["session_id"], row["kind"], row["state"],
                  json.loads(row["progress"]), row["error"], row["created"], row["updated"])


def _job(row: sqlite3.Row) -> JobRow:
    return job_from_row(row, "conversation_id")


class JobRows(SQLitePart):
    """The ``jobs`` table."""


    def create_job(self, user: str, session_id: str | None, kind: str) -> tuple[JobRow, bool]:
        """A queued job for (user, session), unless one is unfinished: then that one. Returns the job
        and whether it was created now."""
        with self._transaction() as db:
            row = db.execute("SELECT * FROM jobs WHERE conversation_id = ? AND session_id IS ? AND kind = ? "
                             f"AND state IN {UNFINISHED}", (user, session_id, kind)).fetchone()
            if row is not None:
                return _job(row), False
            now = time.time()
            cursor = db.execute("INSERT INTO jobs (conversation_id, session_id, kind, state, progress, "
                                "created, updated) VALUES (?, ?, ?, ?, '{}', ?, ?)",
                                (user, session_id, kind, QUEUED, now, now))
            job_id = cursor.lastrowid
        assert job_id is not None  # an INSERT always sets it
        row = self.job_row(job_id)
        assert row is not None  # just inserted
        return row, True

    def update_job(self, job_id: int, state: str, progress: dict[str, Any] | None = None,
                   error: str | None = None) -> None:
        with self._transaction() as db:
            db.execute("UPDATE jobs SET state = ?, progress = COALESCE(?, progress), error = ?, updated = ? "
                       "WHERE id = ?", (state, None if progress is None else json.dumps(progress), error,
                                        time.time(), job_id))

    def job_row(self, job_id: int) -> JobRow | None:
        row = self._db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else _job(row)

    def unfinished(self) -> list[JobRow]:
        """Jobs queued or running, oldest first (to resume after a restart)."""
        rows = self._db.execute(f"SELECT * FROM jobs WHERE state IN {UNFINISHED} ORDER BY id").fetchall()
        return [_job(row) for row in rows]
