"""What the command lines share: choosing the operator by name."""

from __future__ import annotations

from pathlib import Path

from retrieval.consolidation.llm_operator import LLMOperator
from retrieval.consolidation.operations import OfflineOperator, Operator

OPERATORS = ("offline", "llm")
"""``offline``: near-duplicate MERGE without an endpoint; ``llm``: the endpoint of ISQ_LLM_BASE_URL
and ISQ_LLM_MODEL chooses AGGREGATE, MERGE, UPDATE or KEEP."""


def make_operator(kind: str, cache_dir: Path | None) -> Operator:
    """The operator ``kind`` names (``ValueError`` for an unknown one or a missing endpoint)."""
    if kind == "offline":
        return OfflineOperator()
    if kind == "llm":
        return LLMOperator(cache_dir=cache_dir)
    raise ValueError(f"unknown consolidation operator {kind!r} (use one of {', '.join(OPERATORS)})")
