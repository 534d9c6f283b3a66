"""One writer of each kind per store: an advisory lock file held while a store is open for
writing. The kernel releases it when the process ends, however it ends (a SIGKILL included),
so a crashed writer never leaves a stale lock behind."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

from retrieval.memory.errors import StoreBusy
from retrieval.memory.private import FILE_MODE

_HELD_HERE: set[tuple[int, int] | None] = set()
"""The lock files this process holds, by device and inode (a refusal names this process, not a
pid read from a file another thread may not have written yet, or that another container's process
shares); emptied in a forked child, which holds none of them."""
_HELD_GUARD = threading.Lock()


def _forked() -> None:
    """In a forked child: it holds no lock file, and no thread of it holds the guard."""
    global _HELD_GUARD
    _HELD_HERE.clear()
    _HELD_GUARD = threading.Lock()


os.register_at_fork(after_in_child=_forked)


def lock_path(directory: Path, role: str) -> Path:
    """The lock file of ``role``'s writer in a store directory."""
    return directory / f".{role}.lock"


class WriterLock:
    """``<directory>/.<role>.lock``, held exclusively from :meth:`acquire` to :meth:`release`; the
    file says who holds it: the pid, then ``mark`` (what the holder's code is, :func:`other_writer`)."""

    def __init__(self, directory: Path, role: str, mark: str = "") -> None:
        self.path = lock_path(directory, role)
        self.role, self.mark = role, mark
        self._fd: int | None = None
        self._file: tuple[int, int] | None = None
        self._owner = 0
        """The process that took the lock (a forked child inherits the object, not the lock)."""

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        file = _identity(fd)
        with _HELD_GUARD:  # taking the lock and noting it are one step for this process's threads
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)[0]
                os.close(fd)
                if file in _HELD_HERE:
                    raise StoreBusy(f"{self.path.parent} is open for {self.role} in this process already; "
                                    "close that memory or store first, or use it") from None
                raise StoreBusy(f"{self.path.parent} is open for {self.role} by another process (pid "
                                f"{holder}): wait for it to finish or stop it (a server holds its store "
                                "until it stops), or use another store") from None
            try:
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()} {self.mark}".strip().encode())
            except BaseException:  # a full disk, say: give the lock back rather than hold it unseen
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
                raise
            self._fd, self._file, self._owner = fd, file, os.getpid()
            _HELD_HERE.add(file)

    def release(self) -> None:
        with _HELD_GUARD:
            if self._fd is not None:
                _HELD_HERE.discard(self._file)
                if self._owner == os.getpid():  # a forked child shares the parent's lock: not its to free
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
                os.close(self._fd)
                self._fd, self._file = None, None


def other_writer(directory: Path, role: str, mark: str) -> tuple[str, str] | None:
    """A writer of another role than ``role`` that another process holds open on the store in
    ``directory`` and whose lock does not carry ``mark`` (code other than this), as (its role, its
    pid), or None. Each other role's lock is taken and given back at once to see whether it is free
    (``flock`` has no other test), so a process taking it in that moment is refused as busy: ask
    only where it matters, before a migration."""
    for path in sorted(directory.glob(".*.lock")):
        other = path.name[1:-len(".lock")]
        if other == role:
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            with _HELD_GUARD:
                if _identity(fd) in _HELD_HERE:
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    pid, held_mark = _holder(fd)
                    if held_mark == mark:
                        continue
                    return other, pid
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    return None


def _holder(fd: int) -> tuple[str, str]:
    """The pid and the mark a lock file holds ("unknown" for a pid not written yet)."""
    pid, _, mark = os.pread(fd, 64, 0).decode(errors="replace").strip().partition(" ")
    return pid or "unknown", mark


def _identity(fd: int) -> tuple[int, int]:
    """The lock file as the kernel knows it (device and inode), however its path was spelled."""
    status = os.fstat(fd)
    return status.st_dev, status.st_ino
