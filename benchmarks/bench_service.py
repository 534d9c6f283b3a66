"""Load test of the HTTP service against the model's speed, loopback only, bounded in requests
and time.

    python benchmarks/bench_service.py --fingerprinter checkpoints/isq_minilm_dailydialog_cpu --json F.json
    python benchmarks/bench_service.py --no-fingerprinter --users 3 --clients 4 --seconds 10  # no codebook

0. ``floor_ms``, the median bare MiniLM forward of one dev question, and ``ceiling_rps``, the
   queries/s of one forward of 16 of them (:mod:`benchmarks.floor`), measured in this process
   before the server starts and again after it stopped, the two halves' samples pooled (a burst
   of other work on a shared machine during one of them moves the median less), with idle OpenMP
   threads sleeping as in the servers (``GOMP_SPINCOUNT`` in the environment reaches both), on
   this process's model thread: latencies are also given as ratios to the floor, throughput as a
   ratio to the ceiling.
1. A store pre-filled with users holding the LoCoMo dev conversations: the first added through
   ``Memory.add`` session by session (as ``retrieval.ingest`` does), the others copies of it
   (:mod:`retrieval.api.user_copy`, one transaction per user); built once under ``--prefilled``
   (grown when more users are asked) and copied to a scratch directory for each run, so runs
   start alike.
2. ``python -m retrieval.serve`` on a free loopback port, one API key per user, one warm-up
   search per user (the memory builds a user's search snapshot at its first search).
3. The same dev questions searched in-process (a read-only ``Memory`` beside the server) and over
   HTTP by one client, interleaved query by query: the p50 ratio HTTP / in-process.
4. ``--clients`` threads for ``--seconds``: each request picks a user at random; 80% search (a dev
   question, or one in five times another user's canary), 20% add one turn carrying a canary
   unique to its user. Every hit must carry the requesting user's id prefix and no other user's
   canary (else a leak); a non-200 answer, a transport failure, a body that is not the route's
   and an add whose answer does not acknowledge the turn sent are errors: counted, never timed.
5. SIGTERM (the server drains), then the store is read: every acknowledged add must be stored
   exactly once (lost, duplicated).

Figures: ``prefill_s`` (the first user's build ``seed_s`` plus the copies' ``copy_s``),
throughput and p50/p95/p99 per route over the good answers, where a search's time went (medians
of the response's ``Server-Timing`` parts: model_wait, encode, routes, fusion, wait, serialise, queue,
respond, and the rest outside the app: connection, uvicorn and client; null when the server sends
no such header), errors, lost, duplicated, leaks (each null, not measured, when no request, no
search or no add was answered), the p50 ratio. Goals, written beside their figures and summed up
in ``goals_met``: search p99 <= 10x floor, throughput >= 0.4x ceiling, 0 errors, lost, duplicated
and leaks, HTTP p50 <= 1.5x in-process, and a floor and ceiling whose halves (before and after
the load) agree within a quarter (``floor.drift``, ``ceiling.drift``). The codebook channel is
on by default (the committed fingerprinter, as shipped). The client threads share the machine
with the server (and, on the team's 2-core machine, with other work): the figures say so through
the recorded load average.
The LoCoMo file is ``--locomo``, else ``$ISQ_LOCOMO``, else ../shared/data/locomo/locomo_dev.json.
``--database URL``: the load test over PostgreSQL too, one server then two (``service_nodes.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

if __package__ in (None, ""):  # run as a script: python benchmarks/bench_service.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# The floor and ceiling are measured with the servers' OpenMP setting (idle threads sleep unless the
# environment says otherwise, retrieval/service/launch.py), read as torch loads: under load, spinning
# threads would inflate them and flatter every ratio. Only when run, not when imported (by the tests).
if __name__ == "__main__":
    from retrieval.service.launch import idle_threads_sleep

    idle_threads_sleep()

from benchmarks.arguments import add_json_option, exit_on_sigterm, refuse_unusable, within  # noqa: E402
from benchmarks.floor import FLOOR_DRIFT_MAX, BareEncoder, measure_ceiling, measure_floor  # noqa: E402
from benchmarks.paths import FINGERPRINTER, LOCOMO_HELP, default_locomo  # noqa: E402
from benchmarks.prefill import prefill, user_name  # noqa: E402
from benchmarks.service_nodes import database_goals, describe_nodes, on_database  # noqa: E402
from benchmarks.service_process import Server, bearer, collector_pauses  # noqa: E402
from benchmarks.timing import (  # noqa: E402
    Goal,
    apply_goals,
    describe_goals,
    describe_split,
    interleaved_rounds,
    percentiles,
    split_medians,
    with_ratios,
    write_json,
)
from retrieval.api.limits import DEFAULT_K, MAX_K  # noqa: E402
from retrieval.eval.construction import database_url  # noqa: E402
from retrieval.service.timing import RETRIEVAL_PHASES, SERVICE_PARTS  # noqa: E402

SERVER_PARTS = (*RETRIEVAL_PHASES, *SERVICE_PARTS)
"""The parts of a search response's ``Server-Timing``; the rest of its time is outside the app
(the connection, uvicorn, the client)."""
GOALS = (Goal("load.routes.search.p99_ratio_to_floor", "<=", 10),
         Goal("load.per_s_ratio_to_ceiling", ">=", 0.4),
         Goal("load.errors", "==", 0), Goal("load.leaks", "==", 0),
         Goal("verify.lost", "==", 0), Goal("verify.duplicated", "==", 0),
         Goal("compare.http_over_in_process_p50", "<=", 1.5),
         Goal("floor.drift", "<=", FLOOR_DRIFT_MAX), Goal("ceiling.drift", "<=", FLOOR_DRIFT_MAX))


def canary(user: str, client: int, number: int) -> str:
    return f"canary{user}x{client}x{number}"


def load_note(mark: str, number: int) -> str:
    """The text of a load add, carrying its canary ``mark`` (read back by :data:`NOTE_MARK`)."""
    return f"Load note {mark}: remember item {number}."


NOTE_MARK = re.compile(r"Load note (\S+): remember item")


def questions(path: Path) -> list[str]:
    from retrieval.eval.locomo import load_locomo

    return [question.question for conversation in load_locomo(path) for question in conversation.questions]


def parse_server_timing(header: str | None) -> dict[str, float] | None:
    """Seconds per metric of a ``Server-Timing`` value (``name;dur=ms, ...``; a metric without a
    duration is left out); None without the header."""
    if header is None:
        return None
    parts: dict[str, float] = {}
    for metric in header.split(","):
        name, *params = (piece.strip() for piece in metric.split(";"))
        for param in params:
            key, _, value = param.partition("=")
            if name and key.strip().lower() == "dur":
                try:
                    parts[name] = float(value.strip().strip('"')) / 1000.0
                except ValueError:
                    pass
    return parts


def compare_in_process(args: argparse.Namespace, store: Path, url: str, keys: dict[str, str],
                       asked: list[str]) -> dict[str, Any]:
    """The same searches in-process (read-only memory) and over HTTP, interleaved query by query."""
    from retrieval.api.memory import Memory

    rng = random.Random(args.seed + 1)
    pairs = [(user_name(rng.randrange(args.users)), rng.choice(asked)) for _ in range(args.compare_queries)]
    with Memory.open(store, fingerprinter=args.fingerprinter, read_only=True) as memory, \
            httpx.Client(base_url=url, timeout=60) as http:
        def in_process(index: int) -> None:
            user, query = pairs[index]
            memory.search(query, user_id=user, k=args.k)

        def over_http(index: int) -> None:
            user, query = pairs[index]
            response = http.post("/v1/search", json={"query": query, "k": args.k}, headers=bearer(keys[user]))
            response.raise_for_status()

        for user in sorted({user for user, _ in pairs}):  # build each user's snapshot on both sides first
            memory.search(asked[0], user_id=user, k=args.k)
        seconds = interleaved_rounds({"in_process": in_process, "http": over_http}, len(pairs))
    inside, outside = statistics.median(seconds["in_process"]), statistics.median(seconds["http"])
    return {"queries": len(pairs), "in_process": percentiles(seconds["in_process"]),
            "http_one_client": percentiles(seconds["http"]), "http_over_in_process_p50": outside / inside}


@dataclasses.dataclass
class LoadLog:
    """What the clients saw, shared between their threads under a lock."""

    latencies: dict[str, list[float]] = dataclasses.field(default_factory=lambda: defaultdict(list))
    parts: dict[str, list[dict[str, float] | None]] = dataclasses.field(
        default_factory=lambda: defaultdict(list))
    errors: Counter = dataclasses.field(default_factory=Counter)
    leaks: list[str] = dataclasses.field(default_factory=list)
    canaries: dict[str, list[str]] = dataclasses.field(default_factory=lambda: defaultdict(list))
    """Per user, the canary of each add the server acknowledged."""
    requests: int = 0
    full_collections: dict[str, float] = dataclasses.field(default_factory=dict)
    """The servers' full garbage collections during the load: count, and the seconds they held
    their interpreters (summed over the servers)."""
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


def check_hits(user: str, hits: list[dict], users: int) -> list[str]:
    """Leaks in one answer: a hit without the user's id prefix, or with another user's canary."""
    leaks = [f"{user} got hit {hit['id']}" for hit in hits if not hit["id"].startswith(f"{user}:")]
    for hit in hits:
        text = json.dumps(hit)
        leaks += [f"{user} got {other}'s canary" for other in map(user_name, range(users))
                  if other != user and f"canary{other}x" in text]
    return leaks


def client_loop(args: argparse.Namespace, client: int, url: str, keys: dict[str, str], asked: list[str],
                log: LoadLog, deadline: float) -> None:
    rng = random.Random(args.seed * 1000 + client)
    with httpx.Client(base_url=url, timeout=60) as http:
        for number in range(args.max_requests):
            with log.lock:
                if time.monotonic() >= deadline or log.requests >= args.max_requests:
                    return
                log.requests += 1
            user = user_name(rng.randrange(args.users))
            searching = rng.random() < args.search_share
            if searching:
                with log.lock:  # other clients add canaries meanwhile
                    others = {u: list(marks) for u, marks in log.canaries.items() if u != user and marks}
                query = rng.choice(others[rng.choice(list(others))]) if others and rng.random() < 0.2 \
                    else rng.choice(asked)
                route, body, path = "search", {"query": query, "k": args.k}, "/v1/search"
            else:
                mark = canary(user, client, number)
                turn = {"speaker": "Load", "text": load_note(mark, number),
                        "turn_id": f"load-{client}-{number}"}
                route, body, path = "add", {"turns": [turn]}, f"/v1/sessions/load-{client}/turns"
            began = time.perf_counter()
            try:
                response = http.post(path, json=body, headers=bearer(keys[user]))
                elapsed = time.perf_counter() - began  # the answer read; the checks below are not timed
                error, leaks = answered(route, response, user, body, args.users)
            except httpx.TransportError as err:
                error, leaks = f"{route}: {type(err).__name__}", []
            with log.lock:
                if error is not None:
                    log.errors[error] += 1
                    continue
                log.latencies[route].append(elapsed)
                log.parts[route].append(parse_server_timing(response.headers.get("server-timing")))
                log.leaks += leaks
                if not searching:
                    log.canaries[user].append(mark)


def answered(route: str, response: httpx.Response, user: str, sent: dict[str, Any],
             users: int) -> tuple[str | None, list[str]]:
    """An answer's error (its kind; None for a good answer) and the leaks in it: a status other
    than 200, a body that is not the route's, an add that does not acknowledge the turn sent (it
    would go unchecked for loss)."""
    if response.status_code != 200:
        return f"{route}: {response.status_code}", []
    try:
        body = response.json()
        if route == "search":
            return None, check_hits(user, body["hits"], users)
        acknowledged = sent["turns"][0]["turn_id"] in body["turn_ids"]
        return (None, []) if acknowledged else ("add: not acknowledged", [])
    except (ValueError, LookupError, TypeError, AttributeError) as err:
        return f"{route}: malformed answer ({type(err).__name__})", []


def run_load(args: argparse.Namespace, urls: Sequence[str], keys: dict[str, str],
             asked: list[str], metrics_key: str) -> tuple[LoadLog, float]:
    log = LoadLog()
    before = [collector_pauses(url, metrics_key) for url in urls]
    began = time.monotonic()
    threads = [threading.Thread(target=client_loop,  # daemons: an interrupted run does not wait for them
                                args=(args, n, urls[n % len(urls)], keys, asked, log, began + args.seconds),
                                daemon=True)
               for n in range(args.clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.monotonic() - began
    after = [collector_pauses(url, metrics_key) for url in urls]
    log.full_collections = {key: sum(end[key] - start[key] for start, end in zip(before, after, strict=True))
                            for key in ("count", "seconds")}
    return log, seconds


def verify(store: Path | str, log: LoadLog) -> dict[str, int | None]:
    """Every acknowledged add stored exactly once (read after the servers exited), counted by its
    canary in the stored texts: a turn id is unique in the store, so an add stored twice would
    show only as a second turn with its text. Lost and duplicated are None (not measured) when no
    add was acknowledged."""
    from retrieval.memory.backends import open_store

    lost = duplicated = 0
    with open_store(store, read_only=True) as reader:
        for user, marks in log.canaries.items():
            stored = Counter(found[1] for turn in reader.turns(user) if (found := NOTE_MARK.match(turn.text)))
            lost += sum(1 for mark in marks if stored[mark] == 0)
            duplicated += sum(1 for mark in marks if stored[mark] > 1)
    acknowledged = sum(map(len, log.canaries.values()))
    return {"acknowledged_adds": acknowledged, "lost": lost if acknowledged else None,
            "duplicated": duplicated if acknowledged else None}


def summary(log: LoadLog, seconds: float, floor_ms: float, ceiling_rps: float) -> dict[str, Any]:
    """The load's figures: throughput and latencies of the good answers (an error is counted
    apart, never timed), errors and leaks (None, not measured, when no request or no search was
    answered)."""
    routes = {route: {"requests": len(times), "per_s": len(times) / seconds,
                      **with_ratios(percentiles(times), floor_ms),
                      "split": with_ratios(split_medians(log.parts[route], times, SERVER_PARTS, "outside"),
                                           floor_ms)}
              for route, times in sorted(log.latencies.items())}
    good = sum(map(len, log.latencies.values()))
    per_s = good / seconds
    return {"seconds": seconds, "requests": log.requests, "answered": good, "per_s": per_s,
            "per_s_ratio_to_ceiling": per_s / ceiling_rps, "routes": routes,
            "errors": sum(log.errors.values()) if log.requests else None, "error_kinds": dict(log.errors),
            "leaks": len(log.leaks) if log.latencies.get("search") else None,
            "leak_examples": log.leaks[:5], "full_collections": log.full_collections}


def warm_up(url: str, keys: dict[str, str], asked: list[str]) -> float:
    """One search per user (the memory builds each user's search snapshot at its first search)."""
    began = time.perf_counter()
    with httpx.Client(base_url=url, timeout=300) as http:
        for key in keys.values():
            http.post("/v1/search", json={"query": asked[0]}, headers=bearer(key)).raise_for_status()
    return time.perf_counter() - began


def run(args: argparse.Namespace) -> dict[str, Any]:
    from retrieval.service.keys import KeyStore

    built = prefill(args)
    asked = questions(args.locomo)
    encoder = BareEncoder()
    floor, ceiling = measure_floor(encoder, asked), measure_ceiling(encoder, asked)
    with tempfile.TemporaryDirectory(prefix="bench_service_") as scratch:
        store = Path(scratch) / "store"
        shutil.copytree(args.prefilled, store)
        key_store = KeyStore(store)
        keys = {user_name(n): key_store.create(user_name(n)) for n in range(args.users)}
        metrics_key = key_store.create_metrics()
        key_store.close()
        server = Server(store, *(("--fingerprinter", str(args.fingerprinter)) if args.fingerprinter else ()))
        try:
            server.start()
            warm_s = warm_up(server.url, keys, asked)
            compared = compare_in_process(args, store, server.url, keys, asked)
            log, seconds = run_load(args, [server.url], keys, asked, metrics_key)
            exit_status = server.stop()
        finally:
            server.kill()
        checked = verify(store, log)
    floor = measure_floor(encoder, asked, earlier=floor["samples_ms"])  # again after the load: pooled
    ceiling = measure_ceiling(encoder, asked, earlier=ceiling["samples_ms"])
    figures = {"floor_ms": floor["floor_ms"], "ceiling_rps": ceiling["ceiling_rps"],
               "prefill_s": built["seconds"], "floor": floor, "ceiling": ceiling, "prefill": built,
               "warm_up_s": warm_s, "compare": compared,
               "load": summary(log, seconds, floor["floor_ms"], ceiling["ceiling_rps"]), "verify": checked,
               "server_exit_status": exit_status, "settings": vars(args)}
    if args.database:
        figures["postgres"] = on_database(args, asked, figures)
    figures["goals_met"] = apply_goals(figures, GOALS + (database_goals() if args.database else ()))
    return figures


def report(figures: dict[str, Any]) -> str:
    load, compare, built = figures["load"], figures["compare"], figures["prefill"]
    how = "reused: built" if built["reused"] else "built"
    lines = [f"floor {figures['floor_ms']:.2f} ms (one bare forward of a dev question), "
             f"ceiling {figures['ceiling_rps']:.1f} queries/s (one forward of {figures['ceiling']['batch']})",
             f"prefill: {built['users']} users x {built['turns_per_user']} turns ({how}: the first "
             f"user in {built['seed_s']} s, the copies in {built['copy_s']} s)",
             f"load: {load['requests']} requests in {load['seconds']:.1f} s = {load['per_s']:.1f}/s "
             f"({load['per_s_ratio_to_ceiling']:.2f}x ceiling), "
             f"errors {load['errors']} {load['error_kinds'] or ''}, leaks {load['leaks']}",
             f"server full garbage collections during the load: {load['full_collections']['count']:.0f}, "
             f"{load['full_collections']['seconds']:.2f} s"]
    for route, row in load["routes"].items():
        split = describe_split(row["split"])
        lines.append(f"  {route}: {row['requests']} ({row['per_s']:.1f}/s)  p50 {row['p50_ms']:.1f} ms  "
                     f"p95 {row['p95_ms']:.1f} ms  p99 {row['p99_ms']:.1f} ms "
                     f"({row['p99_ratio_to_floor']:.1f}x floor); split ms: {split}")
    lines.append(f"adds acknowledged {figures['verify']['acknowledged_adds']}, "
                 f"lost {figures['verify']['lost']}, duplicated {figures['verify']['duplicated']}")
    lines.append(f"search p50, one client: in-process {compare['in_process']['p50_ms']:.1f} ms, HTTP "
                 f"{compare['http_one_client']['p50_ms']:.1f} ms, "
                 f"ratio {compare['http_over_in_process_p50']:.2f}")
    lines += describe_nodes(figures.get("postgres"))
    lines.append("goals:\n" + describe_goals(figures["goals_met"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    refuse_unusable(parser, args)
    exit_on_sigterm()
    if args.prefill_only:
        print(prefill(args))
        return
    figures = run(args)
    print(report(figures))
    write_json(args.json, figures)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=within(int, 1), default=100)
    parser.add_argument("--clients", type=within(int, 1), default=16)
    parser.add_argument("--seconds", type=within(float, 0.1), default=60.0)
    parser.add_argument("--max-requests", type=within(int, 1), default=200_000,
                        help="a bound on requests, whatever the time")
    parser.add_argument("--search-share", type=within(float, 0, 1), default=0.8)
    parser.add_argument("-k", dest="k", type=within(int, 1, MAX_K), default=DEFAULT_K)
    parser.add_argument("--compare-queries", type=within(int, 1), default=100,
                        help="searches of the in-process comparison")
    parser.add_argument("--locomo", type=Path, default=default_locomo(),
                        help=LOCOMO_HELP)
    parser.add_argument("--fingerprinter", type=Path, default=FINGERPRINTER,
                        help="the fingerprinter of the codebook channel (default: the committed one)")
    parser.add_argument("--no-fingerprinter", dest="fingerprinter", action="store_const", const=None,
                        help="serve without the codebook channel (the records, nodes, turns, lexical "
                             "and temporal channels only)")
    parser.add_argument("--prefilled", type=Path, default=Path("stores/bench_service_prefilled"),
                        help="where the pre-filled store is built once and reused")
    parser.add_argument("--prefill-only", action="store_true", help="build the pre-filled store and stop")
    parser.add_argument("--seed", type=int, default=0)
    add_json_option(parser)
    parser.add_argument("--database", type=database_url, help="also load-test it in this PostgreSQL database")
    return parser


if __name__ == "__main__":
    main()
