"""The load test's own checks: what counts as a leak, how a ``Server-Timing`` header is read, and
how the pre-fill makes its users (the full run is a benchmark, not a test:
``python benchmarks/bench_service.py``)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import httpx
import pytest

from benchmarks.bench_service import (
    GOALS,
    LoadLog,
    _parser,
    answered,
    canary,
    check_hits,
    load_note,
    parse_server_timing,
    summary,
    verify,
)
from benchmarks.prefill import user_name
from benchmarks.timing import apply_goals


def test_a_hit_of_another_user_is_a_leak() -> None:
    mine = {"id": "u001:turn:load-0-1", "text": f"Load note {canary('u001', 0, 1)}", "turns": ["load-0-1"]}
    assert check_hits("u001", [mine], users=3) == []
    foreign_id = dict(mine, id="u002:0:3")
    foreign_text = dict(mine, text=f"Load note {canary('u002', 4, 7)}")
    assert check_hits("u001", [foreign_id], users=3) == ["u001 got hit u002:0:3"]
    assert check_hits("u001", [foreign_text], users=3) == ["u001 got u002's canary"]
    assert user_name(7) == "u007" and canary("u007", 1, 2) == "canaryu007x1x2"


def test_server_timing_durations_in_seconds() -> None:
    header = "encode;dur=12.5, routes;dur=3, fusion;desc=\"fuse\";dur=0.25, serialise;dur=1, queue"
    parts = parse_server_timing(header)
    assert parts == pytest.approx({"encode": 0.0125, "routes": 0.003, "fusion": 0.00025, "serialise": 0.001})
    assert parse_server_timing(None) is None
    assert parse_server_timing("encode;dur=fast") == {}


def test_the_codebook_route_is_on_unless_turned_off() -> None:
    assert _parser().parse_args([]).fingerprinter.name == "isq_minilm_dailydialog_cpu"
    assert _parser().parse_args(["--no-fingerprinter"]).fingerprinter is None


def test_the_prefill_builds_one_user_and_copies_it(tmp_path) -> None:
    """The first user through ``Memory.add``, the others copies holding the same records under
    their own ids; asking for more users later copies only the new ones (the first is not built
    again), asking for fewer reuses the store."""
    from benchmarks.prefill import prefill
    from retrieval.memory.store import AMUStore
    from tests.test_evaluate import write_locomo

    def args(users: int) -> argparse.Namespace:
        return argparse.Namespace(users=users, locomo=Path(write_locomo(tmp_path / "locomo.json")),
                                  fingerprinter=None, prefilled=tmp_path / "prefilled")

    built = prefill(args(3))
    assert built["users"] == 3 and not built["reused"] and built["records_per_user"] > 0
    grown = prefill(args(4))
    assert grown["seed_s"] == built["seed_s"] and grown["users"] == 4 and not grown["reused"]
    assert prefill(args(2))["reused"]
    with AMUStore(tmp_path / "prefilled", read_only=True) as store:
        assert store.users() == [user_name(n) for n in range(4)]
        first = [(amu.id.split(":", 1)[1], amu.text) for amu in store.amus(user_name(0))]
        assert len(first) == built["records_per_user"]
        for n in range(1, 4):
            user = user_name(n)
            assert [(amu.id.split(":", 1)[1], amu.text) for amu in store.amus(user)] == first
            assert all(amu.id.startswith(f"{user}:") for amu in store.amus(user))
            assert len(store.turns(user)) == built["turns_per_user"]


def test_the_floor_and_ceiling_pool_the_samples_of_both_measurements() -> None:
    """Measured before and after the load, the median is over both halves' forwards."""
    from benchmarks.floor import measure_ceiling, measure_floor

    class Fixed:
        def samples_ms(self, batches):
            return [10.0 * len(batches[0])] * len(batches)

    floor = measure_floor(Fixed(), ["q"], forwards=3, earlier=[90.0] * 4)  # type: ignore[arg-type]
    assert floor["floor_ms"] == 90.0 and floor["forwards"] == 7
    assert measure_floor(Fixed(), ["q"], forwards=5, earlier=[90.0] * 4)["floor_ms"] == 10.0  # type: ignore[arg-type]
    ceiling = measure_ceiling(Fixed(), ["q"], batch=16, forwards=2, earlier=[])  # type: ignore[arg-type]
    assert ceiling["forward_ms"] == 160.0 and ceiling["ceiling_rps"] == 100.0


def test_a_floor_that_moved_between_the_halves_of_a_run_is_a_goal_not_met() -> None:
    """Ratios to a floor that doubled between the start and the end of a run are the machine's."""
    from benchmarks.bench_memory import GOALS as MEMORY_GOALS
    from benchmarks.floor import measure_ceiling, measure_floor

    class Fixed:
        def __init__(self, ms: float) -> None:
            self.ms = ms

        def samples_ms(self, batches):
            return [self.ms] * len(batches)

    first = measure_floor(Fixed(10.0), ["q"], forwards=4)  # type: ignore[arg-type]
    assert "drift" not in first  # one measurement has no halves
    floor = measure_floor(Fixed(20.0), ["q"], forwards=4, earlier=first["samples_ms"])  # type: ignore[arg-type]
    assert floor["halves_ms"] == [10.0, 20.0] and floor["drift"] == 2.0
    steady = measure_ceiling(Fixed(11.0), ["q"], forwards=2, earlier=[10.0, 10.0])  # type: ignore[arg-type]
    assert steady["drift"] == pytest.approx(1.1)
    met = apply_goals({"floor": floor, "ceiling": steady}, GOALS)
    assert met["floor.drift <= 1.25"] is False and met["ceiling.drift <= 1.25"] is True
    assert apply_goals({"floor": floor}, MEMORY_GOALS)["floor.drift <= 1.25"] is False


def test_the_loads_figures_are_ratios_to_the_floor_and_ceiling_and_every_goal_is_measured(tmp_path) -> None:
    """From a load of known times: throughput over the ceiling, p99 over the floor, and each goal of
    the table resolves to a figure (a goal naming a key nobody writes would read "not measured")."""
    log = LoadLog()
    log.requests = 10
    log.latencies["search"] = [0.010] * 7 + [0.050]
    log.latencies["add"] = [0.020, 0.020]
    log.parts["search"] = [None] * 8
    log.parts["add"] = [None] * 2
    load = summary(log, 2.0, floor_ms=5.0, ceiling_rps=20.0)
    assert load["per_s"] == 5.0 and load["per_s_ratio_to_ceiling"] == 0.25
    search = load["routes"]["search"]
    assert search["p99_ratio_to_floor"] == pytest.approx(search["p99_ms"] / 5.0) and search["p99_ms"] > 40
    assert load["leaks"] == 0 and load["errors"] == 0
    figures = {"load": load, "verify": {"lost": 0, "duplicated": 0},
               "compare": {"http_over_in_process_p50": 1.2},
               "floor": {"drift": 1.0}, "ceiling": {"drift": 1.0}}
    met = apply_goals(figures, GOALS)
    assert None not in met.values(), met
    assert met == {**dict.fromkeys(met, True), "load.routes.search.p99_ratio_to_floor <= 10": True,
                   "load.per_s_ratio_to_ceiling >= 0.4": False}


def test_a_prefilled_store_is_reused_whatever_path_names_its_files(tmp_path) -> None:
    """The settings a pre-filled store records are resolved paths: the same fingerprinter named
    relative to the working directory reuses it (never deletes and rebuilds it)."""
    from benchmarks.paths import FINGERPRINTER
    from benchmarks.prefill import PREFILL_MARK, prefill

    locomo = tmp_path / "locomo.json"
    locomo.write_text("[]")
    (tmp_path / "prefilled").mkdir()
    mark = {"locomo": str(locomo.resolve()), "fingerprinter": str(FINGERPRINTER.resolve()), "users": 3}
    (tmp_path / "prefilled" / PREFILL_MARK).write_text(json.dumps(mark))
    relative = Path(os.path.relpath(FINGERPRINTER))
    args = argparse.Namespace(users=3, locomo=locomo, fingerprinter=relative,
                              prefilled=tmp_path / "prefilled")
    assert prefill(args)["reused"] and (tmp_path / "prefilled" / PREFILL_MARK).is_file()


def _answer(status: int, body: object) -> httpx.Response:
    content = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    return httpx.Response(status, content=content, headers={"content-type": "application/json"})


def test_an_answer_counts_only_when_it_is_the_routes_and_acknowledges_the_turn_sent() -> None:
    """An add whose 200 does not name the turn sent would go unchecked for loss; a body that is
    not the route's (a proxy's page) is an error, not a dead client thread."""
    sent = {"turns": [{"speaker": "Load", "text": "note", "turn_id": "load-0-1"}]}
    assert answered("add", _answer(200, {"turn_ids": ["load-0-1"]}), "u000", sent, 2) == (None, [])
    assert answered("add", _answer(200, {"turn_ids": [], "duplicates": ["load-0-1"]}), "u000", sent, 2) == (
        "add: not acknowledged", [])
    assert answered("add", _answer(503, {"error": "busy"}), "u000", sent, 2) == ("add: 503", [])
    assert answered("search", _answer(200, "<html>proxy error</html>"), "u000", {}, 2) == (
        "search: malformed answer (JSONDecodeError)", [])
    nothing = answered("search", _answer(200, {"hits": None}), "u000", {}, 2)
    assert nothing == ("search: malformed answer (TypeError)", [])
    leak = answered("search", _answer(200, {"hits": [{"id": "u001:0:1", "text": "x"}]}), "u000", {}, 2)
    assert leak == (None, ["u000 got hit u001:0:1"])


def test_only_good_answers_are_timed_and_goals_are_not_measured_without_them(tmp_path) -> None:
    from retrieval.memory.store import AMUStore

    log = LoadLog()
    log.requests, log.errors["search: 503"] = 3, 3
    figures = summary(log, 1.0, floor_ms=10.0, ceiling_rps=100.0)
    assert (figures["answered"], figures["per_s"], figures["errors"], figures["leaks"]) == (0, 0.0, 3, None)
    assert summary(LoadLog(), 1.0, floor_ms=10.0, ceiling_rps=100.0)["errors"] is None
    AMUStore(tmp_path).close()
    assert verify(tmp_path, log) == {"acknowledged_adds": 0, "lost": None, "duplicated": None}
    log.canaries["u000"].append(canary("u000", 0, 1))
    assert verify(tmp_path, log) == {"acknowledged_adds": 1, "lost": 1, "duplicated": 0}


def test_an_add_stored_twice_under_two_ids_is_a_duplicate(tmp_path) -> None:
    """A turn id is unique in the store: a duplicate shows as its text stored twice."""
    from retrieval.memory.records import Turn
    from retrieval.memory.store import AMUStore

    mark, other = canary("u000", 0, 1), canary("u000", 0, 12)  # one mark a prefix of the other
    with AMUStore(tmp_path) as store:
        store.append_turns("u000", [Turn("u000", "load-0", turn_id, "Load", load_note(mark, 1))
                                    for turn_id in ("load-0-1", "s:7")])
        store.append_turns("u000", [Turn("u000", "load-0", "load-0-12", "Load", load_note(other, 12))])
    log = LoadLog()
    log.canaries["u000"] += [mark, other, canary("u000", 0, 13)]
    assert verify(tmp_path, log) == {"acknowledged_adds": 3, "lost": 1, "duplicated": 1}


@pytest.mark.parametrize("argv", [["--users", "0"], ["--clients", "-1"], ["-k", "0"], ["-k", "101"],
                                  ["--search-share", "1.5"], ["--compare-queries", "0"], ["--seconds", "x"]])
def test_bad_arguments_are_one_error_line(argv, capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        _parser().parse_args(argv)
    assert stopped.value.code == 2 and "error: argument" in capsys.readouterr().err
