"""``python -m retrieval.evaluate``: the LoCoMo evaluation of the memory (library:
:mod:`retrieval.eval`).

    python -m retrieval.evaluate --locomo PATH/TO/locomo_dev.json \\
        --kmeans-fingerprinter checkpoints/kmeans_minilm_dailydialog --out /tmp/eval_minilm --sweep

Per conversation the sessions are added in order through ``retrieval.Memory.add`` into
``OUT/store``, the conversation being the user (a rerun finds the turns stored and reuses it;
``--database URL`` builds it in that PostgreSQL database instead; ``--store DIR`` evaluates a
memory already built there), every AMU is embedded and
fingerprinted with each fingerprinter, and each question of categories 1-4 is answered by retrieval alone and
scored against its evidence dia_ids (metrics: :mod:`retrieval.eval.metrics`; configuration names:
:mod:`retrieval.eval.configs`).

``multi`` and ``multi+code`` are plan-guided multi-route retrieval (:mod:`retrieval.multi_route`),
planned by the rule planner (``--planner llm`` asks the endpoint below) and without reranking
unless ``--reranker DIR`` names a local cross-encoder.

Optional answer stage, when an OpenAI-compatible endpoint is configured (ISQ_LLM_BASE_URL,
ISQ_LLM_MODEL, ISQ_LLM_API_KEY, or --llm-base-url/--llm-model): an LLM answers from the
retrieved AMUs and their source turns, scored with LoCoMo's token F1 and an LLM judge
(CORRECT/WRONG), with the query tokens counted.

Outputs in OUT: ``results.json``, ``results.md``, ``recall.png``, ``recall_at_k.png`` (recall@k
curves, k = 5 ... 100), ``forest.png`` (paired differences per category), ``questions.jsonl`` (per
question and configuration, the evidence found), ``sweep.json`` (``--sweep``) and
``answers.jsonl`` (answer stage).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from isq.encoder import MINILM_ALIAS
from isq.fingerprint import Fingerprinter
from isq.outputs import unwritable
from isq.topology import AGGREGATES, ASSOCIATIONS, TopologyParams
from retrieval.api.errors import MemoryAPIError
from retrieval.api.inputs import check_recorded_file
from retrieval.consolidation.options import OPERATORS, make_operator
from retrieval.eval.answers import AnswerStage
from retrieval.eval.configs import (
    K_CODE,
    K_DENSE,
    KMEANS,
    TRAINED,
    EvaluationError,
    default_configs,
    resolve_configs,
)
from retrieval.eval.construction import database_url
from retrieval.eval.locomo import LocomoConversation, load_locomo
from retrieval.eval.questions import EvidenceReport, select_questions
from retrieval.eval.render import pct
from retrieval.eval.results import Results
from retrieval.eval.run import EvalModels, EvaluationSettings, evaluate
from retrieval.eval.staging import drop_if_empty
from retrieval.extract.base import Extractor
from retrieval.extract.llm_extractor import LLMExtractor
from retrieval.extract.rules import RuleExtractor
from retrieval.index.embed import SentenceEmbedder
from retrieval.ingestion.pipeline import IngestError
from retrieval.llm_client import EndpointRefused
from retrieval.memory.backends import open_store
from retrieval.memory.cache import model_identity
from retrieval.memory.errors import StoreError
from retrieval.memory.fingerprinter_source import UnfoundFingerprinter, recorded_or_refused
from retrieval.memory.meta_keys import bound_alike
from retrieval.memory.records import InputFormatError
from retrieval.memory.targets import store_target
from retrieval.multi_route.planner_llm import LLMPlanner
from retrieval.multi_route.rerank import CrossEncoderReranker

# The committed reference fingerprinter (docs/results.md), found from the source checkout.
DEFAULT_FINGERPRINTER = Path(__file__).resolve().parents[1] / "checkpoints" / "isq_minilm_dailydialog_cpu"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m retrieval.evaluate",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--locomo", type=Path, required=True, help="LoCoMo JSON file (e.g. locomo10.json)")
    parser.add_argument("--fingerprinter", type=Path,
                        help="trained fingerprinter directory (default: the one a --store recorded at "
                             "ingestion, else the committed checkpoints/isq_minilm_dailydialog_cpu)")
    parser.add_argument("--kmeans-fingerprinter", type=Path, help="k-means control fingerprinter directory")
    parser.add_argument("--out", type=Path, required=True,
                        help="output directory (the store goes to OUT/store)")
    parser.add_argument("--extractor", choices=("rule", "llm"), default="rule")
    parser.add_argument("--embedder", default=MINILM_ALIAS,
                        help="sentence-transformers name or path for segmentation and Path A")
    parser.add_argument("--k-dense", type=int, default=K_DENSE)
    parser.add_argument("--k-code", type=int, default=K_CODE)
    defaults = TopologyParams()
    parser.add_argument("--max-hops", type=int, default=defaults.max_hops,
                        help="H_r (0: the self term alone)")
    parser.add_argument("--alpha", type=float, default=defaults.alpha)
    parser.add_argument("--self-term", action=argparse.BooleanOptionalAction, default=defaults.self_term,
                        help="a query code also activates itself (h = 0 term)")
    parser.add_argument("--aggregate", choices=AGGREGATES, default=defaults.aggregate)
    parser.add_argument("--association", choices=ASSOCIATIONS, default=defaults.association,
                        help="weight of a walk: the paper's conditional probability, its lift, "
                             "or IDF on the target")
    parser.add_argument("--length-norm", type=float, default=defaults.length_norm,
                        help="divide a summed S_amu by |U_fp|^LENGTH_NORM (0 = off)")
    parser.add_argument("--configs",
                        help="comma-separated configurations (default: the equal-budget ablation)")
    parser.add_argument("--sweep", action="store_true", help="sweep H_r, α, self term and aggregate")
    parser.add_argument("--planner", choices=("rule", "llm"), default="rule",
                        help="planner of the multi-route configurations (llm: the endpoint below)")
    parser.add_argument("--reranker", type=Path,
                        help="sentence-transformers CrossEncoder directory reranking inside each route "
                             "(default: off)")
    parser.add_argument("--llm-base-url", help="OpenAI-compatible endpoint (default: $ISQ_LLM_BASE_URL)")
    parser.add_argument("--llm-model",
                        help="model name (default: $ISQ_LLM_MODEL); the key is $ISQ_LLM_API_KEY")
    parser.add_argument("--llm-cache", type=Path, help="LLM response cache (default: OUT/llm_cache)")
    parser.add_argument("--answer-configs", default=None,
                        help="configurations answered by the LLM (default: dense+code and the dense "
                             "configuration of the same budget)")
    parser.add_argument("--consolidate", choices=OPERATORS,
                        help="consolidate each conversation's memory after ingestion (offline: "
                             "near-duplicate merges; llm: the endpoint's operations) and evaluate it "
                             "consolidated")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--database", type=database_url,
                       help="add LoCoMo into this PostgreSQL database (postgresql://USER@HOST:PORT/DB) "
                            "instead of OUT/store; the reports still go to OUT")
    where.add_argument("--store", type=store_target,
                       help="evaluate the memory already built in this store (directory or PostgreSQL "
                            "URL; read-only; e.g. one consolidated through Memory.consolidate) instead of "
                            "adding LoCoMo into OUT/store; it must hold the file's turns, as they are there")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def trained_fingerprinter(named: Path | None, store: str | Path | None) -> Path:
    """The one ``named``, else the one ``store`` recorded at ingestion (as every reader of a built
    store takes it), else the committed one: for a store built with a fingerprinter whose directory
    it does not record or no longer finds (one built through a server, a checkpoint moved), only
    when that fingerprinter is the committed one (:class:`UnfoundFingerprinter` otherwise: the
    committed one would stand in for another codebook unsaid)."""
    if named is not None or store is None:
        return named or DEFAULT_FINGERPRINTER
    try:
        with open_store(store, read_only=True) as opened:
            try:
                return recorded_or_refused(opened) or DEFAULT_FINGERPRINTER
            except UnfoundFingerprinter:
                committed = model_identity(Fingerprinter.from_pretrained(DEFAULT_FINGERPRINTER))
                if bound_alike("fingerprinter", opened.meta("fingerprinter"), committed):
                    return DEFAULT_FINGERPRINTER
                raise
    except UnfoundFingerprinter:
        raise
    except StoreError:  # the evaluation's own open of the store says why
        return DEFAULT_FINGERPRINTER


def _split(value: str | None) -> list[str] | None:
    return None if value is None else [item.strip() for item in value.split(",") if item.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    show_progress(not args.no_progress)
    cache = args.llm_cache or args.out / "llm_cache"
    try:
        args.fingerprinter = trained_fingerprinter(args.fingerprinter, args.store)
        conversations = load_locomo(args.locomo)
        _check_inputs(args, conversations)
        fingerprinters = {TRAINED: Fingerprinter.from_pretrained(args.fingerprinter)}
        if args.kmeans_fingerprinter is not None:
            fingerprinters[KMEANS] = Fingerprinter.from_pretrained(args.kmeans_fingerprinter)
        configs = _split(args.configs)
        names = configs or default_configs(args.k_dense, args.k_code, KMEANS in fingerprinters)
        extractor: Extractor = RuleExtractor()
        if args.extractor == "llm":
            extractor = LLMExtractor(args.llm_base_url, args.llm_model, cache_dir=cache)
        answer_stage = None
        if args.llm_base_url or os.environ.get("ISQ_LLM_BASE_URL"):
            answer_stage = AnswerStage.from_endpoint(args.llm_base_url, args.llm_model, cache)
        answer_configs = _split(args.answer_configs)
        if answer_configs is None:
            k = args.k_dense + args.k_code
            answer_configs = [n for n in (f"dense{args.k_dense}+code{args.k_code}", f"dense{k}")
                              if n in names]
        resolve_configs(names, fingerprinters, answer_configs, sweep=args.sweep)
        topology = TopologyParams(args.max_hops, args.alpha, args.self_term, args.aggregate, args.association,
                                  args.length_norm)
        planner = None
        if args.planner == "llm":
            planner = LLMPlanner(args.llm_base_url, args.llm_model, cache_dir=cache)
        reranker = None if args.reranker is None else CrossEncoderReranker(args.reranker)
        operator = None if args.consolidate is None else make_operator(args.consolidate, cache)
        embedder = SentenceEmbedder(args.embedder)
    except (InputFormatError, EvaluationError, UnfoundFingerprinter, OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    settings = {"command": "python -m retrieval.evaluate " + " ".join(sys.argv[1:] if argv is None else argv),
                "locomo": str(args.locomo), "fingerprinter": str(args.fingerprinter),
                "kmeans_fingerprinter": str(args.kmeans_fingerprinter or ""), "embedder": args.embedder,
                # what the paths and names held: a model re-exported in place makes another run
                "identities": {"embedder": model_identity(embedder),
                               **{f"{kind}_fingerprinter": model_identity(fingerprinter)
                                  for kind, fingerprinter in fingerprinters.items()}}}
    fresh_out = not args.out.exists()
    try:
        models = EvalModels(fingerprinters, embedder, extractor, planner, reranker, operator, answer_stage)
        results = evaluate(conversations, models, args.out, EvaluationSettings(
            configs=configs, k_dense=args.k_dense, k_code=args.k_code, topology=topology, sweep=args.sweep,
            answer_configs=answer_configs, recorded=settings, progress=not args.no_progress,
            store=args.store, database=args.database))
    except (EvaluationError, IngestError, StoreError, MemoryAPIError, EndpointRefused) as err:
        drop_if_empty(args.out, fresh_out)
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        drop_if_empty(args.out, fresh_out)
        print(f"interrupted: {args.out}'s reports are as an earlier run left them; the memory built so far "
              "is kept, and the same command again goes on from it", file=sys.stderr)
        return 130
    print(_summary_line(results, args.out))
    return 0


def show_progress(progress: bool) -> None:
    """The evaluation's own progress lines on stderr (``retrieval.*`` at INFO unless --no-progress);
    other libraries only from WARNING up: sentence-transformers' "Loading SentenceTransformer model
    from ..." and the like are not the user's business."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("retrieval").setLevel(logging.INFO if progress else logging.WARNING)


def _check_inputs(args: argparse.Namespace, conversations: Sequence[LocomoConversation]) -> None:
    """What the evaluation cannot use, refused before any model loads."""
    for flag, value in (("--k-dense", args.k_dense), ("--k-code", args.k_code)):
        if value < 1:
            raise EvaluationError(f"{flag} must be at least 1, got {value}")
    if args.configs is not None and not _split(args.configs):
        raise EvaluationError(f"--configs {args.configs!r} names no configuration")
    if (problem := unwritable(args.out, directory=True)) is not None:
        raise EvaluationError(f"--out {problem}")
    if args.fingerprinter == DEFAULT_FINGERPRINTER and not DEFAULT_FINGERPRINTER.is_dir():
        raise EvaluationError("the committed fingerprinter (checkpoints/isq_minilm_dailydialog_cpu) is part "
                              "of a source checkout, not of an installed package: pass --fingerprinter DIR")
    check_recorded_file(args.locomo, [turn for conversation in conversations for turn in conversation.turns])
    report = EvidenceReport()
    if not any(select_questions(conversation, report) for conversation in conversations):
        raise EvaluationError(f"{args.locomo}: no question of categories 1-4 whose evidence names a turn of "
                              "its conversation; nothing to evaluate")


def _summary_line(results: Results, out: Path) -> str:
    parts = [f"{name} R={pct(s.overall.recall)} H={pct(s.overall.hit)}"
             for name, s in results.configs.items()]
    return f"{'; '.join(parts)} | wall {results.wall_seconds:.1f} s -> {out / 'results.md'}"


if __name__ == "__main__":
    sys.exit(main())
