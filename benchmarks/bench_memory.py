"""Benchmark of the memory API: add latency against the model floor, search latency by
memory size. Not a test: prints figures (and writes them with ``--json PATH``).

Add. One user's LoCoMo dev turns are added one at a time through :meth:`retrieval.Memory.add`
(real models: the offline MiniLM embedder, the committed ISQ fingerprinter, the rule extractor;
the user's search snapshot built first, so every add also extends it), each session flushed at
its end. Reported: add latency p50/p99 and turns/s, and their ratio to the floor, the turns/s of
embedding and fingerprinting the same turn texts once, in one batch each (goal: >= 0.5x).

Search. Synthetic memories of 1k, 10k and 100k AMUs in one user, and of 1,000 users with 100
AMUs each: records written through the store's insert path (evidence nodes, FTS5 rows), their
fingerprints drawn at random from the codebook, their vectors random unit vectors put in the
store's cache under the real embedder's identity (so the snapshot builds from SELECTs, as over a
built memory). Queries are the LoCoMo dev questions, embedded and fingerprinted by the real
models at search time: a search's latency includes both. Reported per memory: the snapshot
build (first search) and search p50/p99 (k=10, code route on; goal at 10k: p50 <= 10 ms, p99
<= 30 ms); with 1,000 users the searches go to random users whose snapshots are warm.

    python -m benchmarks.bench_memory --json perf/memory.json
    python -m benchmarks.bench_memory --add-turns 100 --sizes 1000 10000 --users 100 --json /tmp/m.json
"""

from __future__ import annotations

import argparse
import tempfile
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.timing import write_json
from isq.encoder import MINILM_ALIAS
from isq.fingerprint import Fingerprinter
from retrieval import Memory
from retrieval.eval.locomo import load_locomo
from retrieval.extract.rules import RuleExtractor
from retrieval.index.embed import SentenceEmbedder
from retrieval.memory.cache import CachedEmbedder, model_identity
from retrieval.memory.records import AMU, SegmentRecord, SourcePointer, Turn, amu_id
from retrieval.memory.store import AMUStore
from retrieval.multi_route.bank import MemoryBank

ROOT = Path(__file__).resolve().parents[1]
LOCOMO = ROOT.parent / "shared" / "data" / "locomo" / "locomo_dev.json"
FINGERPRINTER = ROOT / "checkpoints" / "isq_minilm_dailydialog_cpu"
PER_SEGMENT = 5
NAMES = [f"Person{i}" for i in range(200)]
TOPICS = ["garden", "violin", "puppy", "bread", "hiking", "lake", "museum", "pottery", "camping", "painting",
          "running", "charity", "school", "concert", "recipe", "travel", "library", "soccer", "poetry",
          "sunset"]


def percentiles(seconds: Sequence[float]) -> dict[str, float]:
    values = np.asarray(seconds) * 1000.0
    return {"p50_ms": float(np.percentile(values, 50)), "p99_ms": float(np.percentile(values, 99)),
            "mean_ms": float(values.mean()), "n": len(values)}


class RandomVectors:
    """Unit vectors seeded by each text, under another model's identity (pre-filling its cache)."""

    def __init__(self, identity: Any, dim: int) -> None:
        self.identity, self.dim = identity, dim

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        out = np.stack([np.random.default_rng(zlib.crc32(t.encode())).standard_normal(self.dim)
                        for t in texts]) \
            if texts else np.zeros((0, self.dim))
        return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32) if len(texts) else out


def bench_add(turns: Sequence[Turn], embedder: Any, fingerprinter: Any, directory: Path) -> dict[str, Any]:
    """Add ``turns`` one at a time as one user; the floor embeds and fingerprints them in one batch."""
    texts = [turn.render() for turn in turns]
    began = time.perf_counter()
    embedder.encode(texts)
    fingerprinter.fingerprint(texts)
    floor_s = time.perf_counter() - began
    latencies = []
    with Memory.open(directory, embedder=embedder, fingerprinter=fingerprinter) as memory:
        memory.search("warm the snapshot", user_id="user", k=10)
        began = time.perf_counter()
        for index, turn in enumerate(turns):
            tick = time.perf_counter()
            memory.add([turn], user_id="user", session_id=turn.session_id)
            if index + 1 == len(turns) or turns[index + 1].session_id != turn.session_id:
                memory.flush(user_id="user", session_id=turn.session_id)
            latencies.append(time.perf_counter() - tick)
        total_s = time.perf_counter() - began
        records = memory.store.count("user", include_archived=False)
    add_rate, floor_rate = len(turns) / total_s, len(turns) / floor_s
    return {"turns": len(turns), "records": records, **percentiles(latencies), "turns_per_s": add_rate,
            "floor_turns_per_s": floor_rate, "ratio_to_floor": add_rate / floor_rate,
            "goal": "ratio_to_floor >= 0.5"}


def synthetic_user(store: AMUStore, user: str, count: int, rng: np.random.Generator, codebook: int) -> None:
    """``count`` records of one user, :data:`PER_SEGMENT` per committed segment, one turn each."""
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
        store.commit_segment(SegmentRecord(user, seq, session, tuple(t.turn_id for t in turns), "synthetic"),
                             turns, amus)


def build_synthetic(directory: Path, users: dict[str, int], embedder: Any, fingerprinter: Any) -> None:
    """Write the users' records, then fill the vector cache the snapshots read."""
    rng = np.random.default_rng(0)
    with AMUStore(directory) as store:
        store.bind("embedder", embedder.identity)
        store.bind("extractor", model_identity(RuleExtractor()))
        store.bind("fingerprinter", fingerprinter.identity)
        for user, count in users.items():
            synthetic_user(store, user, count, rng, fingerprinter.codebook_size)
        filler = CachedEmbedder(RandomVectors(embedder.identity, embedder.dim), store)
        for user in users:
            MemoryBank.build(store, user, filler)


def bench_search(directory: Path, users: dict[str, int], queries: Sequence[str], embedder: Any,
                 fingerprinter: Any, searches: int) -> dict[str, Any]:
    build_synthetic(directory, users, embedder, fingerprinter)
    rng = np.random.default_rng(1)
    names = list(users)
    with Memory.open(directory, embedder=embedder, fingerprinter=fingerprinter) as memory:
        builds = []
        for user in names:
            tick = time.perf_counter()
            memory.search(queries[0], user_id=user, k=10)
            builds.append(time.perf_counter() - tick)
        latencies = []
        for index in range(searches):
            user = names[int(rng.integers(len(names)))]
            tick = time.perf_counter()
            memory.search(queries[index % len(queries)], user_id=user, k=10)
            latencies.append(time.perf_counter() - tick)
    return {"users": len(users), "amus_per_user": next(iter(users.values())), **percentiles(latencies),
            "snapshot_build_s": {"mean": float(np.mean(builds)), "max": float(np.max(builds))}}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--locomo", type=Path, default=LOCOMO)
    parser.add_argument("--fingerprinter", type=Path, default=FINGERPRINTER)
    parser.add_argument("--embedder", default=MINILM_ALIAS)
    parser.add_argument("--add-turns", type=int, default=0,
                        help="turns to add (default: the first conversation's)")
    parser.add_argument("--sizes", type=int, nargs="*", default=[1000, 10000, 100000],
                        help="AMUs in one user")
    parser.add_argument("--users", type=int, default=1000, help="users of 100 AMUs each (0: skip)")
    parser.add_argument("--searches", type=int, default=200, help="timed searches per memory")
    parser.add_argument("--json", help="write the figures to this JSON file")
    args = parser.parse_args(argv)
    conversations = load_locomo(args.locomo)
    embedder, fingerprinter = (SentenceEmbedder(args.embedder),
                               Fingerprinter.from_pretrained(args.fingerprinter))
    queries = [q.question for c in conversations for q in c.questions]
    figures: dict[str, Any] = {"search": {}}
    turns = list(conversations[0].turns)[: args.add_turns or None]
    with tempfile.TemporaryDirectory() as scratch:
        figures["add"] = bench_add(turns, embedder, fingerprinter, Path(scratch) / "add")
        print(f"add: {figures['add']}")
        for size in args.sizes:
            row = bench_search(Path(scratch) / f"one{size}", {"user": size}, queries, embedder, fingerprinter,
                               args.searches)
            figures["search"][f"1x{size}"] = row
            print(f"search, 1 user x {size} AMUs: {row}")
        if args.users:
            users = {f"user{i}": 100 for i in range(args.users)}
            row = bench_search(Path(scratch) / "many", users, queries, embedder, fingerprinter, args.searches)
            figures["search"][f"{args.users}x100"] = row
            print(f"search, {args.users} users x 100 AMUs: {row}")
    figures["goals"] = {"add": "ratio_to_floor >= 0.5", "search_10k": "p50 <= 10 ms, p99 <= 30 ms"}
    write_json(args.json, figures)


if __name__ == "__main__":
    main()
