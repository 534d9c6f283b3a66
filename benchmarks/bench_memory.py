"""Benchmark of the memory API against the model's speed. Not a test: prints figures (and writes
them with ``--json PATH``).

Floor. ``floor_ms`` (top level of the JSON): the median bare MiniLM forward of one dev question,
measured in this run (:mod:`benchmarks.floor`) before the memories and again after them, pooled,
so that the machine's speed drifting during a run (it does, by 10-20% on shared 2-vCPU machines)
weighs on both sides alike; every time below is also given as a ratio to it
(``<figure>_ratio_to_floor``), its goal beside it (``<figure>_goal``) and a ``goals_met`` summary,
which also asks the floor's two halves to agree within a quarter (``floor.drift``: a run whose
floor moved more measured the machine). The lines printed while the run goes are divided by the
first measurement alone.

Add. One user's LoCoMo dev turns are added one at a time through :meth:`retrieval.Memory.add`
(real models: the offline MiniLM embedder, the committed ISQ fingerprinter, the rule extractor;
the user's search snapshot built first, so every add also extends it), each session flushed at
its end. Reported: add latency (the ``add`` call alone; each session's ``flush`` apart), and
the ingest rate, turns/s from the first add until the backlog is processed, over the batch
floor, the turns/s of embedding and fingerprinting the same turn texts once, in one batch each
(goals: add p99 <= 3x floor, ``ingest_ratio_to_floor`` >= 0.5).

Search. Synthetic memories of 1k, 10k and 100k AMUs in one user, and of 1,000 users with 100
AMUs each: records written through the store's insert path (evidence nodes, FTS5 rows; many
segments per transaction), their fingerprints drawn at random from the codebook, their vectors
random unit vectors put in the store's cache under the real embedder's identity (so the
snapshot builds from SELECTs, as over a built memory). Queries are the LoCoMo dev questions,
embedded and fingerprinted by the real models at search time: a search's latency includes both.
Reported per memory: the snapshot build (first search of each user), search p50/p99 (k=10, code
channel on) and where a search's time goes (medians of ``SearchResult.timings``: model_wait,
encode, routes, fusion, and the rest; null where the memory does not report them). Goals: p50 <= 1.5x floor at
1x10000 and 1000x100, <= 3x at 1x100000; the cold build at 1x100000 <= 200x floor. With 1,000
users the searches go to random users whose snapshots are warm.

The LoCoMo file is ``--locomo``, else ``$ISQ_LOCOMO``, else ../shared/data/locomo/locomo_dev.json.

    python -m benchmarks.bench_memory --sizes 10000 100000 --users 1000 --json perf/memory.json
    python -m benchmarks.bench_memory --add-turns 100 --sizes 1000 10000 --users 100 --json /tmp/m.json

With ``--database URL`` each search memory is also built in that PostgreSQL database right after
its SQLite one, and the same searches run on both, interleaved (figures under ``postgres``), with
the ratio of PostgreSQL's search p50 to SQLite's (goal <= 1.5; :mod:`benchmarks.postgres`).
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.arguments import add_json_option, exit_on_sigterm, refuse_unusable, within
from benchmarks.floor import FLOOR_DRIFT_MAX, BareEncoder, measure_floor
from benchmarks.paths import FINGERPRINTER, LOCOMO_HELP, default_locomo
from benchmarks.postgres import holds_store, labelled, ratio_goals, with_sqlite_ratio
from benchmarks.timing import (
    Goal,
    against_floor,
    apply_goals,
    describe_goals,
    describe_split,
    interleaved_rounds,
    percentiles,
    ratio_spread,
    split_medians,
    with_ratios,
    write_json,
)
from isq.encoder import MINILM_ALIAS, EncoderUnavailable
from isq.fingerprint import Fingerprinter
from retrieval import Memory
from retrieval.eval.construction import database_url
from retrieval.eval.locomo import load_locomo
from retrieval.extract.rules import RuleExtractor
from retrieval.index.embed import SentenceEmbedder
from retrieval.index.joint import JointEncoder, why_not_joined
from retrieval.index.model_thread import on_model_thread
from retrieval.memory.backends import open_store
from retrieval.memory.cache import CachedEmbedder, model_identity
from retrieval.memory.records import AMU, SegmentRecord, SourcePointer, Turn, amu_id
from retrieval.multi_route.bank import MemoryBank
from retrieval.service.timing import RETRIEVAL_PHASES

PER_SEGMENT = 5
SEGMENTS_PER_COMMIT = 200
NAMES = [f"Person{i}" for i in range(200)]
TOPICS = ["garden", "violin", "puppy", "bread", "hiking", "lake", "museum", "pottery", "camping", "painting",
          "running", "charity", "school", "concert", "recipe", "travel", "library", "soccer", "poetry",
          "sunset"]
SEARCH_PARTS = RETRIEVAL_PHASES
"""The parts of ``SearchResult.timings``; the rest of a search's time is reported as "other"."""
GOALS = (Goal("search.1x10000.p50_ratio_to_floor", "<=", 1.5),
         Goal("search.1000x100.p50_ratio_to_floor", "<=", 1.5),
         Goal("search.1x100000.p50_ratio_to_floor", "<=", 3),
         Goal("search.1x100000.snapshot_build_s.max_ratio_to_floor", "<=", 200),
         Goal("add.p99_ratio_to_floor", "<=", 3),
         Goal("add.ingest_ratio_to_floor", ">=", 0.5),
         Goal("floor.drift", "<=", FLOOR_DRIFT_MAX))


class RandomVectors:
    """Unit vectors seeded by each text, under another model's identity (pre-filling its cache)."""

    def __init__(self, identity: Any, dim: int) -> None:
        self.identity, self.dim = identity, dim

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.stack([np.random.default_rng(zlib.crc32(t.encode())).standard_normal(self.dim)
                        for t in texts]) \
            if texts else np.zeros((0, self.dim))
        return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32) if len(texts) else out


FLOOR_PASSES = 2
"""Timed passes of the batch floor; the fastest counts."""


def batch_floor(embedder: Any, fingerprinter: Any) -> Callable[[Sequence[str]], Any]:
    """What the ingest ratio's floor computes for a batch of turns: their vectors and codes in one
    forward where the memory joins the two models (:mod:`retrieval.index.joint`), else each
    model's own forward."""
    if why_not_joined(embedder, fingerprinter) is None:
        return JointEncoder(embedder, fingerprinter).compute
    return lambda texts: (embedder.encode(texts), fingerprinter.fingerprint(texts))


def bench_add(turns: Sequence[Turn], embedder: Any, fingerprinter: Any, directory: Path,
              floor_ms: float) -> dict[str, Any]:
    """Add ``turns`` one at a time as one user; the floor embeds and fingerprints them in one batch
    as the memory would (:func:`batch_floor`; the faster of two passes: the first of a fresh model
    is up to a third slower, which would flatter the ingest ratio)."""
    turns = [dataclasses.replace(turn, user_id="user") for turn in turns]
    texts = [turn.render() for turn in turns]
    passes, floor = [], batch_floor(embedder, fingerprinter)
    for _ in range(FLOOR_PASSES):
        began = time.perf_counter()
        on_model_thread(lambda: floor(texts))
        passes.append(time.perf_counter() - began)
    batch_s = min(passes)
    adds, flushes = [], []
    with Memory.open(directory, embedder=embedder, fingerprinter=fingerprinter) as memory:
        memory.search("warm the snapshot", user_id="user", k=10)
        began = time.perf_counter()
        for index, turn in enumerate(turns):
            tick = time.perf_counter()
            memory.add([turn], user_id="user", session_id=turn.session_id)
            adds.append(time.perf_counter() - tick)
            if index + 1 == len(turns) or turns[index + 1].session_id != turn.session_id:
                tick = time.perf_counter()
                memory.flush(user_id="user", session_id=turn.session_id)
                flushes.append(time.perf_counter() - tick)
        memory.drain(user_id="user")
        ingest_s = time.perf_counter() - began
        records = memory.store.count("user", include_archived=False)
    return {"turns": len(turns), "records": records, **with_ratios(percentiles(adds), floor_ms),
            "flush": with_ratios(percentiles(flushes), floor_ms),
            **ingest_rates(len(turns), ingest_s, batch_s)}


def ingest_rates(turns: int, ingest_s: float, batch_s: float) -> dict[str, float]:
    """Turns/s from the first add until the backlog drained, the batch floor's turns/s, and the
    first over the second (the goal: at least half the floor's)."""
    ingest_rate, floor_rate = turns / ingest_s, turns / batch_s
    return {"ingest_s": ingest_s, "ingest_turns_per_s": ingest_rate, "floor_turns_per_s": floor_rate,
            "ingest_ratio_to_floor": ingest_rate / floor_rate}


def synthetic_segments(user: str, count: int, rng: np.random.Generator,
                       codebook: int) -> list[tuple[SegmentRecord, list[Turn], list[AMU]]]:
    """``count`` records of one user, :data:`PER_SEGMENT` per segment, one turn each."""
    segments = []
    for seq in range(0, (count + PER_SEGMENT - 1) // PER_SEGMENT):
        session = f"s{seq // 20}"
        turns, amus = [], []
        for index in range(min(PER_SEGMENT, count - seq * PER_SEGMENT)):
            who, topic = NAMES[int(rng.integers(len(NAMES)))], TOPICS[int(rng.integers(len(TOPICS)))]
            text = f"{who} talked about {topic} and item {int(rng.integers(10**6))} on day {seq}."
            turn_id = f"t{seq}-{index}"
            turns.append(Turn(user, session, turn_id, who, text))
            codes = rng.choice(codebook, size=int(rng.integers(8, 40)), replace=False)
            amus.append(AMU(amu_id(user, seq, index), text, "event",
                            SourcePointer(user, session, (turn_id,), (who,), seq),
                            observed_at="2023-05-08T10:00:00", entities=(who,), tags=(topic,),
                            fingerprint=tuple(int(c) for c in codes), t_ref="2023-05-08"))
        segments.append((SegmentRecord(user, seq, session, tuple(t.turn_id for t in turns), "synthetic"),
                         turns, amus))
    return segments


def build_synthetic(directory: Path | str, users: dict[str, int], embedder: Any, fingerprinter: Any) -> float:
    """Write each user's records (up to :data:`SEGMENTS_PER_COMMIT` segments per transaction),
    then fill the vector cache its snapshot reads (from the records just written: the store's
    active records in its order); the seconds it took."""
    began = time.perf_counter()
    rng = np.random.default_rng(0)
    with open_store(directory) as store:
        store.bind("embedder", embedder.identity)
        store.bind("extractor", model_identity(RuleExtractor()))
        store.bind("fingerprinter", fingerprinter.identity)
        filler = CachedEmbedder(RandomVectors(embedder.identity, embedder.dim), store)
        for user, count in users.items():
            segments = synthetic_segments(user, count, rng, fingerprinter.codebook_size)
            for start in range(0, len(segments), SEGMENTS_PER_COMMIT):
                store.commit_segments(segments[start:start + SEGMENTS_PER_COMMIT])
            MemoryBank.build(store, user, filler.for_user(user),
                             records=[amu for _, _, amus in segments for amu in amus])
    return time.perf_counter() - began


def bench_search(directory: Path | str, users: dict[str, int], queries: Sequence[str], embedder: Any,
                 fingerprinter: Any, searches: int, floor_ms: float) -> dict[str, Any]:
    synthetic_s = build_synthetic(directory, users, embedder, fingerprinter)
    rng = np.random.default_rng(1)
    names = list(users)
    with Memory.open(directory, embedder=embedder, fingerprinter=fingerprinter) as memory:
        builds = []
        for user in names:
            tick = time.perf_counter()
            memory.search(queries[0], user_id=user, k=10)
            builds.append(time.perf_counter() - tick)
        latencies, parts = [], []
        for index in range(searches):
            user = names[int(rng.integers(len(names)))]
            tick = time.perf_counter()
            result = memory.search(queries[index % len(queries)], user_id=user, k=10)
            latencies.append(time.perf_counter() - tick)
            parts.append(result.timings)
    build_max = float(np.max(builds))
    return {"users": len(users), "amus_per_user": next(iter(users.values())),
            **with_ratios(percentiles(latencies), floor_ms),
            "split": with_ratios(split_medians(parts, latencies, SEARCH_PARTS, "other"), floor_ms),
            "snapshot_build_s": {"mean": float(np.mean(builds)), "max": build_max,
                                 "max_ratio_to_floor": 1000.0 * build_max / floor_ms},
            "synthetic_build_s": synthetic_s}


def bench_beside(directory: Path, database: str, label: str, users: dict[str, int], queries: Sequence[str],
                 embedder: Any, fingerprinter: Any, searches: int, floor_ms: float) -> dict[str, Any]:
    """The memory just timed in ``directory`` built again in ``database`` (its users renamed
    :func:`benchmarks.postgres.labelled`), then the same searches of the same users on both,
    interleaved search by search so a drifting load weighs on both alike: each side's
    percentiles, PostgreSQL's p50 over SQLite's and the spread of the per-search ratios."""
    named = labelled(label, users)
    synthetic_s = build_synthetic(database, named, embedder, fingerprinter)
    rng = np.random.default_rng(1)
    picks = [int(rng.integers(len(users))) for _ in range(searches)]
    with Memory.open(directory, embedder=embedder, fingerprinter=fingerprinter) as local, \
            Memory.open(database, embedder=embedder, fingerprinter=fingerprinter) as remote:
        def searcher(memory: Memory, names: Sequence[str]) -> Any:
            return lambda i: memory.search(queries[i % len(queries)], user_id=names[picks[i]], k=10)

        builds = []
        for user, renamed in zip(users, named, strict=True):
            local.search(queries[0], user_id=user, k=10)
            tick = time.perf_counter()
            remote.search(queries[0], user_id=renamed, k=10)
            builds.append(time.perf_counter() - tick)
        seconds = interleaved_rounds({"sqlite": searcher(local, list(users)),
                                      "postgres": searcher(remote, list(named))}, searches)
    sqlite = with_ratios(percentiles(seconds["sqlite"]), floor_ms)
    return {**with_sqlite_ratio(with_ratios(percentiles(seconds["postgres"]), floor_ms), sqlite),
            "sqlite": sqlite, "ratio_spread": ratio_spread(seconds["postgres"], seconds["sqlite"]),
            "snapshot_build_s": {"mean": float(np.mean(builds)), "max": float(np.max(builds))},
            "synthetic_build_s": synthetic_s}


def describe_beside(label: str, row: Mapping[str, Any]) -> str:
    return (f"search, {label}, interleaved: PostgreSQL p50 {row['p50_ms']:.1f} ms, SQLite "
            f"{row['sqlite']['p50_ms']:.1f} ms: {row['p50_ratio_to_sqlite']:.2f}x (per-search ratio IQR "
            f"{row['ratio_spread']['q1']:.2f}-{row['ratio_spread']['q3']:.2f}); PostgreSQL p99 "
            f"{row['p99_ms']:.1f} ms, first search max {row['snapshot_build_s']['max']:.2f} s, "
            f"synthetic build {row['synthetic_build_s']:.1f} s")


def describe_search(label: str, row: Mapping[str, Any]) -> str:
    build = row["snapshot_build_s"]
    split = describe_split(row["split"])
    return (f"search, {label}: p50 {row['p50_ms']:.1f} ms ({row['p50_ratio_to_floor']:.2f}x floor), "
            f"p99 {row['p99_ms']:.1f} ms ({row['p99_ratio_to_floor']:.2f}x); split ms: {split}; first search "
            f"max {build['max']:.2f} s ({build['max_ratio_to_floor']:.0f}x); "
            f"synthetic build {row['synthetic_build_s']:.1f} s")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--locomo", type=Path, default=default_locomo(),
                        help=LOCOMO_HELP)
    parser.add_argument("--fingerprinter", type=Path, default=FINGERPRINTER)
    parser.add_argument("--embedder", default=MINILM_ALIAS)
    parser.add_argument("--add-turns", type=within(int, 0), default=0,
                        help="turns to add (default, 0: the first conversation's)")
    parser.add_argument("--sizes", type=within(int, 1), nargs="*", default=[1000, 10000, 100000],
                        help="AMUs in one user")
    parser.add_argument("--users", type=within(int, 0), default=1000, help="users of 100 AMUs each (0: skip)")
    parser.add_argument("--searches", type=within(int, 1), default=200, help="timed searches per memory")
    add_json_option(parser)
    parser.add_argument("--database", type=database_url,
                        help="also build each search memory in this (empty) PostgreSQL database, right "
                             "after its SQLite one, and give the PostgreSQL/SQLite search p50 ratio")
    args = parser.parse_args(argv)
    refuse_unusable(parser, args)
    exit_on_sigterm()
    if args.database and holds_store(args.database):  # its memories' names would meet an earlier run's
        parser.error("--database: holds a store already (an earlier run's?); give an empty database")
    memories = {f"1x{size}": {"user": size} for size in dict.fromkeys(args.sizes)}
    if args.users:
        if f"{args.users}x100" in memories:
            parser.error(f"--users {args.users} would be the memory of --sizes 100 again ({args.users}x100)")
        memories[f"{args.users}x100"] = {f"user{i}": 100 for i in range(args.users)}
    conversations = load_locomo(args.locomo)
    queries = [q.question for c in conversations for q in c.questions]
    try:
        encoder = BareEncoder(args.embedder)
    except EncoderUnavailable as err:
        parser.error(f"--embedder: {err}")
    first = measure_floor(encoder, queries)
    floor_ms = first["floor_ms"]
    print(f"floor: one bare forward of a dev question, median {floor_ms:.2f} ms over {first['forwards']} "
          "(the ratios printed until the end are to this one)")
    embedder, fingerprinter = on_model_thread(lambda: (SentenceEmbedder(args.embedder),
                                                       Fingerprinter.from_pretrained(args.fingerprinter)))
    figures: dict[str, Any] = {"search": {}}
    turns = list(conversations[0].turns)[: args.add_turns or None]
    with tempfile.TemporaryDirectory() as scratch:
        figures["add"] = add = bench_add(turns, embedder, fingerprinter, Path(scratch) / "add", floor_ms)
        print(f"add: {add['turns']} turns, p50 {add['p50_ms']:.1f} ms, p99 {add['p99_ms']:.1f} ms "
              f"({add['p99_ratio_to_floor']:.2f}x floor); ingest {add['ingest_turns_per_s']:.2f} turns/s, "
              f"batch floor {add['floor_turns_per_s']:.2f}: {add['ingest_ratio_to_floor']:.3f}x")
        for label, users in memories.items():
            row = bench_search(Path(scratch) / label, users, queries, embedder, fingerprinter, args.searches,
                               floor_ms)
            figures["search"][label] = row
            print(describe_search(label, row), flush=True)
            if args.database:
                beside = bench_beside(Path(scratch) / label, args.database, label, users, queries, embedder,
                                      fingerprinter, args.searches, floor_ms)
                figures.setdefault("postgres", {})[label] = beside
                print(describe_beside(label, beside), flush=True)
    floor = measure_floor(encoder, queries, earlier=first["samples_ms"])
    print(f"floor again after the memories: {floor['floor_ms']:.2f} ms, the median of both runs' "
          f"{floor['forwards']} forwards, which every figure of the JSON and the goals are divided by")
    figures = {"floor_ms": floor["floor_ms"], "floor": floor, **against_floor(figures, floor["floor_ms"])}
    figures["goals_met"] = apply_goals(figures, GOALS + ratio_goals("postgres", figures.get("postgres", {})))
    print("goals:\n" + describe_goals(figures["goals_met"]))
    write_json(args.json, figures)


if __name__ == "__main__":
    main()
