"""``python -m retrieval.query``: plan-guided multi-route retrieval over a store, for one question
(library: :mod:`retrieval.routes`).

    python -m retrieval.query --store DIR "When did Caroline go to the support group?"
        [--conversation ID] [-k 40] [--exact-k] [--fingerprinter DIR] [--reranker DIR]
        [--planner rule|llm] [--llm-cache DIR] [--embedder NAME_OR_PATH] [--json]

Prints the plan, a legend of the score columns (:mod:`retrieval.routes.score_legend`), then each
selected item (record or raw turn) with the route that found it, its channel scores, its record
type and time, its provenance and the original turns, verbatim. The codebook route is on when
the store was built with a fingerprinter (loaded from where ingestion recorded it) or
``--fingerprinter`` names one; ``--reranker`` names a local sentence-transformers CrossEncoder
(off otherwise). The store is opened read-only and nothing is written into it (the LLM planner's
response cache goes to ``--llm-cache``, by default a user cache directory); its cached
embeddings are used (it must have been built with the same embedder). Bad input (no store, an
empty question, an unknown conversation) ends with one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from isq.encoders import MINILM_ALIAS
from isq.fingerprint import Fingerprinter
from retrieval.contract import Hit, Query, Retrieval, check_query
from retrieval.index.embed import SentenceEmbedder
from retrieval.llm_client import reader_cache_dir
from retrieval.memory.cache import CachedEmbedder, CachedFingerprinter, model_identity
from retrieval.memory.errors import StoreError, StoreMismatch
from retrieval.memory.fingerprinter_source import check_fingerprinter, recorded_fingerprinter
from retrieval.memory.models import Embedder
from retrieval.memory.store import AMUStore
from retrieval.routes.multi_route import MultiRouteRetriever
from retrieval.routes.planner_llm import LLMPlanner
from retrieval.routes.rerank import CrossEncoderReranker
from retrieval.routes.score_legend import ORDER_NOTE, SCORE_COLUMNS, legend_lines, size_note
from retrieval.routes.snapshot import MemorySnapshot


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m retrieval.query", description=__doc__.split("\n\n")[0])
    parser.add_argument("question", help="the question to retrieve evidence for")
    parser.add_argument("--store", type=Path, required=True, help="store directory (python -m retrieval.ingest)")
    parser.add_argument("--conversation", help="conversation id (needed when the store holds several)")
    parser.add_argument("-k", type=int, default=40, help="evidence budget (final top-k = max(k, 15))")
    parser.add_argument("--exact-k", action="store_true", help="return exactly k items, also below 15")
    parser.add_argument("--fingerprinter", type=Path, help="ISQ fingerprinter directory for the codebook "
                        "route (default: the one the store was built with, if any)")
    parser.add_argument("--reranker", type=Path, help="local CrossEncoder directory reranking inside each route")
    parser.add_argument("--planner", choices=("rule", "llm"), default="rule",
                        help="llm: ISQ_LLM_BASE_URL / ISQ_LLM_MODEL")
    parser.add_argument("--llm-cache", type=Path, default=reader_cache_dir(),
                        help="LLM planner response cache (default: %(default)s; never inside the store)")
    parser.add_argument("--embedder", default=MINILM_ALIAS, help="the embedder the store was built with")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def _conversation(store: AMUStore, wanted: str | None) -> str:
    known = store.conversations()
    if wanted is not None:
        if wanted not in known:
            raise StoreError(f"{store.path}: no conversation {wanted!r} (it holds {', '.join(known) or 'none'})")
        return wanted
    if len(known) != 1:
        raise StoreError(f"{store.path} holds {len(known)} conversations ({', '.join(known) or 'none'}); "
                         "pass --conversation")
    return known[0]


def _check_embedder(store: AMUStore, embedder: Embedder) -> None:
    bound = store.meta("embedder")
    if bound is not None and bound != model_identity(embedder):
        raise StoreMismatch(f"{store.directory} was built with embedder {bound!r}, not {model_identity(embedder)!r}; "
                            "pass --embedder")


def run(args: argparse.Namespace) -> tuple[Retrieval, AMUStore, str]:
    """Open the store, build the conversation's bank and retrieve; returns the retrieval, the open
    store (the caller closes it) and the conversation id."""
    check_query(args.question)
    if args.k < 1:
        raise ValueError(f"-k must be at least 1, got {args.k}")
    store = AMUStore(args.store, read_only=True)
    try:
        conversation = _conversation(store, args.conversation)
        embedder = SentenceEmbedder(args.embedder)
        _check_embedder(store, embedder)
        fingerprinter = None
        args.fingerprinter = args.fingerprinter or recorded_fingerprinter(store)
        if args.fingerprinter is not None:
            fingerprinter = CachedFingerprinter(Fingerprinter.from_pretrained(args.fingerprinter), store)
            check_fingerprinter(store, fingerprinter)
        planner = LLMPlanner(cache_dir=args.llm_cache) if args.planner == "llm" else None
        reranker = None if args.reranker is None else CrossEncoderReranker(args.reranker)
        bank = MemorySnapshot.build(store, conversation, CachedEmbedder(embedder, store), fingerprinter=fingerprinter)
        retriever = MultiRouteRetriever(bank, planner, reranker, use_code=fingerprinter is not None,
                                        **({"plan_depth": 0} if args.exact_k else {}))
        return retriever.retrieve(Query(args.question), args.k), store, conversation
    except BaseException:
        store.close()
        raise


def item_dict(hit: Hit, store: AMUStore, conversation: str) -> dict[str, Any]:
    """One selected item as JSON: id, kind, text, type, time, routes, scores, provenance, turns."""
    turns = [store.turn(conversation, turn_id) for turn_id in hit.source["turn_ids"]]
    return {"rank": hit.rank, "id": hit.id, "kind": hit.kind, "text": hit.text, "memory_type": hit.memory_type,
            "time": hit.time, "routes": [number + 1 for number in hit.routes], "scores": dict(hit.channels),
            "provenance": hit.source,
            "turns": [{"turn_id": t.turn_id, "speaker": t.speaker, "text": t.text, "image_caption": t.image_caption,
                       "session_time": t.session_time.isoformat() if t.session_time else None} for t in turns]}


def render(result: Retrieval, items: Sequence[dict[str, Any]], args: argparse.Namespace) -> str:
    """The human-readable listing."""
    plan = result.plan
    assert plan is not None  # multi-route retrieval always plans
    lines = [f"Question: {result.query}", f"Plan ({plan.planner}): {plan.question_type}"]
    for number, route in enumerate(plan.routes, start=1):
        time = f"{route.time.start}..{route.time.end}" if route.time else "none"
        lines.append(f"  route {number}: queries {list(route.queries)}; entities {list(route.entities)}; "
                     f"topics {list(route.topics)}; time {time}")
    codebook = (f"on ({args.fingerprinter})" if args.fingerprinter else
                "off (no fingerprinter recorded by the store, or its directory is gone; --fingerprinter DIR)")
    size = size_note(args.k, len(items), args.exact_k)
    lines += [f"Reranker: {result.reranker}", f"Codebook route: {codebook}",
              f"{size}, in {1000 * result.seconds:.0f} ms", *legend_lines(), ""]
    for item in items:
        scores = " ".join(f"{name} {value:.3g}" for name, value in item["scores"].items())
        kind = item["memory_type"] if item["kind"] == "record" else "raw turn"
        lines.append(f"{item['rank']:>3}. [{item['id']}] {kind}, time {item['time'] or 'unknown'}, "
                     f"route {','.join(map(str, item['routes'])) or '-'} | {scores}")
        lines.append(f"     {item['text']}")
        lines.append(f"     provenance: {item['provenance']['session_id']}, turns "
                     f"{', '.join(item['provenance']['turn_ids'])}")
        for turn in item["turns"]:
            caption = f" [shares an image: {turn['image_caption']}]" if turn["image_caption"] else ""
            lines.append(f"       > [{turn['turn_id']}] ({(turn['session_time'] or 'undated')[:10]}) "
                         f"{turn['speaker']}: {turn['text']}{caption}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        result, store, conversation = run(args)
    except (StoreError, OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    with store:
        items = [item_dict(hit, store, conversation) for hit in result.hits]
    if args.json:
        print(json.dumps({"question": result.query, "plan": result.plan.to_dict() if result.plan else None,
                          "reranker": result.reranker, "seconds": result.seconds, "k": args.k,
                          "size": size_note(args.k, len(items), args.exact_k), "score_columns": SCORE_COLUMNS,
                          "order": ORDER_NOTE, "items": items}, ensure_ascii=False, indent=2))
    else:
        print(render(result, items, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
