"""Timing helpers shared by the benchmarks: interleaved rounds, per-round ratios, percentiles,
figures as ratios to the model floor, goals written beside their figures, JSON output.

On a shared machine the load drifts during a run, so variants timed one after the other see
different machines. Every benchmark here therefore times its variants round by round, the
order rotated each round, and reports the median over rounds of the per-round ratio together
with its spread (quartiles and extremes): a drift shifts both sides of a round alike.
"""

from __future__ import annotations

import json
import operator
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np


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


def percentiles(seconds: Sequence[float]) -> dict[str, Any]:
    """p50, p95, p99 and mean in milliseconds (linear interpolation) and the count; only the count
    when there is nothing to describe."""
    if len(seconds) == 0:
        return {"n": 0}
    values = np.asarray(seconds, dtype=float) * 1000.0
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    return {"p50_ms": float(p50), "p95_ms": float(p95), "p99_ms": float(p99), "mean_ms": float(values.mean()),
            "n": len(values)}


RATIO = "_ratio_to_floor"


def with_ratios(figures: Mapping[str, Any], floor_ms: float) -> dict[str, Any]:
    """``figures`` with ``<name>_ratio_to_floor`` after each ``<name>_ms`` (None stays None)."""
    out: dict[str, Any] = {}
    for key, value in figures.items():
        out[key] = value
        if key.endswith("_ms") and (value is None or isinstance(value, (int, float))):
            out[key[:-3] + RATIO] = None if value is None else value / floor_ms
    return out


def against_floor(figures: Any, floor_ms: float) -> Any:
    """``figures`` (nested dicts and lists) with every ratio to the floor taken again against
    ``floor_ms``: each ``<name>_ratio_to_floor`` beside a ``<name>_ms``, and a cold build's
    ``max_ratio_to_floor`` beside its ``max`` in seconds. Other ratios (to a batch floor, to
    SQLite) are left as they are."""
    if isinstance(figures, list):
        return [against_floor(value, floor_ms) for value in figures]
    if not isinstance(figures, dict):
        return figures
    out = {key: against_floor(value, floor_ms) for key, value in figures.items()}
    for key, value in figures.items():
        if key.endswith("_ms") and key[:-3] + RATIO in out:
            out[key[:-3] + RATIO] = None if value is None else value / floor_ms
    if "max" + RATIO in out:
        out["max" + RATIO] = 1000.0 * out["max"] / floor_ms
    return out


def split_medians(parts: Sequence[Mapping[str, float] | None], totals: Sequence[float], names: Sequence[str],
                  rest: str) -> dict[str, float | None]:
    """Where the time of a call went: the median milliseconds of each named part (given in
    seconds per call) and of ``rest``, the call's total less its parts, over the calls that
    reported their parts; every figure None when no call did."""
    reported = [(part, total) for part, total in zip(parts, totals, strict=True) if part is not None]
    if not reported:
        return {f"{name}_ms": None for name in (*names, rest)}
    split: dict[str, float | None] = {f"{name}_ms": 1000.0 * statistics.median(
        part.get(name, 0.0) for part, _ in reported) for name in names}
    split[f"{rest}_ms"] = 1000.0 * statistics.median(
        total - sum(part.get(name, 0.0) for name in names) for part, total in reported)
    return split


_COMPARE = {"<=": operator.le, ">=": operator.ge, "==": operator.eq}


@dataclass(frozen=True)
class Goal:
    """A bound on one figure: ``path`` is its keys in the figures, joined by dots."""

    path: str
    op: str
    bound: float

    def __str__(self) -> str:
        return f"{self.path} {self.op} {self.bound:g}"


def apply_goals(figures: dict[str, Any], goals: Sequence[Goal]) -> dict[str, bool | None]:
    """Write each goal beside its figure (``<key>_goal``) and say whether it is met; None where
    the figure was not measured (its memory size not run, or the memory does not report it)."""
    met: dict[str, bool | None] = {}
    for goal in goals:
        *parents, leaf = goal.path.split(".")
        node: Any = figures
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        value = node.get(leaf) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node[f"{leaf}_goal"] = f"{goal.op} {goal.bound:g}"
        met[str(goal)] = None if value is None else bool(_COMPARE[goal.op](value, goal.bound))
    return met


def describe_split(split: Mapping[str, float | None]) -> str:
    """A split's milliseconds in one line ("not reported" when the call reported no parts)."""
    return ", ".join(f"{name[:-3]} {value:.1f}" for name, value in split.items()
                     if name.endswith("_ms") and value is not None) or "not reported"


def describe_goals(met: Mapping[str, bool | None]) -> str:
    """One line per goal: met, NOT met or not measured."""
    words = {True: "met", False: "NOT met", None: "not measured"}
    return "\n".join(f"  {goal}: {words[state]}" for goal, state in met.items())


def machine() -> dict[str, Any]:
    """Where and when the figures were taken: host, CPUs, load average, UTC time."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {"host": platform.node(), "cpus": os.cpu_count(), "load_average": list(load),
            "python": platform.python_version(),
            "utc": datetime.now(UTC).isoformat(timespec="seconds")}


def write_json(path: str | Path | None, figures: Mapping[str, Any]) -> None:
    """Write ``figures`` (plus :func:`machine`) to ``path`` as JSON, when a path is given, and say
    where; paths among them (the run's settings) are written as text."""
    if path is None:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**figures, "machine": machine()}, indent=2, default=_text_of_path) + "\n")
    print(f"wrote the figures to {path.resolve()}")


def _text_of_path(value: Any) -> str:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
