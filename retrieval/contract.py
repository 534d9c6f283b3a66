"""What every retriever promises (docs/design.md §4 and §7): a :class:`Query` in, a :class:`Retrieval`
out, whose :class:`Hit` items carry their provenance (session and turn ids) and each channel's
score. The multi-route retriever (:mod:`retrieval.multi_route.retriever`), the dual-path ablation
of the evaluation (:mod:`retrieval.eval.dual_path`) and the ``Memory`` API all speak it, so the
evaluation and the command lines call any of them the same way; ``Memory.search`` returns its hits
and the service serialises them as they are.
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


@dataclass(frozen=True, kw_only=True)
class Hit:
    """One retrieved item (a record, or a raw turn for multi-route retrieval): the one form a hit
    has from the retriever to ``Memory.search`` and the service's response.

    What every caller reads: ``id`` (an AMU id, or ``<user>:turn:<turn id>`` for a raw turn), its
    ``text``, ``score`` (the final score of ``channel``), ``kind`` ("record" or "turn"), the
    provenance ``session_id`` and ``turns`` (the turn ids it came from; a raw turn names its own),
    a record's ``memory_type`` and ``time``, and ``explain`` when the search was asked for it (per
    channel its rank and score, the routes from 1 that found it, the fused scores and the codes it
    shared with the query).

    What the evaluation reads too: ``channel`` is what found it ("dense", "code", "bm25",
    "codebm25" for the dual path; "multi" for multi-route retrieval), ``rank`` its 1-based position
    in that channel's list, ``index`` its position in its retriever's bank. ``scores`` holds every
    channel's score for the item (for multi-route retrieval also s_best, s_route and s_final),
    ``ranks`` each channel's best rank of it (from 1), ``route_indices`` the plan routes that found
    it (numbered from 0).
    """

    id: str
    text: str
    score: float
    kind: str
    session_id: str
    turns: tuple[str, ...]
    memory_type: str | None = None
    time: str | None = None
    explain: Mapping[str, Any] | None = None
    index: int
    channel: str
    rank: int
    scores: Mapping[str, float] = field(default_factory=dict)
    ranks: Mapping[str, int] = field(default_factory=dict)
    route_indices: tuple[int, ...] = ()


@dataclass(frozen=True)
class Retrieval:
    """What one query retrieved: the hits in order, the wall time, for multi-route retrieval
    the plan it followed and the reranker it used, and where the time went (``timings``: seconds
    per phase, "model_wait", "encode", "routes" and "fusion"; empty when the retriever does not
    measure them)."""

    query: str
    hits: list[Hit]
    seconds: float
    plan: Any | None = None
    reranker: str | None = None
    timings: dict[str, float] = field(default_factory=dict)


class Retriever(Protocol):
    """Anything that retrieves at most ``k`` items for a query."""

    def retrieve(self, query: Query, k: int) -> Retrieval: ...
