"""The lexical-gap subset: questions whose evidence turns share no content word stem with the
question. A lexical matcher (BM25) cannot find their evidence by the content words asked (only
through the names and dates left out here, or what the records add to the turns); if
the codebook's walk finds evidence through related codes, it shows here, not in the overall mean.

Content words are the rule extractor's (stopwords, fillers, month and day names and the
conversation's participants left out), reduced to their Snowball (Porter 2) English stems, so
"painting" in the question and "painted" in a turn do share a stem.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache

import snowballstemmer

from retrieval.eval.locomo import LocomoConversation
from retrieval.eval.metrics import EvidenceScore
from retrieval.eval.questions import EvalQuestion
from retrieval.extract.rules import content_words

_STEMMER = snowballstemmer.stemmer("english")


@cache
def _stem(word: str) -> str:
    return _STEMMER.stemWord(word)


def content_stems(text: str, names: frozenset[str] = frozenset()) -> frozenset[str]:
    """Stems of the content words of ``text`` (lower-cased ``names`` left out)."""
    return frozenset(_stem(word) for word in content_words(text, set(names)))


def gap_flags(questions: Sequence[EvalQuestion], conversations: Sequence[LocomoConversation]) -> list[bool]:
    """For each question: do its evidence turns (text and image caption) share no content stem with it?"""
    turns = {(c.conversation_id, t.turn_id): t for c in conversations for t in c.turns}
    names = {c.conversation_id: frozenset(n.lower() for n in c.participants) for c in conversations}
    flags = []
    for question in questions:
        own = names[question.conversation_id]
        asked = content_stems(question.question, own)
        evidence = frozenset().union(*(
            content_stems(f"{turn.text} {turn.image_caption or ''}", own)
            for turn in (turns[(question.conversation_id, tid)] for tid in question.evidence)))
        flags.append(not asked & evidence)
    return flags


def gap_recall(flags: Sequence[bool],
               per_question: Mapping[str, Sequence[EvidenceScore]]) -> dict[str, float]:
    """Mean evidence recall of every configuration over the flagged questions (empty: none)."""
    rows = [i for i, flag in enumerate(flags) if flag]
    if not rows:
        return {}
    return {name: sum(scores[i].recall for i in rows) / len(rows) for name, scores in per_question.items()}
