"""The LoCoMo evaluation run (SPEC section 6, MemCode's retrieval ablation).

Per conversation the sessions are ingested in order into ``OUT/store`` (a rerun resumes and
reuses it), every AMU is embedded and fingerprinted with each fingerprinter, and one
:class:`DualPathRetriever` per codebook is built (its BM25 channel is the store's FTS5 table)
and, for the multi-route configurations, one :class:`MultiRouteRetriever`
(:mod:`retrieval.eval.multi`). Then every question of categories 1-4 is answered by retrieval
alone, timed, and scored against its evidence dia_ids.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from isq.fingerprint import Fingerprinter
from isq.topology import TopologyParams
from retrieval.consolidation.engine import consolidate_conversation
from retrieval.consolidation.operations import Operator
from retrieval.consolidation.report import ConsolidationReport
from retrieval.eval.answers import AnswerStage, run_answer_stage
from retrieval.eval.bank import (
    STORE_DIR,
    ConstructionLedger,
    ConversationBank,
    add_locomo_conversation,
    build_retriever,
    codebook_diagnostics,
    open_memory,
)
from retrieval.eval.configs import (
    KMEANS,
    TRAINED,
    EvaluationError,
    RetrievalConfig,
    default_configs,
    resolve_configs,
    sweep_grid,
)
from retrieval.eval.consolidated import consolidation_block, recall_ceiling
from retrieval.eval.evidence import CATEGORY_NAMES, EvalQuestion, EvidenceReport, select_questions
from retrieval.eval.lexical_gap import gap_flags, gap_recall
from retrieval.eval.locomo import LocomoConversation
from retrieval.eval.metrics import EvidenceScore, covered_turns, mean, score_evidence, summarise, tied_at_cut
from retrieval.eval.multi import build_route_retriever, multi_info, prepare_queries
from retrieval.eval.render import plot_recall, render_markdown
from retrieval.eval.results import (
    AnswersSkipped,
    CodebookStats,
    Construction,
    EvidenceCounts,
    LexicalGap,
    QuestionRecord,
    Recommended,
    Results,
    RetrievalSummary,
    Settings,
    SweepInfo,
    SweepRow,
    write_questions,
    write_results,
    write_sweep,
)
from retrieval.extract.base import Extractor
from retrieval.extract.rules import RuleExtractor
from retrieval.index.embed import Embedder
from retrieval.memory.cache import CachedEmbedder, CachedFingerprinter, model_identity
from retrieval.memory.segmenter import count_tokens
from retrieval.retriever import Hit
from retrieval.routes.bank import StoreLexical
from retrieval.routes.rerank import CrossEncoderReranker
from retrieval.routes.retriever import RouteHit

logger = logging.getLogger(__name__)


@dataclass
class QuerySet:
    """The scored questions with their embeddings and, per codebook, their fingerprint code sets."""

    questions: list[EvalQuestion]
    embeddings: np.ndarray
    codes: dict[str, list[frozenset[int]]]


@dataclass
class ConfigRun:
    """One configuration's hits per question, with each query's wall time (seconds) and the
    tokens of the text it retrieved (:func:`retrieval.memory.segmenter.count_tokens`)."""

    hits: list[list[Hit]]
    seconds: list[float]
    tokens: list[int]


def retrieve_all(config: RetrievalConfig, banks: Mapping[str, ConversationBank], queries: QuerySet) -> ConfigRun:
    """The hits of ``config`` for every question, in question order, timed one by one."""
    run = ConfigRun([], [], [])
    for i, question in enumerate(queries.questions):
        bank = banks[question.conversation_id]
        tick = time.perf_counter()
        if config.multi:
            if bank.routes is None:
                raise EvaluationError(f"configuration {config.name} needs the multi-route banks")
            # equal budgets: exactly config.budget items (plan_depth 0; at 40 items max(40, 15) is 40 anyway)
            hits: list[Hit] = list(bank.routes.retrieve(question.question, config.budget, use_code=config.uses_codes,
                                                        plan_depth=0).hits)
        else:
            retriever = bank.retrievers[config.codebook]
            hits = retriever.retrieve(
                query_text=question.question, query_embedding=queries.embeddings[i],
                query_codes=queries.codes[config.codebook][i] if config.uses_codes else None,
                k_dense=config.k_dense, k_code=config.k_code, mode=config.mode,
            )
        run.seconds.append(time.perf_counter() - tick)
        run.hits.append(hits)
        texts = [hit.text if isinstance(hit, RouteHit) else bank.retrievers[config.codebook].texts[hit.index]
                 for hit in hits]
        run.tokens.append(sum(count_tokens(text) for text in texts))
    return run


def score_config(queries: QuerySet, run: ConfigRun) -> tuple[RetrievalSummary, list[EvidenceScore]]:
    """Per-question evidence scores of one configuration and their summary, with the mean number
    of items retrieved (to check the budget was used), the mean tokens of their text, the median
    query latency and, for a configuration with a code or BM25 path, the mean
    :func:`tied_at_cut` of that path."""
    hits = run.hits
    scores = [score_evidence(q.evidence, covered_turns(h)) for q, h in zip(queries.questions, hits, strict=True)]
    summary = RetrievalSummary.model_validate(summarise(
        (q.category_name, {"recall": s.recall, "hit": float(s.hit), "complete": float(s.complete)})
        for q, s in zip(queries.questions, scores, strict=True)
    ))
    summary.overall.mean_retrieved = mean([len(h) for h in hits])
    summary.overall.mean_tokens = mean(run.tokens)
    summary.overall.latency_ms = 1000.0 * float(np.median(run.seconds)) if run.seconds else 0.0
    ties = [share for share in map(tied_at_cut, hits) if share is not None]
    if ties:
        summary.overall.tied_at_cut = mean(ties)
    return summary, scores


def run_sweep(configs: Sequence[RetrievalConfig], banks: Mapping[str, ConversationBank], queries: QuerySet,
              grid: Sequence[TopologyParams], restore: TopologyParams) -> list[SweepRow]:
    """Score the Path B ``configs`` under every topology setting of ``grid`` on the built banks
    (only the topology parameters change between settings), then put ``restore`` back."""
    rows = []
    for params in grid:
        for bank in banks.values():
            for retriever in bank.retrievers.values():
                retriever.topology.params = params
        summaries = {config.name: score_config(queries, retrieve_all(config, banks, queries))[0]
                     for config in configs}
        rows.append(SweepRow(**params.to_dict(), configs=summaries))
    for bank in banks.values():
        for retriever in bank.retrievers.values():
            retriever.topology.params = restore
    return rows


def recommend(rows: Sequence[SweepRow], config_name: str) -> Recommended:
    """The sweep setting with the best overall recall of ``config_name``; ties go to the better
    multi-hop recall, then to fewer hops (the simpler walk)."""

    def key(row: SweepRow) -> tuple[float, float, int]:
        summary = row.configs[config_name]
        multi = summary.by_category.get("multi-hop")
        return summary.overall.recall, multi.recall if multi else 0.0, -row.max_hops

    best = max(rows, key=key)
    summary = best.configs[config_name]
    return Recommended(max_hops=best.max_hops, alpha=best.alpha, self_term=best.self_term,
                       aggregate=best.aggregate, config=config_name, overall=summary.overall,
                       by_category=summary.by_category)


def evaluate(conversations: Sequence[LocomoConversation], fingerprinters: Mapping[str, Fingerprinter],
             embedder: Embedder, out_dir: str | Path, *, extractor: Extractor | None = None,
             configs: Sequence[str] | None = None, k_dense: int = 20,
             k_code: int = 20, topology: TopologyParams | None = None, sweep: bool = False,
             answer_stage: AnswerStage | None = None, answer_configs: Sequence[str] = (),
             settings: Mapping[str, Any] | None = None, progress: bool = True, planner: Any | None = None,
             reranker: CrossEncoderReranker | None = None, consolidator: Operator | None = None,
             store_dir: str | Path | None = None) -> Results:
    """Run the evaluation and write its reports to ``out_dir``; returns what ``results.json`` holds.

    ``fingerprinters`` maps ``"trained"`` (required) and optionally ``"kmeans"`` to loaded
    fingerprinters. ``configs`` defaults to :func:`default_configs`. ``extractor`` defaults to
    the :class:`RuleExtractor`; the store is bound to the extractor and embedder it was built with.
    ``answer_configs`` are answered when ``answer_stage`` is given. ``topology`` defaults to
    :class:`TopologyParams`'s defaults. ``settings`` is recorded as is. The multi-route
    configurations plan with ``planner`` (default: the rule planner) and rerank with ``reranker``
    (default: none). With ``consolidator`` each conversation's store is consolidated after
    ingestion and evaluated consolidated; a store stays bound to being consolidated or not.
    Memory is built through :meth:`retrieval.api.memory.Memory.add` (what users call) into
    ``out_dir/store``; with ``store_dir`` the memory already built there is evaluated, read-only.
    """
    started = time.perf_counter()
    topology = topology or TopologyParams()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if TRAINED not in fingerprinters:
        raise EvaluationError("a trained fingerprinter is required")
    names = list(configs) if configs is not None else default_configs(k_dense, k_code, KMEANS in fingerprinters)
    selected = resolve_configs(names, fingerprinters, answer_configs, k_dense + k_code)
    with_routes = any(config.multi for config in selected)
    extractor = extractor or RuleExtractor()

    built_store = store_dir is not None
    store_dir = Path(store_dir) if built_store else out_dir / STORE_DIR
    if built_store and consolidator is not None:
        raise EvaluationError("--store evaluates a memory as built; consolidate it first (Memory.consolidate)")
    with open_memory(store_dir, embedder, extractor, read_only=built_store) as memory:
        store = memory.store
        ledger = ConstructionLedger(store)
        # Embeddings and fingerprints come from the store's cache when an earlier run computed them.
        embedder = CachedEmbedder(embedder, store)
        fingerprinters = {name: CachedFingerprinter(fp, store) for name, fp in fingerprinters.items()}
        if not built_store:
            store.bind("consolidation", "none" if consolidator is None else consolidator.name,
                       hint="evaluate consolidated and unconsolidated memory in two --out directories")
        consolidated: list[ConsolidationReport] = []
        # -- construction: ingest (or reuse), embed, fingerprint, index
        report = EvidenceReport()
        banks: dict[str, ConversationBank] = {}
        timings: Counter[str] = Counter()
        bank_seconds: dict[str, float] = {}
        per_conversation: dict[str, float] = {}
        resumed = 0
        questions: list[EvalQuestion] = []
        for conversation in conversations:
            cid = conversation.conversation_id
            if built_store:  # evaluated as it was built (e.g. consolidated through Memory.consolidate)
                if cid not in store.conversations():
                    raise EvaluationError(f"{store_dir} holds no memory of user {cid!r}")
            else:
                logger.info("%s: adding %d turns through Memory.add", cid, len(conversation.turns))
                stats = add_locomo_conversation(conversation, memory)
                ledger.add(cid, stats)
                timings["ingest"] += stats.wall_s
                resumed += len(conversation.turns) - stats.turns
            if consolidator is not None:
                consolidated.append(consolidate_conversation(store, cid, embedder, consolidator))
            amus = list(store.amus(cid))
            tick = time.perf_counter()
            embeddings = embedder.encode([amu.text for amu in amus])
            built = {"embed": time.perf_counter() - tick}
            retrievers = {}
            for codebook, fingerprinter in fingerprinters.items():
                tick = time.perf_counter()
                lexical = StoreLexical(store, cid, [amu.id for amu in amus])
                retrievers[codebook] = build_retriever(fingerprinter, amus, embeddings, topology, lexical)
                built[f"index_{codebook}"] = time.perf_counter() - tick
            routes = None
            if with_routes:
                tick = time.perf_counter()
                routes = build_route_retriever(store, cid, embedder, amus, embeddings, retrievers[TRAINED].topology,
                                               fingerprinters[TRAINED], planner, reranker)
                built["route_banks"] = bank_seconds[cid] = time.perf_counter() - tick
            timings.update(built)
            # ingestion (summed over the runs that built the store) + what this run built for it
            per_conversation[cid] = (ledger.total([cid], "seconds") + built["embed"] + built[f"index_{TRAINED}"]
                                     + built.get("route_banks", 0.0))
            banks[cid] = ConversationBank(amus, retrievers, routes)
            questions += select_questions(conversation, report)
            logger.info("%s: %d AMUs", cid, len(amus))

        # -- queries: one batched embedding call, one fingerprinting call per codebook
        tick = time.perf_counter()
        texts = [q.question for q in questions]
        queries = QuerySet(questions, embedder.encode(texts),
                           {name: [fp.codes for fp in fp_model.fingerprint(texts)]
                            for name, fp_model in fingerprinters.items()})
        plans = []
        if with_routes:
            plans = prepare_queries({cid: bank.routes for cid, bank in banks.items() if bank.routes is not None},
                                    questions, embedder, fingerprinters[TRAINED])
        timings["queries"] = time.perf_counter() - tick

        # -- retrieval
        tick = time.perf_counter()
        config_results, per_question, all_hits = {}, {}, {}
        for config in selected:
            run = retrieve_all(config, banks, queries)
            all_hits[config.name] = run.hits
            config_results[config.name], per_question[config.name] = score_config(queries, run)
        timings["retrieval"] = time.perf_counter() - tick
        gaps = gap_flags(questions, conversations)
        write_questions(out_dir / "questions.jsonl", [
            QuestionRecord(conversation=q.conversation_id, qa_index=q.qa_index, category=q.category_name,
                           question=q.question, evidence=list(q.evidence),
                           found={name: list(scores[i].found) for name, scores in per_question.items()},
                           lexical_gap=gaps[i])
            for i, q in enumerate(queries.questions)
        ])
        lexical_gap = LexicalGap(questions=sum(gaps), share=sum(gaps) / max(len(gaps), 1),
                                 recall=gap_recall(gaps, per_question))

        ceiling = recall_ceiling(questions, {cid: bank.coverable for cid, bank in banks.items()})
        ids = [c.conversation_id for c in conversations]
        construction = Construction(
            seconds=ledger.total(ids, "seconds") + timings["embed"] + timings[f"index_{TRAINED}"]
            + timings["route_banks"],
            amus=sum(store.count(cid) for cid in ids),
            segments=sum(len(store.segments(cid)) for cid in ids),
            llm_calls=int(ledger.total(ids, "llm_calls")),
            tokens=int(ledger.total(ids, "tokens")),
            ingest_seconds=ledger.total(ids, "seconds"),
            extractor=str(model_identity(extractor)),
            per_conversation={cid: round(seconds, 2) for cid, seconds in per_conversation.items()},
            this_run={"replayed_turns": resumed, "embeddings_computed": embedder.computed,
                      "fingerprints_computed": sum(fp.computed for fp in fingerprinters.values()),
                      **{f"{k}_seconds": round(v, 2) for k, v in timings.items()}},
        )
        codebooks = {name: CodebookStats(**codebook_diagnostics(fp_model, list(banks.values()), name,
                                                                 queries.codes[name]))
                     for name, fp_model in fingerprinters.items()}
        recorded = Settings(**{**(settings or {}), "configs": names, "k_dense": k_dense, "k_code": k_code,
                               "topology": topology.to_dict(),
                               "categories": {str(k): v for k, v in CATEGORY_NAMES.items()},
                               "conversations": ids})

        # -- sweep over the topology parameters, on the same banks
        if sweep:
            swept = [c for c in selected if c.mode in ("code", "dense+code")]  # what the topology changes
            if not swept:
                raise EvaluationError("--sweep needs a configuration with a codebook path")
            tick = time.perf_counter()
            rows = run_sweep(swept, banks, queries, sweep_grid(), topology)
            primary = next((c.name for c in swept if c.mode == "dense+code" and c.codebook == TRAINED), swept[0].name)
            write_sweep(out_dir / "sweep.json", rows)
            swept_info = SweepInfo(file="sweep.json", settings=len(rows), configs=[c.name for c in swept],
                                   seconds=round(time.perf_counter() - tick, 2),
                                   recommended=recommend(rows, primary))
        else:
            rows, swept_info = [], None

        # -- optional answer stage
        if answer_stage is not None and answer_configs:
            logger.info("answering %d questions x %d configurations", len(questions), len(answer_configs))
            answers = run_answer_stage(answer_stage, answer_configs, questions, all_hits, banks, store,
                                       out_dir)
        else:
            answers = AnswersSkipped(note=(
                "no LLM endpoint configured: set ISQ_LLM_BASE_URL and ISQ_LLM_MODEL (and ISQ_LLM_API_KEY if "
                "needed) or pass --llm-base-url/--llm-model" if answer_stage is None
                else "no answer configuration selected (--answer-configs)"))

    results = Results(configs=config_results, construction=construction,
                      evidence=EvidenceCounts(**report.to_dict(), recall_ceiling=ceiling),
                      codebooks=codebooks, settings=recorded, sweep=swept_info, answers=answers,
                      wall_seconds=time.perf_counter() - started,
                      multi=multi_info({c: b.routes for c, b in banks.items() if b.routes is not None}, plans,
                                       bank_seconds) if with_routes else None, lexical_gap=lexical_gap,
                      consolidation=consolidation_block(consolidated, questions) if consolidated else None)
    write_results(out_dir / "results.json", results)
    plot_recall(results, out_dir / "recall.png")
    (out_dir / "results.md").write_text(render_markdown(results, rows))
    return results
