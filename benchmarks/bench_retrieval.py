"""Scaling benchmark of Path B (codebook topology) against Path A (exact faiss) on synthetic banks.

Not a test: prints figures (and writes them with ``--json PATH``). For each bank size it reports the
build time and memory of the topology (incidence, M = X^T X, S_code, inverted index) and of an exact
faiss ``IndexFlatIP``, then times, query by query and in rotated order within each query (see
:mod:`benchmarks.timing`): Path B in the library default (self term + sum, the MaxScore walk
:func:`isq.walks.sum_walk`), Path B in the paper's setting (docs/design.md §3.5: max, the
inverted-index walk :func:`isq.walks.max_walk`), the brute-force scorer of each setting (every AMU
scored), and faiss. Every query's Path B result is checked against brute force: same AMUs, same
order, bitwise the same scores. Ratios are medians of per-query ratios, with quartiles and extremes.
Both sides run on ``--threads`` threads (default 1: Path B's sparse products use one; faiss would
take every core, and its OpenMP team on a busy 2-core machine made it 2.7x slower, not faster).

Synthetic fingerprints (:class:`CodeModel`): each AMU draws codes from a Zipf law over the
codebook (code ids shuffled) mixed with one of a set of topics, small groups of codes that
co-occur; draws are taken without replacement (the first distinct ones kept). The defaults
match the committed fingerprinter on LoCoMo and DailyDialog turns (``docs/performance.md``):
8-40 codes per AMU, 6-16 per query, a flat Zipf law (exponent 0.6). ``--topics 0`` drops the
co-occurrence. Embeddings are random unit vectors.

    python -m benchmarks.bench_retrieval --sizes 100000 1000000 --queries 100 --json perf/retrieval.json
"""

from __future__ import annotations

import argparse
import copy
import itertools
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import faiss
import numpy as np
import psutil

from benchmarks.arguments import add_json_option, within
from benchmarks.timing import describe_ratio, interleaved_rounds, ratio_spread, write_json
from isq.topology import CooccurrenceTopology, TopologyParams
from retrieval.index.dense import DenseIndex


@dataclass(frozen=True)
class CodeModel:
    """A law of synthetic code sets: a Zipf background plus topics of co-occurring codes.

    A draw picks the background with probability 1 - ``topic_share``, else a code of the set's
    topic (``topic_codes[t]``, themselves weighted by a Zipf law of exponent 1).
    """

    code_of_rank: np.ndarray
    background_cdf: np.ndarray
    topic_codes: np.ndarray
    topic_cdf: np.ndarray
    topic_share: float

    @classmethod
    def build(cls, rng: np.random.Generator, num_codes: int, exponent: float, topics: int, topic_size: int,
              topic_share: float) -> CodeModel:
        probs = 1.0 / np.arange(1, num_codes + 1) ** exponent
        topic_probs = 1.0 / np.arange(1, topic_size + 1)
        return cls(
            code_of_rank=rng.permutation(num_codes),  # frequency must not follow code id
            background_cdf=np.cumsum(probs / probs.sum()),
            topic_codes=np.array([rng.choice(num_codes, size=topic_size, replace=False)
                                  for _ in range(topics)]).reshape(topics, topic_size),
            topic_cdf=np.cumsum(topic_probs / topic_probs.sum()),
            topic_share=topic_share if topics else 0.0,
        )

    def draw(self, rng: np.random.Generator, count: int, low: int, high: int,
             chunk: int = 50_000) -> tuple[np.ndarray, np.ndarray]:
        """``count`` code sets in CSR form (indptr, codes); set i wants uniform{low..high} distinct
        codes, the first distinct ones of 2 * high draws (a few sets end up smaller)."""
        draws = 2 * high
        lengths, codes = [], []
        for start in range(0, count, chunk):
            rows = min(chunk, count - start)
            wanted = rng.integers(low, high + 1, size=rows)
            ranks = np.searchsorted(self.background_cdf, rng.random((rows, draws)), side="right")
            drawn = self.code_of_rank[np.minimum(ranks, self.code_of_rank.size - 1)]
            if self.topic_share > 0:
                topic = rng.integers(len(self.topic_codes), size=rows)
                slot = np.minimum(np.searchsorted(self.topic_cdf, rng.random((rows, draws)), side="right"),
                                  self.topic_cdf.size - 1)
                from_topic = rng.random((rows, draws)) < self.topic_share
                drawn = np.where(from_topic, self.topic_codes[topic[:, None], slot], drawn)
            first = first_distinct(drawn)
            keep = first & (np.cumsum(first, axis=1) <= wanted[:, None])
            lengths.append(keep.sum(axis=1))
            codes.append(drawn[keep])
        indptr = np.concatenate(([0], np.cumsum(np.concatenate(lengths))))
        return indptr, np.concatenate(codes)


def first_distinct(drawn: np.ndarray) -> np.ndarray:
    """Mask of the first occurrence of each value in each row of ``drawn``."""
    order = np.argsort(drawn, axis=1, kind="stable")
    ordered = np.take_along_axis(drawn, order, axis=1)
    first_sorted = np.ones_like(ordered, dtype=bool)
    first_sorted[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    first = np.empty_like(first_sorted)
    np.put_along_axis(first, order, first_sorted, axis=1)
    return first


def unit_vectors(rng: np.random.Generator, count: int, dim: int, chunk: int = 100_000) -> np.ndarray:
    out = np.empty((count, dim), dtype=np.float32)
    for start in range(0, count, chunk):
        block = rng.standard_normal((min(chunk, count - start), dim), dtype=np.float32)
        out[start : start + block.shape[0]] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return out


def rss() -> int:
    return psutil.Process().memory_info().rss


def same(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> bool:
    """Same AMUs in the same order with bitwise the same scores."""
    return np.array_equal(a[0], b[0]) and a[1].tobytes() == b[1].tobytes()


def build_topology(indptr: np.ndarray, codes: np.ndarray,
                   num_codes: int) -> tuple[CooccurrenceTopology, float, int]:
    """The default-setting topology, its build seconds and traced peak bytes."""
    tracemalloc.start()  # numpy/scipy buffers are traced; RSS would hide reuse of freed memory
    began = time.perf_counter()
    topology = CooccurrenceTopology(num_codes=num_codes, params=TopologyParams())
    topology.add_incidence(indptr, codes)
    topology.prepare()
    seconds = time.perf_counter() - began
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return topology, seconds, peak


def bench_size(args: argparse.Namespace, size: int, model: CodeModel,
               rng: np.random.Generator) -> dict[str, Any]:
    indptr, codes = model.draw(rng, size, args.amu_codes[0], args.amu_codes[1])
    q_indptr, q_codes = model.draw(rng, args.queries, args.query_codes[0], args.query_codes[1])
    queries = [q_codes[q_indptr[i] : q_indptr[i + 1]] for i in range(args.queries)]
    # Path B in the dual path excludes Path A's hits; simulate those with k random AMUs
    excludes = [rng.choice(size, size=args.k, replace=False) for _ in range(args.queries)]

    default, build_s, build_peak = build_topology(indptr, codes, args.num_codes)
    # The paper's setting on the same bank: a shallow copy shares X and the postings.
    paper = copy.copy(default)
    paper.params = TopologyParams(args.max_hops, args.alpha, self_term=False, aggregate="max")
    paper.prepare()

    vectors = unit_vectors(rng, size, args.dim)
    query_vectors = unit_vectors(rng, args.queries, args.dim)
    before = rss()
    began = time.perf_counter()
    dense = DenseIndex(args.dim)
    dense.add(vectors)
    faiss_build_s = time.perf_counter() - began
    faiss_rss = rss() - before
    del vectors

    results: dict[str, list[Any]] = {name: [None] * args.queries for name in ("b", "p", "bb", "pb")}

    def run(name: str, topology: CooccurrenceTopology, brute: bool) -> Callable[[int], None]:
        search = topology.search_bruteforce if brute else topology.search

        def call(i: int) -> None:
            results[name][i] = search(queries[i], args.k, excludes[i])
        return call

    seconds = interleaved_rounds({
        "path_b_default": run("b", default, False),
        "path_b_paper": run("p", paper, False),
        "bruteforce_default": run("bb", default, True),
        "bruteforce_paper": run("pb", paper, True),
        "faiss_exact": lambda i: dense.search(query_vectors[i], args.k),
    }, args.queries)
    default_exact = [same(a, b) for a, b in zip(results["b"], results["bb"], strict=True)]
    paper_exact = [same(a, b) for a, b in zip(results["p"], results["pb"], strict=True)]
    row: dict[str, Any] = {f"{name}_ms": 1e3 * float(np.median(s)) for name, s in seconds.items()}
    row |= {f"{name}_p95_ms": 1e3 * float(np.percentile(s, 95)) for name, s in seconds.items()}
    row |= {
        "bruteforce_ms": row["bruteforce_default_ms"],
        "path_b_default_exact": all(default_exact),
        "path_b_paper_exact": all(paper_exact),
        "mismatches": len(default_exact) - sum(default_exact) + len(paper_exact) - sum(paper_exact),
        "ratio_default_over_faiss": ratio_spread(seconds["path_b_default"], seconds["faiss_exact"]),
        "ratio_paper_over_faiss": ratio_spread(seconds["path_b_paper"], seconds["faiss_exact"]),
        "ratio_default_over_bruteforce": ratio_spread(seconds["path_b_default"],
                                                      seconds["bruteforce_default"]),
        "build_s": build_s,
        "build_peak_bytes": build_peak,
        "topology_bytes": default.nbytes,
        "faiss_build_s": faiss_build_s,
        "faiss_rss_bytes": faiss_rss,
        "mean_codes_per_amu": codes.size / size,
        "mean_codes_per_query": q_codes.size / args.queries,
        "top_code_share": float(default.doc_freq.max() / size),
        "queries": args.queries,
    }
    print_size(size, row, args)
    return row


def print_size(size: int, row: dict[str, Any], args: argparse.Namespace) -> None:
    mib = 2**20
    print(
        f"\n== {size:,} AMUs ({row['mean_codes_per_amu']:.1f} codes/AMU, "
        f"{row['mean_codes_per_query']:.1f}/query, "
        f"most frequent code in {row['top_code_share']:.0%} of AMUs; {args.queries} queries, k={args.k}, "
        f"{args.k} excluded; {args.threads} thread(s))\n"
        f"build    topology {row['build_s']:7.2f} s ({row['topology_bytes'] / mib:.0f} MiB, peak "
        f"{row['build_peak_bytes'] / mib:.0f} MiB)   faiss add {row['faiss_build_s']:6.2f} s "
        f"(RSS +{row['faiss_rss_bytes'] / mib:.0f} MiB)\n"
        f"median   Path B default {row['path_b_default_ms']:8.3f} ms   "
        f"paper {row['path_b_paper_ms']:8.3f} ms   "
        f"brute default {row['bruteforce_default_ms']:8.3f} ms   "
        f"paper {row['bruteforce_paper_ms']:8.3f} ms   "
        f"faiss exact {row['faiss_exact_ms']:8.3f} ms\n"
        f"exact    default {row['path_b_default_exact']}   paper {row['path_b_paper_exact']}\n"
        + describe_ratio("Path B default / faiss ", row["ratio_default_over_faiss"], "goal <= 0.1") + "\n"
        + describe_ratio("Path B paper / faiss   ", row["ratio_paper_over_faiss"]) + "\n"
        + describe_ratio("Path B default / brute ", row["ratio_default_over_bruteforce"]),
        flush=True,
    )


def growth(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """How each median grows between consecutive sizes (ratio of the larger to the smaller)."""
    out = {}
    keys = ("path_b_default_ms", "path_b_paper_ms", "bruteforce_default_ms", "faiss_exact_ms", "build_s",
            "topology_bytes")
    for small, large in itertools.pairwise(rows):
        out[f"{small}->{large}"] = {"size_factor": int(large) / int(small)} | {
            key: rows[large][key] / rows[small][key] for key in keys}
    return out


def refusal(args: argparse.Namespace) -> str | None:
    """What the arguments ask that no run can do, or None."""
    if args.k > min(args.sizes):
        return f"--k {args.k} is more than the smallest of --sizes ({min(args.sizes)})"
    if args.topics and args.topic_size > args.num_codes:
        return f"--topic-size {args.topic_size} is more than --num-codes ({args.num_codes})"
    for name, (low, high) in (("--amu-codes", args.amu_codes), ("--query-codes", args.query_codes)):
        if low > high:
            return f"{name} {low} {high}: LOW is more than HIGH"
    return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=within(int, 1), nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--queries", type=within(int, 1), default=100)
    parser.add_argument("--seed", type=within(int, 0), default=0)
    parser.add_argument("--k", type=within(int, 1), default=20, help="top-k (at most the smallest size)")
    parser.add_argument("--num-codes", type=within(int, 2), default=1024)
    parser.add_argument("--dim", type=within(int, 1), default=384)
    parser.add_argument("--zipf", type=within(float, 0), default=0.6,
                        help="Zipf exponent of the background law")
    parser.add_argument("--topics", type=within(int, 0), default=64,
                        help="topics of co-occurring codes (0: none)")
    parser.add_argument("--topic-size", type=within(int, 1), default=32,
                        help="codes per topic (at most --num-codes)")
    parser.add_argument("--topic-share", type=within(float, 0, 1), default=0.4,
                        help="share of draws from the topic")
    parser.add_argument("--amu-codes", type=within(int, 1), nargs=2, default=[8, 40], metavar=("LOW", "HIGH"))
    parser.add_argument("--query-codes", type=within(int, 1), nargs=2, default=[6, 16],
                        metavar=("LOW", "HIGH"))
    parser.add_argument("--max-hops", type=within(int, 0), default=2, help="H_r of the paper's setting")
    parser.add_argument("--alpha", type=within(float, 0, 1), default=0.5, help="alpha of the paper's setting")
    parser.add_argument("--threads", type=within(int, 1), default=1, help="faiss's OpenMP threads")
    add_json_option(parser)
    args = parser.parse_args(argv)
    problem = refusal(args)
    if problem is not None:
        parser.error(problem)
    faiss.omp_set_num_threads(args.threads)

    rng = np.random.default_rng(args.seed)
    model = CodeModel.build(rng, args.num_codes, args.zipf, args.topics, args.topic_size, args.topic_share)
    rows = {str(size): bench_size(args, size, model, rng) for size in args.sizes}
    grown = growth(rows)
    if grown:
        print("\n== growth between consecutive sizes (ratio of medians)")
    for step, factors in grown.items():
        print(f"{step} ({factors['size_factor']:.0f}x AMUs): " + ", ".join(
            f"{key} {value:.2f}x" for key, value in factors.items() if key != "size_factor"))
    write_json(args.json, {"sizes": rows, "growth": grown, "settings": vars(args)})


if __name__ == "__main__":
    main()
