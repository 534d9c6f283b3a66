"""What every retriever promises (docs/design.md §4 and §7): a :class:`Query` in, a :class:`Retrieval`
out, whose :class:`Hit` items carry their provenance (session and turn ids) and each channel's
score. The multi-route retriever (:mod:`retrieval.multi_route.retriever`), the dual-path ablation
of the evaluation (:mod:`retrieval.eval.dual_path`) and the ``Memory`` API all speak it, so the
evaluation and the command lines call any of them the same way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

_WORD = re.compile(r"[^\W_]", re.UNICODE)


class EmptyQuery(ValueError):
    """A query with no letter or digit: nothing to retrieve for (its codes would be those of the
    tokenizer's special tokens, its embedding that of an empty sentence)."""


def check_query(text: str) -> str:
    """``text`` unchanged, or :class:`EmptyQuery` when it holds no letter or digit (empty,
    whitespace, punctuation or emoji only)."""
    if not _WORD.search(text):
        raise EmptyQuery(f"the query {text!r} has no letter or digit: nothing to retrieve for")
    return text


@dataclass(frozen=True)
class Query:
    """A question, with its embedding and fingerprint code set when the caller computed them in a
    batch beforehand (a retriever that needs them and finds none computes them itself or refuses)."""

    text: str
    embedding: np.ndarray | None = None
    codes: frozenset[int] | None = None


@dataclass(frozen=True)
class Hit:
    """One retrieved item (an AMU, or a raw turn for multi-route retrieval).

    ``channel`` is what found it ("dense", "code", "bm25", "codebm25" for the dual path; "multi"
    for multi-route retrieval), ``score`` that channel's final score and ``rank`` its 1-based
    position in that channel's list. ``scores`` holds every channel's score for the item (for
    multi-route retrieval also s_best, s_route and s_final; ``ranks`` each channel's best rank
    of it, from 1; ``route_indices`` the plan routes that found it, numbered from 0). ``source`` is
    the provenance: session id and turn ids. ``index`` is the item's position in its retriever's
    bank.
    """

    id: str
    index: int
    channel: str
    score: float
    rank: int
    source: Mapping[str, Any]
    text: str
    scores: Mapping[str, float] = field(default_factory=dict)
    kind: str = "record"
    memory_type: str | None = None
    time: str | None = None
    route_indices: tuple[int, ...] = ()
    ranks: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Retrieval:
    """What one query retrieved: the hits in order, the wall time, and for multi-route retrieval
    the plan it followed and the reranker it used."""

    query: str
    hits: list[Hit]
    seconds: float
    plan: Any | None = None
    reranker: str | None = None
    timings: dict[str, float] = field(default_factory=dict)


class Retriever(Protocol):
    """Anything that retrieves at most ``k`` items for a query."""

    def retrieve(self, query: Query, k: int) -> Retrieval: ...
