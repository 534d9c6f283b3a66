"""``retrieval.evaluate`` refuses what it cannot evaluate with one ``error:`` line and exit status
2, before any model loads (so a mistake costs seconds, not a model load): an empty conversation
list, no scorable question, an empty question, a turn the memory would refuse (named by conversation,
session and turn, not by its place in an add), ``--out`` naming a file, a zero budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import retrieval.evaluate as evaluate_module
from retrieval.eval.locomo import load_locomo
from retrieval.memory.records import InputFormatError
from tests.test_evaluate import QA, write_locomo
from tests.test_ingest import HashEmbedder


@pytest.fixture
def locomo(tmp_path: Path) -> list[dict]:
    return json.loads(Path(write_locomo(tmp_path / "base.json")).read_text())


def never_loaded(directory):
    raise AssertionError("a model loaded before the input was checked")


@pytest.mark.parametrize(("case", "extra", "message"), [
    ("empty list", [], "the list of conversations is empty"),
    ("no questions", [], "no question of categories 1-4"),
    ("only adversarial questions", [], "no question of categories 1-4"),
    ("empty question", [], "conversation 0 (conv-t): qa 0: field 'question' has no letter or digit"),
    ("out is a file", ["--out", "{file}"], "is a file, not a directory"),
    ("zero budgets", ["--k-dense", "0", "--k-code", "0"], "--k-dense must be at least 1, got 0"),
    ("zero code budget", ["--k-code", "0"], "--k-code must be at least 1, got 0"),
    ("no configuration", ["--configs", " , "], "--configs ' , ' names no configuration"),
    ("image-only turn", [], "conversation 'conv-t', session 'session_2', turn 'D2:8': field 'text' must be"),
])
def test_unusable_input_is_one_line_and_exit_2(case, extra, message, locomo, tmp_path, capsys, monkeypatch):
    data = {"empty list": [], "no questions": [dict(locomo[0], qa=[])],
            "only adversarial questions": [dict(locomo[0], qa=[dict(QA[0], category=5)])],
            "empty question": [dict(locomo[0], qa=[dict(QA[0], question="")] + QA[1:])]}.get(case, locomo)
    if case == "image-only turn":  # the memory would refuse it after the conversations before it were built
        locomo[0]["conversation"]["session_2"][-1].update(text="", blip_caption="a photo of a recipe card")
    path = tmp_path / "locomo.json"
    path.write_text(json.dumps(data))
    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setattr(evaluate_module.Fingerprinter, "from_pretrained", never_loaded)
    argv = ["--locomo", str(path), "--out", str(tmp_path / "out"), "--no-progress"]
    assert evaluate_module.main(argv + [a.format(file=tmp_path / "file") for a in extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert (tmp_path / "file").read_text() == "not a directory" and not (tmp_path / "out").exists()


def test_a_missing_store_or_embedder_is_one_line_and_leaves_no_out(locomo, tmp_path, capsys,
                                                                     monkeypatch) -> None:
    path = tmp_path / "locomo.json"
    path.write_text(json.dumps(locomo))
    monkeypatch.setattr(evaluate_module.Fingerprinter, "from_pretrained", lambda directory: object())
    monkeypatch.setattr(evaluate_module, "resolve_configs", lambda *args, **kwargs: None)
    argv = ["--locomo", str(path), "--out", str(tmp_path / "out"), "--no-progress"]
    monkeypatch.setattr(evaluate_module, "SentenceEmbedder", lambda name: (_ for _ in ()).throw(OSError(
        f"{name}: no such model")))
    assert evaluate_module.main([*argv, "--embedder", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'nope'}: no such model\n"
    monkeypatch.setattr(evaluate_module, "SentenceEmbedder", lambda name: HashEmbedder())
    assert evaluate_module.main([*argv, "--store", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.startswith(f"error: no store at {tmp_path / 'nope'}")
    assert not (tmp_path / "out").exists() and not (tmp_path / "nope").exists()


def test_a_question_of_punctuation_is_named_by_the_loader(locomo, tmp_path):
    path = tmp_path / "locomo.json"
    path.write_text(json.dumps([dict(locomo[0], qa=QA[:2] + [dict(QA[2], question=" ?! ")])]))
    with pytest.raises(InputFormatError,
                       match=r"locomo\.json: conversation 0 \(conv-t\): qa 2: field 'question'"):
        load_locomo(path)
