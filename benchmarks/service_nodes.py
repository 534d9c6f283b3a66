"""The load test of ``bench_service --database URL``: the memory in PostgreSQL, served first by one
``retrieval.serve`` process, then by two over the same database, each run on a fresh copy of the
pre-filled database (``CREATE DATABASE ... TEMPLATE``, PostgreSQL's copy of a whole database), so
runs start alike as the SQLite runs do from a copied directory. The client threads are spread over
the servers. Figures: each run's load summary and acknowledged adds read back (0 errors, lost,
duplicated, leaks), the search p50 of the one-server run over SQLite's of the same benchmark (goal
<= 1.5, :mod:`benchmarks.postgres`) and the throughput of two processes over one on the same
cores (goal >= 0.9: coordinating through the database costs little)."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from benchmarks.postgres import ratio_goals, with_sqlite_ratio
from benchmarks.service_process import Server
from benchmarks.timing import Goal

MIN_TWO_OVER_ONE = 0.9
"""Goal: requests/s of two server processes over one database, over one process's."""
_copies = itertools.count()
Load = Callable[[Sequence[str], dict[str, str]], tuple[dict[str, Any], Any]]
"""Loads servers at these URLs with these keys: (its figures, the clients' log)."""


def database_goals() -> tuple[Goal, ...]:
    """The goals of :func:`compare_nodes`'s figures, under ``postgres`` in the benchmark's."""
    runs = [Goal(f"postgres.{run}.load.{figure}", "==", 0) for run in ("one", "two")
            for figure in ("errors", "leaks")]
    runs += [Goal(f"postgres.{run}.verify.{figure}", "==", 0) for run in ("one", "two")
             for figure in ("lost", "duplicated")]
    return (*runs, *ratio_goals("postgres.one", ["search"]),
            Goal("postgres.two_over_one_per_s", ">=", MIN_TWO_OVER_ONE))


@contextlib.contextmanager
def database_copy(template: str) -> Iterator[str]:
    """A new database on ``template``'s server holding what ``template`` holds (no other session
    may be connected to it meanwhile), dropped on exit; yields its URL."""
    import psycopg

    parts = urlsplit(template)
    name = f"bench_service_{os.getpid()}_{next(_copies)}"
    admin = parts._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}" TEMPLATE "{parts.path.lstrip("/")}"')
    try:
        yield parts._replace(path=f"/{name}").geturl()
    finally:
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def serve_and_load(args: argparse.Namespace, template: str, nodes: int, load: Load,
                   check: Callable[[str, Any], dict[str, int | None]],
                   keys_for: Callable[[str], dict[str, str]]) -> dict[str, Any]:
    """``nodes`` server processes over a fresh copy of the pre-filled database with the keys of
    ``keys_for(database)``, loaded by ``load(urls, keys)`` (its figures and client log); once the
    servers have exited, ``check(database, log)`` reads the adds back."""
    extra = ("--fingerprinter", str(args.fingerprinter)) if args.fingerprinter else ()
    with database_copy(template) as database, tempfile.TemporaryDirectory(prefix="bench_nodes_") as logs:
        keys = keys_for(database)
        servers = [Server(database, *extra, logs=Path(logs)) for _ in range(nodes)]
        try:
            for server in servers:
                server.start()
            figures, log = load([server.url for server in servers], keys)
            figures["server_exit_status"] = [server.stop() for server in servers]
        finally:
            for server in servers:
                server.kill()
        figures["verify"] = check(database, log)
    return figures


def compare_nodes(one: dict[str, Any], two: dict[str, Any], sqlite_load: dict[str, Any]) -> dict[str, Any]:
    """The two runs with the ratios their goals bound (the one-server run's search p50 over
    SQLite's one server); a ratio is None (not measured) when a run answered no search, or none
    of its requests."""
    searched, baseline = one["load"]["routes"].get("search"), sqlite_load["routes"].get("search")
    one = {**one, "search": with_sqlite_ratio(searched, baseline) if searched and baseline else None}
    per_s = one["load"]["per_s"]
    return {"one": one, "two": two, "two_over_one_per_s": two["load"]["per_s"] / per_s if per_s else None}


def describe_nodes(figures: dict[str, Any] | None) -> list[str]:
    """Report lines of :func:`on_database`'s figures (none without them)."""
    if figures is None:
        return []
    def shown(value: float | None, unit: str) -> str:
        return "not measured" if value is None else f"{value:.2f}{unit}"

    lines = []
    for run in ("one", "two"):
        load, verified = figures[run]["load"], figures[run]["verify"]
        lines.append(f"PostgreSQL, {run} server(s): {load['per_s']:.1f} requests/s, search p50 "
                     f"{shown(load['routes'].get('search', {}).get('p50_ms'), ' ms')}, errors "
                     f"{load['errors']}, leaks {load['leaks']}, lost {verified['lost']}, duplicated "
                     f"{verified['duplicated']}")
    ratio = (figures["one"]["search"] or {}).get("p50_ratio_to_sqlite")
    lines.append(f"PostgreSQL: search p50 {shown(ratio, 'x')} SQLite's, two servers over one "
                 f"{shown(figures['two_over_one_per_s'], 'x')}")
    return lines


def on_database(args: argparse.Namespace, asked: list[str], figures: dict[str, Any]) -> dict[str, Any]:
    """The load test again with the memory in ``args.database`` (pre-filled there first), served
    by one process, then by two; its figures as :func:`compare_nodes` gives them. The load itself
    is bench_service's (imported here, when it runs, as it imports this module)."""
    from benchmarks.bench_service import LoadLog, run_load, summary, verify, warm_up
    from benchmarks.prefill import add_users, user_name
    from retrieval.service.keys import KeyStore

    prefilled = add_users(args, args.database)
    floor_ms, ceiling_rps = figures["floor_ms"], figures["ceiling_rps"]

    metrics_keys: list[str] = []  # the latest database's: the load reads its servers' /metrics

    def keys_for(database: str) -> dict[str, str]:
        key_store = KeyStore(database)
        try:
            metrics_keys.append(key_store.create_metrics())
            return {user_name(n): key_store.create(user_name(n)) for n in range(args.users)}
        finally:
            key_store.close()

    def load(urls: Sequence[str], keys: dict[str, str]) -> tuple[dict[str, Any], LoadLog]:
        warm_s = sum(warm_up(url, keys, asked) for url in urls)
        log, seconds = run_load(args, urls, keys, asked, metrics_keys[-1])
        return {"servers": len(urls), "warm_up_s": warm_s,
                "load": summary(log, seconds, floor_ms, ceiling_rps)}, log

    runs = [serve_and_load(args, args.database, nodes, load, verify, keys_for) for nodes in (1, 2)]
    return {"prefill": prefilled, **compare_nodes(runs[0], runs[1], figures["load"])}
