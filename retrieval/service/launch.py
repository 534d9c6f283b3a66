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
    parser.add_argument("--threads", type=positive_int,
                        help="threads of this process's model forwards (default: torch's, one per core); "
                             "processes sharing a machine's cores should split them")


def open_memory(args: argparse.Namespace) -> Memory:
    """``Memory.open`` with the command line's options; ``--threads`` bounds torch's intra-op
    threads first (several processes each running as many threads as the machine has cores
    oversubscribe its cores: their forwards slow each other down)."""
    from retrieval.api.memory import Memory

    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    return Memory.open(args.store, fingerprinter=args.fingerprinter)


def positive_int(text: str) -> int:
    """An argument that must be a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
