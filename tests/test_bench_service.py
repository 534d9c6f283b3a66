"""The load test's own checks: what counts as a leak, and its percentiles (the full run is a
benchmark, not a test: ``python benchmarks/bench_service.py``)."""

from __future__ import annotations

from benchmarks.bench_service import canary, check_hits, percentiles, user_name


def test_a_hit_of_another_user_is_a_leak() -> None:
    mine = {"id": "u001:turn:load-0-1", "text": f"Load note {canary('u001', 0, 1)}", "turns": ["load-0-1"]}
    assert check_hits("u001", [mine], users=3) == []
    foreign_id = dict(mine, id="u002:0:3")
    foreign_text = dict(mine, text=f"Load note {canary('u002', 4, 7)}")
    assert check_hits("u001", [foreign_id], users=3) == ["u001 got hit u002:0:3"]
    assert check_hits("u001", [foreign_text], users=3) == ["u001 got u002's canary"]
    assert user_name(7) == "u007" and canary("u007", 1, 2) == "canaryu007x1x2"


def test_percentiles_in_milliseconds() -> None:
    figures = percentiles([n / 1000 for n in range(1, 101)])
    assert figures["p50_ms"] == 50.5
    assert round(figures["p95_ms"], 2) == 95.05 and round(figures["p99_ms"], 2) == 99.01
