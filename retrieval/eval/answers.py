"""The optional answer stage: an LLM answers each question from the retrieved memories and their
source turns, scored with LoCoMo's token F1 and an LLM judge (CORRECT/WRONG)."""

from __future__ import annotations

import json
import logging
import re
import string
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

from retrieval.contract import Hit
from retrieval.eval.construction import BuiltConversation
from retrieval.eval.metrics import mean, summarise
from retrieval.eval.questions import DIA_ID, EvalQuestion
from retrieval.eval.results import AnswersDone, AnswersSkipped, AnswerSummary
from retrieval.llm_client import ChatClient, EndpointRefused, InvalidResponse
from retrieval.memory.records import AMU, Turn
from retrieval.memory.store_contract import Store

logger = logging.getLogger(__name__)

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
_VERDICT = re.compile(r"\b(NOT\s+)?(IN)?(CORRECT|WRONG)\b")
"""The judge's verdict: its first CORRECT or WRONG, turned over by a NOT before it ("not
correct") or an IN ("incorrect")."""


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
        return mean([max(token_f1(p, g) for p in predictions) for g in golds])
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
    return (match[3] == "CORRECT") ^ bool(match[1]) ^ bool(match[2])


def _turn_order(turn: Turn) -> tuple[int, ...]:
    match = DIA_ID.search(turn.turn_id)
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
        memories = [f"{i}. ({(amu.observed_at or 'undated')[:10]}) {amu.text}"
                    for i, amu in enumerate(amus, 1)]
        ordered = sorted({turn.turn_id: turn for turn in turns}.values(), key=_turn_order)
        lines = [f"[{t.turn_id}] ({f'{t.session_time:%d %B %Y}' if t.session_time else 'undated'}) "
                 f"{t.render()}"
                 for t in ordered]
        hint = TEMPORAL_HINT if question.category == 2 else ""
        user = "\n".join(["Memories:", *memories, "", "Original turns:", *lines, "",
                          f"Question: {question.question}{hint}"])
        return [{"role": "system", "content": ANSWER_PROMPT}, {"role": "user", "content": user}]

    def answer(self, question: EvalQuestion, amus: Sequence[AMU], turns: Sequence[Turn]) -> str | None:
        label = f"answer {question.conversation_id}/{question.qa_index}"
        return self.answer_client.complete(self.messages(question, amus, turns), _parse_answer, label=label)

    def judge(self, question: EvalQuestion, prediction: str) -> bool | None:
        user = (f"Question: {question.question}\nGold answer: {question.answer}\n"
                f"Generated answer: {prediction}")
        messages = [{"role": "system", "content": JUDGE_PROMPT}, {"role": "user", "content": user}]
        return self.judge_client.complete(messages, _parse_verdict,
                                          label=f"judge {question.conversation_id}/{question.qa_index}")


def run_answer_stage(stage: AnswerStage | None, config_names: Sequence[str],
                     questions: Sequence[EvalQuestion],
                     hits: Mapping[str, Sequence[Sequence[Hit]]], banks: Mapping[str, BuiltConversation],
                     store: Store, out_dir: Path) -> AnswersDone | AnswersSkipped:
    """Answer and grade every question with each configuration's retrieved AMUs (and raw turns);
    writes ``answers.jsonl`` and returns the summary for ``results.json`` (or why it was skipped:
    no endpoint, no answer configuration, no question answered and graded). A question whose
    answer or grading request failed is counted in ``failed``, not scored (a configuration none
    of whose questions was graded has no summary)."""
    if stage is None or not config_names:
        return AnswersSkipped(note=(
            "no LLM endpoint configured: set ISQ_LLM_BASE_URL and ISQ_LLM_MODEL (and ISQ_LLM_API_KEY if "
            "needed) or pass --llm-base-url/--llm-model" if stage is None
            else "no answer configuration selected (--answer-configs)"))
    logger.info("answering %d questions x %d configurations", len(questions), len(config_names))
    amus_by_id = {amu.id: amu for bank in banks.values() for amu in bank.amus}
    summaries: dict[str, AnswerSummary] = {}
    failed: Counter[str] = Counter()
    with open(out_dir / "answers.jsonl", "w", encoding="utf-8") as handle:
        for name in config_names:
            rows = []
            for question, question_hits in zip(questions, hits[name], strict=True):
                if question.answer is None:
                    failed["no_gold_answer"] += 1
                    continue
                amus = [amus_by_id[hit.id] for hit in question_hits if hit.id in amus_by_id]
                turns = [turn for amu in amus for turn in store.source_turns(amu)]
                # raw-turn items of the multi-route configurations: the turn itself
                turns += [store.turn(question.conversation_id, turn_id) for hit in question_hits
                          if hit.id not in amus_by_id for turn_id in hit.turns]
                try:
                    prediction = stage.answer(question, amus, turns)
                    verdict = stage.judge(question, prediction) if prediction is not None else None
                except EndpointRefused as err:  # every later request would be refused too
                    return AnswersSkipped(note=f"the answer stage stopped: {err}")
                failed["answer"] += prediction is None
                failed["judge"] += prediction is not None and verdict is None
                f1 = (locomo_f1(prediction, question.answer, question.category) if prediction is not None
                      else None)
                if f1 is not None and verdict is not None:  # a failed request is no wrong answer
                    rows.append((question.category_name, {"f1": f1, "judge": float(verdict)}))
                handle.write(json.dumps({
                    "config": name, "conversation": question.conversation_id, "qa_index": question.qa_index,
                    "category": question.category_name, "question": question.question,
                    "gold": question.answer, "prediction": prediction, "f1": f1, "judge": verdict,
                }, ensure_ascii=False) + "\n")
            if rows:
                summaries[name] = AnswerSummary.model_validate(summarise(rows))
    if not summaries:
        return AnswersSkipped(note=f"no question was answered and graded: the endpoint's requests failed "
                                   f"({', '.join(f'{kind} {count}' for kind, count in failed.items())}; "
                                   "answers.jsonl lists them)")
    answer_usage, judge_usage = stage.answer_client.usage, stage.judge_client.usage
    query_tokens = answer_usage.tokens
    answered = sum(summary.overall.n for summary in summaries.values())
    return AnswersDone(model=stage.answer_client.model, configs=summaries, failed=dict(failed),
                       query_tokens=query_tokens,
                       query_tokens_per_question=query_tokens / answered if answered else 0.0,
                       usage={"answer": asdict(answer_usage), "judge": asdict(judge_usage)})
