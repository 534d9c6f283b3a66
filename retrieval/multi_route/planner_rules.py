"""The offline rule planner: the same :class:`Plan` as the LLM planner, without a model.

Query entities are the question's names (participants and capitalised word runs, as the rule
extractor finds them) and the conversation's known entity keys found in it, all through the
store's key normaliser (:func:`retrieval.memory.evidence_keys.normalise_key`); only keys that name an
entity node of the conversation are kept. Topics are the question's content words that are
known topic keys. Temporal expressions go through the project's date resolver (relative dates
against the conversation's latest session time, and absolute dates). The question type comes
from the wording (:func:`question_type`). One route by default (F.2: "for ordinary named-speaker
factual questions, the default behavior is a single route"); a comparison naming several
entities gets one more route per entity.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from retrieval.contract import check_query
from retrieval.extract.dates import absolute_dates, resolve_dates
from retrieval.extract.rules import content_words, find_entities
from retrieval.memory.evidence_keys import normalise_key
from retrieval.memory.times import time_interval
from retrieval.multi_route.params import MAX_ROUTES
from retrieval.multi_route.query_plan import Plan, Route, TimeConstraint

_TYPE_PATTERNS = (
    ("prior_assistant_response",
     r"\b(you|assistant) (said|told|mention(ed)?|suggest(ed)?|recommend(ed)?|answer(ed)?)\b"
                                 r"|\b(earlier|previously|last time) "
                                 r"you\b|\byou\b.*\b(earlier|previously|last time)\b"),
    ("personalized_advice", r"^\s*(would|might|could)\b.*\b(likely|enjoy|want|prefer|interested|like)\b"
                            r"|\bshould (i|he|she|they|we)\b|\b(recommend|suggest)\b"),
    ("comparison", r"\b(both|in common|compare[ds]?|difference|differ|similar|same as|more than|less than|"
                   r"which of)\b"),
    ("temporal", r"^\s*(when|what (date|day|month|year|time))\b|\bhow long\b"
                 r"|\bhow many (days|weeks|months|years)\b"),
    ("aggregate",
     r"\bhow (many|often)\b|^\s*(what|which)\s+(kinds? of\s+)?\w+s\s+(has|have|do|does|did|are)\b"
                  r"|\b(all|list|every|activities|hobbies)\b"),
)


def question_type(question: str) -> str:
    """The first matching type of: prior_assistant_response ("you said"), personalized_advice
    ("Would X likely ...", "should she"), comparison ("both", "in common"), temporal ("When",
    "how long"), aggregate ("how many", "What books has", "all"); otherwise single."""
    for name, pattern in _TYPE_PATTERNS:
        if re.search(pattern, question, re.IGNORECASE):
            return name
    return "single"


@dataclass(frozen=True)
class PlanContext:
    """What a planner knows of the conversation: its speakers, the normalised keys of its entity
    and topic nodes, "now" (its latest session time) for relative dates, and its user (an LLM
    planner caches its plans under it)."""

    participants: tuple[str, ...] = ()
    entity_keys: frozenset[str] = field(default_factory=frozenset)
    topic_keys: frozenset[str] = field(default_factory=frozenset)
    now: datetime | None = None
    user: str | None = None

    @functools.cached_property
    def participant_keys(self) -> frozenset[str]:
        """The normalised keys of the speakers, kept with the context between the user's searches
        (a memory of many speakers would otherwise normalise every name for every question; a
        cache beside the user's state would outlive a forget of the user, and be shared with
        every user of the same speakers)."""
        return frozenset(normalise_key(name) for name in self.participants)


def query_entities(question: str, context: PlanContext) -> list[str]:
    """Known entity keys the question names (capitalised runs, participants, known keys)."""
    normalised = f" {normalise_key(question)} "
    found = [normalise_key(name) for name in find_entities(question, context.participants)]
    found += [key for key in sorted(context.entity_keys, key=len, reverse=True) if f" {key} " in normalised]
    return [key for key in dict.fromkeys(found) if key in context.entity_keys]


def query_topics(question: str, context: PlanContext, entities: Collection[str]) -> list[str]:
    """Known topic keys among the question's content words (entity words left out)."""
    entity_words = {word for key in entities for word in key.split()}
    words = (normalise_key(w) for w in content_words(question, context.participant_keys))
    return [w for w in dict.fromkeys(words) if w in context.topic_keys and w not in entity_words]


def query_time(question: str, now: datetime | None) -> TimeConstraint | None:
    """The range of the question's resolved temporal expressions, or None without any."""
    _, relative = resolve_dates(question, now)
    values = [date.value for date in relative if date.value is not None] + absolute_dates(question)
    if not values:
        return None
    start = min(values, key=lambda value: time_interval(value)[0])
    end = max(values, key=lambda value: time_interval(value)[1])
    return TimeConstraint(start, end)


class RulePlanner:
    """Offline planner; ``plan(question, context)`` -> :class:`Plan` (``planner="rule"``)."""

    name = "rule"

    def plan(self, question: str, context: PlanContext) -> Plan:
        check_query(question)
        entities = query_entities(question, context)
        topics = query_topics(question, context, entities)
        time = query_time(question, context.now)
        kind = question_type(question)
        if kind == "single" and time is not None:
            kind = "temporal"
        main = Route(f"evidence for: {question}", (question,), tuple(entities), tuple(topics), time)
        routes = [main]
        if kind == "comparison" and len(entities) > 1:
            routes += [Route(f"evidence about {entity}", (question,), (entity,), tuple(topics), time)
                       for entity in entities[: MAX_ROUTES - 1]]
        return Plan(kind, tuple(routes), self.name)



class Planner(Protocol):
    """What multi-route retrieval plans with: the rule planner here or
    :class:`retrieval.multi_route.planner_llm.LLMPlanner`."""

    @property
    def name(self) -> str: ...

    def plan(self, question: str, context: PlanContext) -> Plan: ...
