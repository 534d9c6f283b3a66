"""Opening a store for writing so that a failed start leaves nothing behind.

``AMUStore(directory)`` creates the directory and an empty database. When the command that
opened it fails before anything was committed (a fingerprinter that does not load, an endpoint
without a model), that empty store would stay behind and bind nothing, or worse, a later run
would find a store it did not ask for. :func:`writable_store` removes the directory again in
that case, and only then: a directory that existed before, or a store holding a committed
segment, is never touched.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from retrieval.memory.errors import StoreError
from retrieval.memory.store import AMUStore


@contextmanager
def writable_store(directory: str | Path, **options: object) -> Iterator[AMUStore]:
    """``AMUStore(directory, **options)`` as a context manager that removes the directory it
    created when the block raises before any segment was committed."""
    directory = Path(directory)
    fresh = not directory.exists()
    try:
        store = AMUStore(directory, **options)  # type: ignore[arg-type]
    except BaseException:
        _remove_if(fresh, directory)
        raise
    try:
        yield store
    except BaseException:
        empty = fresh and not _holds_segments(store)
        store.close()  # before the files go
        _remove_if(empty, directory)
        raise
    store.close()


def _holds_segments(store: AMUStore) -> bool:
    try:
        return bool(store.conversations())
    except StoreError:  # a store that cannot even say is kept
        return True


def _remove_if(condition: bool, directory: Path) -> None:
    if condition and directory.is_dir():
        shutil.rmtree(directory)
