"""Store files readable by their owner only: a store holds every user's memories, and its key file
lists every user, so neither is left to the process's umask (commonly world-readable)."""

from __future__ import annotations

import os
from pathlib import Path

DIRECTORY_MODE = 0o700
FILE_MODE = 0o600


def private_directory(directory: Path) -> None:
    """Make ``directory`` (and its missing parents) when missing; the directory itself owner-only."""
    if not directory.exists():
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(DIRECTORY_MODE)


def private_file(path: Path) -> None:
    """Create ``path`` empty and owner-only when it is missing. SQLite opens an empty file as a new
    database, keeps its mode, and gives the database's ``-wal`` and ``-shm`` files the same one."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
    except FileExistsError:
        pass
