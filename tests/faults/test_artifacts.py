"""Fault classes 1, 2 and 7a: exports never replace anything by accident; a fingerprinter that
loads is the one that was exported (tokenizer, finite tensors, codebook checksum), and a broken
one is refused in one error that names the file and field; a missing hub encoder is one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file, save_file

from isq.encoder import EncoderUnavailable, load_tokenizer
from isq.export import ExportExistsError, FingerprinterLoadError, sha256_file
from isq.fingerprint import Fingerprinter
from isq.fingerprint import main as fingerprint_main
from isq.model import ISQModel
from tests.conftest import tiny_config, write_config
from training.fit import main as fit_main
from training.kmeans_control import main as kmeans_main

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "checkpoints" / "kmeans_minilm_dailydialog"
TEXT = "Caroline went to the LGBTQ support group on 7 May 2023."


def tree_bytes(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


@pytest.fixture
def export(tmp_path: Path) -> Path:
    return ISQModel(tiny_config()).export_fingerprinter(tmp_path / "fp", run_record={"steps": 1})


# ---------------------------------------------------------------------------- 1. data loss


def test_an_existing_export_is_never_replaced_silently(export: Path) -> None:
    before = tree_bytes(export)
    other = ISQModel(tiny_config())
    with pytest.raises(ExportExistsError, match="already exists"):
        other.export_fingerprinter(export)
    assert tree_bytes(export) == before
    other.export_fingerprinter(export, overwrite=True)  # asked for explicitly: replaced whole
    assert tree_bytes(export) != before and Fingerprinter.from_pretrained(export).identity == \
        other.fingerprinter().identity
    assert not [p for p in export.parent.iterdir() if p.name.startswith(".")]  # no staging left behind
    assert not [p for p in export.parent.iterdir() if p.name.startswith(".")]


def test_overwriting_replaces_an_earlier_export_only(tmp_path: Path) -> None:
    """A mistyped path given with overwrite (a notes file, a directory of other work) is refused
    and left as it was; an empty directory takes an export without being asked."""
    model = ISQModel(tiny_config())
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not an export")
    work = tmp_path / "work"
    work.mkdir()
    (work / "results.json").write_text("{}")
    encoder = tmp_path / "encoder"  # a Hugging Face model directory: a config.json of its own
    encoder.mkdir()
    (encoder / "config.json").write_text('{"model_type": "bert"}')
    (encoder / "NOTES.txt").write_text("mine")
    for target in (a_file, work, encoder):
        with pytest.raises(ExportExistsError, match="not a fingerprinter export"):
            model.export_fingerprinter(target, overwrite=True)
    assert a_file.read_text() == "not an export" and tree_bytes(work) == {"results.json": b"{}"}
    assert tree_bytes(encoder) == {"NOTES.txt": b"mine", "config.json": b'{"model_type": "bert"}'}
    empty = tmp_path / "empty"
    empty.mkdir()
    model.export_fingerprinter(empty)
    assert Fingerprinter.from_pretrained(empty).identity == model.fingerprinter().identity
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "encoder", "notes.txt", "work"]  # no .tmp


def test_an_export_written_while_this_one_was_staged_is_kept(tmp_path: Path) -> None:
    """The directory was free when the export looked and another export took it before this one
    moved its staging into place: this one is refused, the other is kept whole."""
    from isq import export as export_module

    target = tmp_path / "fp"
    model = ISQModel(tiny_config())

    def other_export_meanwhile(staging: Path) -> None:
        ISQModel(tiny_config()).export_fingerprinter(target)  # the other export finishes first
        model.tokenizer.save_pretrained(str(staging))

    with pytest.raises(ExportExistsError, match="written by another export meanwhile"):
        export_module.write_directory(target, model.fingerprinter().stored_tensors(False), {"x": 1},
                                      other_export_meanwhile, None)
    theirs = tree_bytes(target)
    assert theirs and "x" not in json.loads(theirs["config.json"])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left behind


def test_training_refuses_an_occupied_export_directory_before_it_trains(tmp_path: Path, capsys) -> None:
    occupied = tmp_path / "occupied"
    shutil.copytree(COMMITTED, occupied)
    before = tree_bytes(occupied)
    with pytest.raises(SystemExit) as exit_info:
        fit_main(["--config", str(REPO / "configs" / "smoke.yaml"), "--trainer.max_steps", "1",
                  "--trainer.enable_progress_bar", "false", "--trainer.logger.init_args.save_dir",
                  str(tmp_path),
                  "--trainer.callbacks.init_args.dirpath", str(occupied), "--data.cache_dir",
                  str(tmp_path / "c")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert str(occupied) in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert tree_bytes(occupied) == before
    assert not list(tmp_path.glob("**/*.ckpt"))  # refused before a single step


def test_no_config_exports_into_the_committed_checkpoints() -> None:
    # Every config exports into its run's own version directory unless it names a dirpath.
    for path in sorted((REPO / "configs").glob("*.yaml")):
        callbacks = (yaml.safe_load(path.read_text()).get("trainer") or {}).get("callbacks") or []
        for callback in callbacks:
            assert "dirpath" not in (callback.get("init_args") or {}) or "checkpoints" not in str(
                callback["init_args"]["dirpath"]), path


def test_kmeans_control_refuses_an_existing_out_before_any_work(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    shutil.copytree(COMMITTED, out)
    before = tree_bytes(out)
    assert kmeans_main(["--data-root", str(tmp_path / "absent"), "--out", str(out)]) == 2
    assert "--out" in capsys.readouterr().err and tree_bytes(out) == before


# ----------------------------------------------------------------------------
# 2. silently wrong fingerprinters


def as_format1(directory: Path) -> Path:
    """Rewrite an export in the first format: no file checksums, the codebook a bare tensor."""
    tensors = load_file(str(directory / "model.safetensors"))
    tensors["codebook"] = tensors.pop("codebook.vectors")
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    meta = json.loads((directory / "config.json").read_text())
    del meta["files"]
    meta["format_version"] = 1
    write_config(directory, {k: v for k, v in meta.items() if k != "config_sha256"})
    return directory


@pytest.fixture(params=["format2", "format1"])
def copy(request, export: Path) -> Path:
    """A fresh export, in the current format or the first one (which has no file checksums)."""
    if request.param == "format1":
        reference = Fingerprinter.from_pretrained(export).fingerprint([TEXT])
        assert Fingerprinter.from_pretrained(as_format1(export)).fingerprint([TEXT]) == reference
    return export


def test_a_missing_tokenizer_file_is_refused(copy: Path) -> None:
    (copy / "tokenizer.json").unlink()
    with pytest.raises(FingerprinterLoadError, match="tokenizer.json is missing"):
        Fingerprinter.from_pretrained(copy)


def test_nan_weights_are_refused(copy: Path) -> None:
    tensors = load_file(str(copy / "model.safetensors"))
    name = next(key for key in tensors if "projection.conv.weight" in key)
    tensors[name][0, 0, 0] = float("nan")
    save_file(tensors, str(copy / "model.safetensors"), metadata={"format": "pt"})
    meta = json.loads((copy / "config.json").read_text())
    if "files" in meta:  # record the new checksum: the NaN itself must be caught, not the edit
        meta["files"]["model.safetensors"] = sha256_file(copy / "model.safetensors")
        write_config(copy, meta)
    with pytest.raises(FingerprinterLoadError, match=f"{name} holds NaN"):
        Fingerprinter.from_pretrained(copy)


def test_garbage_bytes_in_the_weights_are_refused(copy: Path) -> None:
    data = bytearray((copy / "model.safetensors").read_bytes())
    data[-64:] = b"\xff" * 64  # inside the last tensor: a valid header with garbage values
    (copy / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(FingerprinterLoadError, match="model.safetensors"):
        Fingerprinter.from_pretrained(copy)


def test_truncated_weights_are_refused(copy: Path) -> None:
    data = (copy / "model.safetensors").read_bytes()
    (copy / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(FingerprinterLoadError, match="model.safetensors"):
        Fingerprinter.from_pretrained(copy)


def test_the_recorded_codebook_checksum_is_compared(copy: Path) -> None:
    meta = json.loads((copy / "config.json").read_text())
    meta["identity"]["codebook_sha256"] = "0" * 64
    write_config(copy, meta)
    with pytest.raises(FingerprinterLoadError, match="identity.codebook_sha256"):
        Fingerprinter.from_pretrained(copy)


@pytest.mark.parametrize("setting", [{"max_length": 8}, {"normalize_projection": "layer"}])
def test_an_edited_config_that_changes_the_codes_is_refused(copy: Path, setting: dict) -> None:
    """``config.json`` is the one file no recorded checksum covers; its encoder settings change
    every text's codes, which the recorded encoder identity catches."""
    meta = json.loads((copy / "config.json").read_text())
    meta["isq_config"].update(setting)
    write_config(copy, meta)
    with pytest.raises(FingerprinterLoadError, match="identity.encoder_sha256.*isq_config"):
        Fingerprinter.from_pretrained(copy)


def test_an_export_recorded_before_the_encoder_identity_loads(copy: Path) -> None:
    reference = Fingerprinter.from_pretrained(copy).fingerprint([TEXT])
    meta = json.loads((copy / "config.json").read_text())
    del meta["identity"]["encoder_sha256"]
    write_config(copy, meta)
    assert Fingerprinter.from_pretrained(copy).fingerprint([TEXT]) == reference


@pytest.mark.parametrize(("edit", "field"), [
    (lambda meta: meta["isq_config"].update(code_dim="sixteen"), "code_dim"),
    (lambda meta: meta.pop("isq_config"), "isq_config"),
    (lambda meta: meta.update(format_version=7), "format_version"),
    (lambda meta: meta.update(files=sorted(meta.get("files") or ["model.safetensors"])), "files"),
])
def test_missing_or_mistyped_config_fields_are_named(copy: Path, edit, field: str) -> None:
    meta = json.loads((copy / "config.json").read_text())
    edit(meta)
    write_config(copy, meta)
    with pytest.raises(FingerprinterLoadError, match=f"config.json.*{field}"):
        Fingerprinter.from_pretrained(copy)


def test_the_fingerprint_cli_names_the_broken_file_in_one_line(copy: Path, capsys) -> None:
    (copy / "config.json").write_text("{ not json")
    with pytest.raises(SystemExit) as exit_info:
        fingerprint_main([str(copy), TEXT])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "config.json" in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------------------- 7a. no hub


def test_a_hub_encoder_without_the_hub_is_one_line(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(EncoderUnavailable) as info:
        load_tokenizer(tiny_config(encoder="t5-base", tokenizer=None, encoder_config=None))
    message = str(info.value)
    assert "t5-base" in message and "local" in message and "GPU" in message and "\n" not in message
    assert "--" not in message  # shared by training.fit and training.kmeans_control: it names no flag


def test_the_paper_config_without_the_hub_exits_with_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SystemExit) as exit_info:
        fit_main(["--config", str(REPO / "configs" / "isq_t5base_dailydialog.yaml"), "--data.root",
                  "synthetic", "--trainer.logger.init_args.save_dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "t5-base" in err and "GPU" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_an_export_into_the_current_empty_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``.`` has no name to stage beside: the export is staged beside the directory it stands for
    (it was refused as "written by another export meanwhile")."""
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    model = ISQModel(tiny_config())
    assert model.export_fingerprinter(".") == Path(".")
    assert Fingerprinter.from_pretrained(empty).identity == model.fingerprinter().identity
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]  # no staging left beside it


def test_training_refuses_an_export_directory_it_cannot_write_before_it_trains(tmp_path: Path,
                                                                                capsys) -> None:
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(SystemExit) as exit_info:
        fit_main(["--config", str(REPO / "configs" / "smoke.yaml"), "--trainer.max_steps", "1",
                  "--trainer.enable_progress_bar", "false", "--trainer.logger.init_args.save_dir",
                  str(tmp_path / "runs"),
                  "--trainer.callbacks.init_args.dirpath", str(tmp_path / "a_file" / "fp"),
                  "--data.cache_dir", str(tmp_path / "c")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'a_file'} is not a directory this process may write in" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.glob("**/*.ckpt"))  # refused before a single step
