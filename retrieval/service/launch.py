"""What both command lines (``retrieval.serve``, ``retrieval.mcp``) share: the memory options,
opening the memory, and the one-line failure."""

from __future__ import annotations

import argparse
import ipaddress
from pathlib import Path
from typing import TYPE_CHECKING

from retrieval.memory.targets import store_target

if TYPE_CHECKING:  # imported when a memory is opened: the key commands need none of it
    from retrieval.api.memory import Memory


def add_memory_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", type=store_target, required=True,
                        help="the memory's store directory (created if missing) or PostgreSQL URL")
    parser.add_argument("--fingerprinter", type=Path,
                        help="ISQ fingerprinter directory: adds the codebook route to search")


def open_memory(args: argparse.Namespace) -> Memory:
    """``Memory.open`` with the command line's options."""
    from retrieval.api.memory import Memory

    return Memory.open(args.store, fingerprinter=args.fingerprinter)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
