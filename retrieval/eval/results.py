"""The schema of what an evaluation writes: ``results.json``, the rows of ``questions.jsonl`` and
of ``sweep.json``, as pydantic models.

:func:`retrieval.eval.run.evaluate` builds these models and writes the files from their dumps;
:func:`read_results` and :func:`read_questions` read them back, files written before the models
existed included (the keys are the same), and raise one ValueError naming the file and the line
or field at fault. A field that defaults to None is absent from the file when it is None (for
example ``tied_at_cut`` of a dense-only configuration). Files are written with :mod:`json`, so
floats keep Python's shortest repr and read back bit for bit. Imports no torch: the paired
statistics read ``questions.jsonl`` through this module.

``results.json``, top level: ``configs`` ({configuration: :class:`Summary` of
:class:`RetrievalBlock`}), ``construction``, ``evidence`` (with ``recall_ceiling``),
``codebooks``, ``settings``, ``sweep`` (``--sweep`` only), ``answers`` (skipped or done),
``wall_seconds``, ``multi`` (multi-route configurations only) and ``recall_curves``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)

from retrieval.memory import strict_json


class Record(BaseModel):
    """Base of the schema: a field whose default is None is left out of a dump while it is None."""

    @model_serializer(mode="wrap")
    def _leave_out_absent(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        absent = {name for name, info in type(self).model_fields.items()
                  if info.default is None and getattr(self, name) is None}
        return {key: value for key, value in handler(self).items() if key not in absent}


# -- summary blocks: means over the questions of a group (overall or one category) --------------


class RetrievalBlock(Record):
    """Evidence recall, hit and completeness of one configuration (see :mod:`retrieval.eval.metrics`);
    the overall block also has the mean number of items retrieved, the mean number of tokens of
    their text (whitespace words x 1.3, :func:`retrieval.ingestion.segmenter.count_tokens`), the
    median query latency in milliseconds and, with a code or BM25 path, the mean share of that
    path's hits tied at its cut."""

    recall: float
    hit: float
    complete: float
    n: int
    mean_retrieved: float | None = None
    tied_at_cut: float | None = None
    mean_tokens: float | None = None
    latency_ms: float | None = None


class CeilingBlock(Record):
    """The recall ceiling: share of the evidence turns that some AMU points to."""

    recall: float
    n: int


class AnswerBlock(Record):
    """Answer stage: LoCoMo token F1 and the share the LLM judge marked CORRECT."""

    f1: float
    judge: float
    n: int


BlockT = TypeVar("BlockT", RetrievalBlock, CeilingBlock, AnswerBlock)


class Summary(Record, Generic[BlockT]):
    """A block over all questions and one per LoCoMo category that has questions, in LoCoMo's order."""

    overall: BlockT
    by_category: dict[str, BlockT]


RetrievalSummary = Summary[RetrievalBlock]
AnswerSummary = Summary[AnswerBlock]


# -- results.json --------------------------------------------------------------------------------


class Construction(Record):
    """Cost of the memory: ``seconds``, ``ingest_seconds``, ``llm_calls`` and ``tokens`` are summed
    over the runs that built the store; ``this_run`` has ``replayed_turns`` (turns a rerun found stored) and
    ``<stage>_seconds``."""

    seconds: float
    amus: int
    segments: int
    llm_calls: int
    tokens: int
    ingest_seconds: float
    extractor: str
    this_run: dict[str, int | float]
    per_conversation: dict[str, float] | None = None
    unrecorded: list[str] | None = None
    """Conversations whose building cost the store does not record (built outside the evaluation:
    ``retrieval.ingest``, a server), counted in no sum above (None in a report written before)."""


class EvidenceCounts(Record):
    """What question selection and evidence parsing scored, skipped and repaired, and the ceiling."""

    questions: int
    skipped_categories: dict[str, int]
    questions_without_evidence: int
    unscored_questions: list[str] | None = None
    """Those questions, ``conv qa N (category)`` (None in a report written before they were listed)."""
    evidence_ids: int
    repaired_items: list[str]
    unparsed_items: list[str]
    unknown_ids: list[str]
    recall_ceiling: Summary[CeilingBlock]


class CodebookStats(Record):
    """How one codebook spreads over the AMU banks
    (:func:`retrieval.eval.construction.codebook_diagnostics`)."""

    codebook_size: int
    codes_used: int
    utilisation: float
    mean_codes_per_amu: float
    mean_codes_per_query: float
    mean_amu_share_per_code: float
    codes_in_half_the_amus: float


class TopologySetting(Record):
    """The fields of :class:`isq.topology.TopologyParams`."""

    max_hops: int
    alpha: float
    self_term: bool
    aggregate: str
    association: str | None = None
    """Absent from results written before it was recorded (those ran the default, "conditional")."""
    length_norm: float | None = None
    """Absent likewise (the default, 0.0)."""


class Settings(Record):
    """The run's settings: the CLI's, then the run's own, then anything else the caller recorded."""

    model_config = ConfigDict(extra="allow")

    command: str | None = None
    locomo: str | None = None
    fingerprinter: str | None = None
    kmeans_fingerprinter: str | None = None
    embedder: str | None = None
    configs: list[str]
    k_dense: int
    k_code: int
    topology: TopologySetting
    categories: dict[str, str]
    conversations: list[str]


class SweepRow(TopologySetting):
    """One row of ``sweep.json``: a topology setting and the summary of every swept configuration."""

    configs: dict[str, RetrievalSummary]


class Recommended(TopologySetting):
    """The best sweep setting for ``config`` and its recall there."""

    config: str
    overall: RetrievalBlock
    by_category: dict[str, RetrievalBlock]


class SweepInfo(Record):
    """Where the sweep went (``file``), how many ``settings`` it tried and its recommendation."""

    file: str
    settings: int
    configs: list[str]
    seconds: float
    recommended: Recommended


class AnswersSkipped(Record):
    """The answer stage did not run, and why."""

    status: Literal["skipped"] = "skipped"
    note: str


class AnswersDone(Record):
    """The answer stage's summaries per configuration, failures by kind and token usage."""

    status: Literal["done"] = "done"
    model: str
    configs: dict[str, AnswerSummary]
    failed: dict[str, int]
    query_tokens: int
    query_tokens_per_question: float
    usage: dict[str, dict[str, int]]


class MultiRouteInfo(Record):
    """How the multi-route configurations ran: planner, reranker (or why it was off), question
    types and routes of the plans, evidence nodes per conversation and the seconds spent
    building each conversation's route bank (raw-turn and node embeddings, node reads)."""

    planner: str
    reranker: str
    question_types: dict[str, int]
    mean_routes: float
    nodes: dict[str, dict[str, int]]
    bank_seconds: dict[str, float]
    plans_by: dict[str, int] | None = None
    """How many plans each planner made: an LLM planner's fallbacks (endpoint down or refusing,
    answers that never validate) are the rule planner's. Absent from files written before it."""


class LexicalGap(Record):
    """Recall on the questions whose evidence shares no content stem with them
    (:mod:`retrieval.eval.lexical_gap`)."""

    questions: int
    share: float
    recall: dict[str, float]


class RecallCurves(Record):
    """Recall@k of each configuration's list cut at every k of ``ks`` (:mod:`retrieval.eval.curves`):
    ``configs[name][group]`` holds one mean recall per k, for "overall" and each category."""

    ks: list[int]
    configs: dict[str, dict[str, list[float]]]


class ConsolidationBlock(Record):
    """What consolidation did before the evaluation (``--consolidate``), summed over the
    conversations, with the recall ceiling before and after (equal: no evidence turn lost)."""

    operator: list[str]
    threshold: list[float]
    amus_before: int
    amus_active_after: int
    archived: int
    created: int
    clusters: int
    operations: dict[str, int]
    exact_duplicates: int
    count_sensitive: int
    window_splits: int
    conflicts: int
    refused: int
    unanswered: int
    lost_turns: int
    seconds: float
    llm_calls: int
    tokens: int
    recall_ceiling_before: Summary[CeilingBlock]
    recall_ceiling_after: Summary[CeilingBlock]


class Results(Record):
    """``results.json``."""

    configs: dict[str, RetrievalSummary]
    construction: Construction
    evidence: EvidenceCounts
    codebooks: dict[str, CodebookStats]
    settings: Settings
    sweep: SweepInfo | None = None
    answers: Annotated[AnswersSkipped | AnswersDone, Field(discriminator="status")]
    wall_seconds: float
    multi: MultiRouteInfo | None = None
    lexical_gap: LexicalGap | None = None
    consolidation: ConsolidationBlock | None = None
    recall_curves: RecallCurves | None = None


# -- questions.jsonl -----------------------------------------------------------------------------


class QuestionRecord(Record):
    """One line of ``questions.jsonl``: a scored question and, per configuration, the evidence
    turns its retrieval covered (in evidence order)."""

    conversation: str
    qa_index: int
    category: str
    question: str
    evidence: Annotated[list[str], Field(min_length=1)]  # a question without evidence is not scored
    found: dict[str, list[str]]
    lexical_gap: bool | None = None


# -- reading and writing -------------------------------------------------------------------------


def _problem(err: ValidationError) -> str:
    """The first error of ``err`` as ``dotted.field: message`` (one line for a CLI error)."""
    first = err.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or "top level"
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{field}: {first['msg']}{more}"


def _utf8_text(path: Path) -> str:
    """The file's text, or a ValueError naming it when it is not UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.start})") from None


def write_results(path: Path, results: Results) -> None:
    """``results.json``, indented, through :mod:`json` (floats as Python writes them)."""
    path.write_text(json.dumps(results.model_dump(), indent=2))


def read_results(path: str | Path) -> Results:
    """``results.json`` as :class:`Results`; a ValueError names the file and the line or field at fault."""
    path = Path(path)
    text = _utf8_text(path)
    try:
        return Results.model_validate(strict_json.loads(text))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{err.lineno}: invalid JSON ({err.msg})") from None
    except strict_json.JSONRefused as err:
        raise ValueError(f"{path}: {err}") from None
    except ValidationError as err:
        raise ValueError(f"{path}: not a results.json: {_problem(err)}") from None


def write_sweep(path: Path, rows: Sequence[SweepRow]) -> None:
    """``sweep.json``: the list of :class:`SweepRow`, indented."""
    path.write_text(json.dumps([row.model_dump() for row in rows], indent=2))


def write_questions(path: Path, rows: Sequence[QuestionRecord]) -> None:
    """``questions.jsonl``: one JSON object a line, non-ASCII text kept as is."""
    with open(path, "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(row.model_dump(), ensure_ascii=False) + "\n" for row in rows)


def read_questions(path: str | Path) -> list[QuestionRecord]:
    """The rows of a ``questions.jsonl`` (blank lines skipped). Every row must name the same
    configurations; a ValueError names the file and the line at fault."""
    path = Path(path)
    rows: list[QuestionRecord] = []
    # split at "\n" only: a text may hold U+2028, which str.splitlines would split at
    for number, line in enumerate(_utf8_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = QuestionRecord.model_validate(strict_json.loads(line))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: invalid JSON ({err.msg})") from None
        except strict_json.JSONRefused as err:
            raise ValueError(f"{path}:{number}: {err}") from None
        except ValidationError as err:
            raise ValueError(f"{path}:{number}: not a questions.jsonl record: {_problem(err)}") from None
        if rows and set(row.found) != set(rows[0].found):
            raise ValueError(f"{path}:{number}: configurations {sorted(row.found)} differ from "
                             f"{sorted(rows[0].found)} of the first question")
        rows.append(row)
    return rows
