"""``python -m retrieval.serve``: the memory over HTTP (FastAPI + uvicorn) and MCP (at ``/mcp``),
and the API keys that bind callers to users.

    python -m retrieval.serve --store DIR [--fingerprinter DIR] [--threads N] [--host 127.0.0.1] [--port 8765]
                              [--allow-remote] [--read-only]
    python -m retrieval.serve keys create --store DIR --user USER   # prints the new key last
    python -m retrieval.serve keys list   --store DIR [--user USER]     # never creates a key store
    python -m retrieval.serve keys revoke --store DIR KEY_ID         # or the whole key

The server listens on 127.0.0.1 unless told otherwise; any other address needs
``--allow-remote``. SIGTERM (or Ctrl-C) stops accepting requests, lets running requests finish
for a bounded time and running writes after them, then closes the memory: a turn answered 200 is
stored. With ``--read-only`` it serves the store beside the process that writes it, answering reads
and refusing every write (403). Slow clients are disconnected
(:mod:`retrieval.service.connections`). Bad input ends with one ``error:`` line and exit status 2.
Keys are kept as salted hashes in ``STORE/keys.sqlite``, or in the ``api_keys`` rows of a
PostgreSQL store (``--store postgresql://...``), shared by every server over it.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import socket
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from retrieval.api.errors import MemoryAPIError
from retrieval.memory.errors import StoreError
from retrieval.memory.targets import store_target
from retrieval.service.keys import METRICS, KeyCommandError, KeyStore, check_servable, unservable
from retrieval.service.launch import (
    add_memory_arguments,
    bounded_allocator,
    idle_threads_sleep,
    is_loopback,
    open_memory,
    served_store,
)

if TYPE_CHECKING:
    from retrieval.service.connections import ConnectionTimeouts

DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8765
LISTEN_BACKLOG = 2048
"""Connections the kernel queues before the server accepts them (uvicorn's own default)."""
MCP_SESSION_LOGGERS = ("mcp.server.streamable_http_manager", "mcp.server.streamable_http")


def quiet_mcp_session_logs() -> None:
    """The MCP SDK logs every start and stop of its session manager, and the end of every
    stateless request's session, at INFO, in its own format beside uvicorn's lines: not the user's
    business. Its warnings and errors stay."""
    for name in MCP_SESSION_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def _serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m retrieval.serve", description=__doc__.split("\n\n")[0],
                                     epilog="keys: python -m retrieval.serve keys {create,list,revoke} "
                                            "--help")
    add_memory_arguments(parser)
    parser.add_argument("--host", default=DEFAULT_HOST, help="address to listen on (loopback by default)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--allow-remote", action="store_true", help="allow a --host other than loopback")
    return parser


def _keys_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m retrieval.serve keys", description="manage API keys")
    commands = parser.add_subparsers(dest="command", required=True)
    create = commands.add_parser("create", help="create a key for a user, or one that reads /metrics; "
                                                "prints it as the last line")
    holder = create.add_mutually_exclusive_group(required=True)
    holder.add_argument("--user")
    holder.add_argument("--metrics", action="store_true",
                        help="a key that reads /metrics and nothing of any user (for the operators' scraper)")
    listing = commands.add_parser("list",
                                  help="key ids, users, creation and revocation times (never secrets)")
    listing.add_argument("--user")
    revoke = commands.add_parser("revoke",
                                 help="revoke a key (by id or in full); the server refuses it at once")
    revoke.add_argument("key")
    for command in (create, listing, revoke):
        command.add_argument("--store", type=store_target, required=True,
                             help="the memory's store: its directory or postgresql:// URL")
    return parser


def keys_main(argv: Sequence[str]) -> int:
    args = _keys_parser().parse_args(argv)
    if args.command == "create" and args.user is not None:
        check_servable(args.user)  # before a key store, and its directory, is made
    keys = KeyStore(args.store, create=args.command == "create", read_only=args.command == "list")
    try:
        if args.command == "create":
            key = keys.create_metrics() if args.metrics else keys.create(args.user)
            print(f"created a key for {'/metrics' if args.metrics else f'user {args.user!r}'}; it is shown "
                  "only now (the store keeps a salted hash):")
            print(key)
        elif args.command == "list":
            for info in keys.list(args.user):
                state = f"revoked={info.revoked}" if info.revoked else "active"
                if info.user_id == METRICS:
                    state += " (reads /metrics only)"
                elif not info.revoked and unservable(info.user_id):  # made before keys create checked ids
                    state += " (its user id cannot be served: revoke it)"
                print(f"{info.key_id}  user={info.user_id}  created={info.created}  {state}")
        else:
            info = keys.revoke(args.key)
            print(f"revoked {info.key_id} (user {info.user_id}) at {info.revoked}")
    finally:
        keys.close()
    return 0


def serve_main(argv: Sequence[str]) -> int:
    args = _serve_parser().parse_args(argv)
    if not is_loopback(args.host) and not args.allow_remote:
        raise ValueError(f"--host {args.host} would expose the memory beyond this machine; "
                         "pass --allow-remote to mean it")
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be 1-65535, got {args.port}")
    idle_threads_sleep()
    bounded_allocator()
    from retrieval.service.app import create_app

    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(listening(args.host, args.port))
        where = served_store(args.store)
        memory = open_memory(args)  # before the key file: a refused memory leaves none behind
        stack.callback(memory.close)
        # a reader makes no key file, and reads the keys of a database without writing its schema
        keys = KeyStore(args.store, create=not args.read_only, read_only=args.read_only)
        stack.callback(keys.close)
        app = create_app(memory, keys, args.store, host=args.host)
        print(f"serving {where}{' read-only' if args.read_only else ''} on "
              f"http://{args.host}:{args.port} (OpenAPI /docs, MCP /mcp)", flush=True)
        run(app, args.host, args.port, listener=listener)
    return 0


def listening(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` before anything loads: a port in use or a host that does not
    resolve is one error line then, not a failure once the models are loaded and the store open.
    Its protocol is named (TCP): asyncio turns Nagle's algorithm off only on accepted sockets that
    say so, and with it on, every request after the first on a keep-alive connection waited ~40 ms
    for the client's delayed acknowledgement."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    except OSError as err:
        raise ValueError(f"--host {host}: {err.strerror or err}") from None
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(LISTEN_BACKLOG)  # bound but not listening, the port is still another's to bind
    except OSError as err:
        listener.close()
        raise ValueError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    return listener


def run(app: Any, host: str, port: int, timeouts: ConnectionTimeouts | None = None, *,
        listener: socket.socket | None = None) -> None:
    """Serve ``app`` until SIGTERM or SIGINT, then return once it has drained (``timeouts``: those
    of :mod:`retrieval.service.limits` unless given; ``listener``: a socket already bound to
    ``host:port``, :func:`listening`). A further SIGTERM or SIGINT, while it drains or once it has,
    stops the process at once."""
    from retrieval.service.connections import ConnectionTimeouts, DrainingServer, uvicorn_config

    # uvicorn handles SIGTERM/SIGINT itself (stop accepting, finish requests, lifespan shutdown,
    # which drains writes), then re-raises the signal to the handlers it found: make those no-ops
    # so that the caller closes the memory and the exit status is 0, not death by signal.
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, signal.SIG_IGN)
    quiet_mcp_session_logs()
    server = DrainingServer(uvicorn_config(app, host, port, timeouts or ConnectionTimeouts()))
    server.run(sockets=None if listener is None else [listener])
    # The caller closes the memory next, which waits for the running ingestion step and job: an
    # extractor's LLM call may take minutes. A further signal ends the process then, as a crash
    # would: the turn log and the jobs table resume what was unfinished at the next start.
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, signal.SIG_DFL)
    print("stopped serving; closing the memory once its running ingestion step and job end (a further "
          "SIGINT or SIGTERM stops at once: they resume at the next start)", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return keys_main(argv[1:]) if argv[:1] == ["keys"] else serve_main(argv)
    except (MemoryAPIError, KeyCommandError, StoreError, OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # while the models load or the store opens: nothing was served
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
