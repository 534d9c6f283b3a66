"""Reading an evaluation's files back through their schema (an old results.json, questions.jsonl,
bad input), and the paired recall differences read from questions.jsonl: arithmetic, bootstrap
interval, errors, and a CLI that loads no torch. (The end-to-end run is in test_evaluate.py.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from retrieval.eval.paired_differences import compare, paired_difference
from retrieval.eval.render import render_markdown
from retrieval.eval.results import read_questions, read_results, write_questions
from retrieval.paired import main

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "faiss", "sentence_transformers")


def write_questions_file(path, rows):
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


@pytest.mark.parametrize(("baseline", "other", "expected"), [
    ([0.0, 0.5, 0.25, 0.5], [0.5, 1.0, 0.75, 1.0], (50.0, 50.0, 50.0, 4, 0)),  # every difference +50
    ([1.0, 1.0, 0.5], [0.75, 0.75, 0.25], (-25.0, -25.0, -25.0, 0, 3)),  # every difference -25
    ([0.5], [0.0], (-50.0, -50.0, -50.0, 0, 1)),  # one question: every resample is that question
])
def test_equal_differences_have_a_zero_width_interval_at_that_value(baseline, other, expected):
    result = paired_difference(baseline, other)
    assert (result.mean, result.low, result.high, result.better, result.worse) == expected
    assert result.n == len(baseline)


def test_a_mixed_difference_has_an_interval_around_its_mean():
    # +100 on one question of four, 0 on the others: a resample mean is 25 x (times that question is drawn
    # in 4 draws), which is 0 with probability (3/4)^4 = 32% (> 2.5%, so the low end is 0) and 3 or more with
    # probability 5.1% (> 2.5%, so the high end is 75).
    result = paired_difference([0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0], resamples=4000)
    assert (result.mean, result.low, result.high, result.better, result.worse) == (25.0, 0.0, 75.0, 1, 0)
    assert str(result) == "+25.0 [+0.0, +75.0], +1/-0"
    with pytest.raises(ValueError, match="differ in length"):
        paired_difference([0.0], [0.0, 1.0])
    with pytest.raises(ValueError, match="no questions"):
        paired_difference([], [])


def test_interval_matches_a_direct_bootstrap():
    rng = np.random.default_rng(5)
    base, other = rng.random(50), rng.random(50)
    result = paired_difference(base, other, resamples=300, seed=3)
    diff = 100 * (other - base)
    draws = np.random.default_rng(3).integers(0, 50, size=(300, 50))
    low, high = np.percentile(diff[draws].mean(axis=1), [2.5, 97.5])
    assert (result.low, result.high) == pytest.approx((low, high))


def test_compare_scores_recall_per_category_from_found_turns(tmp_path):
    path = write_questions_file(tmp_path / "q.jsonl", [
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
    write_questions_file(path, [good])
    assert main([str(path), "nope", "--baseline", "dense40"]) == 2
    err = capsys.readouterr().err
    assert "no configuration nope" in err and "dense40, mix" in err
    assert main([str(path), "mix", "--baseline", "dense40"]) == 0
    assert "| mix | -100.0 [-100.0, -100.0], +0/-1 |" in capsys.readouterr().out
    for read in (path, tmp_path / "other.jsonl"):  # the questions file, or a pooled one
        write_questions_file(read, [good])
        pooled = ["--pool", str(read)] if read != path else []
        assert main([str(path), "mix", "--baseline", "dense40", *pooled, "--forest", str(read)]) == 2
        assert "would be replaced" in capsys.readouterr().err
        assert json.loads(read.read_text().splitlines()[0])  # still the questions, not a picture


# -- questions.jsonl -----------------------------------------------------------------------------


def test_questions_jsonl_round_trips_through_the_schema(tmp_path):
    rows = [question("multi-hop", ["D1:1", "D1:2"], dense40=["D1:1"], mix=["D1:1", "D1:2"]),
            {**question("temporal", ["D2:1"], dense40=[], mix=["D2:1"]), "question": "Où est Zoë?"}]
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    read = read_questions(path)
    assert [row.model_dump() for row in read] == rows and read[1].found == {"dense40": [], "mix": ["D2:1"]}
    copy = tmp_path / "copy.jsonl"
    write_questions(copy, read)
    assert copy.read_bytes() == path.read_bytes()  # what evaluate() writes, byte for byte


@pytest.mark.parametrize(("second", "message"), [
    ({"conversation": "c", "qa_index": 1, "category": "temporal", "question": "?", "evidence": ["D1:1"]},
     "q.jsonl:2: not a questions.jsonl record: found: Field required"),
    (question("temporal", ["D1:1"], dense40=["D1:1"], mix="D1:1"),
     "q.jsonl:2: not a questions.jsonl record: found.mix"),
    (question("temporal", ["D1:1"], dense40=["D1:1"]), "q.jsonl:2: configurations ['dense40'] differ"),
    (question("temporal", [], dense40=[], mix=[]),
     "q.jsonl:2: not a questions.jsonl record: evidence: List should have at least 1 item"),
])
def test_a_bad_questions_line_is_named(tmp_path, second, message):
    first = question("temporal", ["D1:1"], dense40=[], mix=[])
    path = write_questions_file(tmp_path / "q.jsonl", [first, second])
    with pytest.raises(ValueError, match=re.escape(message)):
        read_questions(path)


def test_a_questions_file_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_bytes(b'{"question": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=re.escape(f"{path}: not UTF-8 text (byte 17)")):
        read_questions(path)


def test_the_paired_cli_loads_no_torch(tmp_path):
    check = f"import retrieval.paired, sys; print([m for m in {HEAVY!r} if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, cwd=REPO,
                            check=True)
    assert result.stdout.strip() == "[]"
    path = write_questions_file(tmp_path / "q.jsonl", [
        question("temporal", ["D1:1"], dense40=["D1:1"], mix=[]),
        question("single-hop", ["D1:2"], dense40=[], mix=["D1:2"]),
    ])
    # -X importtime lists every module the run imports, on stderr
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "retrieval.paired", str(path), "mix",
                             "--baseline", "dense40"], capture_output=True, text=True, cwd=REPO, check=True)
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in result.stderr.splitlines()
                if line.startswith("import time:")}
    assert "retrieval" in imported and not imported & set(HEAVY)
    assert "| mix | +0.0 [-100.0, +100.0], +1/-1 |" in result.stdout


# -- results.json ------------------------------------------------------------------------------


def old_results() -> dict:
    """A results.json as evaluate() wrote it before the schema existed (the dev run's keys and order)."""
    block = {"recall": 0.6844877344877344, "hit": 0.75, "complete": 0.5, "n": 4}
    ceiling = {"recall": 1.0, "n": 4}
    return {
        "configs": {
            "dense20": {"overall": {**block, "mean_retrieved": 20.0}, "by_category": {"temporal": block}},
            "dense20+code20": {"overall": {**block, "mean_retrieved": 40.0, "tied_at_cut": 0.05},
                               "by_category": {"temporal": block}},
        },
        "construction": {"seconds": 46.75392159399985, "amus": 760, "segments": 107, "llm_calls": 0,
                         "tokens": 0, "ingest_seconds": 19.2, "extractor": "rule",
                         "this_run": {"resumed_segments": 0, "ingest_seconds": 19.24}},
        "evidence": {"questions": 4, "skipped_categories": {"5": 1}, "questions_without_evidence": 0,
                     "evidence_ids": 5, "repaired_items": ["conv-26 qa 37: 'D8:6; D9:17'"],
                     "unparsed_items": [], "unknown_ids": [],
                     "recall_ceiling": {"overall": ceiling, "by_category": {"temporal": ceiling}}},
        "codebooks": {"trained": {"codebook_size": 1024, "codes_used": 751, "utilisation": 0.7333984375,
                                  "mean_codes_per_amu": 25.806578947368422, "mean_codes_per_query": 9.97,
                                  "mean_amu_share_per_code": 0.2134923067459572,
                                  "codes_in_half_the_amus": 4.5}},
        "settings": {"command": "python -m retrieval.evaluate", "configs": ["dense20", "dense20+code20"],
                     "k_dense": 20, "k_code": 20,
                     "topology": {"max_hops": 1, "alpha": 0.3, "self_term": True, "aggregate": "sum"},
                     "categories": {"2": "temporal"}, "conversations": ["conv-26"], "seed": 3},
        "answers": {"status": "skipped", "note": "no LLM endpoint configured"},
        "wall_seconds": 65.02847077199999,
    }


def test_an_old_results_file_reads_back_unchanged(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(old_results(), indent=2))
    results = read_results(path)
    assert results.configs["dense20"].overall.tied_at_cut is None and results.sweep is None
    assert results.configs["dense20+code20"].overall.tied_at_cut == 0.05
    assert results.settings.model_extra == {"seed": 3} and results.answers.status == "skipped"
    assert json.dumps(results.model_dump(), indent=2) == path.read_text()  # same keys, order and floats
    assert json.loads(results.model_dump_json()) == old_results()
    markdown = render_markdown(results, [])
    assert "| configuration | overall | temporal |\n|---|---:|---:|\n| dense20 | 68.4 | 68.4 |" in markdown
    assert "| trained | 1024 | 751 | 73.3% | 25.8 | 10.0 | 21.3% | 4.5 |" in markdown


def test_a_bad_results_file_names_the_file_and_the_field(tmp_path):
    path = tmp_path / "results.json"
    broken = old_results()
    del broken["configs"]["dense20"]["overall"]["recall"]
    path.write_text(json.dumps(broken, indent=2))
    field = "configs.dense20.overall.recall"
    with pytest.raises(ValueError, match=re.escape(f"{path}: not a results.json: {field}")):
        read_results(path)
    broken = {**old_results(), "answers": {"status": "done"}}
    path.write_text(json.dumps(broken, indent=2))
    with pytest.raises(ValueError, match=re.escape(f"{path}: not a results.json: answers.done.model")):
        read_results(path)
    path.write_text('{\n  "configs": {\n    "dense20": ,\n')
    with pytest.raises(ValueError, match=re.escape(f"{path}:3: invalid JSON")):
        read_results(path)
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match=re.escape(f"{path}: JSON nested too deep to read")):
        read_results(path)


@pytest.mark.parametrize(("option", "value"), [("--resamples", "0"), ("--resamples", "1"),
                                               ("--resamples", "999"), ("--resamples", "100000000000"),
                                               ("--resamples", "many"), ("--seed", "-1")])
def test_out_of_range_options_are_refused_naming_the_option(tmp_path, capsys, option, value):
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "questions.jsonl"), "dense20", "--baseline", "dense40", option, value])
    assert exit_info.value.code == 2
    assert f"argument {option}: expected a whole number from" in capsys.readouterr().err


def test_questions_linked_by_evidence_turns_are_one_unit_within_their_conversation():
    from retrieval.eval.paired_differences import evidence_units
    from retrieval.eval.results import QuestionRecord

    cited = [("a", ["D1:1"]), ("a", ["D1:1", "D1:2"]), ("a", ["D1:2"]), ("b", ["D1:1"]), ("a", ["D2:5"]),
             ("b", ["D3:1", "D1:1"])]
    rows = [QuestionRecord(conversation=c, qa_index=i, category="single-hop", question="?", evidence=e,
                           found={}) for i, (c, e) in enumerate(cited)]
    units = evidence_units(rows).tolist()
    assert units[0] == units[1] == units[2] and units[3] == units[5]
    assert len({units[0], units[3], units[4]}) == 3


def test_an_evidence_unit_is_one_draw_so_its_questions_move_together(tmp_path):
    """Two units of five questions, each citing one turn: the other configuration finds the first
    unit's evidence and misses the second's. Drawn as two units, a resample often holds one unit
    only, so the interval reaches both ends; drawn as ten questions it does not."""
    turns = [f"D{1 + i // 5}:1" for i in range(10)]
    rows = [dict(question("single-hop", [turn], base=[], other=[turn] if i < 5 else []), qa_index=i)
            for i, turn in enumerate(turns)]
    path = write_questions_file(tmp_path / "q.jsonl", rows)
    apart = compare(path, "base", ["other"])["other"]["overall"]
    by_unit = compare(path, "base", ["other"], by_evidence_unit=True)["other"]["overall"]
    assert apart.mean == by_unit.mean == 50.0
    assert (by_unit.low, by_unit.high) == (0.0, 100.0)
    assert 0.0 < apart.low and apart.high < 100.0
    assert main([str(path), "--evidence-units", "--baseline", "base", "other"]) == 0
