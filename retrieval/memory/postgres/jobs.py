"""Durable background jobs in the PostgreSQL store (the SQLite store's :mod:`retrieval.memory.
job_rows`): one row per job; creating one checks for an unfinished one of the same user, session
and kind under the user's lock, so two processes never queue the same job twice."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from retrieval.memory.job_rows import QUEUED, UNFINISHED, JobRow, job_from_row

if TYPE_CHECKING:
    from retrieval.memory.postgres.database import Database


def _job(row: Any) -> JobRow:
    return job_from_row(row, "user_id")


class Jobs:
    """The ``jobs`` table."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def create_job(self, user: str, session_id: str | None, kind: str) -> tuple[JobRow, bool]:
        """A queued job for (user, session), unless one is unfinished: then that one; and whether it
        was created now."""
        with self.db.transaction([user]) as conn:
            row = conn.execute("SELECT * FROM jobs WHERE user_id = %s AND session_id IS NOT DISTINCT FROM %s "
                               "AND kind = %s AND state = ANY(%s)",
                               (user, session_id, kind, list(UNFINISHED))).fetchone()
            if row is not None:
                return _job(row), False
            now = time.time()
            row = conn.execute("INSERT INTO jobs (user_id, session_id, kind, state, progress, created, "
                               "updated) VALUES (%s, %s, %s, %s, '{}', %s, %s) RETURNING *",
                               (user, session_id, kind, QUEUED, now, now)).fetchone()
        assert row is not None  # RETURNING gives the row
        return _job(row), True

    def update_job(self, job_id: int, state: str, progress: dict[str, Any] | None = None,
                   error: str | None = None) -> None:
        with self.db.transaction() as conn:
            conn.execute("UPDATE jobs SET state = %s, progress = coalesce(%s, progress), error = %s, "
                         "updated = %s WHERE id = %s",
                         (state, None if progress is None else json.dumps(progress), error, time.time(),
                          job_id))

    def job_row(self, job_id: int) -> JobRow | None:
        row = self.db.row("SELECT * FROM jobs WHERE id = %s", (job_id,))
        return None if row is None else _job(row)

    def unfinished(self) -> list[JobRow]:
        """Jobs queued or running, oldest first (to resume after a restart)."""
        return [_job(row) for row in self.db.rows("SELECT * FROM jobs WHERE state = ANY(%s) ORDER BY id",
                                                  (list(UNFINISHED),))]
