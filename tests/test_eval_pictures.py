"""The evaluation's pictures: recall@k curves (one retrieval at the largest k, cut) and the forest
plot of paired differences (the statistics of retrieval.paired), unit by unit and end to end."""

from __future__ import annotations

import colorsys
import json
import subprocess
import sys
from types import SimpleNamespace

import matplotlib.colors
import pytest

from retrieval.contract import Hit
from retrieval.eval.configs import parse_config
from retrieval.eval.curves import CURVES_FILE, curve, curve_styles, cut, path_runs, plot_curves, recall_curves
from retrieval.eval.dual_path import Channel
from retrieval.eval.forest import FOREST_FILE, comparisons, forest_table, plot_forest
from retrieval.eval.locomo import load_locomo
from retrieval.eval.paired_differences import compare
from retrieval.eval.questions import EvalQuestion
from retrieval.eval.results import RecallCurves
from retrieval.eval.run import EvalModels, EvaluationSettings, evaluate
from tests.test_evaluate import HashEmbedder, fingerprinter_dirs, fingerprinters, write_locomo  # noqa: F401
from tests.test_paired import REPO, question, write_questions_file

PNG = b"\x89PNG"


ITEMS: dict[str, int] = {}


def hit(path: str, rank: int, turn: str) -> Hit:
    """A hit of the bank item that covers ``turn`` (one item per turn, whatever path finds it)."""
    return Hit(id=turn, text="", score=1.0, kind="record", session_id="s", turns=(turn,),
               index=ITEMS.setdefault(turn, len(ITEMS)), channel=path, rank=rank)


@pytest.mark.parametrize(("name", "runs"), [
    ("dense20+code20", [(None, 0, "trained"), (Channel.CODE, 0, "trained")]),
    ("dense30+kmeans10", [(None, 0, "kmeans"), (Channel.CODE, 0, "kmeans")]),
    ("dense20+bm25_20", [(None, 0, None), (Channel.BM25, 0, None)]),
    ("code40", [(Channel.CODE, 0, "trained")]), ("dense40", [(None, 0, None)]),
])
def test_each_path_runs_once_at_the_largest_k(name, runs):
    found = path_runs(parse_config(name), 100)
    assert [(r.dual.complement, r.dual.k_dense, r.codebook) for r in found] == runs
    assert {r.k for r in found} == {100} and {r.name for r in found} == {name}


def test_multi_route_runs_once_at_the_largest_k():
    (run,) = path_runs(parse_config("multi+kmeans"), 100)
    assert (run.name, run.k, run.codebook, run.dual) == ("multi+kmeans", 100, "kmeans", None)


def test_a_two_path_cut_is_the_configuration_at_that_budget():
    dense = [hit("dense", r, f"d{r}") for r in range(1, 7)]
    code = [hit("dense", 2, "d2"), hit("code", 9, "c9"), hit("dense", 5, "d5"), hit("code", 8, "c8")]
    config = parse_config("dense1+code1")
    assert [h.turns[0] for h in cut(config, [dense, code], 4)] == ["d1", "d2", "c9", "d5"]
    # dense3+code1 in proportion: 3 dense hits, then the best complement hit not among them
    assert [h.turns[0] for h in cut(parse_config("dense3+code1"), [dense, code], 4)] == [
        "d1", "d2", "d3", "c9"]
    assert cut(parse_config("dense40"), [dense], 2) == dense[:2]


def test_curve_is_recall_of_each_cut_overall_and_per_category():
    questions = [EvalQuestion("c", 0, 1, "?", None, ("t1", "t3")),
                 EvalQuestion("c", 1, 4, "?", None, ("t2",))]
    lists = [[hit("dense", 1, "t1"), hit("dense", 2, "x"), hit("dense", 3, "t3")],
             [hit("dense", 1, "y"), hit("dense", 2, "t2")]]
    result = curve(questions, lambda i, k: lists[i][:k], [1, 2, 3])
    assert (result
            == {"overall": [0.25, 0.75, 1.0], "multi-hop": [0.5, 0.5, 1.0], "single-hop": [0.0, 1.0, 1.0]})


def test_recall_curves_retrieve_each_path_once_at_the_largest_k():
    questions = [EvalQuestion("c", 0, 2, "?", None, ("t2",))]
    asked = []

    def retrieve(config):
        asked.append((config.dual.complement, config.dual.k_dense, config.k))
        dense = config.dual.complement is None
        return SimpleNamespace(hits=[[hit("dense", 1, "t1"), hit("dense", 2, "t3")] if dense
                                     else [hit("code", 1, "t2")]])

    curves = recall_curves([parse_config("dense2+code2")], questions, retrieve, ks=(1, 2, 10))
    assert asked == [(None, 0, 10), (Channel.CODE, 0, 10)]
    assert curves.ks == [1, 2, 10] and curves.configs["dense2+code2"]["overall"] == [0.0, 1.0, 1.0]


TWELVE = ["dense20", "dense40", "dense20+code20", "dense20+kmeans20", "dense20+bm25_20",
          "dense20+codebm25_20", "code40", "kmeans40", "codebm25_40", "multi", "multi+code", "multi+kmeans"]


def hue_and_lightness(colour: str) -> tuple[float, float]:
    hue, lightness, _ = colorsys.rgb_to_hls(*matplotlib.colors.to_rgb(colour))
    return 360 * hue, lightness


def check_styles(styles: dict[str, tuple[str, str, str]]) -> None:
    """Every curve its own colour and its own marker; a k-means control in its configuration's hue,
    lighter and dashed, the configuration solid."""
    assert len(set(styles.values())) == len(styles)
    assert len({colour for colour, _, _ in styles.values()}) == len(styles)
    assert len({marker for _, marker, _ in styles.values()}) == len(styles)
    controls = [name for name in styles if "kmeans" in name]
    assert controls
    for control in controls:
        (colour, _, line), (twin, _, twin_line) = styles[control], styles[control.replace("kmeans", "code")]
        (hue, lightness), (twin_hue, twin_lightness) = hue_and_lightness(colour), hue_and_lightness(twin)
        assert min(abs(hue - twin_hue), 360 - abs(hue - twin_hue)) < 10 and lightness > twin_lightness
        assert (line, twin_line) == ("--", "-")


def test_every_configuration_s_curve_has_its_own_colour_and_marker_and_a_control_its_twin_s_hue():
    check_styles(curve_styles(TWELVE))
    # with matplotlib's default 10-colour cycle, the 11th and 12th curves repeated the 1st and 2nd colours
    styles = curve_styles(TWELVE)
    assert styles["dense20"][0] != styles["multi+code"][0]
    assert styles["dense40"][0] != styles["multi+kmeans"][0]


def test_the_drawn_curves_take_those_styles(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    drawn = []
    monkeypatch.setattr(plt, "close", drawn.append)
    curves = RecallCurves(ks=[5, 10], configs={name: {"overall": [0.1, 0.2], "temporal": [0.3, 0.4]}
                                               for name in TWELVE})
    plot_curves(curves, tmp_path / CURVES_FILE)
    assert (tmp_path / CURVES_FILE).read_bytes()[:4] == PNG
    for axis in drawn[0].axes:
        found = {line.get_label(): (matplotlib.colors.to_hex(line.get_color()), line.get_marker(),
                                    line.get_linestyle()) for line in axis.get_lines()}
        assert found == curve_styles(TWELVE)
    check_styles(found)
    plt.close(drawn[0])


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
    plot_forest(table, tmp_path / "forest", "title")  # the file named, not forest.png beside it
    assert (tmp_path / "forest").read_bytes()[:4] == PNG


def test_paired_cli_draws_the_forest_it_prints(tmp_path):
    path = write_questions_file(tmp_path / "q.jsonl", [
        question("temporal", ["D1:1"], dense40=["D1:1"], mix=[]),
        {**question("single-hop", ["D1:2"], dense40=[], mix=["D1:2"]), "qa_index": 1},
    ])
    run = [sys.executable, "-m", "retrieval.paired", str(path), "mix", "--baseline", "dense40", "--forest"]
    result = subprocess.run([*run, str(tmp_path / "f.png")], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0 and (tmp_path / "f.png").read_bytes()[:4] == PNG
    deeper = subprocess.run([*run, str(tmp_path / "new" / "f.png")], capture_output=True, text=True, cwd=REPO)
    assert deeper.returncode == 0 and (tmp_path / "new" / "f.png").read_bytes()[:4] == PNG  # folder made
    (tmp_path / "a_file").write_text("x")
    bad = subprocess.run([*run, str(tmp_path / "a_file" / "f.png")], capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2 and "error: argument --forest" in bad.stderr and "Traceback" not in bad.stderr


def test_the_evaluation_writes_both_pictures_and_links_them(tmp_path, fingerprinters):  # noqa: F811
    conversations = load_locomo(write_locomo(tmp_path / "locomo.json"))
    names = ["dense2", "dense4", "dense2+code2", "code4", "kmeans4", "multi", "multi+code", "multi+kmeans"]
    models = EvalModels(fingerprinters, HashEmbedder())
    results = evaluate(conversations, models, tmp_path, EvaluationSettings(names, 2, 2, progress=False))
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
    # a cut at k is the configuration at k: dense4's curve at 5 and 10, dense2+code2's at 10 (dense5+code5)
    again = evaluate(conversations, models, tmp_path,
                     EvaluationSettings(["dense5", "dense10", "dense5+code5"], 10, 10, progress=False))
    recall = {name: summary.overall.recall for name, summary in again.configs.items()}  # budget 20: no pair
    assert curves.configs["dense4"]["overall"][:2] == [recall["dense5"], recall["dense10"]]
    assert curves.configs["dense2+code2"]["overall"][1] == recall["dense5+code5"]
    markdown = (tmp_path / "results.md").read_text()
    assert f"]({FOREST_FILE})" not in markdown  # this rerun has no pair to draw ...
    assert not (tmp_path / FOREST_FILE).exists()  # ... and leaves no stale one beside results.md
    evaluate(conversations, models, tmp_path, EvaluationSettings(names, 2, 2, progress=False))
    markdown = (tmp_path / "results.md").read_text()
    assert f"]({CURVES_FILE})" in markdown and f"]({FOREST_FILE})" in markdown
