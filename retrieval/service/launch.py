"""What both command lines (``retrieval.serve``, ``retrieval.mcp``) share: the memory options (a
built store's fingerprinter, when not named, is the one it recorded at ingestion), opening the
memory, and the one-line failure.

Idle OpenMP threads sleep. The model's forwards run on one OpenMP team, the model thread's
(:mod:`retrieval.index.model_thread`); by default an idle team thread spins at each barrier
before it sleeps. A server shares its cores with its own request threads (the routes and fusion
in Python), its clients and other processes, and there a spinning thread burns the core the
thread it waits for needs: on the team's 2-core machine, two processes running forwards side by
side took 54 ms a forward spinning 30,000 rounds and 7 ms sleeping at once. So a server's idle
threads sleep at once (``OMP_WAIT_POLICY=PASSIVE``), unless the environment says otherwise: a
server alone on its machine's cores gains from ``GOMP_SPINCOUNT=30000`` (about 0.3 ms of
spinning; a forward of one query 4.6 ms against 10.2 there). The threads and their share of the
work are the same either way, so every vector and code is the same, bit for bit.

A bounded allocator. glibc's malloc gives each thread an arena (up to eight per core) and raises
its mmap threshold to the largest block freed, after which arrays (vectors, score rows, SQLite
pages) are carved from the arenas, whose freed pages stay with the process. A server building
and dropping search states grew 300-430 MiB above its states' bound that way and kept it idle;
two arenas and a fixed 128 KiB threshold (a larger block goes back to the system when freed)
held it 150-250 MiB lower in the same soak (docs/performance.md, "A server under churn").
``MALLOC_ARENA_MAX`` or ``MALLOC_MMAP_THRESHOLD_`` in the environment win.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import ipaddress
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from retrieval.memory.connection import missing_store
from retrieval.memory.targets import local_directory, redacted, store_target

if TYPE_CHECKING:  # imported when a memory is opened: the key commands need none of it
    from retrieval.api.memory import Memory


def add_memory_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", type=store_target, required=True,
                        help="the memory's store directory (created if missing) or PostgreSQL URL")
    parser.add_argument("--fingerprinter", type=Path,
                        help="ISQ fingerprinter directory: adds the codebook channel to search (default: "
                             "the one the store recorded when it was ingested with one)")
    parser.add_argument("--extractor", choices=("rule", "llm"), default="rule",
                        help="the extractor that closes segments (llm: the ISQ_LLM_* endpoint); a built "
                             "store opens only with the one it was built with")
    parser.add_argument("--embedder",
                        help="sentence-transformers name or path (default: offline all-MiniLM-L6-v2); a "
                             "built store opens only with the one it was built with")
    parser.add_argument("--read-only", action="store_true",
                        help="answer reads only (search, get, list, jobs) beside the process that writes the "
                             "store; every write is refused")
    parser.add_argument("--threads", type=thread_count,
                        help="threads of this process's model forwards, at most one per core it may run on "
                             "(default: torch's, one per core); processes sharing a machine's cores should "
                             "split them")


def served_store(store: str | Path) -> str:
    """The store as a serving command names it when it starts, read before the memory opens: a
    directory's absolute path (what a relative ``--store`` came to from the working directory the
    command was started in, an MCP client's own), marked new when opening it creates it; a URL
    without its password."""
    directory = local_directory(store)
    if directory is None:
        return redacted(store)
    return f"{directory}{' (a new store: nothing was there)' if missing_store(directory) else ''}"


def open_memory(args: argparse.Namespace) -> Memory:
    """``Memory.open`` with the command line's options (the command has called
    :func:`idle_threads_sleep` before anything loaded torch): ``--threads`` bounding torch's
    intra-op threads (several processes each running as many threads as the
    machine has cores oversubscribe its cores: their forwards slow each other down), and the
    users' search states kept out of the collector's full passes
    (:class:`retrieval.multi_route.collector.LongLivedFreezer`)."""
    from retrieval.api.memory import Memory
    from retrieval.memory.fingerprinter_source import named_or_recorded
    from retrieval.multi_route.collector import LongLivedFreezer

    LongLivedFreezer().install()

    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    fingerprinter = named_or_recorded(args.store, args.fingerprinter, writer=not args.read_only)
    return Memory.open(args.store, fingerprinter=fingerprinter, extractor=args.extractor,
                       embedder=args.embedder, read_only=args.read_only)


def idle_threads_sleep() -> None:
    """Idle OpenMP threads sleep at once unless ``OMP_WAIT_POLICY`` says otherwise (a
    ``GOMP_SPINCOUNT`` in the environment still sets how long they spin; the module docstring).
    OpenMP reads it once, as torch loads: a command calls this first, before it imports anything
    that imports torch (the app, the MCP tools, the memory)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


MALLOC_ARENAS = 2
"""The arenas a serving process's malloc keeps (glibc ``M_ARENA_MAX``)."""
MMAP_THRESHOLD_BYTES = 128 * 1024
"""Blocks from this size are mapped apart and returned when freed (glibc ``M_MMAP_THRESHOLD``,
which then stays fixed)."""
_M_ARENA_MAX, _M_MMAP_THRESHOLD = -8, -3  # glibc's mallopt parameters (malloc.h)


def bounded_allocator() -> list[str]:
    """Set glibc's malloc to :data:`MALLOC_ARENAS` arenas and a fixed :data:`MMAP_THRESHOLD_BYTES`
    (the module docstring), each unless the environment sets it; returns the settings applied
    (none off glibc). A command calls it first, before its threads start."""
    name = ctypes.util.find_library("c")
    libc = None if name is None else ctypes.CDLL(name)
    if libc is None or not hasattr(libc, "gnu_get_libc_version"):
        return []
    settings = {"MALLOC_ARENA_MAX": (_M_ARENA_MAX, MALLOC_ARENAS),
                "MALLOC_MMAP_THRESHOLD_": (_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)}
    return [name for name, (parameter, value) in settings.items()
            if name not in os.environ and libc.mallopt(parameter, value) == 1]


def thread_count(text: str) -> int:
    """A number of threads: a whole number from 1 to the cores this process may run on (more only
    queue for the same cores, and past the system's limit on threads a start fails part way)."""
    cores = len(os.sched_getaffinity(0))
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= cores:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1 to {cores} (the cores this "
                                         f"process may run on), got {text!r}")
    return value


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only: localhost, or a name or address whose every
    address is a loopback one (127.0.0.0/8, ::1). A name that does not resolve is a
    :class:`ValueError` naming ``--host`` (a typo, not a remote machine)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as err:  # UnicodeError: a name IDNA cannot encode (``a..b``)
        raise ValueError(f"--host {host}: {getattr(err, 'strerror', None) or err}") from None
    return all(ipaddress.ip_address(str(address[4][0]).split("%")[0]).is_loopback for address in found)
