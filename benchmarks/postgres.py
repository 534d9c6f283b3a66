"""The benchmarks' PostgreSQL comparison (``--database URL``): the same figures with the memory in
that database beside the SQLite ones of the same run, and the goal on their ratio. The database
should be empty and kept for the benchmark: each memory's users are written there under names of
their own (``LABEL.USER``), so the memories of one run never meet."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from benchmarks.timing import Goal

MAX_P50_RATIO = 1.5
"""Goal: a search's p50 with the memory in PostgreSQL at most this many times SQLite's."""
RATIO = "p50_ratio_to_sqlite"


def unreachable(url: str | None) -> str | None:
    """Why the ``--database`` the benchmark was given cannot be used (None: it can, or none was
    given): asked before any work, not after the SQLite half of a run."""
    if url is None:
        return None
    import psycopg

    try:
        psycopg.connect(url, connect_timeout=10).close()
    except psycopg.Error as err:
        return f"--database: cannot connect ({str(err).strip().splitlines()[-1]})"
    return None


def holds_store(url: str) -> bool:
    """Whether the database at ``url`` (reachable: :func:`unreachable`) holds a store already."""
    import psycopg

    with psycopg.connect(url, connect_timeout=10) as connection:
        row = connection.execute("SELECT to_regclass('turns') IS NOT NULL").fetchone()
    return bool(row and row[0])


def labelled(label: str, users: Mapping[str, int]) -> dict[str, int]:
    """``users`` renamed into one memory's own names in the shared database."""
    return {f"{label}.{user}": count for user, count in users.items()}


def with_sqlite_ratio(postgres: Mapping[str, Any], sqlite: Mapping[str, Any]) -> dict[str, Any]:
    """PostgreSQL's figures with the ratio of its search p50 to SQLite's in the same run."""
    return {**postgres, RATIO: postgres["p50_ms"] / sqlite["p50_ms"]}


def ratio_goals(parent: str, labels: Iterable[str]) -> tuple[Goal, ...]:
    """One goal on the p50 ratio of each memory measured under ``parent`` in the figures."""
    return tuple(Goal(f"{parent}.{label}.{RATIO}", "<=", MAX_P50_RATIO) for label in labels)
