"""LoCoMo questions and their evidence: which questions are scored and which turns they cite.

Categories are the numeric ``category`` values of ``locomo10.json``: 1 multi-hop, 2 temporal,
3 open-domain, 4 single-hop, 5 adversarial (skipped: its questions have no answer in the
conversation). This is the mapping of the benchmark's own evaluation code (category 1 is scored
per comma-separated sub-answer there) and of the data (91% of category-1 questions cite several
turns; every category-2 question asks "when"); some third-party harnesses number them otherwise.

Evidence ids are parsed leniently ("D1:3;D1:4", "D 1:3", "D1: 3", "D30:05"); items without a
readable id and ids naming no turn of the conversation are listed and left out; a question left
without evidence is listed (with its category) and not scored.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from retrieval.eval.locomo import LocomoConversation

CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
"""LoCoMo category number -> name, for the scored categories (5, adversarial, is skipped)."""


DIA_ID = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)", re.IGNORECASE)


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
        found = [f"D{int(session)}:{int(turn)}" for session, turn in DIA_ID.findall(text)]
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
    unscored: list[str] = field(default_factory=list)
    """The questions of categories 1-4 left without usable evidence, ``conv qa N (category)``."""
    evidence_ids: int = 0
    repaired: list[str] = field(default_factory=list)
    unparsed: list[str] = field(default_factory=list)
    unknown_ids: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "questions": self.questions,
            "skipped_categories": {str(k): v for k, v in sorted(self.skipped_categories.items())},
            "questions_without_evidence": len(self.unscored),
            "unscored_questions": self.unscored,
            "evidence_ids": self.evidence_ids,
            "repaired_items": self.repaired,
            "unparsed_items": self.unparsed,
            "unknown_ids": self.unknown_ids,
        }


def select_questions(conversation: LocomoConversation, report: EvidenceReport) -> list[EvalQuestion]:
    """The questions of categories 1-4 that keep at least one evidence id naming a turn of the
    conversation; ``report`` counts what was skipped, repaired or dropped. Evidence is read in the
    canonical ``D<session>:<turn>`` form and kept as the conversation spells its turn ids (``D1:01``
    where its ``dia_id`` is written so), which the hits name."""
    known: dict[str, str] = {}
    for turn in conversation.turns:
        if canonical := parse_evidence([turn.turn_id]).ids:
            known.setdefault(canonical[0], turn.turn_id)
    selected = []
    for index, qa in enumerate(conversation.questions):
        if qa.category not in CATEGORY_NAMES:
            report.skipped_categories[qa.category] += 1
            continue
        evidence = parse_evidence(qa.evidence)
        where = f"{conversation.conversation_id} qa {index}"
        report.repaired += [f"{where}: {item!r}" for item in evidence.repaired]
        report.unparsed += [f"{where}: {item!r}" for item in evidence.unparsed]
        usable = tuple(known[turn_id] for turn_id in evidence.ids if turn_id in known)
        report.unknown_ids += [f"{where}: {turn_id}" for turn_id in evidence.ids if turn_id not in known]
        if not usable:
            report.unscored.append(f"{where} ({CATEGORY_NAMES[qa.category]})")
            continue
        report.questions += 1
        report.evidence_ids += len(usable)
        selected.append(EvalQuestion(conversation.conversation_id, index, qa.category, qa.question, qa.answer,
                                     usable))
    return selected
