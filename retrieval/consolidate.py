"""``python -m retrieval.consolidate``: asynchronous consolidation of a store's conversations
(library: :mod:`retrieval.consolidation`; docs/design.md §8).

    python -m retrieval.consolidate --store DIR|URL [--operator offline|llm] [--threshold T]
        [--linkage complete|average|single] [--window-days D] [--user ID ...]
        [--embedder NAME_OR_PATH] [--fingerprinter DIR] [--llm-cache DIR]

It may run while ``python -m retrieval.ingest`` writes to the same store. It prints one line per
conversation and an audit line (every archived AMU leads to an active one, no source turn is
lost); exit code 0, or 1 when the audit fails. Bad input ends with one ``error:`` line and exit
code 2. A rerun resumes an interrupted run and changes nothing in a consolidated store.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from isq.encoder import MINILM_ALIAS
from isq.fingerprint import Fingerprinter
from retrieval.api.loading import llm_cache
from retrieval.consolidation.audit import audit
from retrieval.consolidation.config import LINKAGES, WINDOW_DAYS, ConsolidationConfig
from retrieval.consolidation.engine import consolidate_user
from retrieval.consolidation.options import OPERATORS, make_operator
from retrieval.index.embed import SentenceEmbedder
from retrieval.memory.backends import open_store
from retrieval.memory.connection import missing_store
from retrieval.memory.errors import StoreError
from retrieval.memory.fingerprinter_source import recorded_or_refused
from retrieval.memory.targets import local_directory, store_target


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m retrieval.consolidate",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=store_target, required=True,
                        help="store directory (or PostgreSQL URL) written by retrieval.ingest")
    parser.add_argument("--operator", choices=OPERATORS, default="offline",
                        help="offline near-duplicate MERGE (default) or an LLM (ISQ_LLM_BASE_URL, "
                             "ISQ_LLM_MODEL)")
    parser.add_argument("--threshold", type=float, help="HAC cut, cosine distance (default: the operator's)")
    parser.add_argument("--linkage", choices=LINKAGES, default="complete")
    parser.add_argument("--window-days", type=float, default=WINDOW_DAYS, help="time-window gate, in days")
    parser.add_argument("--user", "--conversation", dest="user", action="append",
                        help="only this user (repeatable; a LoCoMo conversation is the user of its id)")
    parser.add_argument("--embedder", default=MINILM_ALIAS, help="sentence embedder of the AMUs")
    parser.add_argument("--fingerprinter", type=Path,
                        help="the fingerprinter the store was built with, if any")
    parser.add_argument("--llm-cache", type=Path, help="LLM response cache (default: STORE/llm_cache)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = ConsolidationConfig(threshold=args.threshold, linkage=args.linkage,
                                     window_days=args.window_days)
        missing = missing_store(local_directory(args.store))
        if missing is not None:  # never create a store here
            raise StoreError(f"{missing}; ingest into it first")
        with open_store(args.store, role="consolidate") as store:
            stored = store.users_with_segments()
            conversations = args.user or stored
            unknown = [cid for cid in conversations if cid not in stored]
            if unknown:
                raise ValueError(f"{store.location} holds no user {unknown[0]!r} "
                                 f"(it holds {len(stored)})")
            operator = make_operator(args.operator, args.llm_cache or llm_cache(store.local_files))
            named = args.fingerprinter or recorded_or_refused(store)  # the one ingestion recorded
            fingerprinter = None if named is None else Fingerprinter.from_pretrained(named)
            embedder = SentenceEmbedder(args.embedder)
            for user_id in conversations:
                report = consolidate_user(store, user_id, embedder, operator, config,
                                                  fingerprinter=fingerprinter)
                print(report.summary(), flush=True)
            result = audit(store)
    except (StoreError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(result.summary())
    for problem in result.problems[:20]:
        print(f"  {problem}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
