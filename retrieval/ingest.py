"""``python -m retrieval.ingest``: a conversation stream -> online segmentation -> one extraction
per segment -> the AMU store (library: :mod:`retrieval.ingestion.pipeline`).

    python -m retrieval.ingest --locomo locomo10.json --store DIR [--extractor rule|llm]
        [--embedder NAME_OR_PATH] [--fingerprinter DIR] [--llm-cache DIR] [--no-progress]
        [--consolidate-in-background [offline|llm]]
    python -m retrieval.ingest --jsonl turns.jsonl --store DIR ...

The JSONL turn stream is described in :mod:`retrieval.ingestion.turns_jsonl`. A rerun on the same
store resumes it. ``--consolidate-in-background`` runs consolidation (:mod:`retrieval.consolidation`)
in a worker beside the ingest and waits for its last round at the end.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path

from isq.encoders import MINILM_ALIAS
from isq.fingerprint import Fingerprinter
from retrieval.consolidation.options import OPERATORS, make_operator
from retrieval.consolidation.worker import ConsolidationWorker, SerializedEmbedder
from retrieval.eval.locomo import load_locomo
from retrieval.extract.base import Extractor
from retrieval.extract.llm_extractor import LLMExtractor
from retrieval.extract.rules import RuleExtractor
from retrieval.index.embed import SentenceEmbedder
from retrieval.ingestion.pipeline import IngestError, ingest_turns
from retrieval.ingestion.turns_jsonl import read_turns_jsonl
from retrieval.memory.errors import StoreError
from retrieval.memory.fingerprinter_source import remember_fingerprinter
from retrieval.memory.fresh_store import writable_store
from retrieval.memory.models import Embedder
from retrieval.memory.records import InputFormatError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m retrieval.ingest", description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--locomo", type=Path, help="LoCoMo JSON file (list of conversations)")
    source.add_argument("--jsonl", type=Path, help="JSONL turn stream (format: module docstring)")
    parser.add_argument("--store", type=Path, required=True, help="store directory (created if missing)")
    parser.add_argument("--extractor", choices=("rule", "llm"), default="rule")
    parser.add_argument("--embedder", default=MINILM_ALIAS, help="sentence-transformers name or path for "
                        "segmentation embeddings (default: offline all-MiniLM-L6-v2)")
    parser.add_argument("--fingerprinter", type=Path, help="exported ISQ fingerprinter directory")
    parser.add_argument("--llm-cache", type=Path, help="LLM response cache (default: STORE/llm_cache)")
    parser.add_argument("--no-retry-fallbacks", action="store_true",
                        help="do not extract again the stored segments that fell back to raw turns")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--consolidate-in-background", nargs="?", const="offline", choices=OPERATORS,
                        help="consolidate in a background worker beside the ingest (operator: offline by default)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.locomo is not None:
            conversations = load_locomo(args.locomo)
            turns = [turn for conversation in conversations for turn in conversation.turns]
            participants = {c.conversation_id: c.participants for c in conversations}
        else:
            turns, participants = read_turns_jsonl(args.jsonl), None
        if not turns:  # an empty input would create a store and fix its models for nothing
            raise InputFormatError(f"{args.locomo or args.jsonl}: no turns; nothing to ingest")
        # Opened before any model loads, so a bad store fails fast; removed again if this run created
        # it and fails before committing a segment.
        with writable_store(args.store) as store:
            embedder, extractor, fingerprinter = _models(args)
            if fingerprinter is not None:  # so that a reader need not name it again
                remember_fingerprinter(store, args.fingerprinter, fingerprinter)
            worker = None
            if args.consolidate_in_background:
                embedder = SerializedEmbedder(embedder)  # shared with the worker thread
                operator = make_operator(args.consolidate_in_background, args.llm_cache or args.store / "llm_cache")
                worker = ConsolidationWorker(args.store, embedder, operator, fingerprinter=fingerprinter)
            with worker or nullcontext():
                stats = ingest_turns(turns, store, embedder, extractor, fingerprinter=fingerprinter,
                                     participants=participants, progress=not args.no_progress,
                                     retry_fallbacks=not args.no_retry_fallbacks)
    except (InputFormatError, IngestError, StoreError, OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(stats.summary())
    for report in (worker.reports.values() if worker else ()):
        print(f"consolidation {report.summary()}")
    return 0


def _models(args: argparse.Namespace) -> tuple[Embedder, Extractor, Fingerprinter | None]:
    """The embedder, extractor and (optional) fingerprinter the arguments name."""
    extractor: Extractor
    if args.extractor == "llm":
        try:
            extractor = LLMExtractor(cache_dir=args.llm_cache or args.store / "llm_cache")
        except ValueError as err:
            raise IngestError(str(err)) from None
    else:
        extractor = RuleExtractor()
    fingerprinter = None if args.fingerprinter is None else Fingerprinter.from_pretrained(args.fingerprinter)
    return SentenceEmbedder(args.embedder), extractor, fingerprinter


if __name__ == "__main__":
    sys.exit(main())
