"""Opening a store for writing so that a failed start leaves nothing behind.

``AMUStore(directory)`` creates the directory and an empty database. When the command that
opened it fails before anything was committed (a fingerprinter that does not load, an endpoint
without a model), that empty store would stay behind and bind nothing, or worse, a later run
would find a store it did not ask for. ``Memory.open`` removes the directory again in that case
(:func:`discard_if_fresh`, :func:`remove_if_created`), and only then: a directory that existed
before, or a store holding a committed segment, is never touched.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from retrieval.memory.errors import StoreError
from retrieval.memory.store import AMUStore


def discard_if_fresh(store: AMUStore, fresh: bool) -> None:
    """Close ``store`` after a failed start; remove its directory when this run created it
    (``fresh``) and it holds no committed segment."""
    empty = fresh and not _holds_segments(store)
    store.close()  # before the files go
    _remove_if(empty, store.directory)


def remove_if_created(directory: Path, fresh: bool) -> None:
    """Remove ``directory`` after a store failed to open in it, when this run created it."""
    _remove_if(fresh, directory)


def _holds_segments(store: AMUStore) -> bool:
    try:
        return bool(store.users_with_segments())
    except StoreError:  # a store that cannot even say is kept
        return True


def _remove_if(condition: bool, directory: Path) -> None:
    if condition and directory.is_dir():
        shutil.rmtree(directory)
