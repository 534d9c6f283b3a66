"""``python -m retrieval.store check --store DIR``: is a store file intact?

Runs SQLite's ``PRAGMA quick_check`` on the store (opened read-only, so it may run beside an
ingest) and prints ``ok`` with the store's counts, or each problem found. Exit status 0 when
intact, 1 when damaged (rebuild the store from its input into a new directory, or restore a
copy), 2 when the store cannot be opened at all (one ``error:`` line).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from retrieval.memory.errors import StoreError
from retrieval.memory.store import AMUStore

SHOWN_PROBLEMS = 20


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m retrieval.store", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="PRAGMA quick_check of the store file")
    check.add_argument("--store", type=Path, required=True, help="store directory")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        with AMUStore(args.store, read_only=True) as store:
            problems = store.integrity_problems()
            counts = None if problems else (len(store.users_with_segments()), store.count())
    except StoreError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if counts is not None:
        print(f"ok: {store.path} ({counts[0]} conversations, {counts[1]} AMUs)")
        return 0
    print(f"damaged: {store.path}; rebuild the store from its input into a new directory, or restore a copy")
    for problem in problems[:SHOWN_PROBLEMS]:
        print(f"  {problem}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
