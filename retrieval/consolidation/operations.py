"""Consolidation operations and the offline operator.

An operator looks at one gated cluster and returns drafts: each names the members it replaces
(two or more) and the fields of the one compact AMU that replaces them, under one of MemCode's
operations:

- ``MERGE``: the members say the same thing (duplicates); one statement is kept.
- ``UPDATE``: a newer statement supersedes an older state; the current state is kept.
- ``AGGREGATE``: related facts are summarised into one AMU that keeps their details.
- ``KEEP`` (no draft): the members stay as they are (an LLM's way to decline).

The :class:`OfflineOperator` needs no endpoint: it MERGEs exact and near duplicates (the cluster
was cut at a tight cosine distance) whose event times agree, keeping the newest statement. It
does no UPDATE or AGGREGATE: telling a state change from two facts needs reading, not rules.
The LLM operator is :class:`retrieval.consolidation.llm_operator.LLMOperator`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Protocol

from retrieval.consolidation.config import OFFLINE_THRESHOLD
from retrieval.consolidation.members import Member
from retrieval.consolidation.prefix import strip_prefix
from retrieval.llm_usage import LLMUsage


class Operation(str, Enum):
    AGGREGATE = "AGGREGATE"
    MERGE = "MERGE"
    UPDATE = "UPDATE"
    KEEP = "KEEP"


@dataclass(frozen=True)
class Draft:
    """The AMU that replaces ``member_ids`` (without the time prefix, id, source and statement
    time, which :mod:`retrieval.consolidation.forward` derives from the members). ``exact``
    marks a MERGE of identical statements."""

    operation: Operation
    member_ids: tuple[str, ...]
    text: str
    memory_type: str
    entities: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    timestamps: tuple[str, ...] = ()
    t_ref: str | None = None
    valid_from: str | None = None
    valid_to: str | None = None
    exact: bool = False


class Operator(Protocol):
    """Decides what one gated cluster becomes."""

    @property
    def name(self) -> str: ...

    @property
    def default_threshold(self) -> float: ...

    def usage_of(self, user: str) -> LLMUsage:
        """The accounting of the requests made for ``user``'s records (a copy)."""

    def decide(self, cluster: Sequence[Member]) -> list[Draft] | None:
        """Drafts for (parts of) the cluster, [] to keep it as it is, None without a usable answer."""

    def forget(self, user: str) -> None:
        """Drop what the operator keeps of the user's records (cached answers): a purge removed
        some of them while it decided."""


def newest(members: Sequence[Member]) -> Member:
    """The member stated last (ties: the later one in store order)."""
    return max(enumerate(members), key=lambda item: (item[1].last or datetime.min, item[0]))[1]


def union(values: Sequence[Sequence[str]]) -> tuple[str, ...]:
    """The values in order of first appearance, without repeats (case-insensitive)."""
    seen: dict[str, str] = {}
    for value in (v for sequence in values for v in sequence):
        seen.setdefault(value.casefold(), value)
    return tuple(seen.values())


def normalised(text: str) -> str:
    """A statement's words, case-folded, without its time prefix and punctuation."""
    return " ".join(re.findall(r"\w+", strip_prefix(text).casefold()))


def keep_newest(operation: Operation, members: Sequence[Member]) -> Draft:
    """The draft that keeps the newest statement (text, type, temporal scope) and the union of
    the members' entities, tags and event times."""
    last = newest(members).amu
    ordered = [last] + [m.amu for m in members if m.amu is not last]
    return Draft(operation, tuple(m.id for m in members), strip_prefix(last.text), last.memory_type,
                 union([a.entities for a in ordered]), union([a.tags for a in ordered]),
                 union([a.timestamps for a in ordered]), last.t_ref, last.valid_from, last.valid_to,
                 exact=len({normalised(m.amu.text) for m in members}) == 1)


class OfflineOperator:
    """Deterministic MERGE of exact and near duplicates, for machines without an endpoint.

    Within a cluster, members are grouped by their event times (the set of ``timestamps``):
    "went to the support group on 7 May" and "... on 24 May" are two events, not duplicates.
    Each group of two or more becomes one MERGE that keeps the newest statement.
    """

    name = "offline"
    default_threshold = OFFLINE_THRESHOLD

    def decide(self, cluster: Sequence[Member]) -> list[Draft]:
        groups: dict[frozenset[str], list[Member]] = {}
        for member in cluster:
            groups.setdefault(frozenset(member.amu.timestamps), []).append(member)
        return [keep_newest(Operation.MERGE, group) for group in groups.values() if len(group) > 1]

    def usage_of(self, user: str) -> LLMUsage:
        return LLMUsage()

    def forget(self, user: str) -> None:
        """Nothing: the offline operator keeps nothing."""
