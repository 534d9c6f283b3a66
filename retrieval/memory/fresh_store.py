"""Opening a store for writing so that a failed start leaves nothing behind.

Opening a SQLite store for writing creates its directory and an empty database. When the command that
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
from retrieval.memory.store_contract import Store


def discard_if_fresh(store: Store, created: Path | None) -> None:
    """Close ``store`` after a failed start; remove the directory this run ``created`` for it
    (None: none, e.g. a store on a database server) when it holds no committed segment."""
    empty = created is not None and not _holds_segments(store)
    store.close()  # before the files go
    remove_if_created(created if empty else None)


def remove_if_created(created: Path | None) -> None:
    """Remove the directory this run ``created`` for a store (None: nothing to remove)."""
    if created is not None and created.is_dir():
        shutil.rmtree(created)


def _holds_segments(store: Store) -> bool:
    try:
        return bool(store.users_with_segments())
    except StoreError:  # a store that cannot even say is kept
        return True
