"""Opening a store for writing so that a failed start leaves nothing behind.

Opening a SQLite store for writing creates its directory and an empty database. When the command that
opened it fails before anything was committed (a fingerprinter that does not load, an endpoint
without a model), that empty store would stay behind and bind nothing, or worse, a later run
would find a store it did not ask for. ``Memory.open`` removes what it created again in that case
(:func:`fresh_paths`, :func:`discard_if_fresh`, :func:`remove_if_created`): the directory, or, in a
directory that existed without a store (another one given by mistake, say a fingerprinter's
export), the database and lock files. Nothing that existed before, and no store holding a
committed segment, is ever touched.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from retrieval.memory.connection import DB_NAME
from retrieval.memory.errors import StoreError
from retrieval.memory.lock import lock_path
from retrieval.memory.store_contract import Store


def fresh_paths(directory: Path | None, read_only: bool) -> list[Path]:
    """What opening ``directory`` (None: a store on a database server) for writing creates: the
    directory when it does not exist, else the files of a store when it holds none."""
    if directory is None or read_only or (directory / DB_NAME).exists():
        return []
    if not directory.exists():
        return [directory]
    paths = [directory / name for name in (DB_NAME, f"{DB_NAME}-wal", f"{DB_NAME}-shm")]
    return [path for path in [*paths, lock_path(directory, "ingest")] if not path.exists()]


def discard_if_fresh(store: Store, created: list[Path]) -> None:
    """Close ``store`` after a failed start; remove what this run ``created`` for it
    (:func:`fresh_paths`) when it holds no committed segment."""
    empty = bool(created) and not _holds_segments(store)
    store.close()  # before the files go
    remove_if_created(created if empty else [])


def remove_if_created(created: list[Path]) -> None:
    """Remove the directory or files this run ``created`` for a store (:func:`fresh_paths`): those
    that exist (the open may have failed before making them; on a read-only file system even
    removing a missing file fails), and quietly where they cannot go, so the error that ended the
    start is the one reported."""
    for path in created:
        if not (path.exists() or path.is_symlink()):
            continue
        try:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:
            continue


def _holds_segments(store: Store) -> bool:
    try:
        return bool(store.users_with_segments())
    except StoreError:  # a store that cannot even say is kept
        return True
