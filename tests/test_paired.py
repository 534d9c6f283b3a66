"""Paired recall differences from a questions.jsonl: arithmetic, bootstrap interval, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from retrieval.eval.paired import compare, paired_difference
from retrieval.paired import main


def write_questions(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def question(category, evidence, **found):
    return {"conversation": "c", "qa_index": 0, "category": category, "question": "?", "evidence": evidence,
            "found": found}


def test_difference_is_the_mean_of_per_question_differences_in_points():
    result = paired_difference([0.0, 0.5, 1.0, 1.0], [1.0, 0.5, 0.5, 1.0], resamples=500)
    assert result.n == 4 and result.mean == pytest.approx(12.5)
    assert (result.better, result.worse) == (1, 1)
    assert result.low <= result.mean <= result.high
    # Every resample mean lies between the smallest and largest per-question difference.
    assert -50.0 <= result.low and result.high <= 100.0


def test_identical_configurations_have_a_zero_width_interval():
    result = paired_difference([0.2, 0.7, 1.0], [0.2, 0.7, 1.0])
    assert (result.mean, result.low, result.high, result.better, result.worse) == (0.0, 0.0, 0.0, 0, 0)


def test_interval_matches_a_direct_bootstrap():
    rng = np.random.default_rng(5)
    base, other = rng.random(50), rng.random(50)
    result = paired_difference(base, other, resamples=300, seed=3)
    diff = 100 * (other - base)
    draws = np.random.default_rng(3).integers(0, 50, size=(300, 50))
    low, high = np.percentile(diff[draws].mean(axis=1), [2.5, 97.5])
    assert (result.low, result.high) == pytest.approx((low, high))


def test_compare_scores_recall_per_category_from_found_turns(tmp_path):
    path = write_questions(tmp_path / "q.jsonl", [
        question("multi-hop", ["D1:1", "D1:2"], dense40=["D1:1"], mix=["D1:1", "D1:2"]),
        question("temporal", ["D2:1"], dense40=["D2:1"], mix=[]),
        question("multi-hop", ["D3:1"], dense40=[], mix=["D3:1"]),
    ])
    table = compare(path, "dense40", ["mix"], resamples=200)
    assert list(table["mix"]) == ["overall", "multi-hop", "temporal"]  # LoCoMo's category order
    assert table["mix"]["overall"].mean == pytest.approx((50 - 100 + 100) / 3)
    assert table["mix"]["multi-hop"].mean == pytest.approx(75.0) and table["mix"]["multi-hop"].n == 2
    assert table["mix"]["temporal"].mean == pytest.approx(-100.0)


def test_cli_names_a_bad_line_and_an_unknown_configuration(tmp_path, capsys):
    good = question("temporal", ["D1:1"], dense40=["D1:1"], mix=[])
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps(good) + "\n{not json\n")
    assert main([str(path), "mix", "--baseline", "dense40"]) == 2
    assert "q.jsonl:2" in capsys.readouterr().err
    write_questions(path, [good])
    assert main([str(path), "nope", "--baseline", "dense40"]) == 2
    err = capsys.readouterr().err
    assert "no configuration nope" in err and "dense40, mix" in err
    assert main([str(path), "mix", "--baseline", "dense40"]) == 0
    assert "| mix | -100.0 [-100.0, -100.0], +0/-1 |" in capsys.readouterr().out
