"""``python -m retrieval.query``: one search of a memory (:meth:`retrieval.Memory.search`, plan-guided
multi-route retrieval, :mod:`retrieval.multi_route`), opened read-only; a conversation is a user.

    python -m retrieval.query --store DIR "When did Caroline go to the support group?"
        [--user ID] [-k 40] [--exact-k] [--fingerprinter DIR] [--reranker DIR]
        [--planner rule|llm] [--llm-cache DIR] [--embedder NAME_OR_PATH] [--json]

Prints the plan, a legend of the score columns (:mod:`retrieval.multi_route.score_legend`), then each
selected item (record or raw turn) with the route that found it, its channel scores, its record
type and time, its provenance and the original turns, verbatim. The codebook channel is on when
the store was built with a fingerprinter (loaded from where ingestion recorded it) or
``--fingerprinter`` names one; ``--reranker`` names a local sentence-transformers CrossEncoder
(off otherwise). The store is opened read-only beside any writer and nothing is written into it
(the LLM planner's answers are kept only in a ``--llm-cache`` directory, when one is named);
its cached embeddings are used (it must have been built with the same embedder). Bad input (no
store, an empty question, an unknown conversation) ends with one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from isq.encoder import MINILM_ALIAS
from isq.fingerprint import Fingerprinter
from retrieval.api.errors import InvalidInput, MemoryAPIError
from retrieval.api.inputs import check_query
from retrieval.api.limits import MAX_K
from retrieval.api.loading import Deferred
from retrieval.api.memory import Memory
from retrieval.api.results import SearchResult
from retrieval.contract import Hit
from retrieval.eval.configs import BUDGET
from retrieval.index.embed import SentenceEmbedder
from retrieval.memory.errors import StoreError
from retrieval.memory.fingerprinter_source import named_or_recorded
from retrieval.memory.targets import store_target
from retrieval.multi_route.params import PLAN_DEPTH, final_top_k
from retrieval.multi_route.planner_llm import LLMPlanner
from retrieval.multi_route.score_legend import ORDER_NOTE, SCORE_COLUMNS, legend_lines, size_note


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m retrieval.query", description=__doc__.split("\n\n")[0])
    parser.add_argument("question", help="the question to retrieve evidence for")
    parser.add_argument("--store", type=store_target, required=True,
                        help="store directory or postgresql:// URL (python -m retrieval.ingest)")
    parser.add_argument("--user", "--conversation", dest="user",
                        help="the user to search (needed when the store holds several; a LoCoMo "
                             "conversation is the user of its id)")
    parser.add_argument("-k", type=int, default=BUDGET,
                        help=f"hits to return (k; the final top-k is max(k, {PLAN_DEPTH}))")
    parser.add_argument("--exact-k", action="store_true",
                        help=f"return exactly k items, also below {PLAN_DEPTH}")
    parser.add_argument("--fingerprinter", type=Path, help="ISQ fingerprinter directory for the codebook "
                        "route (default: the one the store was built with, if any)")
    parser.add_argument("--reranker", type=Path,
                        help="local CrossEncoder directory reranking inside each route")
    parser.add_argument("--planner", choices=("rule", "llm"), default="rule",
                        help="llm: ISQ_LLM_BASE_URL / ISQ_LLM_MODEL")
    parser.add_argument("--llm-cache", type=Path,
                        help="keep the LLM planner's answers in this directory across runs (default: "
                             "kept nowhere; never inside the store, so a purge of the store does not "
                             "reach it: delete it with the users' data)")
    parser.add_argument("--embedder", default=MINILM_ALIAS, help="the embedder the store was built with")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def _user(memory: Memory, wanted: str | None) -> str:
    known = memory.users()
    where = memory.store.location
    if wanted is not None:
        if wanted not in known:
            raise InvalidInput(f"{where}: no user {wanted!r} (it holds {', '.join(known) or 'none'})")
        return wanted
    if len(known) != 1:
        raise InvalidInput(f"{where} holds {len(known)} users ({', '.join(known) or 'none'}); "
                           "pass --user")
    return known[0]


def run(args: argparse.Namespace) -> tuple[SearchResult, list[dict[str, Any]]]:
    """Open the memory read-only, search the conversation (user) and read each hit's turns; returns
    the result and its hits in JSON form."""
    if not 1 <= args.k <= MAX_K:
        raise InvalidInput(f"-k must be from 1 to {MAX_K}, got {args.k}")
    check_query(args.question)
    args.fingerprinter = named_or_recorded(args.store, args.fingerprinter)
    fingerprinter = None if args.fingerprinter is None else Deferred(Fingerprinter.from_pretrained,
                                                                      args.fingerprinter)
    planner = Deferred(LLMPlanner, cache_dir=args.llm_cache) if args.planner == "llm" else "rule"
    with Memory.open(args.store, read_only=True, embedder=Deferred(SentenceEmbedder, args.embedder),
                     fingerprinter=fingerprinter, planner=planner, reranker=args.reranker) as memory:
        user = _user(memory, args.user)
        k = args.k if args.exact_k else final_top_k(args.k, PLAN_DEPTH)
        result = memory.search(args.question, user_id=user, k=k, explain=True)
        return result, [hit_dict(rank, hit, memory, user) for rank, hit in enumerate(result.hits, start=1)]


def hit_dict(rank: int, hit: Hit, memory: Memory, user: str) -> dict[str, Any]:
    """One hit as JSON, in the HTTP hit's words (``session_id``, ``turns``: the ids of its source
    turns), with its rank, routes and scores, and the source turns verbatim (``source_turns``)."""
    turns = [memory.store.turn(user, turn_id) for turn_id in hit.turns]
    explain = hit.explain or {}
    scores = {name: channel["score"] for name, channel in explain.get("channels", {}).items()}
    return {"rank": rank, "id": hit.id, "kind": hit.kind, "text": hit.text, "score": hit.score,
            "memory_type": hit.memory_type,
            "time": hit.time, "session_id": hit.session_id, "turns": list(hit.turns),
            "routes": explain.get("routes", []), "scores": {**scores, **explain.get("fused", {})},
            "source_turns": [{"turn_id": t.turn_id, "speaker": t.speaker, "text": t.text,
                              "image_caption": t.image_caption,
                              "time": t.session_time.isoformat() if t.session_time else None}
                             for t in turns]}


def render(result: SearchResult, hits: Sequence[dict[str, Any]], args: argparse.Namespace) -> str:
    """The human-readable listing."""
    plan = result.plan or {"planner": "-", "question_type": "-", "routes": []}
    lines = [f"Question: {result.query}", f"Plan ({plan['planner']}): {plan['question_type']}"]
    for number, route in enumerate(plan["routes"], start=1):
        time = f"{route['time']['start']}..{route['time']['end']}" if route["time"] else "none"
        lines.append(f"  route {number}: queries {route['queries']}; entities {route['entities']}; "
                     f"topics {route['topics']}; time {time}")
    codebook = (f"on ({args.fingerprinter})" if args.fingerprinter else
                "off (no fingerprinter recorded by the store, or its directory is gone; --fingerprinter DIR)")
    size = size_note(args.k, len(hits), args.exact_k)
    lines += [f"Reranker: {result.reranker}", f"Codebook channel: {codebook}",
              f"{size}, in {1000 * result.seconds:.0f} ms", *legend_lines(), ""]
    for hit in hits:
        scores = " ".join(f"{name} {value:.3g}" for name, value in hit["scores"].items())
        kind = hit["memory_type"] if hit["kind"] == "record" else "raw turn"
        lines.append(f"{hit['rank']:>3}. [{hit['id']}] {kind}, time {hit['time'] or 'unknown'}, "
                     f"route {','.join(map(str, hit['routes'])) or '-'} | {scores}")
        lines.append(f"     {hit['text']}")
        lines.append(f"     provenance: {hit['session_id']}, turns {', '.join(hit['turns'])}")
        for turn in hit["source_turns"]:
            caption = f" [shares an image: {turn['image_caption']}]" if turn["image_caption"] else ""
            lines.append(f"       > [{turn['turn_id']}] ({(turn['time'] or 'undated')[:10]}) "
                         f"{turn['speaker']}: {turn['text']}{caption}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        result, hits = run(args)
    except (MemoryAPIError, StoreError, OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"query": result.query, "plan": result.plan, "reranker": result.reranker,
                          "seconds": result.seconds, "k": args.k,
                          "size": size_note(args.k, len(hits), args.exact_k), "score_columns": SCORE_COLUMNS,
                          "order": ORDER_NOTE, "hits": hits}, ensure_ascii=False, indent=2))
    else:
        print(render(result, hits, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
