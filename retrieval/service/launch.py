"""What both command lines (``retrieval.serve``, ``retrieval.mcp``) share: the memory options,
opening the memory, and the one-line failure.

Idle OpenMP threads sleep. The model's forwards run on torch's OpenMP threads; by default an
idle one spins at each barrier before it sleeps. A server shares its cores with its own request
threads (the routes and fusion in Python), its clients and other processes, so a spinning thread
can burn the core the thread it waits for needs: on the team's 2-core machine at load ~10, back to
back forwards of 6 queries cost 250-490 ms of CPU each with the default, 55-75 ms with sleeping
threads. The threads and their share of the work are the same, so every vector and code is the
same, bit for bit. A value of ``OMP_WAIT_POLICY`` already in the environment is kept.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
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
    """``Memory.open`` with the command line's options, idle OpenMP threads sleeping (the
    module docstring) when torch is not loaded yet (OpenMP reads the setting as it loads)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
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
