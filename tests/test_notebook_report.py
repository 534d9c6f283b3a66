"""The analysis notebook runs top to bottom, is committed clean, and `python -m isq.report` works."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest
import torch
from nbclient import NotebookClient

from isq.model import ISQModel
from isq.report import InputError, default_sample, main, read_metrics_log, read_texts
from isq.synthetic import synthetic_dialogues, write_synthetic_corpus
from tests.conftest import tiny_config

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "codebook_analysis.ipynb"
SAMPLE_FIGURES = ("usage", "norms", "distances", "pca", "lengths", "stability", "topology_degree")
TRAINING_FIGURES = ("training_losses", "training_codes", "training_perplexity")

# A CSVLogger file: each row fills only the columns of one logging call.
METRICS_CSV = """epoch,step,train/loss,train/ce_loss,train/commitment_loss,train/codebook_loss,\
train/entropy_loss,train/perplexity,train/codes_used,train/dead_codes,train/revived_codes,val/ce_loss,\
val/loss,val/codebook_perplexity,val/codes_used
0,9,12.0,10.0,1.5,1.5,-2.0,40.0,50,10,0,,,,
0,19,9.0,8.0,0.8,0.8,-1.0,60.0,70,12,12,,,,
0,19,,,,,,,,,,7.5,8.1,55.0,66
1,29,7.0,6.5,0.4,0.4,-0.5,80.0,90,4,0,,,,
1,39,6.0,5.8,0.2,0.2,-0.4,85.0,95,4,4,,,,
1,39,,,,,,,,,,5.9,6.2,70.0,80
"""


@pytest.fixture(scope="module")
def fingerprinter_dir(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    return ISQModel(tiny_config()).export_fingerprinter(tmp_path_factory.mktemp("fingerprinter"))


@pytest.fixture(scope="module")
def dialogue_file(tmp_path_factory) -> Path:
    """A DailyDialog-style file (utterances separated by __eou__) from the synthetic corpus."""
    path = tmp_path_factory.mktemp("texts") / "dialogues_validation.txt"
    path.write_text("".join(" __eou__ ".join(d) + " __eou__\n" for d in synthetic_dialogues(12, seed=5)))
    return path


# ---------------------------------------------------------------------------- notebook


def test_committed_notebook_has_no_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code, "the notebook has no code"
    assert all(cell.outputs == [] and cell.execution_count is None for cell in code)


def test_notebook_executes_top_to_bottom(fingerprinter_dir, monkeypatch, tmp_path):
    """Run by a kernel outside the repository, the fingerprinter given relative to the repository."""
    # the kernel inherits this process's environment
    monkeypatch.setenv("ISQ_FINGERPRINTER", os.path.relpath(fingerprinter_dir, REPO))
    monkeypatch.setenv("ISQ_SAMPLE_SIZE", "40")
    monkeypatch.setenv("ISQ_DAILYDIALOG", "synthetic")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    elsewhere = tmp_path / "kernel"
    elsewhere.mkdir()
    client = NotebookClient(notebook, kernel_name="python3", timeout=180,
                            resources={"metadata": {"path": str(elsewhere)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 7  # usage, norms, distances, PCA, lengths, stability, degree
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "40 texts from the project's synthetic corpus" in printed


def fake_release(root: Path) -> Path:
    """A DailyDialog-layout directory whose validation split is recognisably not the default corpus."""
    write_synthetic_corpus(root, sizes=(3, 2, 2), seed=11)
    return root


def test_default_sample_without_a_setting_is_the_synthetic_corpus(tmp_path, monkeypatch):
    monkeypatch.delenv("ISQ_DAILYDIALOG", raising=False)
    repo = tmp_path / "repo"
    repo.mkdir()
    fake_release(tmp_path / "shared" / "data" / "dailydialog")  # beside the repository: not looked at
    texts, source = default_sample(repo)
    assert source == "the project's synthetic corpus, validation split" and len(texts) > 100
    monkeypatch.setenv("ISQ_DAILYDIALOG", str(tmp_path / "shared" / "data" / "dailydialog"))
    texts, source = default_sample(repo)
    assert source.startswith("DailyDialog validation (") and str(tmp_path / "shared") in source
    assert len(texts) == sum(len(d) for d in synthetic_dialogues(2, seed=12))


def test_default_sample_leaves_out_the_validation_dialogues_train_holds(tmp_path, monkeypatch):
    """The codebook never trained on the validation split it is analysed on: a validation dialogue
    that is also a training dialogue is left out, and the source says how many were."""
    root = fake_release(tmp_path / "dd")
    train = (root / "train" / "dialogues_train.txt").read_text().splitlines()
    validation = root / "validation" / "dialogues_validation.txt"
    validation.write_text(validation.read_text() + train[0] + "\n")
    monkeypatch.setenv("ISQ_DAILYDIALOG", str(root))
    texts, source = default_sample(tmp_path)
    assert len(texts) == sum(len(d) for d in synthetic_dialogues(2, seed=12))
    assert source.endswith("; 1 dialogues also in train left out)")


def test_a_report_whose_validation_dialogues_are_all_in_train_is_one_clear_error(fingerprinter_dir, tmp_path,
                                                                                  capsys, monkeypatch):
    """Nothing is left to analyse: one line naming the setting and what was left out, exit 2."""
    root = fake_release(tmp_path / "dd")
    train = (root / "train" / "dialogues_train.txt").read_text().splitlines()
    (root / "validation" / "dialogues_validation.txt").write_text(train[0] + "\n")
    monkeypatch.setenv("ISQ_DAILYDIALOG", str(root))
    assert main([str(fingerprinter_dir), "--out", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err
    assert err == (f"isq.report: error: $ISQ_DAILYDIALOG={root}: no validation utterances to analyse "
                   "(1 dialogues also in train left out); give texts with --texts\n")


def test_default_sample_resolves_a_relative_setting_against_the_repository(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    fake_release(repo / "data" / "dd")
    monkeypatch.chdir(tmp_path)  # a notebook kernel runs in notebooks/, not at the root
    monkeypatch.setenv("ISQ_DAILYDIALOG", "data/dd")
    assert default_sample(repo)[1].startswith(f"DailyDialog validation ({repo / 'data' / 'dd'}")
    monkeypatch.setenv("ISQ_DAILYDIALOG", "data/absent")
    with pytest.raises(InputError, match="ISQ_DAILYDIALOG=data/absent: no DailyDialog release there"):
        default_sample(repo)
    monkeypatch.setenv("ISQ_DAILYDIALOG", "")  # ISQ_DAILYDIALOG=$UNSET: never the synthetic corpus unsaid
    with pytest.raises(InputError, match="ISQ_DAILYDIALOG is set but empty"):
        default_sample(repo)


def test_an_installed_package_resolves_a_relative_setting_against_the_working_directory(tmp_path,
                                                                                        monkeypatch):
    site = tmp_path / "site-packages"  # where an installed isq has its parents: no pyproject.toml
    site.mkdir()
    monkeypatch.setattr("isq.report.inputs.REPO", site)
    fake_release(tmp_path / "work" / "dd")
    monkeypatch.chdir(tmp_path / "work")
    monkeypatch.setenv("ISQ_DAILYDIALOG", "dd")
    assert default_sample()[1].startswith(f"DailyDialog validation ({tmp_path / 'work' / 'dd'}")


# ---------------------------------------------------------------------------- report inputs


def test_read_texts_splits_dailydialog_utterances(dialogue_file, tmp_path):
    texts = read_texts(dialogue_file)
    assert len(texts) == sum(len(d) for d in synthetic_dialogues(12, seed=5))
    assert all(text and "__eou__" not in text for text in texts)
    plain = tmp_path / "plain.txt"
    plain.write_text("first text\n\n  second text  \n")
    assert read_texts(plain) == ["first text", "second text"]


def test_read_texts_detokenises_dailydialog_as_training_does(tmp_path):
    path = tmp_path / "dialogues_test.txt"
    path.write_text("it ' s 7 pm . __eou__ ok , thanks ! __eou__\n"
                    "where ' s John ? __eou__ I don ' t know . __eou__\n")
    assert read_texts(path) == ["it's 7 pm.", "ok, thanks!", "where's John?", "I don't know."]


def test_read_texts_refuses_a_malformed_dialogue_file_naming_file_and_line(tmp_path):
    path = tmp_path / "dialogues_test.txt"
    path.write_text("hello . __eou__ hi . __eou__\na line without separators\n")
    with pytest.raises(InputError, match=f"{path}:2: no '__eou__'"):
        read_texts(path)


def test_read_metrics_log_keeps_each_column_sparse(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text(METRICS_CSV)
    log = read_metrics_log(path)
    steps, values = log["val/ce_loss"]
    np.testing.assert_array_equal(steps, [19, 39])
    np.testing.assert_array_equal(values, [7.5, 5.9])
    assert log["train/loss"][0].tolist() == [9, 19, 29, 39]
    assert "epoch" not in log and "step" not in log


@pytest.mark.parametrize(("content", "expected"), [
    (b"PK\x03\x04\x80\x81 a checkpoint's bytes", r"not UTF-8 text \(invalid start byte at byte 4\)"),
    (b"step,x\n1,2,3\n", r"metrics.csv:2: more cells than the header has columns"),
    (b"epoch,step,train/loss\n", r"metrics.csv: no values logged \(a run stopped before its first"),
], ids=["binary", "extra cells", "header only"])
def test_a_log_that_is_not_a_metrics_csv_is_one_input_error(tmp_path, content, expected):
    path = tmp_path / "metrics.csv"
    path.write_bytes(content)
    with pytest.raises(InputError, match=expected):
        read_metrics_log(path)


# ---------------------------------------------------------------------------- report command


def _report_files(out: Path) -> set[str]:
    return {path.stem for path in out.glob("*.png")}


def test_report_writes_figures_and_summary(fingerprinter_dir, dialogue_file, tmp_path, capsys):
    out = tmp_path / "report"
    assert (main([str(fingerprinter_dir), "--texts", str(dialogue_file), "--out", str(out), "--sample",
                  "30"]) == 0)
    assert _report_files(out) == set(SAMPLE_FIGURES)
    report = (out / "report.md").read_text()
    for figure in SAMPLE_FIGURES:
        assert f"]({figure}.png)" in report
    assert "| texts / tokens | 30 /" in report
    assert "perplexity" in report and "Gini" in report and "## Training" not in report
    assert str(out / "report.md") in capsys.readouterr().out


def test_report_without_texts_uses_and_names_the_default_sample(fingerprinter_dir, tmp_path, capsys,
                                                                monkeypatch):
    monkeypatch.setenv("ISQ_DAILYDIALOG", "synthetic")
    assert main([str(fingerprinter_dir), "--out", str(tmp_path / "report"), "--sample", "25"]) == 0
    assert "25 texts from the project's synthetic corpus" in capsys.readouterr().out
    assert "texts from `the project's synthetic corpus" in (tmp_path / "report" / "report.md").read_text()


def test_multi_hop_only_associations_are_walked_two_steps():
    """Codes 0 and 2 never share a text but each shares one with code 1: one step (the default
    H_r) cannot score 0 -> 2, which the multi-hop-only table is about; two steps do."""
    import numpy as np

    from isq.analysis import SampleCodes, top_associations
    from isq.report import multi_hop_scores, sample_topology

    codes = [np.array([0, 1]), np.array([1, 2]), np.array([0, 1]), np.array([1, 2])]
    sample = SampleCodes(["t"] * 4, [["a", "b"]] * 4, codes, [np.ones(2)] * 4, [np.ones(2)] * 4, 4)
    topology = sample_topology(sample)
    assert topology.params.max_hops == 1 and topology.code_scores()[0, 2] == 0
    found = top_associations(multi_hop_scores(topology), topology.cooccurrence, 5, indirect_only=True)
    assert {(link.source, link.target) for link in found} == {(0, 2), (2, 0)}


def test_report_with_training_log(fingerprinter_dir, dialogue_file, tmp_path):
    run = tmp_path / "runs" / "smoke" / "version_0"  # --log takes the run directory
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text(METRICS_CSV)
    out = tmp_path / "report"
    argv = [str(fingerprinter_dir), "--texts", str(dialogue_file), "--out", str(out), "--log", str(run),
            "--sample", "20", "--words", "dollars,Monday"]
    assert main(argv) == 0
    assert _report_files(out) == set(SAMPLE_FIGURES + TRAINING_FIGURES)
    report = (out / "report.md").read_text()
    assert "## Training" in report and all(f"]({name}.png)" in report for name in TRAINING_FIGURES)
    assert "| dollars |" in report and "| Monday |" in report
    assert main(argv[:argv.index("--log")] + ["--sample", "20"]) == 0  # again, without the log
    assert _report_files(out) == set(SAMPLE_FIGURES)  # the training figures went with the old report
    (out / "mine.png").write_bytes(b"not the report's")
    assert main(argv[:argv.index("--log")] + ["--sample", "20"]) == 0
    assert (out / "mine.png").read_bytes() == b"not the report's"


def test_an_out_that_is_a_file_is_refused_before_the_analysis(fingerprinter_dir, dialogue_file, tmp_path,
                                                               capsys, monkeypatch):
    import isq.report.cli as cli

    monkeypatch.setattr(cli, "analyse", lambda *args: pytest.fail("analysed before --out was checked"))
    (tmp_path / "out").write_text("a file")
    assert main([str(fingerprinter_dir), "--texts", str(dialogue_file), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err == f"isq.report: error: --out {tmp_path / 'out'} is a file, not a directory\n"


@pytest.mark.parametrize("broken", ["directory", "texts", "empty texts", "log"])
def test_bad_input_exits_2_with_one_line_naming_the_file(broken, fingerprinter_dir, dialogue_file, tmp_path,
                                                         capsys):
    paths = {"directory": fingerprinter_dir, "texts": dialogue_file, "log": None}
    if broken == "empty texts":
        paths["texts"] = tmp_path / "empty.txt"
        paths["texts"].write_text("\n  \n")
    else:
        paths[broken] = tmp_path / f"missing_{broken}"
    argv = [str(paths["directory"]), "--texts", str(paths["texts"]), "--out", str(tmp_path / "out")]
    if paths["log"] is not None:
        argv += ["--log", str(paths["log"])]
    assert main(argv) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and error.startswith("isq.report: error:")
    named = paths["texts"] if broken == "empty texts" else paths[broken]
    assert str(named) in error
    assert not (tmp_path / "out").exists()


def test_analysis_and_report_import_neither_training_nor_retrieval():
    code = ("import sys, isq.analysis, isq.report; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'training', 'retrieval', 'lightning'}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_bad_input_from_the_command_line_has_no_traceback(tmp_path):
    missing = tmp_path / "nothing_here.txt"
    result = subprocess.run(
        [sys.executable, "-m", "isq.report", str(tmp_path), "--texts", str(missing), "--out",
         str(tmp_path / "o")],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"isq.report: error: fingerprinter directory not found (no config.json): {tmp_path}"]
