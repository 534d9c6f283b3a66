"""Every command line that writes checks where before any work: a path it cannot write is one
argparse ``error:`` line (exit status 2), not a traceback at the end of the run."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks.locomo_standin import main as standin_main
from isq.outputs import export_directory, export_unwritable, unwritable
from isq.report.cli import main as report_main
from retrieval.evaluate import main as evaluate_main
from retrieval.paired import main as paired_main
from tests.test_evaluate import write_locomo
from training.kmeans_control import main as kmeans_main


def test_unwritable_names_the_obstacle(tmp_path: Path) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    assert unwritable(tmp_path / "new" / "deeper", directory=True) is None  # made on the way
    assert unwritable(tmp_path / "new.json", directory=False) is None
    assert unwritable(tmp_path, directory=True) is None
    assert unwritable(a_file, directory=True) == f"{a_file} is a file, not a directory"
    assert unwritable(tmp_path, directory=False) == f"{tmp_path} is a directory; give a file to write"
    assert unwritable(a_file / "x", directory=False) == (
        f"{a_file / 'x'} cannot be written: {a_file} is not a directory this process may write in")



def test_what_this_process_may_not_write_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Permissions as ``os.access`` reports them (root may write anywhere, so they are simulated): a
    locked directory, a read-only file in a writable one, and an export whose parent is locked
    (the export is staged beside its directory)."""
    import isq.outputs as outputs

    locked, kept = tmp_path / "locked", tmp_path / "locked" / "export"
    kept.mkdir(parents=True)
    (tmp_path / "ro.json").write_text("{}")
    read_only = {locked, tmp_path / "ro.json"}
    monkeypatch.setattr(outputs.os, "access", lambda path, mode: Path(path) not in read_only)
    assert unwritable(locked / "x", directory=True) == (
        f"{locked / 'x'} cannot be written: {locked} is not a directory this process may write in")
    read_only_file = tmp_path / "ro.json"
    assert unwritable(read_only_file, directory=False) == f"{read_only_file} is not writable by this process"
    assert unwritable(kept, directory=True) is None  # filling it would work
    assert export_unwritable(kept) == f"{locked} is not writable by this process"  # staging beside would not
    with pytest.raises(argparse.ArgumentTypeError, match="is not writable"):
        export_directory(str(kept))


@pytest.mark.parametrize(("main", "argv", "says"), [
    (report_main, ["checkpoints/isq_minilm_dailydialog_cpu", "--out", "{file}/report"],
     "isq.report: error: --out "),
    (evaluate_main, ["--locomo", "{locomo}", "--out", "{file}/dev"], "error: --out "),
    (kmeans_main, ["--out", "{file}/control"], "error: argument --out: "),
    (standin_main, ["--locomo", "absent.json", "--out", "{file}/standin.json"], "error: argument --out: "),
    (paired_main, ["absent.jsonl", "dense20", "--baseline", "dense40", "--forest", "{file}/f.png"],
     "error: argument --forest: "),
])
def test_an_output_under_a_file_is_refused_before_any_work(main, argv, says, tmp_path, capsys) -> None:
    """Refused in the command's own one-line form (the report, the evaluation) or argparse's."""
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    try:
        status = main([value.format(file=a_file, locomo=write_locomo(tmp_path / "locomo.json"))
                       for value in argv])
    except SystemExit as stopped:
        status = stopped.code
    err = capsys.readouterr().err
    assert status == 2 and says in err and "Traceback" not in err, err
    assert f"{a_file} is not a directory this process may write in" in err
    assert a_file.read_text() == "x"


def test_the_kmeans_control_overwrites_an_earlier_export_only(tmp_path, capsys) -> None:
    """``--overwrite`` given with a file's path or a directory of other work is refused before any
    clustering, and what was there is kept."""
    notes = tmp_path / "work" / "notes.txt"
    notes.parent.mkdir()
    notes.write_text("keep me")
    with pytest.raises(SystemExit) as stopped:
        kmeans_main(["--data-root", "unread", "--out", str(notes), "--overwrite"])
    assert stopped.value.code == 2 and f"{notes} is a file, not a directory" in capsys.readouterr().err
    assert kmeans_main(["--data-root", "unread", "--out", str(notes.parent), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert f"error: --out {notes.parent} is not a fingerprinter export (no config.json with" in err
    assert kmeans_main(["--data-root", "unread", "--out", str(notes.parent)]) == 2
    err = capsys.readouterr().err
    assert f"--out {notes.parent} already exists and is not empty; pass --overwrite" in err
    assert notes.read_text() == "keep me"
