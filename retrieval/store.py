"""``python -m retrieval.store``: look after a store.

    python -m retrieval.store check   --store DIR|URL   # is the store intact?
    python -m retrieval.store compact --store DIR|URL   # leave no trace of deleted data in its files
    python -m retrieval.store backup  --store DIR --to NEW_DIR   # a consistent copy, while it is in use

``check`` runs the store's integrity check (SQLite's ``PRAGMA quick_check`` and the schema's
tables, none missing, none another program's nor a trigger of the schema changed: on PostgreSQL,
the tables, views and rules of the store's schema and the triggers on its tables; opened read-only,
so it may run beside an ingest) and prints ``ok`` with the store's counts, or each problem found:
exit status 0 when intact, 1 when damaged (rebuild the store from its input into a new directory,
or restore a copy). ``compact`` does what a purge does after it
deletes (:meth:`retrieval.memory.purge.Purge.compact`: the FTS5 index rewritten without deleted
terms, the database file rebuilt with freed pages zeroed, the write-ahead log truncated), so no
deleted text stays in any file of the store directory; on PostgreSQL every table rewritten with
``VACUUM FULL``, then a ``CHECKPOINT``. Either command exits with status 2 and one ``error:``
line when the store cannot be opened or compacted (``compact`` of a directory that holds no store
creates none). ``backup`` copies a SQLite store directory into a new one while servers and
ingestion use it (:mod:`retrieval.memory.backup`: each database through SQLite's online backup,
then ``PRAGMA quick_check`` of the copy); a PostgreSQL store is backed up with ``pg_dump``.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from retrieval.memory.backends import open_store
from retrieval.memory.backup import back_up
from retrieval.memory.connection import missing_store
from retrieval.memory.errors import StoreError
from retrieval.memory.targets import local_directory, redacted, store_target

SHOWN_PROBLEMS = 20


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m retrieval.store", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="integrity check of the store (PRAGMA quick_check)")
    compact = commands.add_parser("compact", help="leave no trace of deleted data in the store's files")
    backup = commands.add_parser("backup", help="a consistent copy of a SQLite store, while it is in use")
    for command in (check, compact, backup):
        command.add_argument("--store", type=store_target, required=True, help="store directory or URL")
    backup.add_argument("--to", type=Path, required=True, help="new (or empty) directory for the copy")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"compact": compact, "backup": backup, "check": check}[args.command](args)
    except (StoreError, OSError) as err:  # OSError: a directory the command may not read or write
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def check(args: argparse.Namespace) -> int:
    with open_store(args.store, read_only=True) as store:
        problems = store.integrity_problems()
        counts = None if problems else (len(store.users()), store.count())  # users with turns stored
    if counts is not None:
        print(f"ok: {store.location} (users: {counts[0]}, AMUs: {counts[1]})")
        return 0
    print(f"damaged: {store.location}; rebuild the store from its input into a new directory, "
          "or restore a copy")
    for problem in problems[:SHOWN_PROBLEMS]:
        print(f"  {problem}")
    return 1


def compact(args: argparse.Namespace) -> int:
    missing = missing_store(local_directory(args.store))
    if missing is not None:  # a typo must not make a new store
        raise StoreError(missing)
    with open_store(args.store) as store:
        done = store.compact()
    if not done:
        print(f"not finished: {store.location}: a reader of an older snapshot (another process's long "
              "read) kept the write-ahead log; run this again once it ends (the compaction stays owed)")
        return 1
    print(f"compacted: {store.location}")
    return 0


def backup(args: argparse.Namespace) -> int:
    source = local_directory(args.store)
    if source is None:
        raise StoreError(f"{redacted(args.store)} is a PostgreSQL store: back it up with pg_dump")
    # SIGTERM (timeout, systemd, docker stop) ends the backup as Ctrl-C does, so that its partial
    # copy is removed: exit status 143
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        copied = back_up(source, args.to)
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(f"backed up {source} to {args.to}: {', '.join(copied)} (each passed PRAGMA quick_check)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
