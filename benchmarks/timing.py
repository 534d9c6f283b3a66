"""Timing helpers shared by the benchmarks: interleaved rounds, per-round ratios, JSON output.

On a shared machine the load drifts during a run, so variants timed one after the other see
different machines. Every benchmark here therefore times its variants round by round, the
order rotated each round, and reports the median over rounds of the per-round ratio together
with its spread (quartiles and extremes): a drift shifts both sides of a round alike.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def rotated(names: Sequence[str], round_index: int) -> list[str]:
    """``names`` rotated by ``round_index``: each variant goes first equally often."""
    shift = round_index % len(names)
    return list(names[shift:]) + list(names[:shift])


def interleaved_rounds(variants: Mapping[str, Callable[[int], Any]], rounds: int) -> dict[str, list[float]]:
    """Seconds per round of each variant, the variants called in rotated order within each round.

    ``variants`` maps a name to a function of the round index (e.g. the query it handles).
    """
    names = list(variants)
    seconds: dict[str, list[float]] = {name: [0.0] * rounds for name in names}
    for index in range(rounds):
        for name in rotated(names, index):
            began = time.perf_counter()
            variants[name](index)
            seconds[name][index] = time.perf_counter() - began
    return seconds


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, quartiles and extremes of ``values``."""
    if len(values) == 1:
        q1 = q3 = values[0]
    else:
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return {"median": statistics.median(values), "q1": q1, "q3": q3, "min": min(values), "max": max(values)}


def ratio_spread(numerator: Sequence[float], denominator: Sequence[float]) -> dict[str, float]:
    """:func:`spread` of the per-round ratios numerator[i] / denominator[i]."""
    return spread([a / b for a, b in zip(numerator, denominator, strict=True)])


def describe_ratio(label: str, stats: Mapping[str, float], goal: str = "") -> str:
    """One line: median ratio with its interquartile range and extremes."""
    line = (f"{label}: median {stats['median']:.3f}  IQR {stats['q1']:.3f}-{stats['q3']:.3f}  "
            f"min-max {stats['min']:.3f}-{stats['max']:.3f}")
    return f"{line}  ({goal})" if goal else line


def machine() -> dict[str, Any]:
    """Where and when the figures were taken: host, CPUs, load average, UTC time."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {"host": platform.node(), "cpus": os.cpu_count(), "load_average": list(load),
            "python": platform.python_version(),
            "utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def write_json(path: str | Path | None, figures: Mapping[str, Any]) -> None:
    """Write ``figures`` (plus :func:`machine`) to ``path`` as JSON, when a path is given, and say where."""
    if path is None:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**figures, "machine": machine()}, indent=2) + "\n")
    print(f"wrote the figures to {path.resolve()}")
