"""What both command lines (``retrieval.serve``, ``retrieval.mcp``) share: the memory options (a
built store's fingerprinter, when not named, is the one it recorded at ingestion), opening the
memory, and the one-line failure.

Idle OpenMP threads spin briefly. The model's forwards run on one OpenMP team, the model thread's
(:mod:`retrieval.index.model_thread`). A team thread waiting at a barrier spins, then sleeps: a
forward is some hundred operators, and a thread that sleeps between them is woken for each, which
made one short query's forward 2.4x as slow on the team's 2-core machine (``OMP_WAIT_POLICY=
PASSIVE``, never spinning: 10.2 ms against 4.3). A thread that spins long after a forward burns
the core that a request thread (the routes and fusion in Python) or a client may need, and
libgomp's default spins up to ~3 ms. So a server spins :data:`SPIN_ROUNDS` rounds (about 0.3 ms;
4.6 ms a forward there), through ``GOMP_SPINCOUNT``, which OpenMP reads as torch loads. The
threads and their share of the work are the same, so every vector and code is the same, bit for
bit. A value already in the environment is kept.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from pathlib import Path
from typing import TYPE_CHECKING

from retrieval.memory.targets import store_target

SPIN_ROUNDS = "30000"
"""How many rounds an idle OpenMP thread of a server spins before it sleeps (the module docstring)."""

if TYPE_CHECKING:  # imported when a memory is opened: the key commands need none of it
    from retrieval.api.memory import Memory


def add_memory_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", type=store_target, required=True,
                        help="the memory's store directory (created if missing) or PostgreSQL URL")
    parser.add_argument("--fingerprinter", type=Path,
                        help="ISQ fingerprinter directory: adds the codebook route to search (default: "
                             "the one the store recorded when it was ingested with one)")
    parser.add_argument("--extractor", choices=("rule", "llm"), default="rule",
                        help="the extractor that closes segments (llm: the ISQ_LLM_* endpoint); a built "
                             "store opens only with the one it was built with")
    parser.add_argument("--embedder",
                        help="sentence-transformers name or path (default: offline all-MiniLM-L6-v2); a "
                             "built store opens only with the one it was built with")
    parser.add_argument("--threads", type=positive_int,
                        help="threads of this process's model forwards (default: torch's, one per core); "
                             "processes sharing a machine's cores should split them")


def open_memory(args: argparse.Namespace) -> Memory:
    """``Memory.open`` with the command line's options: idle OpenMP threads spinning briefly
    (:func:`spin_briefly`), ``--threads``
    bounding torch's intra-op threads (several processes each running as many threads as the
    machine has cores oversubscribe its cores: their forwards slow each other down), and the
    users' search states kept out of the collector's full passes
    (:class:`retrieval.multi_route.collector.LongLivedFreezer`)."""
    spin_briefly()
    from retrieval.api.memory import Memory
    from retrieval.memory.fingerprinter_source import named_or_recorded
    from retrieval.multi_route.collector import LongLivedFreezer

    LongLivedFreezer().install()

    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    fingerprinter = named_or_recorded(args.store, args.fingerprinter, writer=True)
    return Memory.open(args.store, fingerprinter=fingerprinter,
                       extractor=args.extractor, embedder=args.embedder)


def spin_briefly() -> None:
    """Idle OpenMP threads spin :data:`SPIN_ROUNDS` rounds, then sleep, unless ``GOMP_SPINCOUNT``
    is set already; call it before torch loads (OpenMP reads it then)."""
    os.environ.setdefault("GOMP_SPINCOUNT", SPIN_ROUNDS)


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
