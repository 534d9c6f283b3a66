"""Store files readable by their owner only: a store holds every user's memories, and its key file
lists every user, so neither is left to the process's umask (commonly world-readable), nor kept in
a directory another user may write into (who could plant the database, its lock or its log there,
or a link to another file, and read or rewrite what the store writes)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from retrieval.memory.errors import StoreError

DIRECTORY_MODE = 0o700
FILE_MODE = 0o600


def private_directory(directory: Path) -> None:
    """Make ``directory`` (and its missing parents) when missing; the directory itself owner-only.
    :class:`StoreError` for one that another user may write into: owned by someone other than this
    process's user (or root), or writable by its group or by all."""
    if not directory.exists():
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(DIRECTORY_MODE)
    status = directory.stat()
    if status.st_uid not in (os.geteuid(), 0):
        raise StoreError(f"{directory} is owned by another user (uid {status.st_uid}), who could read and "
                         "change what is stored there: run this as that user, or give the store a "
                         "directory of your own")
    if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise StoreError(f"{directory} may be written by other users (mode {stat.filemode(status.st_mode)}), "
                         f"who could read and change what is stored there: chmod go-w {directory}, or give "
                         "the store a directory of its own")


def private_file(path: Path) -> None:
    """Create ``path`` empty and owner-only when it is missing. SQLite opens an empty file as a new
    database, keeps its mode, and gives the database's ``-wal`` and ``-shm`` files the same one."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
    except FileExistsError:
        pass
