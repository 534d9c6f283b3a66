"""``python -m retrieval.ingest``: a recorded conversation stream added through the memory API
(:class:`retrieval.Memory`): each conversation is a user, each session one ``add`` then a
``flush`` (online segmentation, one extraction per segment, the store).

    python -m retrieval.ingest --locomo locomo10.json --store DIR [--extractor rule|llm]
        [--embedder NAME_OR_PATH] [--fingerprinter DIR] [--llm-cache DIR] [--no-progress]
        [--consolidate-in-background [offline|llm]]
    python -m retrieval.ingest --jsonl turns.jsonl --store DIR ...

The JSONL turn stream is described in :mod:`retrieval.ingestion.turns_jsonl`. A rerun on the same
store adds nothing (stored turn ids are replays). ``--consolidate-in-background`` then runs one
durable consolidation job per conversation (:meth:`Memory.consolidate`) on the memory's job
workers, one conversation after another, and prints each job's report. Ids a server cannot put in
a URL (:data:`retrieval.api.limits.ID_PATTERN`: a space, a slash) are stored, with one warning:
Python and ``retrieval.query`` reach them, HTTP and MCP do not.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from isq.encoder import MINILM_ALIAS
from isq.fingerprint import Fingerprinter
from retrieval.api.bulk import add_conversation
from retrieval.api.errors import MemoryAPIError
from retrieval.api.inputs import check_recorded_file
from retrieval.api.limits import ID_PATTERN
from retrieval.api.loading import Deferred, llm_cache
from retrieval.api.memory import Memory
from retrieval.consolidation.options import OPERATORS, make_operator
from retrieval.eval.locomo import load_locomo
from retrieval.extract.llm_extractor import LLMExtractor
from retrieval.extract.rules import RuleExtractor
from retrieval.index.embed import SentenceEmbedder
from retrieval.ingestion.pipeline import IngestError
from retrieval.ingestion.turns_jsonl import read_turns_jsonl
from retrieval.memory.errors import StoreError
from retrieval.memory.fingerprinter_source import named_or_recorded, remember_fingerprinter
from retrieval.memory.records import InputFormatError, Turn
from retrieval.memory.targets import local_directory, store_target


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m retrieval.ingest", description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--locomo", type=Path, help="LoCoMo JSON file (list of conversations)")
    source.add_argument("--jsonl", type=Path, help="JSONL turn stream (format: module docstring)")
    parser.add_argument("--store", type=store_target, required=True,
                        help="store directory (created if missing) or PostgreSQL URL")
    parser.add_argument("--extractor", choices=("rule", "llm"), default="rule")
    parser.add_argument("--embedder", default=MINILM_ALIAS, help="sentence-transformers name or path for "
                        "segmentation embeddings (default: offline all-MiniLM-L6-v2)")
    parser.add_argument("--fingerprinter", type=Path,
                        help="exported ISQ fingerprinter directory (default, adding to a built store: "
                             "the one it recorded)")
    parser.add_argument("--llm-cache", type=Path, help="LLM response cache (default: STORE/llm_cache)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--consolidate-in-background", nargs="?", const="offline", choices=OPERATORS,
                        help="then queue one consolidation job per conversation and wait for them "
                             "(operator: offline by default)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # A failed step's warning and traceback are for a server's log; this run ends in one error line.
    steps = logging.getLogger("retrieval.api.backlog")
    level = steps.level
    steps.setLevel(logging.ERROR)
    try:
        return _ingest(args)
    finally:
        steps.setLevel(level)  # as it was: a caller in this process keeps its own logging


def _ingest(args: argparse.Namespace) -> int:
    try:
        if args.locomo is not None:
            turns = [turn for conversation in load_locomo(args.locomo) for turn in conversation.turns]
        else:
            turns = read_turns_jsonl(args.jsonl)
        if not turns:  # an empty input would create a store and fix its models for nothing
            raise InputFormatError(f"{args.locomo or args.jsonl}: no turns; nothing to ingest")
        check_recorded_file(args.locomo or args.jsonl, turns)
        warn_unservable(args.locomo or args.jsonl, turns)
        # adding to a built store: its fingerprinter unless another is named, as the readers do
        args.fingerprinter = named_or_recorded(args.store, args.fingerprinter, writer=True)
        embedder, extractor, fingerprinter = _models(args)
        operator = make_operator(args.consolidate_in_background or "offline",
                                 _llm_cache(args))
        with Memory.open(args.store, embedder=embedder, extractor=extractor, fingerprinter=fingerprinter,
                         operator=operator) as memory:
            if args.fingerprinter is not None:  # so that a reader need not name it again
                remember_fingerprinter(memory.store, args.fingerprinter, memory.models.fingerprinter)
            stats = add_conversation(memory, turns, progress=not args.no_progress)
            jobs = []
            if args.consolidate_in_background:  # one job a user, each waited for before the next
                # is queued: asked again once its job ended, consolidate would start a second one
                jobs = [memory.consolidate(user_id=user, wait=True)
                        for user in dict.fromkeys(t.user_id for t in turns)]
    except (InputFormatError, IngestError, MemoryAPIError, StoreError, OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: the turns added so far are stored; the same command again adds the rest",
              file=sys.stderr)
        return 130
    print(stats.summary())
    for job in jobs:
        report = job.progress
        if job.error or report.get("purged_meanwhile"):  # a purge's counts are never shown
            why = job.error or "the user's data was deleted meanwhile (another process's delete or forget)"
            print(f"consolidation {job.user_id}: job {job.id} {job.state}: {why}")
            continue
        print(f"consolidation {job.user_id}: active AMUs {report.get('amus_before')} -> "
              f"{report.get('amus_active_after')} | archived {report.get('archived')} | created "
              f"{report.get('created')} | job {job.id} {job.state}")
    return 1 if any(job.error for job in jobs) else 0  # the turns are stored; a consolidation is not done


def warn_unservable(source: Path, turns: Sequence[Turn]) -> None:
    """One warning line for the ids of ``turns`` that no URL can name: the store keeps them, but
    ``retrieval.serve keys create`` refuses such a user, and such a session or turn cannot be
    listed, read or deleted over HTTP or MCP."""
    kinds = {"conversation": {t.user_id for t in turns}, "session": {t.session_id for t in turns},
             "turn": {t.turn_id for t in turns}}
    unservable = {kind: sorted(i for i in ids if not re.fullmatch(ID_PATTERN, i))
                  for kind, ids in kinds.items()}
    named = [f"{len(ids)} {kind} id(s) such as {ids[0]!r}" for kind, ids in unservable.items() if ids]
    if named:
        print(f"warning: {source}: {', '.join(named)} cannot be served over HTTP or MCP (an id there starts "
              "with a letter or digit and holds only ASCII letters, digits and ._:@-); Python and "
              "retrieval.query reach them", file=sys.stderr)


def _models(args: argparse.Namespace) -> tuple[Deferred, Deferred, Deferred | None]:
    """The embedder, extractor and (optional) fingerprinter the arguments name, loaded once the
    store is open (a busy or broken store fails fast)."""
    cache = _llm_cache(args)
    extractor = (Deferred(LLMExtractor, cache_dir=cache) if args.extractor == "llm"
                 else Deferred(RuleExtractor))
    fingerprinter = (None if args.fingerprinter is None
                     else Deferred(Fingerprinter.from_pretrained, args.fingerprinter))
    return Deferred(SentenceEmbedder, args.embedder), extractor, fingerprinter


def _llm_cache(args: argparse.Namespace) -> Path | None:
    """``--llm-cache``, else the store's own (none for a store on a database server)."""
    return args.llm_cache or llm_cache(local_directory(args.store))


if __name__ == "__main__":
    sys.exit(main())
