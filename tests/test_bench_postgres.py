"""The benchmarks' ``--database URL`` parts on the test PostgreSQL: a search memory built there
beside the SQLite one with the ratio of their p50s, the database copy each load run starts from,
the nodes' figures and goals, and the flag refusing what is not a PostgreSQL URL. (The full runs
are benchmarks, not tests.)"""

from __future__ import annotations

import psycopg
import pytest
import torch

from benchmarks.bench_memory import bench_beside, bench_search, describe_beside
from benchmarks.bench_memory import main as bench_memory_main
from benchmarks.bench_service import _parser
from benchmarks.bench_service import main as bench_service_main
from benchmarks.postgres import ratio_goals, unreachable
from benchmarks.service_nodes import compare_nodes, database_copy, database_goals, describe_nodes
from benchmarks.timing import apply_goals
from isq.fingerprint import Fingerprinter
from isq.model import ISQModel
from retrieval.memory.backends import open_store
from tests.conftest import tiny_config
from tests.test_evaluate import HashEmbedder


@pytest.fixture(scope="module")
def fingerprinter(tmp_path_factory):
    torch.manual_seed(0)
    return Fingerprinter.from_pretrained(ISQModel(tiny_config()).export_fingerprinter(
        tmp_path_factory.mktemp("fingerprinter") / "tiny"))


class NamedHashEmbedder(HashEmbedder):
    identity = "hash-bow"  # what bench_memory records as the embedder's identity


def test_a_search_memory_in_postgres_beside_its_sqlite_one(tmp_path, postgres_url, fingerprinter):
    users = {"a": 30, "b": 12}
    queries = ["Who talked about the garden?", "What about item 5 on day 2?"]
    embedder = NamedHashEmbedder()
    sqlite = bench_search(tmp_path / "m", users, queries, embedder, fingerprinter, 6, 10.0)
    beside = bench_beside(tmp_path / "m", postgres_url, "2x", users, queries, embedder, fingerprinter, 6, 1.0)
    assert sqlite["amus_per_user"] == 30 and beside["p50_ms"] > 0 and beside["sqlite"]["p50_ms"] > 0
    assert beside["sqlite"]["n"] == beside["n"] == 6  # the same searches on both, interleaved
    with open_store(postgres_url, read_only=True) as store:
        assert (store.count("2x.a"), store.count("2x.b"), store.count("a")) == (30, 12, 0)
    assert beside["p50_ratio_to_sqlite"] == pytest.approx(beside["p50_ms"] / beside["sqlite"]["p50_ms"])
    assert beside["ratio_spread"]["min"] <= beside["ratio_spread"]["median"] <= beside["ratio_spread"]["max"]
    figures = {"postgres": {"2x": beside}}
    met = apply_goals(figures, ratio_goals("postgres", figures["postgres"]))
    assert met == {"postgres.2x.p50_ratio_to_sqlite <= 1.5": beside["p50_ratio_to_sqlite"] <= 1.5}
    assert figures["postgres"]["2x"]["p50_ratio_to_sqlite_goal"] == "<= 1.5"
    assert "interleaved" in describe_beside("2x", beside)


def test_each_load_run_gets_a_copy_of_the_prefilled_database(postgres_url):
    with psycopg.connect(postgres_url, autocommit=True) as connection:
        connection.execute("CREATE TABLE filled (word text)")
        connection.execute("INSERT INTO filled VALUES ('prefilled')")
    with database_copy(postgres_url) as copy:
        assert copy != postgres_url and copy.rpartition("/")[0] == postgres_url.rpartition("/")[0]
        with psycopg.connect(copy, autocommit=True) as connection:
            assert connection.execute("SELECT word FROM filled").fetchall() == [("prefilled",)]
            connection.execute("INSERT INTO filled VALUES ('load')")
    with psycopg.connect(postgres_url) as connection:  # the template is untouched, the copy gone
        assert connection.execute("SELECT count(*) FROM filled").fetchone() == (1,)
        name = copy.rpartition("/")[2]
        assert connection.execute("SELECT count(*) FROM pg_database WHERE datname = %s",
                                  (name,)).fetchone() == (0,)


def _run(per_s: float, p50_ms: float, errors: int = 0, lost: int = 0) -> dict:
    return {"load": {"per_s": per_s, "errors": errors, "leaks": 0, "routes": {"search": {"p50_ms": p50_ms}}},
            "verify": {"lost": lost, "duplicated": 0}}


def test_two_nodes_figures_and_goals():
    sqlite_load = {"routes": {"search": {"p50_ms": 100.0}}}
    figures = {"postgres": compare_nodes(_run(10.0, 120.0), _run(9.5, 130.0, lost=1), sqlite_load)}
    nodes = figures["postgres"]
    assert nodes["two_over_one_per_s"] == pytest.approx(0.95)
    assert nodes["one"]["search"]["p50_ratio_to_sqlite"] == pytest.approx(1.2)
    met = apply_goals(figures, database_goals())
    assert met["postgres.two_over_one_per_s >= 0.9"] is True
    assert met["postgres.one.search.p50_ratio_to_sqlite <= 1.5"] is True
    assert met["postgres.two.verify.lost == 0"] is False and met["postgres.one.verify.lost == 0"] is True
    assert len(met) == 10 and all(value is not None for value in met.values())
    lines = describe_nodes(nodes)
    assert "1.20x SQLite's" in lines[-1] and "0.95x" in lines[-1] and "lost 1" in lines[1]
    assert describe_nodes(None) == []


def test_a_run_that_answered_nothing_measures_no_ratio():
    """Every request failed (the load counts errors only): the ratios are not measured, not a crash."""
    silent = {"load": {"per_s": 0.0, "errors": 40, "leaks": None, "routes": {}},
              "verify": {"lost": None, "duplicated": None}}
    nodes = compare_nodes(silent, _run(9.5, 130.0), {"routes": {"search": {"p50_ms": 100.0}}})
    assert nodes["two_over_one_per_s"] is None and nodes["one"]["search"] is None
    met = apply_goals({"postgres": nodes}, database_goals())
    assert met["postgres.two_over_one_per_s >= 0.9"] is None
    assert met["postgres.one.search.p50_ratio_to_sqlite <= 1.5"] is None
    assert "not measured SQLite's" in describe_nodes(nodes)[-1]


def test_database_flag_takes_only_a_postgresql_url(capsys):
    url = "postgresql://postgres@127.0.0.1:5432/bench"
    assert _parser().parse_args(["--database", url]).database == url
    assert _parser().parse_args([]).database is None
    with pytest.raises(SystemExit):
        _parser().parse_args(["--database", "stores/bench"])
    assert "not a PostgreSQL URL" in capsys.readouterr().err


def test_a_database_that_cannot_be_used_is_refused_before_any_work(postgres_url, tmp_path, capsys):
    """Asked before the SQLite half of the run, not after minutes of it."""
    from tests.test_evaluate import write_locomo

    missing = postgres_url.rpartition("/")[0] + "/no_such_database"
    assert unreachable(postgres_url) is None and unreachable(None) is None
    assert unreachable(missing).startswith("--database: cannot connect (")
    with pytest.raises(SystemExit) as stopped:
        bench_service_main(["--database", missing, "--no-fingerprinter",
                            "--locomo", str(write_locomo(tmp_path / "locomo.json"))])
    assert stopped.value.code == 2 and "no_such_database" in capsys.readouterr().err


def test_bench_memory_refuses_a_database_that_holds_a_store_before_any_work(postgres_url, tmp_path, capsys):
    """Its memories are written under fixed names: an earlier run's would meet them (a traceback
    after the SQLite half of the run, minutes in)."""
    from tests.test_evaluate import write_locomo

    with psycopg.connect(postgres_url) as connection:
        connection.execute("CREATE TABLE turns (conversation_id text)")
    with pytest.raises(SystemExit) as stopped:
        bench_memory_main(["--database", postgres_url, "--locomo", str(write_locomo(tmp_path / "l.json"))])
    assert stopped.value.code == 2 and "holds a store already" in capsys.readouterr().err
