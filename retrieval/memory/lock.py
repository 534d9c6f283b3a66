"""One writer of each kind per store: an advisory lock file held while a store is open for
writing. The kernel releases it when the process ends, however it ends (a SIGKILL included),
so a crashed writer never leaves a stale lock behind."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from retrieval.memory.errors import StoreBusy
from retrieval.memory.private import FILE_MODE

_HELD_HERE: set[str] = set()
"""The lock files this process holds (a refusal names this process, not a pid read from a file
another thread may not have written yet, or that another container's process shares)."""


def lock_path(directory: Path, role: str) -> Path:
    """The lock file of ``role``'s writer in a store directory."""
    return directory / f".{role}.lock"


class WriterLock:
    """``<directory>/.<role>.lock``, held exclusively from :meth:`acquire` to :meth:`release`."""

    def __init__(self, directory: Path, role: str) -> None:
        self.path = lock_path(directory, role)
        self.role = role
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if self._key in _HELD_HERE:
                raise StoreBusy(f"{self.path.parent} is open for {self.role} in this process already; "
                                "close that memory or store first, or use it") from None
            raise StoreBusy(f"{self.path.parent} is open for {self.role} by another process (pid {holder}); "
                            "wait for it to finish, or use another store") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        _HELD_HERE.add(self._key)

    def release(self) -> None:
        if self._fd is not None:
            _HELD_HERE.discard(self._key)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    @property
    def _key(self) -> str:
        return str(self.path.resolve())
