"""``python -m retrieval.mcp``: the memory as an MCP server over stdio, for one user.

    python -m retrieval.mcp --store DIR --user USER [--fingerprinter DIR] [--read-only]

Tools: memory_add, memory_flush, memory_search, memory_list, memory_get, memory_history,
memory_delete, memory_forget, memory_consolidate, memory_job (:mod:`retrieval.service.mcp_tools`).
Every call acts for ``--user`` (an id a key could serve: the same user over HTTP): whoever can
start this process owns that user's memory. Over the network, use ``python -m retrieval.serve``,
whose ``/mcp`` endpoint takes the user from the API key. Bad input ends with one ``error:`` line
on stderr and exit status 2 (stdout carries only the protocol).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence

from retrieval.api.errors import MemoryAPIError
from retrieval.api.inputs import check_id
from retrieval.memory.errors import StoreError
from retrieval.service.keys import check_servable
from retrieval.service.launch import (
    add_memory_arguments,
    bounded_allocator,
    idle_threads_sleep,
    open_memory,
    served_store,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m retrieval.mcp", description=__doc__.split("\n\n")[0])
    add_memory_arguments(parser)
    parser.add_argument("--user", required=True, help="the user every tool call acts for")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    idle_threads_sleep()
    bounded_allocator()
    from retrieval.service.drain import WriteGate
    from retrieval.service.mcp_tools import build_mcp, fixed_user

    try:
        check_id("--user", args.user)  # what every tool call would refuse, refused at the start
        check_servable(args.user)  # an id no key could serve (" alice"): a memory HTTP never reaches
        where = served_store(args.store)
        with contextlib.redirect_stdout(sys.stderr):  # stdout is the protocol's: model loaders print
            memory = open_memory(args)
    except (MemoryAPIError, StoreError, OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"serving {where} to user {args.user!r} over stdio", file=sys.stderr, flush=True)
    with memory:
        build_mcp(memory, WriteGate(), fixed_user(args.user)).run("stdio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
