"""LoCoMo evaluation of the dual-path memory (SPEC section 6, MemCode's retrieval ablation).

    python -m retrieval.evaluate --locomo ../shared/data/locomo/locomo_dev.json \\
        --fingerprinter checkpoints/isq_minilm_dailydialog_cpu \\
        --kmeans-fingerprinter checkpoints/kmeans_minilm_dailydialog --out /tmp/eval_minilm --sweep

Per conversation the sessions are ingested in order into ``OUT/store`` (a rerun resumes and
reuses it), every AMU is embedded and fingerprinted with each fingerprinter, and one
:class:`DualPathRetriever` per codebook is built. Then every question of categories 1-4 is
answered by retrieval alone and scored against its evidence dia_ids.

Categories are the numeric ``category`` values of ``locomo10.json``: 1 multi-hop, 2 temporal,
3 open-domain, 4 single-hop, 5 adversarial (skipped: its questions have no answer in the
conversation). This is the mapping of the benchmark's own evaluation code (category 1 is scored
per comma-separated sub-answer there) and of the data (91% of category-1 questions cite several
turns; every category-2 question asks "when"); some third-party harnesses number them otherwise.

Metrics, per question with evidence ids E and the turn ids R that the retrieved AMUs' source
pointers cover: recall@k = |E ∩ R| / |E|; hit@k = 1 if at least one evidence id is covered;
complete@k = 1 if all are. Each is averaged over questions (micro average: every question weighs
the same) per category and overall. Evidence ids are parsed leniently ("D1:3;D1:4", "D 1:3",
"D1: 3", "D30:05"); items without a readable id and ids naming no turn of the conversation are
counted and left out; a question left without evidence is counted and not scored.

Configurations at equal budget are named ``dense{K}``, ``code{K}``, ``kmeans{K}``, ``bm25_{K}`` or
``dense{K}+code{K}`` / ``dense{K}+kmeans{K}`` / ``dense{K}+bm25_{K}``: ``code`` is Path B with the
trained fingerprinter, ``kmeans`` Path B with the k-means control, and a ``+`` path only adds
AMUs that the dense path did not return (SPEC section 4).

Optional answer stage, when an OpenAI-compatible endpoint is configured (ISQ_LLM_BASE_URL,
ISQ_LLM_MODEL, ISQ_LLM_API_KEY, or --llm-base-url/--llm-model): an LLM answers from the
retrieved AMUs and their source turns, scored with LoCoMo's token F1 and an LLM judge
(CORRECT/WRONG), with the query tokens counted.

Outputs in OUT: ``results.json``, ``results.md``, ``recall.png``, ``questions.jsonl`` (per
question and configuration, the evidence found), ``sweep.json`` (``--sweep``) and
``answers.jsonl`` (answer stage).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import string
import sys
import time
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from isq.encoders import MINILM_ALIAS
from isq.fingerprint import Fingerprinter
from retrieval.amu import AMU, AMUStore, InputFormatError, Turn
from retrieval.dual_path import DualPathRetriever, Hit
from retrieval.embed import Embedder, SentenceEmbedder
from retrieval.extract import ChatClient, Extractor, InvalidResponse, LLMExtractor, RuleExtractor
from retrieval.ingest import IngestError, IngestStats, ingest_locomo_conversation
from retrieval.locomo import LocomoConversation, load_locomo
from retrieval.topology import AGGREGATES, CooccurrenceTopology

logger = logging.getLogger(__name__)

CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
"""LoCoMo category number -> name, for the scored categories (5, adversarial, is skipped)."""

TRAINED, KMEANS = "trained", "kmeans"
"""Names of the two codebooks: the trained fingerprinter and the k-means control."""

SWEEP_HOPS = (1, 2, 3)
SWEEP_ALPHAS = (0.3, 0.5, 0.8)
SWEEP_SELF_TERMS = (False, True)

STORE_DIR = "store"
LEDGER_NAME = "construction.json"


class EvaluationError(ValueError):
    """The evaluation cannot run as asked (e.g. a configuration needs a fingerprinter not given)."""


# ---------------------------------------------------------------------------------------------
# Evidence and questions
# ---------------------------------------------------------------------------------------------

_DIA_ID = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class Evidence:
    """Evidence dia_ids read from a question's raw ``evidence`` list.

    ``ids``: canonical ``D<session>:<turn>`` ids, deduplicated, in order; ``repaired``: raw
    items that needed repair to be read (a list in one string, stray spaces, leading zeros);
    ``unparsed``: raw items from which no id could be read (``"D1"``, ``""``).
    """

    ids: tuple[str, ...]
    repaired: tuple[str, ...] = ()
    unparsed: tuple[str, ...] = ()


def parse_evidence(raw: Iterable[object]) -> Evidence:
    """Read every ``D<session>:<turn>`` id in the raw items; never raises."""
    ids: dict[str, None] = {}
    repaired, unparsed = [], []
    for item in raw:
        text = str(item)
        found = [f"D{int(session)}:{int(turn)}" for session, turn in _DIA_ID.findall(text)]
        if not found:
            unparsed.append(text)
            continue
        if found != [text]:
            repaired.append(text)
        ids.update(dict.fromkeys(found))
    return Evidence(tuple(ids), tuple(repaired), tuple(unparsed))


@dataclass(frozen=True)
class EvalQuestion:
    """A scored question: its conversation, position in ``qa``, category and usable evidence."""

    conversation_id: str
    qa_index: int
    category: int
    question: str
    answer: str | None
    evidence: tuple[str, ...]

    @property
    def category_name(self) -> str:
        return CATEGORY_NAMES[self.category]


@dataclass
class EvidenceReport:
    """What question selection and evidence parsing skipped or repaired, over all conversations."""

    questions: int = 0
    skipped_categories: Counter[int] = field(default_factory=Counter)
    without_evidence: int = 0
    evidence_ids: int = 0
    repaired: list[str] = field(default_factory=list)
    unparsed: list[str] = field(default_factory=list)
    unknown_ids: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "questions": self.questions,
            "skipped_categories": {str(k): v for k, v in sorted(self.skipped_categories.items())},
            "questions_without_evidence": self.without_evidence,
            "evidence_ids": self.evidence_ids,
            "repaired_items": self.repaired,
            "unparsed_items": self.unparsed,
            "unknown_ids": self.unknown_ids,
        }


def select_questions(conversation: LocomoConversation, report: EvidenceReport) -> list[EvalQuestion]:
    """The questions of categories 1-4 that keep at least one evidence id naming a turn of the
    conversation; ``report`` counts what was skipped, repaired or dropped."""
    known = {turn.turn_id for turn in conversation.turns}
    selected = []
    for index, qa in enumerate(conversation.questions):
        if qa.category not in CATEGORY_NAMES:
            report.skipped_categories[qa.category] += 1
            continue
        evidence = parse_evidence(qa.evidence)
        where = f"{conversation.conversation_id} qa {index}"
        report.repaired += [f"{where}: {item!r}" for item in evidence.repaired]
        report.unparsed += [f"{where}: {item!r}" for item in evidence.unparsed]
        usable = tuple(turn_id for turn_id in evidence.ids if turn_id in known)
        report.unknown_ids += [f"{where}: {turn_id}" for turn_id in evidence.ids if turn_id not in known]
        if not usable:
            report.without_evidence += 1
            continue
        report.questions += 1
        report.evidence_ids += len(usable)
        selected.append(EvalQuestion(conversation.conversation_id, index, qa.category, qa.question, qa.answer,
                                     usable))
    return selected


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvidenceScore:
    """Recall, hit and completeness of one question's evidence by one retrieval."""

    recall: float
    hit: bool
    complete: bool
    found: tuple[str, ...]


def covered_turns(hits: Iterable[Hit]) -> set[str]:
    """The turn ids that the retrieved AMUs' source pointers name."""
    return {turn_id for hit in hits for turn_id in hit.source["turn_ids"]}


def score_evidence(evidence: Sequence[str], covered: Collection[str]) -> EvidenceScore:
    """recall = share of the evidence ids covered; hit = at least one; complete = all."""
    if not evidence:
        raise ValueError("a question without evidence cannot be scored")
    found = tuple(turn_id for turn_id in evidence if turn_id in covered)
    return EvidenceScore(len(found) / len(evidence), bool(found), len(found) == len(evidence), found)


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if values else 0.0


def summarise(rows: Iterable[tuple[str, Mapping[str, float]]]) -> dict[str, Any]:
    """``(category name, {metric: value})`` per question -> ``{"overall": {...}, "by_category":
    {...}}``, each ``{metric: mean, ..., "n": questions}``; categories without questions are absent."""
    groups: dict[str, list[Mapping[str, float]]] = {}
    everything: list[Mapping[str, float]] = []
    for category, values in rows:
        groups.setdefault(category, []).append(values)
        everything.append(values)

    def block(items: list[Mapping[str, float]]) -> dict[str, Any]:
        metrics = list(items[0]) if items else []
        return {**{m: _mean([float(item[m]) for item in items]) for m in metrics}, "n": len(items)}

    order = [name for name in CATEGORY_NAMES.values() if name in groups]
    return {"overall": block(everything), "by_category": {name: block(groups[name]) for name in order}}


# ---------------------------------------------------------------------------------------------
# Configurations and topology settings
# ---------------------------------------------------------------------------------------------

_PART = re.compile(r"(dense|code|kmeans|bm25_)(\d+)")


@dataclass(frozen=True)
class RetrievalConfig:
    """One retrieval configuration: its name, DualPathRetriever mode and budgets, and the
    codebook whose retriever runs it."""

    name: str
    mode: str
    k_dense: int
    k_code: int
    codebook: str = TRAINED

    @property
    def uses_codes(self) -> bool:
        return self.mode.endswith("code")

    @property
    def budget(self) -> int:
        return self.k_dense + self.k_code


def parse_config(name: str) -> RetrievalConfig:
    """``dense20`` / ``code40`` / ``kmeans40`` / ``bm25_40`` / ``dense20+code20`` /
    ``dense20+kmeans20`` / ``dense20+bm25_20`` -> :class:`RetrievalConfig`."""
    parts = [_PART.fullmatch(part) for part in name.split("+")]
    valid = all(parts) and (len(parts) == 1 or (len(parts) == 2 and parts[0][1] == "dense" and parts[1][1] != "dense"))
    if not valid:
        raise EvaluationError(f"unknown configuration {name!r}: expected dense<K>, code<K>, kmeans<K>, bm25_<K> "
                              "or dense<K>+code<K>, dense<K>+kmeans<K>, dense<K>+bm25_<K>")
    k_dense = int(parts[0][2]) if parts[0][1] == "dense" else 0
    other = parts[-1] if parts[-1][1] != "dense" else None
    path = {None: "dense", "code": "code", "kmeans": "code", "bm25_": "bm25"}[other[1] if other else None]
    mode = f"dense+{path}" if k_dense and other else path
    return RetrievalConfig(name, mode, k_dense, int(other[2]) if other else 0,
                           KMEANS if other is not None and other[1] == "kmeans" else TRAINED)


def default_configs(k_dense: int = 20, k_code: int = 20, with_kmeans: bool = False) -> list[str]:
    """Dense-K, Dense-2K, Dense-K + Codebook-K, Dense-K + BM25-K, Codebook-2K and, with the
    control, Dense-K + k-means-K: the ablation at equal budgets."""
    total = k_dense + k_code
    names = [f"dense{k_dense}", f"dense{total}", f"dense{k_dense}+code{k_code}", f"dense{k_dense}+bm25_{k_code}",
             f"code{total}"]
    return names + ([f"dense{k_dense}+kmeans{k_code}"] if with_kmeans else [])


def resolve_configs(names: Sequence[str], codebooks: Collection[str],
                    answer_configs: Sequence[str] = ()) -> list[RetrievalConfig]:
    """Parse ``names``, checking that each one's codebook is among ``codebooks`` and that every
    answer configuration is one of them."""
    selected = [parse_config(name) for name in names]
    missing = [c.name for c in selected if c.codebook not in codebooks]
    if missing:
        raise EvaluationError(f"configuration(s) {', '.join(missing)} need a k-means control fingerprinter")
    unknown = [name for name in answer_configs if name not in names]
    if unknown:
        raise EvaluationError(f"answer configuration(s) {', '.join(unknown)} are not among {list(names)}")
    return selected


@dataclass(frozen=True)
class TopologyParams:
    """Path B's topology parameters (see :class:`CooccurrenceTopology`)."""

    max_hops: int = 1
    alpha: float = 0.3
    self_term: bool = True
    aggregate: str = "sum"

    def __post_init__(self) -> None:
        # the topology checks these too, but only at the first query; fail before any work
        if self.max_hops < 1 or not 0.0 < self.alpha <= 1.0 or self.aggregate not in AGGREGATES:
            raise EvaluationError(f"invalid topology parameters {self}: need max_hops >= 1, 0 < alpha <= 1 "
                                  f"and aggregate in {AGGREGATES}")

    def apply(self, topology: CooccurrenceTopology) -> None:
        """Set them on a built topology (S_code is recomputed lazily on the next query)."""
        topology.max_hops, topology.alpha = self.max_hops, self.alpha
        topology.self_term, topology.aggregate = self.self_term, self.aggregate

    def label(self) -> str:
        return f"H_r={self.max_hops} α={self.alpha} self={'on' if self.self_term else 'off'} {self.aggregate}"


def sweep_grid() -> list[TopologyParams]:
    """H_r x α x self term x aggregate. The aggregate varies fastest: it does not change S_code,
    so consecutive settings reuse the cached S_code."""
    return [TopologyParams(hops, alpha, self_term, aggregate) for hops in SWEEP_HOPS for alpha in SWEEP_ALPHAS
            for self_term in SWEEP_SELF_TERMS for aggregate in AGGREGATES]


# ---------------------------------------------------------------------------------------------
# Memory construction
# ---------------------------------------------------------------------------------------------


@dataclass
class ConversationBank:
    """One conversation's AMUs and its retrievers (one per codebook, same AMU order)."""

    amus: list[AMU]
    retrievers: dict[str, DualPathRetriever]

    @property
    def coverable(self) -> set[str]:
        """Turn ids that some AMU points to: the most any retrieval can cover."""
        return {turn_id for amu in self.amus for turn_id in amu.source.turn_ids}


class ConstructionLedger:
    """Construction cost per conversation in ``store/construction.json``, summed over the runs
    that built parts of the store, so a rerun that reuses the store still reports what building
    it cost. It also pins the extractor and embedder: a store built with others is refused."""

    def __init__(self, store_dir: Path, extractor: str, embedder: str) -> None:
        self.path = store_dir / LEDGER_NAME
        saved = json.loads(self.path.read_text()) if self.path.is_file() else None
        if saved is not None and (saved["extractor"], saved["embedder"]) != (extractor, embedder):
            raise EvaluationError(f"{store_dir} was built with extractor {saved['extractor']!r} and embedder "
                                  f"{saved['embedder']!r}, not {extractor!r} and {embedder!r}; use another --out")
        self.record = saved or {"extractor": extractor, "embedder": embedder, "conversations": {}}

    def add(self, conversation_id: str, stats: IngestStats) -> None:
        entry = self.record["conversations"].setdefault(
            conversation_id, {"seconds": 0.0, "llm_calls": 0, "tokens": 0})
        if stats.segments == stats.resumed_segments:  # everything came from the store: nothing was spent
            return
        llm = stats.llm
        entry["seconds"] += stats.wall_s
        # cache hits stand for calls an earlier run paid for
        entry["llm_calls"] += llm.http_calls + llm.cache_hits
        entry["tokens"] += (llm.prompt_tokens + llm.completion_tokens + llm.cached_prompt_tokens
                            + llm.cached_completion_tokens)
        self.path.write_text(json.dumps(self.record, indent=2))

    def total(self, conversation_ids: Iterable[str], key: str) -> float:
        return sum(self.record["conversations"].get(cid, {}).get(key, 0) for cid in conversation_ids)


def build_retriever(fingerprinter: Fingerprinter, amus: Sequence[AMU], embeddings: np.ndarray,
                    params: TopologyParams) -> DualPathRetriever:
    """A dual-path bank over ``amus`` with their fingerprints by ``fingerprinter``."""
    retriever = DualPathRetriever(embeddings.shape[1], fingerprinter.identity, max_hops=params.max_hops,
                                  alpha=params.alpha, self_term=params.self_term, aggregate=params.aggregate)
    prints = fingerprinter.fingerprint([amu.text for amu in amus])
    sources = [{"session_id": amu.source.session_id, "turn_ids": list(amu.source.turn_ids)} for amu in amus]
    retriever.add([amu.id for amu in amus], [amu.text for amu in amus], embeddings,
                  [fp.codes for fp in prints], sources)
    retriever.topology.prepare()
    return retriever


def codebook_diagnostics(fingerprinter: Fingerprinter, banks: Sequence[ConversationBank], codebook: str,
                         query_codes: Sequence[frozenset[int]]) -> dict[str, Any]:
    """How the codebook spreads over the AMU banks: codes in use, codes per AMU and query, and
    how generic the codes are (a code in every AMU has IDF 0 and cannot discriminate)."""
    used: set[int] = set()
    per_amu, df_share, generic = [], [], []
    for bank in banks:
        topology = bank.retrievers[codebook].topology
        incidence = topology.incidence
        doc_freq = topology.doc_freq
        units = max(topology.num_units, 1)
        used.update(np.flatnonzero(doc_freq).tolist())
        per_amu += np.diff(incidence.indptr).tolist()
        df_share += (doc_freq[incidence.indices] / units).tolist()
        generic.append(int((doc_freq >= 0.5 * units).sum()))
    return {
        "codebook_size": fingerprinter.codebook_size,
        "codes_used": len(used),
        "utilisation": len(used) / fingerprinter.codebook_size,
        "mean_codes_per_amu": _mean(per_amu),
        "mean_codes_per_query": _mean([len(codes) for codes in query_codes]),
        "mean_amu_share_per_code": _mean(df_share),
        "codes_in_half_the_amus": _mean(generic),
    }


# ---------------------------------------------------------------------------------------------
# Answer stage
# ---------------------------------------------------------------------------------------------

ANSWER_PROMPT = """You answer questions about a long conversation between two people, using only the
memories retrieved for the question and the original conversation turns they come from.
Answer with a short phrase (a few words: a name, a date, an item list), no explanation.
Give your best guess when the memories are not conclusive."""

JUDGE_PROMPT = """You grade an answer to a question about a conversation against the gold answer.
Reply CORRECT if the generated answer states the same thing as the gold answer (same facts,
dates in any format, synonyms, more detail are fine) and WRONG otherwise. Reply with one word."""

TEMPORAL_HINT = " Use the dates of the conversation to answer with an approximate date."
"""Added to temporal questions, as the LoCoMo evaluation does for category 2."""

_ARTICLES = re.compile(r"\b(a|an|the|and)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_VERDICT = re.compile(r"\b(CORRECT|WRONG)\b")


def normalize_answer(text: str) -> str:
    """LoCoMo's answer normalisation: lower case, commas and punctuation removed, the words
    a/an/the/and removed, whitespace collapsed."""
    text = text.replace(",", "").lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_f1(prediction: str, gold: str) -> float:
    """F1 of the normalised tokens (multiset overlap)."""
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def locomo_f1(prediction: str, gold: str, category: int) -> float:
    """LoCoMo's QA F1: multi-hop (1) averages, over the gold's comma-separated sub-answers, the
    best F1 against any of the prediction's; open-domain (3) keeps the gold before any ';'.
    (LoCoMo also Porter-stems tokens; that step is left out here, which can only lower F1.)"""
    if category == 1:
        predictions = [p.strip() for p in prediction.split(",")]
        golds = [g.strip() for g in gold.split(",")]
        return _mean([max(token_f1(p, g) for p in predictions) for g in golds])
    if category == 3:
        gold = gold.split(";")[0].strip()
    return token_f1(prediction, gold)


def _parse_answer(content: str) -> str:
    answer = re.sub(r"^\s*(final\s+)?answer\s*:\s*", "", content.strip(), flags=re.IGNORECASE).strip()
    if not answer:
        raise InvalidResponse("empty answer")
    return answer


def _parse_verdict(content: str) -> bool:
    match = _VERDICT.search(content.upper())
    if match is None:
        raise InvalidResponse(f"no CORRECT or WRONG in {content[:80]!r}")
    return match[1] == "CORRECT"


def _turn_order(turn: Turn) -> tuple[int, ...]:
    match = _DIA_ID.search(turn.turn_id)
    return (int(match[1]), int(match[2])) if match else (sys.maxsize,)


class AnswerStage:
    """Answers questions from retrieved AMUs plus their source turns, then grades them.

    ``answer_client`` and ``judge_client`` are :class:`ChatClient` s (plain-text answers, so
    without JSON mode); their ``usage`` is the query-time token count.
    """

    def __init__(self, answer_client: ChatClient, judge_client: ChatClient) -> None:
        self.answer_client = answer_client
        self.judge_client = judge_client

    @classmethod
    def from_endpoint(cls, base_url: str | None, model: str | None, cache_dir: Path) -> AnswerStage:
        return cls(*(ChatClient(base_url, model, json_mode=False, cache_dir=cache_dir) for _ in range(2)))

    @staticmethod
    def messages(question: EvalQuestion, amus: Sequence[AMU], turns: Sequence[Turn]) -> list[dict[str, str]]:
        """System prompt, then the memories (with the date each was stated), the source turns in
        conversation order (with session dates) and the question."""
        memories = [f"{i}. ({(amu.observed_at or 'undated')[:10]}) {amu.text}" for i, amu in enumerate(amus, 1)]
        ordered = sorted({turn.turn_id: turn for turn in turns}.values(), key=_turn_order)
        lines = [f"[{t.turn_id}] ({f'{t.session_time:%d %B %Y}' if t.session_time else 'undated'}) {t.render()}"
                 for t in ordered]
        hint = TEMPORAL_HINT if question.category == 2 else ""
        user = "\n".join(["Memories:", *memories, "", "Original turns:", *lines, "",
                          f"Question: {question.question}{hint}"])
        return [{"role": "system", "content": ANSWER_PROMPT}, {"role": "user", "content": user}]

    def answer(self, question: EvalQuestion, amus: Sequence[AMU], turns: Sequence[Turn]) -> str | None:
        label = f"answer {question.conversation_id}/{question.qa_index}"
        return self.answer_client.complete(self.messages(question, amus, turns), _parse_answer, label=label)

    def judge(self, question: EvalQuestion, prediction: str) -> bool | None:
        user = f"Question: {question.question}\nGold answer: {question.answer}\nGenerated answer: {prediction}"
        messages = [{"role": "system", "content": JUDGE_PROMPT}, {"role": "user", "content": user}]
        return self.judge_client.complete(messages, _parse_verdict,
                                          label=f"judge {question.conversation_id}/{question.qa_index}")


def run_answer_stage(stage: AnswerStage, config_names: Sequence[str], questions: Sequence[EvalQuestion],
                     hits: Mapping[str, Sequence[Sequence[Hit]]], banks: Mapping[str, ConversationBank],
                     store: AMUStore, out_dir: Path) -> dict[str, Any]:
    """Answer and grade every question with each configuration's retrieved AMUs; writes
    ``answers.jsonl`` and returns the summary for ``results.json``."""
    amus_by_id = {amu.id: amu for bank in banks.values() for amu in bank.amus}
    summaries, failed = {}, Counter()
    with open(out_dir / "answers.jsonl", "w", encoding="utf-8") as handle:
        for name in config_names:
            rows = []
            for question, question_hits in zip(questions, hits[name], strict=True):
                if question.answer is None:
                    failed["no_gold_answer"] += 1
                    continue
                amus = [amus_by_id[hit.amu_id] for hit in question_hits]
                turns = [turn for amu in amus for turn in store.source_turns(amu)]
                prediction = stage.answer(question, amus, turns)
                verdict = stage.judge(question, prediction) if prediction is not None else None
                failed["answer"] += prediction is None
                failed["judge"] += prediction is not None and verdict is None
                f1 = locomo_f1(prediction, question.answer, question.category) if prediction is not None else 0.0
                rows.append((question.category_name, {"f1": f1, "judge": float(bool(verdict))}))
                handle.write(json.dumps({
                    "config": name, "conversation": question.conversation_id, "qa_index": question.qa_index,
                    "category": question.category_name, "question": question.question, "gold": question.answer,
                    "prediction": prediction, "f1": f1, "judge": verdict,
                }, ensure_ascii=False) + "\n")
            summaries[name] = summarise(rows)
    answer_usage, judge_usage = stage.answer_client.usage, stage.judge_client.usage
    query_tokens = (answer_usage.prompt_tokens + answer_usage.completion_tokens
                    + answer_usage.cached_prompt_tokens + answer_usage.cached_completion_tokens)
    answered = sum(summary["overall"]["n"] for summary in summaries.values())
    return {
        "status": "done",
        "model": stage.answer_client.model,
        "configs": summaries,
        "failed": dict(failed),
        "query_tokens": query_tokens,
        "query_tokens_per_question": query_tokens / answered if answered else 0.0,
        "usage": {"answer": asdict(answer_usage), "judge": asdict(judge_usage)},
    }


# ---------------------------------------------------------------------------------------------
# The evaluation
# ---------------------------------------------------------------------------------------------


@dataclass
class QuerySet:
    """The scored questions with their embeddings and, per codebook, their fingerprint code sets."""

    questions: list[EvalQuestion]
    embeddings: np.ndarray
    codes: dict[str, list[frozenset[int]]]


def retrieve_all(config: RetrievalConfig, banks: Mapping[str, ConversationBank], queries: QuerySet) -> list[list[Hit]]:
    """The hits of ``config`` for every question, in question order."""
    results = []
    for i, question in enumerate(queries.questions):
        retriever = banks[question.conversation_id].retrievers[config.codebook]
        results.append(retriever.retrieve(
            query_text=question.question, query_embedding=queries.embeddings[i],
            query_codes=queries.codes[config.codebook][i] if config.uses_codes else None,
            k_dense=config.k_dense, k_code=config.k_code, mode=config.mode,
        ))
    return results


def tied_at_cut(hits: Sequence[Hit]) -> float | None:
    """Share of the non-dense path's hits whose score equals that path's last (lowest) score:
    among tied AMUs the order of the bank decides, not the score. None without such hits."""
    scores = [hit.score for hit in hits if hit.path != "dense"]
    return sum(score == scores[-1] for score in scores) / len(scores) if scores else None


def score_config(queries: QuerySet, hits: Sequence[Sequence[Hit]]) -> tuple[dict[str, Any], list[EvidenceScore]]:
    """Per-question evidence scores of one configuration and their summary, with the mean number
    of AMUs retrieved (to check the budget was used) and, for a configuration with a code or BM25
    path, the mean :func:`tied_at_cut` of that path."""
    scores = [score_evidence(q.evidence, covered_turns(h)) for q, h in zip(queries.questions, hits, strict=True)]
    summary = summarise(
        (q.category_name, {"recall": s.recall, "hit": float(s.hit), "complete": float(s.complete)})
        for q, s in zip(queries.questions, scores, strict=True)
    )
    summary["overall"]["mean_retrieved"] = _mean([len(h) for h in hits])
    ties = [share for share in map(tied_at_cut, hits) if share is not None]
    if ties:
        summary["overall"]["tied_at_cut"] = _mean(ties)
    return summary, scores


def run_sweep(configs: Sequence[RetrievalConfig], banks: Mapping[str, ConversationBank], queries: QuerySet,
              grid: Sequence[TopologyParams], restore: TopologyParams) -> list[dict[str, Any]]:
    """Score the Path B ``configs`` under every topology setting of ``grid`` on the built banks
    (only the topology parameters change between settings), then put ``restore`` back."""
    rows = []
    for params in grid:
        for bank in banks.values():
            for retriever in bank.retrievers.values():
                params.apply(retriever.topology)
        summaries = {config.name: score_config(queries, retrieve_all(config, banks, queries))[0]
                     for config in configs}
        rows.append({**asdict(params), "configs": summaries})
    for bank in banks.values():
        for retriever in bank.retrievers.values():
            restore.apply(retriever.topology)
    return rows


def recommend(rows: Sequence[Mapping[str, Any]], config_name: str) -> dict[str, Any]:
    """The sweep setting with the best overall recall of ``config_name``; ties go to the better
    multi-hop recall, then to fewer hops (the simpler walk)."""

    def key(row: Mapping[str, Any]) -> tuple[float, float, int]:
        summary = row["configs"][config_name]
        multi = summary["by_category"].get("multi-hop", {}).get("recall", 0.0)
        return summary["overall"]["recall"], multi, -row["max_hops"]

    best = max(rows, key=key)
    return {k: best[k] for k in ("max_hops", "alpha", "self_term", "aggregate")} | {
        "config": config_name, "overall": best["configs"][config_name]["overall"],
        "by_category": best["configs"][config_name]["by_category"],
    }


def evaluate(conversations: Sequence[LocomoConversation], fingerprinters: Mapping[str, Fingerprinter],
             embedder: Embedder, out_dir: str | Path, *, extractor: Extractor | None = None,
             extractor_name: str = "rule", configs: Sequence[str] | None = None, k_dense: int = 20,
             k_code: int = 20, topology: TopologyParams | None = None, sweep: bool = False,
             answer_stage: AnswerStage | None = None, answer_configs: Sequence[str] = (),
             settings: Mapping[str, Any] | None = None, progress: bool = True) -> dict[str, Any]:
    """Run the evaluation and write its reports to ``out_dir``; returns ``results.json``'s content.

    ``fingerprinters`` maps ``"trained"`` (required) and optionally ``"kmeans"`` to loaded
    fingerprinters. ``configs`` defaults to :func:`default_configs`. ``extractor`` defaults to
    the :class:`RuleExtractor`; ``extractor_name`` and ``embedder.name`` are pinned in the store.
    ``answer_configs`` are answered when ``answer_stage`` is given. ``topology`` defaults to
    :class:`TopologyParams`'s defaults. ``settings`` is recorded as is.
    """
    started = time.perf_counter()
    topology = topology or TopologyParams()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if TRAINED not in fingerprinters:
        raise EvaluationError("a trained fingerprinter is required")
    names = list(configs) if configs is not None else default_configs(k_dense, k_code, KMEANS in fingerprinters)
    selected = resolve_configs(names, fingerprinters, answer_configs)
    extractor = extractor or RuleExtractor()
    store_dir = out_dir / STORE_DIR
    ledger = ConstructionLedger(store_dir, extractor_name, getattr(embedder, "name", type(embedder).__name__))

    with AMUStore(store_dir) as store:
        # -- construction: ingest (or reuse), embed, fingerprint, index
        report = EvidenceReport()
        banks: dict[str, ConversationBank] = {}
        timings: Counter[str] = Counter()
        resumed = 0
        questions: list[EvalQuestion] = []
        for conversation in conversations:
            cid = conversation.conversation_id
            logger.info("%s: ingesting %d turns", cid, len(conversation.turns))
            stats = ingest_locomo_conversation(conversation, store, embedder, extractor, progress=progress)
            ledger.add(cid, stats)
            timings["ingest"] += stats.wall_s
            resumed += stats.resumed_segments
            amus = list(store.amus(cid))
            tick = time.perf_counter()
            embeddings = embedder.encode([amu.text for amu in amus])
            timings["embed"] += time.perf_counter() - tick
            retrievers = {}
            for codebook, fingerprinter in fingerprinters.items():
                tick = time.perf_counter()
                retrievers[codebook] = build_retriever(fingerprinter, amus, embeddings, topology)
                timings[f"index_{codebook}"] += time.perf_counter() - tick
            banks[cid] = ConversationBank(amus, retrievers)
            questions += select_questions(conversation, report)
            logger.info("%s: %d AMUs", cid, len(amus))

        # -- queries: one batched embedding call, one fingerprinting call per codebook
        tick = time.perf_counter()
        texts = [q.question for q in questions]
        queries = QuerySet(questions, embedder.encode(texts),
                           {name: [fp.codes for fp in fp_model.fingerprint(texts)]
                            for name, fp_model in fingerprinters.items()})
        timings["queries"] = time.perf_counter() - tick

        # -- retrieval
        tick = time.perf_counter()
        config_results, per_question, all_hits = {}, {}, {}
        for config in selected:
            all_hits[config.name] = retrieve_all(config, banks, queries)
            config_results[config.name], per_question[config.name] = score_config(queries, all_hits[config.name])
        timings["retrieval"] = time.perf_counter() - tick
        _write_questions(out_dir / "questions.jsonl", queries.questions, per_question)

        coverable = {cid: bank.coverable for cid, bank in banks.items()}
        ceiling = summarise(
            (q.category_name, {"recall": score_evidence(q.evidence, coverable[q.conversation_id]).recall})
            for q in questions
        )
        ids = [c.conversation_id for c in conversations]
        construction = {
            "seconds": ledger.total(ids, "seconds") + timings["embed"] + timings[f"index_{TRAINED}"],
            "amus": sum(store.count(cid) for cid in ids),
            "segments": sum(len(store.segments(cid)) for cid in ids),
            "llm_calls": int(ledger.total(ids, "llm_calls")),
            "tokens": int(ledger.total(ids, "tokens")),
            "ingest_seconds": ledger.total(ids, "seconds"),
            "extractor": extractor_name,
            "this_run": {"resumed_segments": resumed, **{f"{k}_seconds": round(v, 2) for k, v in timings.items()}},
        }
        results: dict[str, Any] = {
            "configs": config_results,
            "construction": construction,
            "evidence": report.to_dict() | {"recall_ceiling": ceiling},
            "codebooks": {name: codebook_diagnostics(fp_model, list(banks.values()), name, queries.codes[name])
                          for name, fp_model in fingerprinters.items()},
            "settings": {**(settings or {}), "configs": names, "k_dense": k_dense, "k_code": k_code,
                         "topology": asdict(topology), "categories": {str(k): v for k, v in CATEGORY_NAMES.items()},
                         "conversations": ids},
        }

        # -- sweep over the topology parameters, on the same banks
        if sweep:
            swept = [c for c in selected if c.uses_codes]
            if not swept:
                raise EvaluationError("--sweep needs a configuration with a codebook path")
            tick = time.perf_counter()
            rows = run_sweep(swept, banks, queries, sweep_grid(), topology)
            primary = next((c.name for c in swept if c.mode == "dense+code" and c.codebook == TRAINED), swept[0].name)
            (out_dir / "sweep.json").write_text(json.dumps(rows, indent=2))
            results["sweep"] = {"file": "sweep.json", "settings": len(rows), "configs": [c.name for c in swept],
                                "seconds": round(time.perf_counter() - tick, 2),
                                "recommended": recommend(rows, primary)}
        else:
            rows = []

        # -- optional answer stage
        if answer_stage is not None and answer_configs:
            logger.info("answering %d questions x %d configurations", len(questions), len(answer_configs))
            results["answers"] = run_answer_stage(answer_stage, answer_configs, questions, all_hits, banks, store,
                                                  out_dir)
        else:
            results["answers"] = {"status": "skipped", "note": (
                "no LLM endpoint configured: set ISQ_LLM_BASE_URL and ISQ_LLM_MODEL (and ISQ_LLM_API_KEY if "
                "needed) or pass --llm-base-url/--llm-model" if answer_stage is None
                else "no answer configuration selected (--answer-configs)")}

    results["wall_seconds"] = time.perf_counter() - started
    (out_dir / "results.json").write_text(json.dumps(results, indent=2))
    plot_recall(results, out_dir / "recall.png")
    (out_dir / "results.md").write_text(render_markdown(results, rows))
    return results


def _write_questions(path: Path, questions: Sequence[EvalQuestion],
                     per_question: Mapping[str, Sequence[EvidenceScore]]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for i, q in enumerate(questions):
            handle.write(json.dumps({
                "conversation": q.conversation_id, "qa_index": q.qa_index, "category": q.category_name,
                "question": q.question, "evidence": list(q.evidence),
                "found": {name: list(scores[i].found) for name, scores in per_question.items()},
            }, ensure_ascii=False) + "\n")


# ---------------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------------


def _pct(value: float) -> str:
    return f"{100 * value:.1f}"


def _metric_table(configs: Mapping[str, Any], metric: str, categories: Sequence[str]) -> list[str]:
    lines = ["| configuration | overall | " + " | ".join(categories) + " |",
             "|---|" + "---:|" * (len(categories) + 1)]
    for name, summary in configs.items():
        cells = [_pct(summary["overall"][metric])]
        cells += [_pct(summary["by_category"][c][metric]) if c in summary["by_category"] else "–" for c in categories]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def render_markdown(results: Mapping[str, Any], sweep_rows: Sequence[Mapping[str, Any]]) -> str:
    """``results.md``: tables per configuration and category, construction, codebooks, sweep, answers."""
    configs = results["configs"]
    first = next(iter(configs.values()))
    categories = list(first["by_category"])
    counts = ", ".join(f"{c} {first['by_category'][c]['n']}" for c in categories)
    settings = results["settings"]
    lines = ["# LoCoMo retrieval evaluation", ""]
    for key in ("command", "locomo", "fingerprinter", "kmeans_fingerprinter", "embedder"):
        if settings.get(key):
            lines.append(f"- {key}: `{settings[key]}`")
    lines += [f"- conversations: {', '.join(settings['conversations'])}; questions: "
              f"{first['overall']['n']} ({counts})",
              f"- topology: {TopologyParams(**settings['topology']).label()}", "",
              "## Evidence recall@k (%)", "", *_metric_table(configs, "recall", categories), "",
              "## Evidence hit@k (%): at least one evidence turn retrieved", "",
              *_metric_table(configs, "hit", categories), "",
              "## All evidence retrieved (%)", "", *_metric_table(configs, "complete", categories), "",
              "Mean AMUs retrieved: " + ", ".join(f"{name} {s['overall']['mean_retrieved']:.1f}"
                                                  for name, s in configs.items()) + ".",
              "Code/BM25 path hits tied with that path's last score (so ranked by AMU order, not score): "
              + ", ".join(f"{name} {_pct(s['overall']['tied_at_cut'])}%" for name, s in configs.items()
                          if "tied_at_cut" in s["overall"]) + ".", ""]
    evidence = results["evidence"]
    ceiling = evidence["recall_ceiling"]["overall"]["recall"]
    lines += ["## Evidence", "",
              f"{evidence['questions']} questions scored, {evidence['evidence_ids']} evidence ids; skipped: "
              + (", ".join(f"{n} of category {k}" for k, n in evidence["skipped_categories"].items()) or "none")
              + f"; {evidence['questions_without_evidence']} questions "
              f"without usable evidence; {len(evidence['repaired_items'])} items repaired, "
              f"{len(evidence['unparsed_items'])} unparsable, {len(evidence['unknown_ids'])} ids naming no turn.",
              f"Recall ceiling (evidence turns that some AMU points to): {_pct(ceiling)}%.", ""]
    for key in ("repaired_items", "unparsed_items", "unknown_ids"):
        if evidence[key]:
            lines.append(f"- {key}: " + "; ".join(evidence[key][:20]))
    c = results["construction"]
    lines += ["", "## Construction", "",
              f"- {c['amus']} AMUs from {c['segments']} segments (extractor {c['extractor']}); "
              f"{c['llm_calls']} LLM calls, {c['tokens']} tokens",
              f"- construction {c['seconds']:.1f} s (ingestion {c['ingest_seconds']:.1f} s, summed over the runs "
              "that built the store, + AMU embedding and trained-codebook indexing of this run)",
              "- this run: " + ", ".join(f"{k} {v}" for k, v in c["this_run"].items()),
              f"- wall time of this run: {results['wall_seconds']:.1f} s", "",
              "## Codebooks", "", "| codebook | size | codes used | utilisation | codes/AMU | codes/query | "
              "mean AMU share per code | codes in ≥50% of AMUs |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, d in results["codebooks"].items():
        lines.append(f"| {name} | {d['codebook_size']} | {d['codes_used']} | {_pct(d['utilisation'])}% | "
                     f"{d['mean_codes_per_amu']:.1f} | {d['mean_codes_per_query']:.1f} | "
                     f"{_pct(d['mean_amu_share_per_code'])}% | {d['codes_in_half_the_amus']:.1f} |")
    if sweep_rows:
        lines += ["", *render_sweep(sweep_rows, results["sweep"]["recommended"])]
    answers = results["answers"]
    lines += ["", "## Answer stage", ""]
    if answers["status"] == "done":
        lines += [f"Model `{answers['model']}`; query tokens {answers['query_tokens']} "
                  f"({answers['query_tokens_per_question']:.0f} per answered question); failures {answers['failed']}.",
                  "", "LoCoMo F1 (%):", "", *_metric_table(answers["configs"], "f1", categories), "",
                  "LLM judge, CORRECT (%):", "", *_metric_table(answers["configs"], "judge", categories)]
    else:
        lines.append(f"Skipped: {answers['note']}.")
    lines += ["", "![recall per configuration and category](recall.png)", ""]
    return "\n".join(lines)


def render_sweep(rows: Sequence[Mapping[str, Any]], recommended: Mapping[str, Any]) -> list[str]:
    """The sweep as a table (overall and multi-hop recall per swept configuration), best first."""
    names = list(rows[0]["configs"])
    primary = recommended["config"]
    header = "| H_r | α | self | aggregate | " + " | ".join(f"{n} overall | {n} multi-hop" for n in names) + " |"
    lines = ["## Topology sweep (evidence recall@k, %)", "",
             f"Recommended for {primary}: H_r={recommended['max_hops']}, α={recommended['alpha']}, self term "
             f"{'on' if recommended['self_term'] else 'off'}, aggregate {recommended['aggregate']} "
             f"(overall {_pct(recommended['overall']['recall'])}%).", "", header,
             "|---:|---:|---|---|" + "---:|---:|" * len(names)]

    def multi(summary: Mapping[str, Any]) -> str:
        block = summary["by_category"].get("multi-hop")
        return _pct(block["recall"]) if block else "–"

    ordered = sorted(rows, key=lambda r: -r["configs"][primary]["overall"]["recall"])
    for row in ordered:
        cells = [f"{_pct(row['configs'][n]['overall']['recall'])} | {multi(row['configs'][n])}" for n in names]
        lines.append(f"| {row['max_hops']} | {row['alpha']} | {'on' if row['self_term'] else 'off'} | "
                     f"{row['aggregate']} | " + " | ".join(cells) + " |")
    return lines


def plot_recall(results: Mapping[str, Any], path: Path) -> None:
    """Grouped bars: evidence recall per category (and overall), one bar per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = results["configs"]
    first = next(iter(configs.values()))
    groups = ["overall", *first["by_category"]]
    counts = [first["overall"]["n"]] + [first["by_category"][g]["n"] for g in groups[1:]]
    width = 0.8 / max(len(configs), 1)
    figure, axes = plt.subplots(figsize=(2 + 1.6 * len(groups), 5))
    positions = np.arange(len(groups))
    for i, (name, summary) in enumerate(configs.items()):
        values = [summary["overall"]["recall"]] + [summary["by_category"][g]["recall"] for g in groups[1:]]
        axes.bar(positions + (i - (len(configs) - 1) / 2) * width, [100 * v for v in values], width, label=name)
    axes.set_xticks(positions, [f"{g}\n(n={n})" for g, n in zip(groups, counts, strict=True)])
    axes.set_ylabel("evidence recall@k (%)")
    axes.set_ylim(0, 100)
    axes.set_title("LoCoMo evidence recall per configuration")
    # below the axes, so that no bar hides behind it
    axes.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m retrieval.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--locomo", type=Path, required=True, help="LoCoMo JSON file (e.g. locomo10.json)")
    parser.add_argument("--fingerprinter", type=Path, required=True, help="trained fingerprinter directory")
    parser.add_argument("--kmeans-fingerprinter", type=Path, help="k-means control fingerprinter directory")
    parser.add_argument("--out", type=Path, required=True, help="output directory (the store goes to OUT/store)")
    parser.add_argument("--extractor", choices=("rule", "llm"), default="rule")
    parser.add_argument("--embedder", default=MINILM_ALIAS,
                        help="sentence-transformers name or path for segmentation and Path A")
    parser.add_argument("--k-dense", type=int, default=20)
    parser.add_argument("--k-code", type=int, default=20)
    defaults = TopologyParams()
    parser.add_argument("--max-hops", type=int, default=defaults.max_hops, help="H_r")
    parser.add_argument("--alpha", type=float, default=defaults.alpha)
    parser.add_argument("--self-term", action=argparse.BooleanOptionalAction, default=defaults.self_term,
                        help="a query code also activates itself (h = 0 term)")
    parser.add_argument("--aggregate", choices=AGGREGATES, default=defaults.aggregate)
    parser.add_argument("--configs", help="comma-separated configurations (default: the equal-budget ablation)")
    parser.add_argument("--sweep", action="store_true", help="sweep H_r, α, self term and aggregate")
    parser.add_argument("--llm-base-url", help="OpenAI-compatible endpoint (default: $ISQ_LLM_BASE_URL)")
    parser.add_argument("--llm-model", help="model name (default: $ISQ_LLM_MODEL); the key is $ISQ_LLM_API_KEY")
    parser.add_argument("--llm-cache", type=Path, help="LLM response cache (default: OUT/llm_cache)")
    parser.add_argument("--answer-configs", default=None,
                        help="configurations answered by the LLM (default: dense+code and the dense "
                             "configuration of the same budget)")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def _split(value: str | None) -> list[str] | None:
    return None if value is None else [item.strip() for item in value.split(",") if item.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.no_progress else logging.INFO, format="%(message)s")
    cache = args.llm_cache or args.out / "llm_cache"
    try:
        conversations = load_locomo(args.locomo)
        fingerprinters = {TRAINED: Fingerprinter.from_pretrained(args.fingerprinter)}
        if args.kmeans_fingerprinter is not None:
            fingerprinters[KMEANS] = Fingerprinter.from_pretrained(args.kmeans_fingerprinter)
        configs = _split(args.configs)
        names = configs or default_configs(args.k_dense, args.k_code, KMEANS in fingerprinters)
        extractor: Extractor = RuleExtractor()
        extractor_name = "rule"
        if args.extractor == "llm":
            llm = LLMExtractor(args.llm_base_url, args.llm_model, cache_dir=cache)
            extractor, extractor_name = llm, f"llm:{llm.model}"
        answer_stage = None
        if args.llm_base_url or os.environ.get("ISQ_LLM_BASE_URL"):
            answer_stage = AnswerStage.from_endpoint(args.llm_base_url, args.llm_model, cache)
        answer_configs = _split(args.answer_configs)
        if answer_configs is None:
            k = args.k_dense + args.k_code
            answer_configs = [n for n in (f"dense{args.k_dense}+code{args.k_code}", f"dense{k}") if n in names]
        resolve_configs(names, fingerprinters, answer_configs)
        topology = TopologyParams(args.max_hops, args.alpha, args.self_term, args.aggregate)
    except (InputFormatError, EvaluationError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    settings = {"command": "python -m retrieval.evaluate " + " ".join(sys.argv[1:] if argv is None else argv),
                "locomo": str(args.locomo), "fingerprinter": str(args.fingerprinter),
                "kmeans_fingerprinter": str(args.kmeans_fingerprinter or ""), "embedder": args.embedder}
    embedder = SentenceEmbedder(args.embedder)
    try:
        results = evaluate(
            conversations, fingerprinters, embedder, args.out, extractor=extractor, extractor_name=extractor_name,
            configs=configs, k_dense=args.k_dense, k_code=args.k_code,
            topology=topology, sweep=args.sweep,
            answer_stage=answer_stage, answer_configs=answer_configs, settings=settings,
            progress=not args.no_progress,
        )
    except (EvaluationError, IngestError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(_summary_line(results, args.out))
    return 0


def _summary_line(results: Mapping[str, Any], out: Path) -> str:
    parts = [f"{name} R={_pct(s['overall']['recall'])} H={_pct(s['overall']['hit'])}"
             for name, s in results["configs"].items()]
    return f"{'; '.join(parts)} | wall {results['wall_seconds']:.1f} s -> {out / 'results.md'}"


__all__ = [
    "CATEGORY_NAMES", "AnswerStage", "EvalQuestion", "EvaluationError", "Evidence", "EvidenceScore",
    "RetrievalConfig", "TopologyParams", "covered_turns", "default_configs", "evaluate", "locomo_f1",
    "normalize_answer", "parse_config", "parse_evidence", "recommend", "resolve_configs", "run_answer_stage",
    "run_sweep", "score_evidence", "select_questions", "summarise", "sweep_grid", "tied_at_cut", "token_f1",
]

if __name__ == "__main__":
    sys.exit(main())
