"""An exported fingerprinter loads only as written: every file by its checksum, the encoder by its
identity, finite weights; an overwrite replaces an earlier export only. Each test edits a copy of
a committed export."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from isq.export import FingerprinterLoadError, NonFiniteWeights, sha256_file
from isq.fingerprint import Fingerprinter
from isq.model import ISQModel
from tests.conftest import tiny_config, write_config


@pytest.fixture
def export(tmp_path):
    source = Path(__file__).resolve().parents[1] / "checkpoints" / "isq_minilm_dailydialog_cpu"
    target = tmp_path / "fp"
    shutil.copytree(source, target)
    return target


def test_an_edited_tokenizer_file_is_refused_by_its_checksum(export):
    """Format 2 records every file's SHA-256; a tokenizer file edited after export (here its
    truncation length) must be refused by name. Nothing else checks tokenizer_config.json."""
    path = export / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["model_max_length"] = 8
    path.write_text(json.dumps(config))
    with pytest.raises(FingerprinterLoadError, match="tokenizer_config.json: SHA-256 differs"):
        Fingerprinter.from_pretrained(export)


def test_a_tokenizer_file_the_export_does_not_list_is_not_read(export):
    """Only the listed (and checksummed) files make the tokenizer: an ``added_tokens.json`` dropped
    in beside them gave ids past the encoder's vocabulary, and fingerprinting a text with its word
    raised a bare IndexError."""
    text = "Caroline went to the LGBTQ support group yesterday."
    expected = Fingerprinter.from_pretrained(export).fingerprint([text])
    (export / "added_tokens.json").write_text(json.dumps({"caroline": 30522, "lgbtq": 30523}))
    assert Fingerprinter.from_pretrained(export).fingerprint([text]) == expected


@pytest.mark.parametrize("name", ["../../outside/evil.txt", "/tmp/evil.txt", "sub/evil.txt", ".."])
def test_a_listed_file_named_by_a_path_is_refused_before_anything_is_read_or_written(
        export, tmp_path, monkeypatch, name):
    """Loading copies each listed file by its name into a scratch directory: a name that is a path
    (its checksum recomputed with the config's) read a file outside the export and wrote over one
    outside the scratch directory (here ``victim``), then loaded as if nothing had happened."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "scratch"))
    (tmp_path / "scratch").mkdir()
    victim = tmp_path / "outside" / "evil.txt"  # scratch/isq-tokenizer-*/../../outside
    payload = tmp_path / "x" / "outside" / "evil.txt"  # x/y/fp/../../outside
    for path, text in ((victim, "the user's own file"), (payload, "written by an export")):
        path.parent.mkdir(parents=True)
        path.write_text(text)
    shutil.move(export, tmp_path / "x" / "y" / "fp")
    export = tmp_path / "x" / "y" / "fp"
    meta = json.loads((export / "config.json").read_text())
    meta["files"][name] = sha256_file(payload)
    write_config(export, meta)
    with pytest.raises(FingerprinterLoadError, match=f"field 'files' lists {re.escape(repr(name))}"):
        Fingerprinter.from_pretrained(export)
    assert victim.read_text() == "the user's own file"


def test_an_edited_max_length_in_config_is_refused_by_the_encoder_identity(export, tmp_path):
    """An export that records identity.encoder_sha256 is checked against it; config.json's own
    isq_config (max_length) is covered by no file checksum, only by that identity."""
    resaved = Fingerprinter.from_pretrained(export).save_pretrained(tmp_path / "resaved")
    meta = json.loads((resaved / "config.json").read_text())
    assert "encoder_sha256" in json.dumps(meta["identity"])
    meta["isq_config"]["max_length"] = 16
    meta.pop("config_sha256")  # as an export written before that field (format 2)
    meta["format_version"] = 2
    (resaved / "config.json").write_text(json.dumps(meta))
    with pytest.raises(FingerprinterLoadError, match="identity"):
        Fingerprinter.from_pretrained(resaved)


@pytest.mark.parametrize(("field", "value"), [("lora_alpha", 256), ("max_length", 16)])
def test_any_edited_field_of_a_new_exports_config_is_refused(export, tmp_path, field, value):
    """A new export records the checksum of config.json's own fields: settings no file checksum
    covers and the encoder identity does not hash (a LoRA adapter's lora_alpha scales its
    weights) change the codes, so an edit is refused, naming the file and the field."""
    resaved = Fingerprinter.from_pretrained(export).save_pretrained(tmp_path / "resaved")
    text = (resaved / "config.json").read_text()
    Fingerprinter.from_pretrained(resaved)  # as written: loads
    meta = json.loads(text)
    meta["isq_config"][field] = value
    (resaved / "config.json").write_text(json.dumps(meta, indent=4))
    with pytest.raises(FingerprinterLoadError, match=r"config.json: its fields differ .*'config_sha256'"):
        Fingerprinter.from_pretrained(resaved)
    (resaved / "config.json").write_text(json.dumps(json.loads(text), indent=4, sort_keys=True))
    Fingerprinter.from_pretrained(resaved)  # only the fields count, not their layout
    meta.pop("config_sha256")  # and the check is no line to delete
    (resaved / "config.json").write_text(json.dumps(meta))
    with pytest.raises(FingerprinterLoadError, match=r"'config_sha256' was computed from \(or it has none\)"):
        Fingerprinter.from_pretrained(resaved)


def test_a_max_length_past_the_encoders_positions_is_a_load_error_naming_the_file(export):
    meta = json.loads((export / "config.json").read_text())
    meta["isq_config"]["max_length"] = 1024
    write_config(export, meta)
    with pytest.raises(FingerprinterLoadError, match=r"config.json: cannot build the encoder .*512"):
        Fingerprinter.from_pretrained(export)


def test_a_referenced_encoder_whose_config_changed_is_refused_though_its_weights_match(export, tmp_path):
    """The same weights under another activation compute other vectors, so other codes: an export
    records the referenced encoder's config.json as well as its weights."""
    from transformers import AutoConfig

    from isq.encoder import resolve_encoder_path

    installed = tmp_path / "minilm"
    shutil.copytree(resolve_encoder_path("offline:all-MiniLM-L6-v2"), installed)
    model = Fingerprinter.from_pretrained(export)
    model.config.encoder = str(installed)
    saved = model.save_pretrained(tmp_path / "referencing")
    assert json.loads((saved / "config.json").read_text())["encoder_reference"]["encoder"] == str(installed)
    Fingerprinter.from_pretrained(saved)
    AutoConfig.from_pretrained(installed).save_pretrained(installed)  # written out again, defaults and all
    Fingerprinter.from_pretrained(saved)
    config = json.loads((installed / "config.json").read_text())
    config["hidden_act"] = "relu"
    (installed / "config.json").write_text(json.dumps(config))
    with pytest.raises(FingerprinterLoadError, match="has config.json SHA-256"):
        Fingerprinter.from_pretrained(saved)


def test_an_export_with_a_nan_weight_is_refused(export, tmp_path):
    """Every tensor must be finite; an export written from a run that diverged (NaN weights,
    checksums and codebook identity consistent) must not load and fingerprint garbage."""
    import torch

    model = Fingerprinter.from_pretrained(export)
    name, tensor = next(
        (n, t) for n, t in model.state_dict().items() if "projection" in n and t.is_floating_point()
    )
    with torch.no_grad():
        tensor.view(-1)[0] = float("nan")
    with pytest.raises(NonFiniteWeights, match=f"tensor .*{name.split('.')[-1]} holds NaN.*nothing exported"):
        model.save_pretrained(tmp_path / "nan")
    assert not (tmp_path / "nan").exists()
    # written all the same, with its checksum recorded: loading refuses it
    from safetensors.torch import load_file, save_file

    shutil.copytree(export, tmp_path / "nan")
    weights = tmp_path / "nan" / "model.safetensors"
    saved = load_file(str(weights))
    key = next(k for k in saved if "projection" in k and saved[k].is_floating_point())
    saved[key].view(-1)[0] = float("nan")
    save_file(saved, str(weights), metadata={"format": "pt"})
    config = json.loads((tmp_path / "nan" / "config.json").read_text())
    config["files"]["model.safetensors"] = sha256_file(weights)
    write_config(tmp_path / "nan", config)
    with pytest.raises(FingerprinterLoadError, match="NaN"):
        Fingerprinter.from_pretrained(tmp_path / "nan")


@pytest.mark.parametrize(("field", "value"), [("num_codes", 2048), ("code_dim", 4096)])
def test_a_config_claiming_another_codebook_than_the_file_holds_is_refused_before_building(
        export, tmp_path, monkeypatch, field, value):
    """config.json's numbers size what loading allocates: checked against the weights file's header
    first, so an edited config (its checksum recomputed, as anyone can) asking for millions of codes
    is one line naming both, not a model built to that size."""
    import isq.fingerprint

    config = json.loads((export / "config.json").read_text())
    config["isq_config"][field] = value
    write_config(export, config)

    def built(*args, **kwargs):
        raise AssertionError("the encoder was built before the codebook's shape was checked")

    monkeypatch.setattr(isq.fingerprint, "build_encoder", built)
    shape = (2048, 384) if field == "num_codes" else (1024, 4096)
    with pytest.raises(FingerprinterLoadError, match=re.escape(
            f"codebook.vectors has shape (1024, 384), but config.json gives num_codes and code_dim {shape}")):
        Fingerprinter.from_pretrained(export)


def test_overwrite_never_replaces_a_directory_that_is_not_an_export(export, tmp_path):
    """Overwrite=True replaces an earlier export only; a directory of other files (a mistyped
    path, a model directory) must be refused and left as it was, not deleted."""
    from isq.export import ExportExistsError

    model = Fingerprinter.from_pretrained(export)
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(ExportExistsError):
        model.save_pretrained(other, overwrite=True)
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]


def test_an_overwrite_through_a_symbolic_link_replaces_the_export_it_points_to(export, tmp_path):
    model = Fingerprinter.from_pretrained(export)
    model.save_pretrained(tmp_path / "real", run_record={"run": 1})
    (tmp_path / "link").symlink_to(tmp_path / "real")
    model.save_pretrained(tmp_path / "link", run_record={"run": 2}, overwrite=True)
    assert (tmp_path / "link").is_symlink()
    assert json.loads((tmp_path / "real" / "training_run.json").read_text()) == {"run": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fp", "link", "real"]


def test_a_new_export_records_the_checksum_of_its_tokenizer_files(export, tmp_path):
    """Write_directory records the SHA-256 of every file it writes but the run record; an
    export that recorded the weights alone would load an edited tokenizer file."""
    resaved = Fingerprinter.from_pretrained(export).save_pretrained(tmp_path / "resaved")
    files = json.loads((resaved / "config.json").read_text())["files"]
    assert {"model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(files)
    path = resaved / "tokenizer_config.json"
    path.write_text(path.read_text() + "\n")
    with pytest.raises(FingerprinterLoadError, match="SHA-256 differs"):
        Fingerprinter.from_pretrained(resaved)


def test_a_format_1_export_with_its_bare_codebook_tensor_loads_and_fingerprints_as_written(tmp_path):
    """The first exports (format 1: no file or config checksums) stored the codebook as a bare
    tensor ``codebook``, read as today's ``codebook.vectors``: its shape is checked from the file's
    header under that name too, and the export loads to the same fingerprints as the one it was
    made from."""
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    directory = ISQModel(tiny_config()).export_fingerprinter(tmp_path / "fp")
    texts = ["Ann adopted a puppy named Max.", "The budget spreadsheet is due on Friday."]
    written = Fingerprinter.from_pretrained(directory).fingerprint(texts)
    tensors = load_file(str(directory / "model.safetensors"))
    tensors["codebook"] = tensors.pop("codebook.vectors")
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    meta = json.loads((directory / "config.json").read_text())
    meta["format_version"] = 1
    del meta["files"], meta["config_sha256"]
    (directory / "config.json").write_text(json.dumps(meta))
    loaded = Fingerprinter.from_pretrained(directory)
    assert tuple(loaded.codebook.vectors.shape) == (64, 16)
    assert loaded.fingerprint(texts) == written


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_every_exported_file_is_as_readable_as_the_umask_lets_it_be(tmp_path, umask):
    """Another account serving the export (or a colleague) reads its weights as it reads its config:
    every file's mode is the one the process's umask gives a new file."""
    torch.manual_seed(0)
    previous = os.umask(umask)
    try:
        directory = ISQModel(tiny_config()).export_fingerprinter(tmp_path / "fp")
    finally:
        os.umask(previous)
    modes = {path.name: path.stat().st_mode & 0o777 for path in directory.iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o666 & ~umask}, modes
