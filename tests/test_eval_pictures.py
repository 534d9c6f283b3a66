"""The evaluation's pictures: recall@k curves (one retrieval at the largest k, cut) and the forest
plot of paired differences (the statistics of retrieval.paired), unit by unit and end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from retrieval.eval.configs import RetrievalConfig, parse_config
from retrieval.eval.curves import CURVES_FILE, curve, cut_order, recall_curves, scaled
from retrieval.eval.evidence import EvalQuestion
from retrieval.eval.forest import FOREST_FILE, comparisons, forest_table, plot_forest
from retrieval.eval.locomo import load_locomo
from retrieval.eval.paired import compare
from retrieval.eval.run import evaluate
from retrieval.retriever import Hit
from tests.test_evaluate import HashEmbedder, fingerprinter_dirs, fingerprinters, write_locomo  # noqa: F401
from tests.test_paired import REPO, question, write_questions_file

PNG = b"\x89PNG"


def hit(path: str, rank: int, turn: str) -> Hit:
    return Hit(f"{path}{rank}", rank, path, 1.0, rank, {"session_id": "s", "turn_ids": [turn]})


@pytest.mark.parametrize(("name", "k", "budgets"), [
    ("dense20+code20", 100, (50, 50)), ("dense30+bm25_10", 100, (75, 25)), ("code40", 100, (0, 100)),
    ("dense40", 60, (60, 0)), ("multi+kmeans", 100, (100, 0)),
])
def test_scaling_keeps_the_name_and_the_split(name, k, budgets):
    big = scaled(parse_config(name), k)
    assert (big.name, (big.k_dense, big.k_code), big.budget) == (name, budgets, k)
    assert big.codebook == parse_config(name).codebook


def test_a_two_path_list_is_cut_in_the_proportion_of_its_budgets():
    hits = [hit("dense", r, f"d{r}") for r in range(1, 7)] + [hit("code", r, f"c{r}") for r in range(1, 3)]
    order = [h.amu_id for h in cut_order(hits, RetrievalConfig("x", "dense+code", 6, 2))]
    assert order == ["dense1", "dense2", "code1", "dense3", "dense4", "dense5", "code2", "dense6"]
    even = cut_order(hits[:2] + hits[6:], RetrievalConfig("x", "dense+code", 2, 2))
    assert [h.amu_id for h in even] == ["dense1", "code1", "dense2", "code2"]
    single = hits[:3][::-1]  # a single path's (or multi-route) list keeps its order
    assert cut_order(single, RetrievalConfig("x", "dense", 3, 0)) == single
    assert cut_order(single, RetrievalConfig("multi", "multi", 3, 0)) == single


def test_curve_is_recall_of_each_prefix_overall_and_per_category():
    questions = [EvalQuestion("c", 0, 1, "?", None, ("t1", "t3")), EvalQuestion("c", 1, 4, "?", None, ("t2",))]
    lists = [[hit("dense", 1, "t1"), hit("dense", 2, "x"), hit("dense", 3, "t3")],
             [hit("dense", 1, "y"), hit("dense", 2, "t2")]]
    result = curve(questions, lists, [1, 2, 3])
    assert result == {"overall": [0.25, 0.75, 1.0], "multi-hop": [0.5, 0.5, 1.0], "single-hop": [0.0, 1.0, 1.0]}


def test_recall_curves_retrieve_once_per_configuration_at_the_largest_k():
    questions = [EvalQuestion("c", 0, 2, "?", None, ("t2",))]
    asked = []

    def retrieve(config):
        asked.append((config.name, config.k_dense, config.k_code))
        return [[hit("dense", 1, "t1"), hit("code", 1, "t2"), hit("dense", 2, "t3")]]

    curves = recall_curves([parse_config("dense2+code2")], questions, retrieve, ks=(1, 2, 10))
    assert asked == [("dense2+code2", 5, 5)]
    assert curves.ks == [1, 2, 10] and curves.configs["dense2+code2"]["overall"] == [0.0, 1.0, 1.0]


def test_comparisons_pair_each_configuration_with_the_dense_baseline_multi_and_its_kmeans_twin():
    names = ["dense40", "dense20+code20", "dense20+kmeans20", "code40", "multi", "multi+code", "multi+kmeans"]
    pairs = comparisons(names, 40)
    assert pairs == [(name, "dense40") for name in names[1:]] + [
        ("multi+code", "multi"), ("multi+kmeans", "multi"),
        ("dense20+code20", "dense20+kmeans20"), ("multi+code", "multi+kmeans")]
    assert comparisons(["dense20+code20"], 40) == [] and comparisons(["multi", "multi+code"], 40) == [
        ("multi+code", "multi")]


def test_forest_rows_are_the_paired_statistics_and_draw(tmp_path):
    rows = [question("temporal", ["D1:1"], a=["D1:1"], b=[], c=["D1:1"]),
            question("single-hop", ["D1:2", "D1:3"], a=["D1:2"], b=["D1:2"], c=[]),
            question("single-hop", ["D1:4"], a=[], b=["D1:4"], c=["D1:4"])]
    path = write_questions_file(tmp_path / "q.jsonl", [{**row, "qa_index": i} for i, row in enumerate(rows)])
    table = forest_table(path, [("a", "b"), ("c", "b"), ("a", "c")], resamples=200)
    assert list(table) == ["a − b", "c − b", "a − c"]
    assert table["a − b"] == compare(path, "b", ["a"], resamples=200)["a"]
    assert table["a − c"]["overall"].mean == pytest.approx(100 * (0 + 0.5 - 1) / 3)
    assert table["c − b"]["temporal"].mean == 100.0 and table["c − b"]["overall"].n == 3
    plot_forest(table, tmp_path / "forest.png", "title")
    assert (tmp_path / "forest.png").read_bytes()[:4] == PNG


def test_paired_cli_draws_the_forest_it_prints(tmp_path):
    path = write_questions_file(tmp_path / "q.jsonl", [
        question("temporal", ["D1:1"], dense40=["D1:1"], mix=[]),
        {**question("single-hop", ["D1:2"], dense40=[], mix=["D1:2"]), "qa_index": 1},
    ])
    run = [sys.executable, "-m", "retrieval.paired", str(path), "mix", "--baseline", "dense40", "--forest"]
    result = subprocess.run([*run, str(tmp_path / "f.png")], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0 and (tmp_path / "f.png").read_bytes()[:4] == PNG
    bad = subprocess.run([*run, str(tmp_path / "no" / "f.png")], capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2 and bad.stderr.startswith("error:") and "Traceback" not in bad.stderr


def test_the_evaluation_writes_both_pictures_and_links_them(tmp_path, fingerprinters):  # noqa: F811
    conversations = load_locomo(write_locomo(tmp_path / "locomo.json"))
    names = ["dense2", "dense4", "dense2+code2", "code4", "kmeans4", "multi", "multi+code", "multi+kmeans"]
    results = evaluate(conversations, fingerprinters, HashEmbedder(), tmp_path, configs=names, k_dense=2,
                       k_code=2, progress=False)
    curves = results.recall_curves
    assert curves is not None and curves.ks == list(range(5, 101, 5)) and set(curves.configs) == set(names)
    for by_group in curves.configs.values():
        overall = by_group["overall"]
        assert all(a <= b for a, b in zip(overall, overall[1:], strict=False))  # cuts of one list only grow
        assert set(by_group) == {"overall", "multi-hop", "temporal", "open-domain", "single-hop"}
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["recall_curves"]["configs"]["multi"]["overall"] == curves.configs["multi"]["overall"]
    for picture in (CURVES_FILE, FOREST_FILE):
        assert (tmp_path / picture).read_bytes()[:4] == PNG
    # a single path cut at k is that path at k: dense4's curve at 5 and 10 against dense runs of 5 and 10
    again = evaluate(conversations, fingerprinters, HashEmbedder(), tmp_path, configs=["dense5", "dense10"],
                     k_dense=10, k_code=10, progress=False)  # budget 20: no dense20 to pair with
    assert curves.configs["dense4"]["overall"][:2] == [again.configs[n].overall.recall for n in ("dense5", "dense10")]
    markdown = (tmp_path / "results.md").read_text()
    assert f"]({FOREST_FILE})" not in markdown  # this rerun has no pair to draw ...
    assert not (tmp_path / FOREST_FILE).exists()  # ... and leaves no stale one beside results.md
    evaluate(conversations, fingerprinters, HashEmbedder(), tmp_path, configs=names, k_dense=2, k_code=2,
             progress=False)
    markdown = (tmp_path / "results.md").read_text()
    assert f"]({CURVES_FILE})" in markdown and f"]({FOREST_FILE})" in markdown
