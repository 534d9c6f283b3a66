"""Training and fingerprinter values are range-checked, so a bad value fails at once, by name.

Every numeric field of ``ISQConfig``, the LightningModule and the DataModule is refused outside
its range with one line naming the field and the range (``training.fit``: ``error:`` + exit 2;
an export's ``config.json``: one load error naming the file); ``max_steps`` below the validation
interval still validates, so the export records the checkpoint it came from.
"""

from __future__ import annotations

import json
import math
import typing
from dataclasses import fields
from pathlib import Path

import pytest
import torch

from isq.config import RANGES, ISQConfig
from isq.encoder import load_tokenizer
from isq.export import FingerprinterLoadError
from isq.fingerprint import Fingerprinter
from isq.fingerprint import main as fingerprint_main
from isq.model import ISQModel
from isq.ranges import TOKEN_LENGTH, OutOfRange, Range
from tests.conftest import tiny_config, write_config
from tests.test_fit import smoke_args
from training.callbacks import ExportFingerprinter
from training.data import RANGES as DATA_RANGES
from training.data import DialogueDataModule
from training.fit import main as fit_main
from training.module import RANGES as MODULE_RANGES
from training.module import ISQLightningModule


def numeric_fields(hints: dict[str, typing.Any]) -> set[str]:
    def numeric(hint: typing.Any) -> bool:
        return hint in (int, float) or any(arm in (int, float) for arm in typing.get_args(hint))
    return {name for name, hint in hints.items() if numeric(hint)}


def test_every_numeric_isq_config_field_has_a_range():
    assert numeric_fields(typing.get_type_hints(ISQConfig)) == set(RANGES)
    assert set(RANGES) <= {f.name for f in fields(ISQConfig)}


def test_every_numeric_module_and_data_argument_has_a_range():
    module_hints = typing.get_type_hints(ISQLightningModule.__init__)
    assert numeric_fields(module_hints) == set(MODULE_RANGES)
    data_hints = typing.get_type_hints(DialogueDataModule.__init__)
    assert numeric_fields(data_hints) - {"seed"} == set(DATA_RANGES)


@pytest.mark.parametrize(("field", "value", "allowed"), [
    ("max_length", 0, ">= 3"), ("max_length", 2, ">= 3"), ("num_codes", 0, ">= 1"), ("code_dim", 0, ">= 1"),
    ("ema_decay", 1.0, "in (0, 1)"), ("ema_decay", 0.0, "in (0, 1)"), ("ema_eps", 0.0, "> 0"),
    ("beta", -0.1, ">= 0"),
    ("lambda_ent", math.nan, ">= 0"), ("nce_temperature", 0.0, "> 0"), ("revive_every", 0, ">= 1"),
    ("lora_rank", -1, ">= 0"), ("entropy_temperature", math.inf, "> 0"),
])
def test_isq_config_refuses_a_value_out_of_range_naming_field_and_range(field, value, allowed):
    with pytest.raises(OutOfRange) as refused:
        ISQConfig(**{field: value})
    assert f"'{field}'" in str(refused.value) and allowed in str(refused.value)


def test_isq_config_refuses_even_kernels_unknown_norms_and_zero_decoder_sizes():
    with pytest.raises(OutOfRange, match="'kernel_size' is 2"):
        ISQConfig(kernel_size=2)
    with pytest.raises(OutOfRange, match="'normalize_projection'"):
        ISQConfig(normalize_projection="batch")
    with pytest.raises(OutOfRange, match="ISQConfig.decoder field 'd_model' is 0"):
        ISQConfig(decoder={"d_model": 0})
    assert ISQConfig(decoder={"dropout_rate": 0.0}).decoder == {"dropout_rate": 0.0}


def test_the_shortest_token_length_still_cuts_a_text():
    """MiniLM's tokenizer adds [CLS] and [SEP]: cut to TOKEN_LENGTH it keeps one token of the text;
    cut to 2 it keeps none, and asked for 1 it does not cut at all (a long text then overruns the
    encoder's positions), which is why no length below TOKEN_LENGTH is allowed."""
    tokenizer = load_tokenizer(tiny_config())
    long_text = "word " * 600
    cut = [len(tokenizer(long_text, truncation=True, max_length=length)["input_ids"])
           for length in (int(TOKEN_LENGTH.low), 2, 1)]
    assert cut == [3, 2, 602]


def test_range_text_and_bounds():
    assert [str(Range(0, low_open=True)), str(Range(0, 1, high_open=True)), str(Range(high=2))] == [
        "> 0", "in [0, 1)", "<= 2"]
    assert Range(0, 1, high_open=True).contains(0.0) and not Range(0, 1, high_open=True).contains(1.0)


def edited_export(tmp_path: Path, **isq_config: typing.Any) -> Path:
    directory = ISQModel(tiny_config()).export_fingerprinter(tmp_path / "fp")
    path = directory / "config.json"
    meta = json.loads(path.read_text())
    meta["isq_config"].update(isq_config)
    write_config(directory, meta)
    return directory


def test_an_exports_out_of_range_max_length_is_one_load_error_naming_file_and_field(tmp_path, capsys):
    directory = edited_export(tmp_path, max_length=-5)
    with pytest.raises(FingerprinterLoadError) as refused:
        Fingerprinter.from_pretrained(directory)
    message = str(refused.value)
    assert str(directory / "config.json") in message and "'max_length' is -5" in message and ">= 3" in message
    with pytest.raises(SystemExit) as exit_info:
        fingerprint_main([str(directory), "a text"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "max_length" in err


@pytest.mark.parametrize(("flag", "value", "expected"), [
    ("--model.encoder_lr", "-1.0", "'encoder_lr' is -1.0: allowed range is > 0"),
    ("--model.min_lr_ratio", "2", "'min_lr_ratio' is 2.0: allowed range is in [0, 1]"),
    ("--model.isq.max_length", "2", "'max_length' is 2: allowed range is >= 3"),
    ("--model.isq.num_codes", "0", "'num_codes' is 0: allowed range is >= 1"),
    ("--data.batch_size", "0", "'batch_size' is 0: allowed range is >= 1"),
    ("--data.max_context_tokens", "1", "'max_context_tokens' is 1: allowed range is >= 3"),
    ("--data.max_target_tokens", "2", "'max_target_tokens' is 2: allowed range is >= 3"),
    ("--trainer.val_check_interval", "0", "'val_check_interval' is 0: allowed is a number of batches >= 1"),
    ("--trainer.val_check_interval", "1.5", "'val_check_interval' is 1.5: allowed is a number of batches"),
    ("--trainer.accumulate_grad_batches", "0", "'accumulate_grad_batches' is 0: allowed range is >= 1"),
    ("--trainer.max_steps", "0", "'max_steps' is 0: allowed is -1 (no limit) or >= 1"),
    ("--trainer.max_epochs", "0", "'max_epochs' is 0: allowed is -1 (no limit) or >= 1"),
    ("--trainer.limit_train_batches", "0", "'limit_train_batches' is 0"),
    ("--trainer.limit_val_batches", "0", "'limit_val_batches' is 0"),
    ("--trainer.limit_val_batches", "-1", "'limit_val_batches' is -1"),
    ("--trainer.gradient_clip_val", "-1", "'gradient_clip_val' is -1"),  # -1 or -1.0, as parsed
    ("--trainer.log_every_n_steps", "-1", "'log_every_n_steps' is -1: allowed range is >= 0"),
    ("--trainer.devices", "0", "devices"),
    ("--model.isq.encoder_config", "{model_type: t5, vocab_size: 128, d_model: -4}",
     "'encoder_config' builds no encoder"),
])
def test_fit_refuses_out_of_range_values_in_one_line(tmp_path, capsys, flag, value, expected):
    with pytest.raises(SystemExit) as exit_info:
        fit_main(smoke_args(tmp_path, 1, flag, value))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error: " in err and expected in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists(), "a refused run must not leave a run directory"


@pytest.mark.parametrize("config", ["model:\n  bogus_key: 1\n", "model: [unclosed\n"])
def test_an_unknown_key_or_malformed_config_is_its_error_line_alone(tmp_path, capsys, config):
    (tmp_path / "bad.yaml").write_text(config)
    with pytest.raises(SystemExit) as exit_info:
        fit_main(smoke_args(tmp_path, 1, "--config", str(tmp_path / "bad.yaml")))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1, err


def test_max_steps_below_the_validation_interval_still_validates_and_records_the_checkpoint(tmp_path, capsys):
    cli = fit_main(smoke_args(tmp_path, 2, "--trainer.val_check_interval", "50"))
    assert "validating after batch 2 instead" in capsys.readouterr().err
    (callback,) = [c for c in cli.trainer.callbacks if isinstance(c, ExportFingerprinter)]
    record = json.loads((callback.exported_to / "training_run.json").read_text())
    assert record["checkpoint"] is not None and Path(record["checkpoint"]).name == "step2.ckpt"
    assert "val/ce_loss" in record["last_metrics"]


def test_the_run_record_describes_the_exported_checkpoint_not_the_last_step(tmp_path, capsys):
    """Five steps validated every two: the fifth is trained after the last validation (the run
    says so when it starts), so the export holds an earlier checkpoint's weights, and its record
    gives that checkpoint's step and score beside the steps the run trained."""
    cli = fit_main(smoke_args(tmp_path, 5))
    note = "the last 1 of 5 training batches come after the last validation (batch 4"
    assert note in capsys.readouterr().err
    (callback,) = [c for c in cli.trainer.callbacks if isinstance(c, ExportFingerprinter)]
    record = json.loads((callback.exported_to / "training_run.json").read_text())
    saved = torch.load(record["checkpoint"], weights_only=False)
    assert record["global_step"] == saved["global_step"] < record["trained_steps"] == 5
    (checkpoints,) = [c for c in saved["callbacks"].values() if "best_model_score" in c]
    assert record["checkpoint_score"] == {"val/ce_loss": float(checkpoints["best_model_score"])}


def test_a_whole_float_is_a_count_of_batches_as_lightning_reads_it():
    """The parser may give ``--trainer.limit_val_batches 2`` as 2.0, which Lightning takes as 2
    batches; a fraction above 1 is neither a count nor a share of the epoch."""
    from training.fit import check_trainer

    check_trainer({"limit_val_batches": 2.0, "limit_train_batches": 0.5, "val_check_interval": 2})
    with pytest.raises(OutOfRange, match="'limit_val_batches' is 2.5"):
        check_trainer({"limit_val_batches": 2.5})
