"""The one way the store binds a list of values into SQL: ``column IN (?, ?, ...)`` in chunks, so a
query never passes more host parameters than SQLite allows."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

IN_CHUNK = 500
"""Values per ``IN (...)`` list: SQLite's default limit is 999 host parameters per statement, and
the statement's other parameters (a user, a model) need room beside the list."""

T = TypeVar("T")


def in_chunks(values: Sequence[T]) -> Iterator[tuple[str, list[T]]]:
    """``values`` in order, in slices of at most :data:`IN_CHUNK`, each with its placeholder list
    (``"?,?,?"`` for three values) to put inside ``IN (...)``. Nothing for no values."""
    for start in range(0, len(values), IN_CHUNK):
        chunk = list(values[start:start + IN_CHUNK])
        yield ",".join("?" * len(chunk)), chunk
