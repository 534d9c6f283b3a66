"""The LoCoMo evaluation run (docs/design.md §6, MemCode's retrieval ablation).

Four steps over one :class:`EvaluationSettings`: :func:`construct` ingests each conversation's
sessions in order into ``OUT/store`` (a rerun resumes and reuses it), embeds and fingerprints
every AMU with each fingerprinter and builds one dual-path bank per codebook (its BM25 channel
is an FTS5 table over the conversation's own records) and the multi-route retrievers
(:mod:`retrieval.eval.multi`);
:func:`encode_queries` embeds and fingerprints the questions in batches; :func:`retrieve_all` answers
every question of categories 1-4 through each configuration's :class:`retrieval.contract.Retriever`, timed;
:func:`score_config` scores it; :func:`evaluate` writes the reports, pictures, optional sweep and answers.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from isq.fingerprint import Fingerprinter
from isq.topology import TopologyParams
from retrieval.api.memory import Memory
from retrieval.consolidation.engine import consolidate_user
from retrieval.consolidation.operations import Operator
from retrieval.consolidation.report import ConsolidationReport
from retrieval.contract import Hit, Query
from retrieval.eval.answers import AnswerStage, run_answer_stage
from retrieval.eval.configs import (
    K_CODE,
    K_DENSE,
    KMEANS,
    TRAINED,
    EvaluationError,
    RetrievalConfig,
    default_configs,
    resolve_configs,
    sweep_grid,
)
from retrieval.eval.consolidated import consolidation_block, recall_ceiling
from retrieval.eval.construction import (
    STORE_DIR,
    BuiltConversation,
    ConstructionLedger,
    add_locomo_conversation,
    build_retriever,
    codebook_diagnostics,
    open_memory,
)
from retrieval.eval.curves import recall_curves
from retrieval.eval.kept_arrays import run_cache
from retrieval.eval.lexical_gap import gap_flags, gap_recall
from retrieval.eval.locomo import LocomoConversation
from retrieval.eval.metrics import EvidenceScore, covered_turns, mean, score_evidence, summarise, tied_at_cut
from retrieval.eval.multi import build_route_retrievers, multi_info, prepare_queries
from retrieval.eval.questions import CATEGORY_NAMES, EvalQuestion, EvidenceReport, select_questions
from retrieval.eval.render import render_markdown, write_pictures
from retrieval.eval.results import (
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
from retrieval.eval.staging import publish, staged
from retrieval.extract.base import Extractor
from retrieval.extract.rules import RuleExtractor
from retrieval.index.fts import RecordLexical
from retrieval.ingestion.segmenter import count_tokens
from retrieval.memory.cache import CachedEmbedder, CachedFingerprinter, model_identity
from retrieval.memory.protocols import Embedder
from retrieval.memory.store_contract import Store
from retrieval.multi_route.planner_rules import Planner
from retrieval.multi_route.query_plan import Plan
from retrieval.multi_route.rerank import CrossEncoderReranker

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvaluationSettings:
    """What to evaluate: the configuration names (default :func:`default_configs`), the budgets
    (a multi-route configuration takes ``k_dense + k_code`` items), Path B's topology, whether to
    sweep it, the configurations the optional answer stage answers, what ``results.json`` records
    beside these (``recorded``, e.g. the command line), whether to show progress, and where the
    memory is instead of ``OUT/store``: ``store``, a memory already built to evaluate read-only, or
    ``database``, a PostgreSQL URL to add LoCoMo into (the reports still go to ``OUT``)."""

    configs: Sequence[str] | None = None
    k_dense: int = K_DENSE
    k_code: int = K_CODE
    topology: TopologyParams = TopologyParams()
    sweep: bool = False
    answer_configs: Sequence[str] = ()
    recorded: Mapping[str, Any] = field(default_factory=dict)
    progress: bool = True
    store: str | Path | None = None
    database: str | None = None


@dataclass(frozen=True)
class EvalModels:
    """What builds and reads the memory: the fingerprinters (``"trained"`` required, ``"kmeans"``
    optional), the embedder, the extractor (default the rule extractor), the multi-route planner
    (default the rule planner) and reranker (default none), an optional consolidation operator (each store
    is then consolidated after ingestion and evaluated consolidated) and an optional answer stage."""

    fingerprinters: Mapping[str, Fingerprinter]
    embedder: Embedder
    extractor: Extractor | None = None
    planner: Planner | None = None
    reranker: CrossEncoderReranker | None = None
    operator: Operator | None = None
    answer_stage: AnswerStage | None = None


@dataclass
class QuerySet:
    """The scored questions with their embeddings and, per codebook, their fingerprint code sets."""

    questions: list[EvalQuestion]
    embeddings: np.ndarray
    codes: dict[str, list[frozenset[int]]]

    def query(self, i: int, codebook: str | None) -> Query:
        """Question ``i`` as a query, with the codes of ``codebook`` (None: without codes)."""
        codes = self.codes[codebook][i] if codebook is not None else None
        return Query(self.questions[i].question, self.embeddings[i], codes)


@dataclass
class ConfigRun:
    """One configuration's hits per question, with each query's wall time (seconds) and the
    tokens of the text it retrieved (:func:`retrieval.ingestion.segmenter.count_tokens`)."""

    hits: list[list[Hit]]
    seconds: list[float]
    tokens: list[int]


@dataclass
class Built:
    """What :func:`construct` built: the conversations, their questions and what it cost."""

    conversations: dict[str, BuiltConversation] = field(default_factory=dict)
    questions: list[EvalQuestion] = field(default_factory=list)
    report: EvidenceReport = field(default_factory=EvidenceReport)
    timings: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    route_seconds: dict[str, float] = field(default_factory=dict)
    per_conversation: dict[str, float] = field(default_factory=dict)
    consolidated: list[ConsolidationReport] = field(default_factory=list)
    resumed: int = 0


def retrieve_all(config: RetrievalConfig, built: Mapping[str, BuiltConversation], queries: QuerySet,
                 topology: TopologyParams | None = None) -> ConfigRun:
    """The hits of ``config`` for every question, in question order, timed one by one
    (``topology`` rescores Path B, for a sweep)."""
    run = ConfigRun([], [], [])
    retrievers = {cid: conversation.retriever(config, topology) for cid, conversation in built.items()}
    for i, question in enumerate(queries.questions):
        query = queries.query(i, config.codebook)
        tick = time.perf_counter()
        hits = retrievers[question.conversation_id].retrieve(query, config.k).hits
        run.seconds.append(time.perf_counter() - tick)
        run.hits.append(hits)
        run.tokens.append(sum(count_tokens(hit.text) for hit in hits))
    return run


def score_config(queries: QuerySet, run: ConfigRun) -> tuple[RetrievalSummary, list[EvidenceScore]]:
    """Per-question evidence scores of one configuration and their summary, with the mean number
    of items retrieved (to check the budget was used), the mean tokens of their text, the median
    query latency and, for a configuration with a code or BM25 path, the mean
    :func:`tied_at_cut` of that path."""
    hits = run.hits
    scores = [score_evidence(q.evidence, covered_turns(h))
              for q, h in zip(queries.questions, hits, strict=True)]
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


def run_sweep(configs: Sequence[RetrievalConfig], built: Mapping[str, BuiltConversation], queries: QuerySet,
              grid: Sequence[TopologyParams]) -> list[SweepRow]:
    """Score the Path B ``configs`` under every topology setting of ``grid`` on the built banks
    (only the topology parameters change between settings; the banks are not touched)."""
    rows = []
    for params in grid:
        summaries = {config.name: score_config(queries, retrieve_all(config, built, queries, params))[0]
                     for config in configs}
        rows.append(SweepRow(**params.to_dict(), configs=summaries))
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


def construct(conversations: Sequence[LocomoConversation], memory: Memory, models: EvalModels,
              fingerprinters: Mapping[str, CachedFingerprinter], embedder: CachedEmbedder,
              settings: EvaluationSettings, selected: Sequence[RetrievalConfig]) -> Built:
    """Add through ``Memory.add`` (or reuse), consolidate if asked, embed, fingerprint and index
    every conversation."""
    store, ledger = memory.store, ConstructionLedger(memory.store)
    multi_configs = [config for config in selected if config.multi]
    built = Built()
    for conversation in conversations:
        cid = conversation.conversation_id
        spent, replayed = add_locomo_conversation(conversation, memory, ledger)
        built.timings["ingest"] += spent
        built.resumed += replayed
        embedder_u = embedder.for_user(cid)
        fingerprinters_u = {name: fp.for_user(cid) for name, fp in fingerprinters.items()}
        if models.operator is not None:
            built.consolidated.append(consolidate_user(store, cid, embedder_u, models.operator))
        amus = list(store.amus(cid))
        tick = time.perf_counter()
        embeddings = embedder_u.encode([amu.text for amu in amus])
        seconds = {"embed": time.perf_counter() - tick}
        banks, lexical = {}, RecordLexical(amus)
        for codebook, fingerprinter in fingerprinters_u.items():
            tick = time.perf_counter()
            banks[codebook] = build_retriever(fingerprinter, amus, embeddings, settings.topology, lexical)
            seconds[f"index_{codebook}"] = time.perf_counter() - tick
        multi = {}
        if multi_configs:
            tick = time.perf_counter()
            multi = build_route_retrievers(store, cid, embedder_u, amus, embeddings, banks, fingerprinters_u,
                                           models.planner, models.reranker, multi_configs)
            seconds["route_banks"] = built.route_seconds[cid] = time.perf_counter() - tick
        for step, spent in seconds.items():
            built.timings[step] += spent
        # ingestion (summed over the runs that built the store) + what this run built for it
        built.per_conversation[cid] = (ledger.total([cid], "seconds") + seconds["embed"]
                                       + seconds[f"index_{TRAINED}"]
                                       + seconds.get("route_banks", 0.0))
        built.conversations[cid] = BuiltConversation(amus, banks, multi)
        built.questions += select_questions(conversation, built.report)
        logger.info("%s: %d AMUs", cid, len(amus))
    return built


def encode_queries(built: Built, fingerprinters: Mapping[str, CachedFingerprinter],
                   embedder: CachedEmbedder) -> tuple[QuerySet, list[Plan]]:
    """The questions embedded in one call and fingerprinted in one per codebook (cached under their
    conversations); the multi-route plans, their route queries' vectors and codes cached."""
    texts, users = [q.question for q in built.questions], [q.conversation_id for q in built.questions]
    queries = QuerySet(built.questions, embedder.encode_for(users, texts),
                       {name: [fp.codes for fp in fp_model.fingerprint_for(users, texts)]
                        for name, fp_model in fingerprinters.items()})
    multi = {cid: next(iter(c.multi.values())) for cid, c in built.conversations.items() if c.multi}
    plans = prepare_queries(multi, built.questions, embedder, fingerprinters.values()) if multi else []
    return queries, plans


def construction_record(built: Built, store: Store, ids: Sequence[str], extractor: Extractor,
                        embedder: CachedEmbedder,
                        fingerprinters: Mapping[str, CachedFingerprinter]) -> Construction:
    """What building the memory cost, over the runs that built the store and in this run."""
    ledger, timings = ConstructionLedger(store), built.timings
    return Construction(
        seconds=ledger.total(ids, "seconds") + timings["embed"] + timings[f"index_{TRAINED}"]
        + timings["route_banks"], amus=sum(store.count(cid) for cid in ids),
        segments=sum(len(store.segments(cid)) for cid in ids),
        llm_calls=int(ledger.total(ids, "llm_calls")), tokens=int(ledger.total(ids, "tokens")),
        ingest_seconds=ledger.total(ids, "seconds"), extractor=str(model_identity(extractor)),
        unrecorded=ledger.unrecorded(ids),
        per_conversation={cid: round(seconds, 2) for cid, seconds in built.per_conversation.items()},
        this_run={"replayed_turns": built.resumed, "embeddings_computed": embedder.computed,
                  "fingerprints_computed": sum(fp.computed for fp in fingerprinters.values()),
                  **{f"{k}_seconds": round(v, 2) for k, v in timings.items()}},
    )


def sweep_topology(selected: Sequence[RetrievalConfig], built: Built, queries: QuerySet,
                   out_dir: Path) -> tuple[list[SweepRow], SweepInfo]:
    """The topology sweep over the Path B configurations, written to ``sweep.json``."""
    swept = [c for c in selected if c.walks_topology]
    tick = time.perf_counter()
    rows = run_sweep(swept, built.conversations, queries, sweep_grid())
    primary = next((c.name for c in swept if c.dual and c.dual.k_dense and c.codebook == TRAINED),
                   swept[0].name)
    write_sweep(out_dir / "sweep.json", rows)
    return rows, SweepInfo(file="sweep.json", settings=len(rows), configs=[c.name for c in swept],
                           seconds=round(time.perf_counter() - tick, 2), recommended=recommend(rows, primary))


def evaluate(conversations: Sequence[LocomoConversation], models: EvalModels, out_dir: str | Path,
             settings: EvaluationSettings = EvaluationSettings()) -> Results:
    """Run the evaluation and write its reports to ``out_dir``; returns what ``results.json`` holds.
    The store is bound to the extractor and embedder it was built with, and to being consolidated
    or not."""
    started = time.perf_counter()
    out_dir = Path(out_dir)
    if TRAINED not in models.fingerprinters:
        raise EvaluationError("a trained fingerprinter is required")
    names = (list(settings.configs) if settings.configs is not None
             else default_configs(settings.k_dense, settings.k_code, KMEANS in models.fingerprinters))
    selected = resolve_configs(names, models.fingerprinters, settings.answer_configs,
                               settings.k_dense + settings.k_code, sweep=settings.sweep)
    if settings.store is not None and settings.database is not None:
        raise EvaluationError("give the memory's store (evaluated read-only) or a database to build it in, "
                              "not both")
    extractor = models.extractor or RuleExtractor()
    target = settings.store or settings.database or out_dir / STORE_DIR
    with open_memory(target, models.embedder, extractor, models.operator,
                     read_only=settings.store is not None) as memory, staged(out_dir) as staging:
        # out_dir made once the memory opened (a refused run leaves none); embeddings and
        # fingerprints come from its cache when an earlier run computed them
        store, arrays = memory.store, run_cache(memory.store)
        embedder = CachedEmbedder(models.embedder, arrays)
        fingerprinters = {name: CachedFingerprinter(fp, arrays) for name, fp in models.fingerprinters.items()}
        built = construct(conversations, memory, models, fingerprinters, embedder, settings, selected)
        tick = time.perf_counter()
        queries, plans = encode_queries(built, fingerprinters, embedder)
        built.timings["queries"] = time.perf_counter() - tick

        tick = time.perf_counter()
        config_results, per_question, all_hits = {}, {}, {}
        for config in selected:
            run = retrieve_all(config, built.conversations, queries)
            all_hits[config.name] = run.hits
            config_results[config.name], per_question[config.name] = score_config(queries, run)
        built.timings["retrieval"] = time.perf_counter() - tick
        questions = built.questions
        curves = recall_curves(selected, questions, lambda c: retrieve_all(c, built.conversations, queries))
        gaps = gap_flags(questions, conversations)
        write_questions(staging / "questions.jsonl", [
            QuestionRecord(conversation=q.conversation_id, qa_index=q.qa_index, category=q.category_name,
                           question=q.question, evidence=list(q.evidence),
                           found={name: list(scores[i].found) for name, scores in per_question.items()},
                           lexical_gap=gaps[i])
            for i, q in enumerate(questions)
        ])
        lexical_gap = LexicalGap(questions=sum(gaps), share=sum(gaps) / max(len(gaps), 1),
                                 recall=gap_recall(gaps, per_question))
        ceiling = recall_ceiling(questions, {cid: c.coverable for cid, c in built.conversations.items()})
        ids = [c.conversation_id for c in conversations]
        construction = construction_record(built, store, ids, extractor, embedder, fingerprinters)
        codebooks = {name: CodebookStats(**codebook_diagnostics(fp_model, list(built.conversations.values()),
                                                                name,
                                                                 queries.codes[name]))
                     for name, fp_model in fingerprinters.items()}
        recorded = Settings(**{**settings.recorded, "configs": names, "k_dense": settings.k_dense,
                               "k_code": settings.k_code, "topology": settings.topology.to_dict(),
                               "categories": {str(k): v for k, v in CATEGORY_NAMES.items()},
                               "conversations": ids})
        rows, swept_info = sweep_topology(selected, built, queries, staging) if settings.sweep else ([], None)
        answers = run_answer_stage(models.answer_stage, settings.answer_configs, questions, all_hits,
                                   built.conversations, store, staging)

    multi = {cid: next(iter(c.multi.values())) for cid, c in built.conversations.items() if c.multi}
    results = Results(configs=config_results, construction=construction,
                      evidence=EvidenceCounts(**built.report.to_dict(), recall_ceiling=ceiling),
                      codebooks=codebooks, settings=recorded, sweep=swept_info, answers=answers,
                      wall_seconds=time.perf_counter() - started,
                      multi=multi_info(multi, plans, built.route_seconds) if multi else None,
                      lexical_gap=lexical_gap,
                      consolidation=(consolidation_block(built.consolidated, questions)
                                     if built.consolidated else None), recall_curves=curves)
    write_results(staging / "results.json", results)
    write_pictures(results, staging)
    (staging / "results.md").write_text(render_markdown(results, rows))
    publish(staging, out_dir)
    return results

