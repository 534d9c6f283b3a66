"""A consistent copy of a SQLite store directory, taken while the store is in use: each SQLite
database in it (the memory's ``amus.sqlite3``, the service's ``keys.sqlite``) through SQLite's
online backup, which copies one snapshot of the database whatever its writers commit meanwhile
(a plain copy of a database file and its write-ahead log, taken while they change, can tear),
then checked (``PRAGMA quick_check``, whatever the store's schema version).

Left out: the writers' lock files, the databases' ``-wal`` and ``-shm`` files (the copies hold
every committed page) and the LLM answers' cache (a cache: a restored store asks the endpoint
again). A snapshot in which a delete or forget owes its compaction still holds the deleted text
in its pages: the copy is taken again until the store's writer has compacted (it does within
seconds, :data:`retrieval.api.compaction.COMPACT_AFTER_S`), or refused after
:data:`COMPACTED_WAIT_S`. The copy is made in a staging directory beside the target, created
owner-only under a name no one can foresee (``.TARGET.partial-`` and random letters: one planted
in a shared folder is never used), and moved into place whole, so an interrupted or failed backup
leaves no partial copy (one killed outright leaves its staging directory, which the next backup
into the same folder removes, whatever its target: a copy of every user's data that no delete
reaches). Like any copy, it keeps what the store's users delete after it was taken."""

from __future__ import annotations

import fcntl
import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from retrieval.memory.connection import DB_NAME, missing_store, read_only_connection
from retrieval.memory.errors import StoreError
from retrieval.memory.meta_keys import COMPACTION_OWED
from retrieval.memory.private import private_file

SQLITE_HEADER = b"SQLite format 3\x00"
COMPACTED_WAIT_S = 120.0
"""How long a backup waits for the compaction a delete or forget owes before it refuses: past a
writer's retry of a compaction a reader held up (:data:`retrieval.api.compaction.COMPACT_RETRY_S`)
and the spacing after a long one (:data:`retrieval.api.compaction.COMPACT_SPACING`)."""
RETRY_S = 0.5
STAGING = ".partial-"
"""Between the target's name and the random letters of its staging directory's name (the backup's
process id, in earlier versions)."""
STAGING_MARK = ".isq-backup-staging"
"""The empty file a staging directory holds while its backup runs, locked by it (:func:`_held`):
a directory named alike without one is not a backup's to remove."""


def back_up(source: Path, target: Path) -> list[str]:
    """Copy the store directory ``source`` into ``target`` (a new or empty directory outside
    ``source``; the copy owner-only, as a store is); the names copied. :class:`StoreError` when
    ``source`` holds no store, ``target`` is not a new or empty directory, or a copy fails."""
    if (problem := missing_store(source)) is not None:
        raise StoreError(problem)
    _check_target(source, target)
    databases = sorted((path for path in source.iterdir() if _is_database(path)),
                       key=lambda path: path.name != DB_NAME)  # the memory first
    target.parent.mkdir(parents=True, exist_ok=True)
    _drop_abandoned(target)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}{STAGING}", dir=target.parent))  # mode 0700
    mark = staging / STAGING_MARK
    try:
        with _held(mark):
            for path in databases:
                _copy_database(path, staging / path.name)
            mark.unlink()
            staging.rename(target)  # onto a missing or empty directory
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return [path.name for path in databases]


@contextmanager
def _held(mark: Path) -> Iterator[None]:
    """The staging directory's mark, created and locked (``flock``) while the backup runs: the lock,
    which the system drops when the process ends however it ends, tells a running backup's staging
    directory from an abandoned one, also across PID namespaces (a container's backup into the
    host's folder), where a process id names no process. The mark is locked under another name,
    then renamed: no other backup sees it unlocked."""
    locking = mark.with_name(mark.name + ".new")
    handle = os.open(locking, os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        locking.rename(mark)
        yield
    finally:
        os.close(handle)


def _drop_abandoned(target: Path) -> None:
    """Remove the staging directories of earlier backups into ``target``'s folder that no backup
    runs in any more (killed: nothing ran its clean-up), which would keep a copy of every user's
    data beside it, out of reach of every delete: those whose :data:`STAGING_MARK` nobody holds,
    whatever their target (backups into dated targets never name one twice), and those of earlier
    versions, unmarked, named after ``target`` itself with the id of a process that is gone."""
    own = f".{target.name}{STAGING}"
    for left in target.parent.glob(f".*{STAGING}*"):
        if left.is_symlink() or not left.is_dir():
            continue
        pid, mark = left.name.rsplit("-", 1)[-1], left / STAGING_MARK
        if mark.is_file():
            abandoned = _unheld(mark)
        else:
            abandoned = left.name.startswith(own) and pid.isdigit() and not _running(int(pid))
        if abandoned:
            shutil.rmtree(left, ignore_errors=True)


def _unheld(mark: Path) -> bool:
    """Whether no running backup holds ``mark`` (:func:`_held`)."""
    try:
        handle = os.open(mark, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(handle)
    return True


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _check_target(source: Path, target: Path) -> None:
    resolved = target.resolve()
    if source.resolve() in (resolved, *resolved.parents):
        raise StoreError(f"{target} is inside the store {source}: back up into a directory outside it")
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise StoreError(f"{target} is not a directory: back up into a new directory")
    if target.is_dir() and any(target.iterdir()):
        raise StoreError(f"{target} is not empty: back up into a new directory")


def _is_database(path: Path) -> bool:
    """A SQLite database file (a link to one too), not its ``-wal`` or ``-shm`` file."""
    if not path.is_file():
        return False
    try:
        with path.open("rb") as handle:
            return handle.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    except OSError:
        return False


def _copy_database(path: Path, copy: Path) -> None:
    """One snapshot of the database at ``path`` written to ``copy`` (owner-only) and checked,
    taken again while it owes a compaction (see the module docstring)."""
    deadline = time.monotonic() + COMPACTED_WAIT_S
    while True:
        private_file(copy)
        if not _snapshot(path, copy):
            return
        copy.unlink()  # not kept while waiting: it holds what the delete removed
        if time.monotonic() >= deadline:
            raise StoreError(f"{path} still owes the compaction of a delete or forget after "
                             f"{COMPACTED_WAIT_S:.0f} s (no writer has the store open, or a long read "
                             "keeps its write-ahead log): run `python -m retrieval.store compact` on it, "
                             "then back it up again")
        time.sleep(RETRY_S)


def _reading(uri: str) -> sqlite3.Connection:
    """A read-only connection at ``uri`` that has read the schema: SQLite opens lazily, so only a
    read tells whether the file can be read this way (on read-only media without the WAL index
    file it cannot, and :func:`read_only_connection` must see that to open it immutable)."""
    db = sqlite3.connect(uri, uri=True)
    try:
        db.execute("SELECT 1 FROM sqlite_master LIMIT 1")
    except sqlite3.Error:
        db.close()
        raise
    return db


def _snapshot(path: Path, copy: Path) -> bool:
    """Copy the database at ``path`` into ``copy`` and check the copy; whether it owes a
    compaction."""
    try:
        reader, _ = read_only_connection(path, _reading, sqlite3.OperationalError)
    except sqlite3.Error as err:
        raise StoreError(f"cannot read {path}: {err}") from None
    writer = sqlite3.connect(copy)
    try:
        reader.backup(writer)
        problems = [row[0] for row in writer.execute("PRAGMA quick_check")]
        has_meta = writer.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'")
        owed = has_meta.fetchone() is not None and writer.execute("SELECT 1 FROM meta WHERE key = ?",
                                                                  (COMPACTION_OWED,)).fetchone() is not None
    except sqlite3.Error as err:
        raise StoreError(f"cannot copy {path}: {err}") from None
    finally:
        writer.close()
        reader.close()
    if problems != ["ok"]:
        raise StoreError(f"{path} is damaged ({' '.join(problems[0].split())}); nothing was backed up")
    return owed
