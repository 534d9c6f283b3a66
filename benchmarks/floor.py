"""The model's speed, which the memory's figures are divided by: the bare MiniLM forward.

``floor_ms``: the median time of one transformer forward of one short query (tokenised before
the clock starts, ``torch.inference_mode``, no sentence-transformers ``encode`` around it): a
search must encode its query at least once. ``ceiling_rps``: queries per second of one forward
of a batch of 16 short queries (16 / the median forward time), what a query encoder that
batches concurrent requests can serve at most. Both are measured in the same run as the figures
they divide, on the dev questions, after a warm-up; a run may measure them twice (before and after
its load, passing the first samples as ``earlier``) so that a burst of other work on the machine
during one of the two moves the median less. Such a run also gives each half's median and their
``drift`` (the larger over the smaller): ratios to a floor that moved by more than
:data:`FLOOR_DRIFT_MAX` say more about the machine than about the memory, and the benchmarks
count the run's steadiness among their goals.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch

from isq.encoder import MINILM_ALIAS, from_pretrained
from retrieval.index.model_thread import on_model_thread

FLOOR_FORWARDS = 200
CEILING_BATCH = 16
CEILING_FORWARDS = 30
WARM_UP = 10
FLOOR_DRIFT_MAX = 1.25
"""The most a run's floor (or ceiling forward) may differ between its two halves for its ratios
to be read as the memory's: a quarter, just above the 10-20% a shared machine drifts in one run."""


class BareEncoder:
    """The embedder's transformer and tokenizer, loaded on their own (the same weights), loaded and
    run on the process's model thread, as the memory's models are
    (:mod:`retrieval.index.model_thread`: one OpenMP team in the process)."""

    def __init__(self, model: str = MINILM_ALIAS) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.tokenizer = from_pretrained(AutoTokenizer, model)
        self.model = on_model_thread(lambda: from_pretrained(AutoModel, model).eval())

    def forward_seconds(self, texts: Sequence[str]) -> float:
        """Seconds of one forward of ``texts`` as one padded batch (tokenised before timing)."""
        inputs = self.tokenizer(list(texts), padding=True, truncation=True, return_tensors="pt")

        def timed() -> float:
            with torch.inference_mode():
                began = time.perf_counter()
                self.model(**inputs)
                return time.perf_counter() - began

        return on_model_thread(timed)

    def samples_ms(self, batches: Sequence[Sequence[str]]) -> list[float]:
        """Milliseconds of one forward of each batch, after a warm-up."""
        for batch in batches[:WARM_UP]:
            self.forward_seconds(batch)
        return [1000.0 * self.forward_seconds(batch) for batch in batches]


def measure_floor(encoder: BareEncoder, queries: Sequence[str], forwards: int = FLOOR_FORWARDS,
                  earlier: Sequence[float] = ()) -> dict[str, Any]:
    """``floor_ms``: the median of ``forwards`` single-query forwards (the queries taken in turn)
    and of the ``earlier`` samples of the same run."""
    samples, steadiness = _pooled(encoder, [[queries[i % len(queries)]] for i in range(forwards)], earlier)
    return {"floor_ms": statistics.median(samples), "forwards": len(samples), "samples_ms": samples,
            **steadiness}


def measure_ceiling(encoder: BareEncoder, queries: Sequence[str], batch: int = CEILING_BATCH,
                    forwards: int = CEILING_FORWARDS, earlier: Sequence[float] = ()) -> dict[str, Any]:
    """``ceiling_rps``: ``batch`` / the median forward time of ``forwards`` batches of ``batch``
    queries and of the ``earlier`` samples of the same run."""
    batches = [[queries[(i * batch + j) % len(queries)] for j in range(batch)] for i in range(forwards)]
    samples, steadiness = _pooled(encoder, batches, earlier)
    forward_ms = statistics.median(samples)
    return {"ceiling_rps": batch / (forward_ms / 1000.0), "batch": batch, "forward_ms": forward_ms,
            "forwards": len(samples), "samples_ms": samples, **steadiness}


def _pooled(encoder: BareEncoder, batches: Sequence[Sequence[str]],
            earlier: Sequence[float]) -> tuple[list[float], dict[str, Any]]:
    """The ``earlier`` samples with this measurement's, and, when there were earlier ones, each
    half's median and their ``drift``, the larger over the smaller (1: a steady machine)."""
    now = encoder.samples_ms(batches)
    if not earlier:
        return now, {}
    first, second = statistics.median(earlier), statistics.median(now)
    return [*earlier, *now], {"halves_ms": [first, second], "drift": max(first, second) / min(first, second)}
