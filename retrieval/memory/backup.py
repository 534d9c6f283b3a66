"""A consistent copy of a SQLite store directory, taken while the store is in use: each SQLite
database in it (the memory's ``amus.sqlite3``, the service's ``keys.sqlite``) through SQLite's
online backup, which copies one snapshot of the database whatever its writers commit meanwhile
(a plain copy of a database file and its write-ahead log, taken while they change, can tear);
every other file and directory (the LLM answers' cache) as it is. The writers' lock files and the
databases' ``-wal`` and ``-shm`` files are left out: the copies hold every committed page. The
copy, like any, keeps what the store's users delete after it was taken."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from retrieval.memory.connection import DB_NAME, missing_store, read_only_connection
from retrieval.memory.errors import StoreError
from retrieval.memory.private import private_directory, private_file

SQLITE_HEADER = b"SQLite format 3\x00"
LEFT_OUT = ("-wal", "-shm", "-journal", ".lock")
"""Endings of the files a copy leaves out."""


def back_up(source: Path, target: Path) -> list[str]:
    """Copy the store directory ``source`` into ``target`` (a new or empty directory, made
    owner-only as a store's is); the names copied, in order. :class:`StoreError` when ``source``
    holds no store or ``target`` holds anything."""
    if (problem := missing_store(source)) is not None:
        raise StoreError(problem)
    if target.resolve() == source.resolve() or (target.is_dir() and any(target.iterdir())):
        raise StoreError(f"{target} is not empty: back up into a new directory")
    if target.exists() and not target.is_dir():
        raise StoreError(f"{target} is a file: back up into a new directory")
    private_directory(target)
    copied = []
    for path in sorted(source.iterdir(), key=lambda path: path.name != DB_NAME):  # the memory first
        if path.name.endswith(LEFT_OUT) or path.is_symlink():
            continue
        if path.is_dir():
            shutil.copytree(path, target / path.name)
        elif _is_database(path):
            _copy_database(path, target / path.name)
        else:
            shutil.copy2(path, target / path.name)
        copied.append(path.name)
    return copied


def _is_database(path: Path) -> bool:
    with path.open("rb") as handle:
        return handle.read(len(SQLITE_HEADER)) == SQLITE_HEADER


def _copy_database(path: Path, copy: Path) -> None:
    """One snapshot of the database at ``path`` written to ``copy`` (owner-only)."""
    reader, _ = read_only_connection(path, lambda uri: sqlite3.connect(uri, uri=True),
                                     sqlite3.OperationalError)
    private_file(copy)
    writer = sqlite3.connect(copy)
    try:
        reader.backup(writer)
    except sqlite3.Error as err:
        raise StoreError(f"cannot copy {path}: {err}") from None
    finally:
        writer.close()
        reader.close()
