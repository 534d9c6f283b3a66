"""The benchmarks' arithmetic: percentiles, figures as ratios to the model floor, where a call's
time went, goals written beside their figures, and where the LoCoMo file is looked for (the
timed runs are benchmarks, not tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks import paths
from benchmarks.timing import Goal, against_floor, apply_goals, percentiles, split_medians, with_ratios


def test_percentiles_in_milliseconds_and_an_empty_sample() -> None:
    figures = percentiles([n / 1000 for n in range(1, 101)])
    assert figures["p50_ms"] == 50.5 and figures["n"] == 100
    assert round(figures["p95_ms"], 2) == 95.05 and round(figures["p99_ms"], 2) == 99.01
    assert round(figures["mean_ms"], 6) == 50.5
    assert percentiles([]) == {"n": 0}


def test_every_millisecond_figure_gets_its_ratio_to_the_floor_beside_it() -> None:
    figures = with_ratios({"p50_ms": 30.0, "n": 7, "split_ms": None, "rate": 2.0}, floor_ms=12.0)
    assert list(figures) == ["p50_ms", "p50_ratio_to_floor", "n", "split_ms", "split_ratio_to_floor", "rate"]
    assert figures["p50_ratio_to_floor"] == 2.5 and figures["split_ratio_to_floor"] is None


def test_ratios_are_taken_again_against_a_later_floor() -> None:
    """Every ratio to the floor beside a millisecond figure, nested or in lists, and a cold
    build's (seconds), follows the new floor; ratios to anything else stay."""
    first = {"add": {**with_ratios({"p99_ms": 6.0}, 12.0), "ingest_ratio_to_floor": 0.25},
             "search": {"1x10": {**with_ratios({"p50_ms": 24.0}, 12.0),
                                 "split": with_ratios({"encode_ms": 12.0, "other_ms": None}, 12.0),
                                 "snapshot_build_s": {"max": 1.2, "max_ratio_to_floor": 100.0}}},
             "postgres": [{**with_ratios({"p50_ms": 30.0}, 12.0), "p50_ratio_to_sqlite": 1.25}]}
    again = against_floor(first, 10.0)
    assert again["add"] == {"p99_ms": 6.0, "p99_ratio_to_floor": 0.6, "ingest_ratio_to_floor": 0.25}
    row = again["search"]["1x10"]
    assert row["p50_ratio_to_floor"] == 2.4 and row["split"]["encode_ratio_to_floor"] == 1.2
    assert row["split"]["other_ratio_to_floor"] is None
    assert row["snapshot_build_s"] == {"max": 1.2, "max_ratio_to_floor": pytest.approx(120.0)}
    assert again["postgres"] == [{"p50_ms": 30.0, "p50_ratio_to_floor": 3.0, "p50_ratio_to_sqlite": 1.25}]
    assert first["add"]["p99_ratio_to_floor"] == 0.5  # the figures given are not changed


def test_the_split_takes_medians_of_the_parts_and_of_the_rest() -> None:
    parts = [{"encode": 0.010, "routes": 0.004}, {"encode": 0.012, "routes": 0.002, "other_key": 9.0}, None]
    split = split_medians(parts, [0.020, 0.030, 5.0], ("encode", "routes", "fusion"), "other")
    assert split["encode_ms"] == pytest.approx(11.0) and split["routes_ms"] == pytest.approx(3.0)
    assert split["fusion_ms"] == 0.0
    # The median of 6 and 16 ms; the call without parts is left out.
    assert split["other_ms"] == pytest.approx(11.0)


def test_a_memory_that_reports_no_parts_gives_a_null_split() -> None:
    split = split_medians([None, None], [0.1, 0.2], ("encode",), "client")
    assert split == {"encode_ms": None, "client_ms": None}


def test_goals_are_written_beside_their_figures_and_summed_up() -> None:
    figures: dict[str, Any] = {
        "search": {"1x10000": {"p50_ratio_to_floor": 1.2}, "1000x100": {"p50_ratio_to_floor": 2.0}},
        "add": {"ingest_ratio_to_floor": 0.5}, "load": {"errors": 1}}
    met = apply_goals(figures, [Goal("search.1x10000.p50_ratio_to_floor", "<=", 1.5),
                                Goal("search.1000x100.p50_ratio_to_floor", "<=", 1.5),
                                Goal("search.1x100000.p50_ratio_to_floor", "<=", 3),
                                Goal("add.ingest_ratio_to_floor", ">=", 0.5),
                                Goal("load.errors", "==", 0)])
    assert met == {"search.1x10000.p50_ratio_to_floor <= 1.5": True,
                   "search.1000x100.p50_ratio_to_floor <= 1.5": False,
                   "search.1x100000.p50_ratio_to_floor <= 3": None,
                   "add.ingest_ratio_to_floor >= 0.5": True, "load.errors == 0": False}
    assert figures["search"]["1x10000"]["p50_ratio_to_floor_goal"] == "<= 1.5"
    assert figures["add"]["ingest_ratio_to_floor_goal"] == ">= 0.5"
    assert "1x100000" not in figures["search"]


def test_the_locomo_file_comes_from_the_environment_else_beside_the_checkout(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(paths.LOCOMO_ENV, str(tmp_path / "dev.json"))
    assert paths.default_locomo() == tmp_path / "dev.json"
    assert "ISQ_LOCOMO" in (paths.missing_locomo(paths.default_locomo()) or "")
    (tmp_path / "dev.json").write_text("[]")
    assert paths.missing_locomo(paths.default_locomo()) is None
    monkeypatch.delenv(paths.LOCOMO_ENV)
    assert paths.default_locomo() == paths.ROOT.parent / "shared" / "data" / "locomo" / "locomo_dev.json"
    assert isinstance(paths.default_locomo(), Path)
