"""``python -m training.fit`` end to end on the tiny config (CPU, no network)."""

from __future__ import annotations

import csv
import errno
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from isq.config import ISQConfig
from isq.fingerprint import Fingerprinter
from isq.synthetic import write_synthetic_corpus
from training.callbacks import BEST_KEY, ExportFingerprinter
from training.data import DialogueDataModule
from training.fit import changed_settings, main, out_of_space
from training.module import ISQLightningModule

REPO = Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "configs" / "smoke.yaml")


def smoke_args(tmp: Path, steps: int, *extra: str) -> list[str]:
    return [
        "--config", SMOKE,
        "--trainer.max_steps", str(steps),
        "--trainer.val_check_interval", "2",
        "--trainer.limit_val_batches", "2",
        "--trainer.log_every_n_steps", "1",
        "--trainer.enable_progress_bar", "false",
        "--trainer.logger.init_args.save_dir", str(tmp / "runs"),
        "--data.cache_dir", str(tmp / "cache"),
        "--data.batch_size", "8",
        *extra,
    ]


def exported(cli) -> Path:
    """Where the run's ExportFingerprinter wrote the fingerprinter."""
    (callback,) = [c for c in cli.trainer.callbacks if isinstance(c, ExportFingerprinter)]
    return callback.exported_to


def read_metrics(run_dir: Path) -> list[dict[str, str]]:
    (path,) = run_dir.glob("**/metrics.csv")
    with open(path) as handle:
        return list(csv.DictReader(handle))


def test_fit_logs_every_metric_checkpoints_and_exports(tmp_path):
    cli = main(smoke_args(tmp_path, 4))
    assert cli.trainer.global_step == 4
    rows = read_metrics(tmp_path / "runs")
    columns = set(rows[0])
    for name in ["train/loss", "train/ce_loss", "train/codebook_loss", "train/commitment_loss",
                 "train/entropy_loss", "train/perplexity", "train/codes_used", "train/dead_codes",
                 "train/revived_codes", "train/tokens_per_s", "lr/head", "lr/encoder", "val/ce_loss",
                 "val/next_turn_ppl", "val/codebook_perplexity", "val/codes_used", "val/codes_used_frac"]:
        assert name in columns, name
    assert list((tmp_path / "runs").glob("**/checkpoints/*.ckpt"))
    assert exported(cli) == tmp_path / "runs" / "smoke" / "version_0" / "fingerprinter"
    run_config = yaml.safe_load((tmp_path / "runs" / "smoke" / "version_0" / "config.yaml").read_text())
    assert run_config["trainer"]["max_steps"] == 4 and not (tmp_path / "runs" / "config.yaml").exists()
    fingerprinter = Fingerprinter.from_pretrained(exported(cli))
    record = fingerprinter.run_record
    assert record["trained_steps"] == 4 and record["seed"] == 0
    assert record["torch"] == {"version": torch.__version__, "threads": torch.get_num_threads()}
    # 4 batches of 8 of the synthetic corpus's training pairs: a fraction of one epoch, not "1"
    assert record["epochs"] == round(4 / cli.trainer.num_training_batches, 4) and 0 < record["epochs"] < 1
    assert record["global_step"] == int(Path(record["checkpoint"]).stem.removeprefix("step"))
    assert "val/ce_loss" in record["last_metrics"] and set(record["checkpoint_score"]) == {"val/ce_loss"}
    prints = fingerprinter.fingerprint(["Shall we meet at the park at 5 o'clock?"])
    assert len(prints[0].token_codes) > 5 and all(0 <= c < 256 for c in prints[0].codes)


def test_optional_terms_are_logged_and_the_export_stays_a_plain_fingerprinter(tmp_path):
    cli = main(smoke_args(tmp_path, 2, "--model.isq.lambda_rec", "0.5", "--model.isq.lambda_nce", "0.5",
                          "--model.isq.kernel_size", "1"))
    rows = read_metrics(tmp_path / "runs")
    for term in ("reconstruction_loss", "contrastive_loss"):
        train = [float(r[f"train/{term}"]) for r in rows if r.get(f"train/{term}")]
        assert train and all(0 < v < 20 for v in train), term
        assert any(r.get(f"val/{term}") for r in rows), term
    # The token head is a training aid: the exported fingerprinter neither stores nor needs it.
    fingerprinter = Fingerprinter.from_pretrained(exported(cli))
    assert fingerprinter.config.lambda_rec == 0.5 and fingerprinter.config.kernel_size == 1
    assert not any("token_head" in name for name in fingerprinter.state_dict())
    assert cli.model.model.token_head is not None


def test_init_from_starts_from_an_exported_fingerprinter(tmp_path):
    source_dir = exported(main(smoke_args(tmp_path / "source", 2)))
    source = Fingerprinter.from_pretrained(source_dir)
    # At step 0 the warm-started model holds the source's encoder, projection and codebook.
    isq = ISQConfig.from_dict(yaml.safe_load(Path(SMOKE).read_text())["model"]["isq"])
    module = ISQLightningModule(isq, init_from=str(source_dir))
    torch.testing.assert_close(module.model.quantizer.codebook.vectors, source.codebook.vectors, rtol=0,
                               atol=0)
    for name, tensor in source.semantic_encoder.state_dict().items():
        torch.testing.assert_close(module.model.semantic_encoder.state_dict()[name], tensor, rtol=0, atol=0)
    # Through the CLI it trains on and exports as usual.
    cli = main(smoke_args(tmp_path / "warm", 2, "--model.init_from", str(source_dir),
                          "--seed_everything", "7"))
    assert cli.trainer.global_step == 2
    warm = Fingerprinter.from_pretrained(exported(cli))
    assert warm.run_record["optim"]["init_from"] == str(source_dir) and warm.run_record["seed"] == 7


def test_cpu_config_starts_from_the_committed_control():
    values = yaml.safe_load((REPO / "configs" / "isq_minilm_dailydialog_cpu.yaml").read_text())["model"]
    module = ISQLightningModule(ISQConfig.from_dict(values["isq"]), init_from=str(REPO / values["init_from"]))
    control = Fingerprinter.from_pretrained(REPO / values["init_from"])
    assert torch.equal(module.model.quantizer.codebook.vectors, control.codebook.vectors)
    texts = ["Melanie ran a charity race for mental health on Saturday."]
    started = Fingerprinter(module.model.config, module.model.tokenizer, module.model.semantic_encoder,
                            module.model.quantizer.codebook.vectors)
    assert started.fingerprint(texts) == control.fingerprint(texts)


def test_init_from_a_bad_directory_or_a_mismatched_config_is_one_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(smoke_args(tmp_path, 2, "--model.init_from", str(tmp_path / "absent")))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--model.init_from" in err and "absent" in err and "Traceback" not in err
    source_dir = exported(main(smoke_args(tmp_path / "source", 2)))
    with pytest.raises(SystemExit):
        main(smoke_args(tmp_path, 2, "--model.init_from", str(source_dir),
                        "--model.isq.code_dim", "16"))
    assert "code_dim is 32 in the fingerprinter but 16 in this model" in capsys.readouterr().err


def test_resume_continues_step_count_and_optimizer_state(tmp_path, capsys):
    """Extended from 4 steps to 6, the run continues its count and optimizer state; its learning-rate
    schedule is rebuilt over 6 steps, which the run says (the rate rose again, silently)."""
    first = main(smoke_args(tmp_path, 4))
    last = next((tmp_path / "runs").glob("**/checkpoints/last.ckpt"))
    saved = torch.load(last, weights_only=False)
    assert saved["global_step"] == 4
    capsys.readouterr()
    resumed = main(smoke_args(tmp_path, 6, "--ckpt_path", str(last)))
    assert ("note: the checkpoint's learning-rate schedule ran over 4 steps, this run's over 6: from step 4"
            in capsys.readouterr().err)
    assert resumed.trainer.global_step == 6
    state = resumed.trainer.optimizers[0].state
    steps = {int(s["step"]) for s in state.values()}
    assert steps == {6}, "AdamW state did not continue from the checkpoint"
    assert int(resumed.model.model.quantizer.codebook.window_steps) == 6 % 20
    assert first.trainer.global_step == 4


@pytest.mark.parametrize("limits", [(), ("--trainer.limit_train_batches", "2")],
                         ids=["mid-epoch", "epoch-end"])
def test_a_resumed_run_ends_with_the_weights_of_the_uninterrupted_run(tmp_path, monkeypatch, limits, capsys):
    """A run that crashed after its step-2 checkpoint, resumed from it, trains on the batches
    the uninterrupted run trained on (not the epoch's first ones again) with the same random
    draws, and ends bit for bit where the uninterrupted run ended; with epochs of two batches the
    checkpoint closes an epoch, and the resumed run starts the next one as the uninterrupted did."""
    seen: dict[str, list[str]] = {"straight": [], "crashed": [], "resumed": []}
    train = ISQLightningModule.training_step

    def recorded(run: str, crash_at: int | None = None):
        def step(self, batch, batch_idx):
            if self.global_step == crash_at:
                raise RuntimeError("crash")
            seen[run].append(hashlib.sha256(batch["input_ids"].numpy().tobytes()).hexdigest())
            return train(self, batch, batch_idx)
        return step

    monkeypatch.setattr(ISQLightningModule, "training_step", recorded("straight"))
    straight = main(smoke_args(tmp_path / "straight", 4, *limits)).model.state_dict()
    monkeypatch.setattr(ISQLightningModule, "training_step", recorded("crashed", crash_at=2))
    with pytest.raises(RuntimeError, match="crash"):
        main(smoke_args(tmp_path / "crashed", 4, *limits))
    last = next((tmp_path / "crashed" / "runs").glob("**/checkpoints/last.ckpt"))
    monkeypatch.setattr(ISQLightningModule, "training_step", recorded("resumed"))
    capsys.readouterr()
    resumed = main(smoke_args(tmp_path / "resumed", 4, *limits, "--ckpt_path", str(last))).model.state_dict()
    assert "learning-rate schedule" not in capsys.readouterr().err  # resumed with its own length
    assert len(set(seen["straight"])) == 4
    assert seen["crashed"] + seen["resumed"] == seen["straight"]
    assert [name for name in straight if not torch.equal(straight[name], resumed[name])] == []


def test_a_resumed_run_exports_the_best_checkpoint_of_its_whole_history(tmp_path, monkeypatch):
    """Validation gets worse after step 4 (a stand-in for a late rise); the run crashes after its
    step-4 checkpoint. Resumed from another working directory (its run directory is relative, as
    the configs' ``runs`` is), the run validates only the worse step 6 in its own directory, yet
    exports step 4, as the uninterrupted run does; so does a checkpoint written before the best was
    recorded in it (its checkpoint callback's best, found beside the checkpoint resumed)."""
    forward, train = ISQLightningModule.forward, ISQLightningModule.training_step

    def rising(self, batch):
        out = forward(self, batch)
        if not self.training and self.global_step > 4:
            out.ce_loss = out.ce_loss + 1.0
        return out

    def crashing(self, batch, batch_idx):
        if self.global_step == 5:
            raise RuntimeError("crash")
        return train(self, batch, batch_idx)

    def here(directory: Path) -> list[str]:
        directory.mkdir()
        monkeypatch.chdir(directory)
        return ["--trainer.logger.init_args.save_dir", "runs"]

    monkeypatch.setattr(ISQLightningModule, "forward", rising)
    straight = Fingerprinter.from_pretrained(exported(main(smoke_args(tmp_path / "straight", 6))))
    monkeypatch.setattr(ISQLightningModule, "training_step", crashing)
    with pytest.raises(RuntimeError, match="crash"):
        main(smoke_args(tmp_path, 6, *here(tmp_path / "crashed")))
    last = next((tmp_path / "crashed" / "runs").glob("**/checkpoints/last.ckpt"))
    legacy = tmp_path / "legacy.ckpt"
    saved = torch.load(last, weights_only=False)
    del saved[BEST_KEY]
    torch.save(saved, legacy)
    shutil.copy(legacy, last.with_name("legacy.ckpt"))  # beside the run's checkpoints, as it was written
    monkeypatch.setattr(ISQLightningModule, "training_step", train)
    for name, checkpoint in (("resumed", last), ("from_legacy", last.with_name("legacy.ckpt"))):
        cli = main(smoke_args(tmp_path, 6, *here(tmp_path / name), "--ckpt_path", str(checkpoint)))
        resumed = Fingerprinter.from_pretrained(exported(cli))
        assert straight.run_record["global_step"] == resumed.run_record["global_step"] == 4, name
        assert straight.run_record["checkpoint_score"] == resumed.run_record["checkpoint_score"]
        assert resumed.run_record["checkpoint"] == str(last.with_name("step4.ckpt"))
        assert torch.equal(straight.codebook.vectors, resumed.codebook.vectors)


class Planted:
    """A pickled object that, unpickled as pickle allows, creates the file ``marker``: the code a
    checkpoint handed over may hold."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_only_a_checkpoint_holding_the_recorded_score_or_weights_only_is_exported(tmp_path):
    """A path taken from another working directory may name another run's file: a full checkpoint
    is exported only when its checkpoint callback saved it with the recorded score; a weights-only
    one, which has no callback state, as it is."""
    from training.callbacks import _saved_checkpoint

    def state(monitor: str, score: float) -> dict:
        return {"ModelCheckpoint{'monitor': 'x'}": {"monitor": monitor, "current_score": torch.tensor(score)}}

    files = {"ours": {"callbacks": state("val/ce_loss", 1.0)},
             "other_score": {"callbacks": state("val/ce_loss", 2.0)},
             "other_monitor": {"callbacks": state("val/loss", 1.0)}, "no_state": {"callbacks": {}},
             "weights_only": {"state_dict": {}}}
    files["planted"] = {"callbacks": state("val/ce_loss", 1.0), "x": Planted(tmp_path / "ran")}
    accepted = set()
    for name, content in files.items():
        torch.save(content, tmp_path / name)
        if _saved_checkpoint({"path": str(tmp_path / name), "monitor": "val/ce_loss", "score": 1.0},
                             torch.device("cpu")) is not None:
            accepted.add(name)
    assert accepted == {"ours", "weights_only"}
    assert not (tmp_path / "ran").exists()  # a pickled object is never called


def test_a_checkpoint_saved_with_an_infinite_score_is_its_own(tmp_path):
    """Lightning records a NaN validation score as infinite: the checkpoint holding that score is
    still the one chosen (inf - inf is NaN, which no tolerance takes)."""
    from training.callbacks import _saved_checkpoint

    state = {"monitor": "val/ce_loss", "current_score": torch.tensor(float("inf"))}
    torch.save({"callbacks": {"ModelCheckpoint{'monitor': 'x'}": state}}, tmp_path / "diverged")
    chosen = {"path": str(tmp_path / "diverged"), "monitor": "val/ce_loss", "score": float("inf")}
    assert _saved_checkpoint(chosen, torch.device("cpu")) is not None


def test_a_run_checkpointing_weights_only_exports_its_best(tmp_path, monkeypatch):
    """A weights-only checkpoint holds no callback state to check its score by: it is exported as
    the best all the same."""
    forward = ISQLightningModule.forward

    def rising(self, batch):
        out = forward(self, batch)
        if not self.training and self.global_step > 2:
            out.ce_loss = out.ce_loss + 1.0
        return out

    monkeypatch.setattr(ISQLightningModule, "forward", rising)
    callbacks = tmp_path / "callbacks.yaml"
    callbacks.write_text(yaml.safe_dump({"trainer": {"callbacks": [
        {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
         "init_args": {"monitor": "val/ce_loss", "mode": "min", "filename": "step{step}",
                       "auto_insert_metric_name": False, "save_weights_only": True}},
        {"class_path": "training.callbacks.ExportFingerprinter"}]}}))
    record = Fingerprinter.from_pretrained(exported(main(smoke_args(tmp_path, 4, "--config", str(callbacks))))
                                           ).run_record
    assert record["global_step"] == 2 and record["checkpoint"].endswith("step2.ckpt")


@pytest.mark.parametrize(("setting", "value", "said"), [
    ("--model.head_lr", "0.5", "model.head_lr 0.003, not 0.5"),
    ("--model.isq.freeze_encoder", "true", "model.isq.freeze_encoder False, not True"),
    ("--seed_everything", "5", "seed_everything 0, not 5"),  # its run record said seed 5
])
def test_a_resume_with_other_model_settings_is_one_clear_error(tmp_path, capsys, setting, value, said):
    """The restored optimiser would keep the checkpoint's learning rates, and a frozen encoder
    changes its parameter groups (a traceback inside Lightning); validating is not refused."""
    main(smoke_args(tmp_path, 2))
    last = str(next((tmp_path / "runs").glob("**/checkpoints/last.ckpt")))
    with pytest.raises(SystemExit) as refused:
        main(smoke_args(tmp_path, 4, setting, value, "--ckpt_path", last))
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert f"the run was trained with {said}" in err and "Traceback" not in err
    validated = main(smoke_args(tmp_path, 4, setting, value, "--ckpt_path", last, "--validate_only", "true"))
    assert "val/ce_loss" in validated.trainer.callback_metrics


@pytest.mark.parametrize(("setting", "value", "said"), [
    ("--data.root", "{tmp}/other", "data.root 'synthetic', not '{tmp}/other'"),
    ("--data.batch_size", "4", "data.batch_size 8, not 4"),
])
def test_a_resume_on_other_data_is_one_clear_error(tmp_path, capsys, setting, value, said):
    """Its best checkpoint was scored on the first data's validation split, which the export would
    rank against the new split's scores, and its epoch's position counts the first data's batches;
    where the batches are cached may change."""
    main(smoke_args(tmp_path, 2))
    last = str(next((tmp_path / "runs").glob("**/checkpoints/last.ckpt")))
    with pytest.raises(SystemExit) as refused:
        main(smoke_args(tmp_path, 4, setting, value.format(tmp=tmp_path), "--ckpt_path", last))
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert f"the run was trained with {said.format(tmp=tmp_path)}" in err and "Traceback" not in err
    resumed = main(smoke_args(tmp_path, 4, "--data.cache_dir", str(tmp_path / "cache2"), "--ckpt_path", last))
    assert resumed.trainer.global_step == 4


def test_a_resume_compares_the_directory_read_from_the_environment(tmp_path, capsys, monkeypatch):
    """A run given no --data.root records the directory ``$ISQ_DAILYDIALOG`` named, so a resume with
    the variable naming another is refused like one given another --data.root."""
    monkeypatch.setenv("ISQ_DAILYDIALOG", "synthetic")
    main(smoke_args(tmp_path, 2, "--data.root", "null"))
    last = str(next((tmp_path / "runs").glob("**/checkpoints/last.ckpt")))
    monkeypatch.setenv("ISQ_DAILYDIALOG", str(tmp_path / "other"))
    with pytest.raises(SystemExit):
        main(smoke_args(tmp_path, 4, "--data.root", "null", "--ckpt_path", last))
    said = f"the run was trained with data.root 'synthetic', not '{tmp_path}/other'"
    assert said in capsys.readouterr().err


def test_a_run_on_the_hubs_copy_records_no_data_directory(tmp_path, monkeypatch):
    """It reads no directory, so neither ``$ISQ_DAILYDIALOG`` nor the working directory may refuse
    its resume."""
    monkeypatch.setenv("ISQ_DAILYDIALOG", "dd")
    monkeypatch.chdir(tmp_path)
    assert DialogueDataModule(hub_id="someone/daily_dialog", cache_dir=str(tmp_path)).hparams["root"] is None
    assert DialogueDataModule(cache_dir=str(tmp_path)).hparams["root"] == str(tmp_path / "dd")


def test_a_resume_compares_a_relative_data_directory_as_the_directory_it_names(tmp_path, capsys, monkeypatch):
    """``--data.root dd`` names another directory from another working directory: refused there,
    resumed from the first."""
    for place, seed in (("a", 1), ("b", 2)):
        write_synthetic_corpus(tmp_path / place / "dd", sizes=(40, 8, 8), seed=seed)
    monkeypatch.chdir(tmp_path / "a")
    main(smoke_args(tmp_path, 2, "--data.root", "dd"))
    last = str(next((tmp_path / "runs").glob("**/checkpoints/last.ckpt")))
    monkeypatch.chdir(tmp_path / "b")
    with pytest.raises(SystemExit):
        main(smoke_args(tmp_path, 4, "--data.root", "dd", "--ckpt_path", last))
    said = f"the run was trained with data.root '{tmp_path}/a/dd', not '{tmp_path}/b/dd'"
    assert said in capsys.readouterr().err
    monkeypatch.chdir(tmp_path / "a")
    assert main(smoke_args(tmp_path, 4, "--data.root", "dd", "--ckpt_path", last)).trainer.global_step == 4


def test_settings_a_resume_may_spell_otherwise(tmp_path, monkeypatch):
    """The warm start (the checkpoint's weights replace it), a path spelled another way, a setting
    the checkpoint predates and a list kept as a tuple are no change; another value is."""
    (tmp_path / "fp").mkdir()
    monkeypatch.chdir(tmp_path)
    saved = {"head_lr": 0.003, "init_from": "fp", "_instantiator": "lightning", "isq": {
        "encoder": "fp", "lora_targets": ["q", "v"], "decoder": {"d_model": 64}}}
    current = {"head_lr": 0.003, "init_from": str(tmp_path / "fp"), "isq": {
        "encoder": "./fp", "lora_targets": ("q", "v"), "decoder": {"d_model": 64}, "added_since": "none"}}
    assert changed_settings(saved, current) == []
    current["isq"]["lora_targets"] = ("q", "k")
    assert changed_settings(saved, current) == ["model.isq.lora_targets[1] 'v', not 'k'"]


def test_a_path_that_cannot_be_written_is_one_error_line_and_leaves_no_empty_run(tmp_path, capsys):
    """A cache directory named where a file is: one line with the error and its path, exit 2, and
    no empty runs/<name>/version_N that would move the next run's version on."""
    (tmp_path / "afile").write_text("not a directory")
    with pytest.raises(SystemExit) as refused:
        main(smoke_args(tmp_path, 2, "--data.cache_dir", str(tmp_path / "afile")))
    err = capsys.readouterr().err
    assert refused.value.code == 2 and "Traceback" not in err
    assert err.splitlines()[-1] == (f"error: [Errno 20] Not a directory: "
                                    f"'{tmp_path / 'afile' / 'synthetic_corpus' / 'train'}'")
    assert [path for path in (tmp_path / "runs").rglob("*") if path.is_dir() and not any(path.iterdir())
            and path.name.startswith("version_")] == []


@pytest.mark.parametrize("logger", ["false", "[]"])
def test_training_without_a_logger_is_refused_before_it_writes_anything(tmp_path, capsys, monkeypatch,
                                                                        logger):
    """Without a logger Lightning would put the checkpoints into ./checkpoints and the export into
    the working directory (here the repository's committed checkpoints/)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as refused:
        main(smoke_args(tmp_path, 2, "--trainer.logger", logger))
    assert refused.value.code == 2 and "--trainer.logger false is refused" in capsys.readouterr().err
    assert [path.name for path in tmp_path.iterdir()] == []


def test_a_warm_up_longer_than_the_run_and_a_run_no_validation_chose_are_said(tmp_path, capsys):
    cli = main(smoke_args(tmp_path, 2, "--model.warmup_steps", "100", "--trainer.val_check_interval", "0.5",
                          "--trainer.check_val_every_n_epoch", "1"))
    err = capsys.readouterr().err
    assert "note: --model.warmup_steps 100 is not below --trainer.max_steps 2" in err
    assert "note: no validated checkpoint is left to export" in err
    assert Fingerprinter.from_pretrained(exported(cli)).run_record["checkpoint"] is None


def test_a_disk_that_fills_under_a_checkpoint_is_one_line_and_leaves_no_part_of_it(tmp_path, capsys,
                                                                                  monkeypatch):
    """Lightning writes a checkpoint to a temporary file and moves it into place: on a full disk
    the move stopped part-way, leaving a truncated ``.ckpt`` under a good name, and the run ended
    in a traceback. Now one line says so and the part is removed."""
    written: list[Path] = []

    def fill_the_disk(checkpoint, path):
        Path(path).write_bytes(b"PK\x03\x04 part of a checkpoint")
        written.append(Path(path))
        raise OSError(errno.ENOSPC, "No space left on device", "/tmp/tmp_checkpoint", None, str(path))

    monkeypatch.setattr("lightning.fabric.plugins.io.torch_io._atomic_save", fill_the_disk)
    with pytest.raises(SystemExit) as stopped:
        main(smoke_args(tmp_path, 2))
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "Traceback" not in err, err
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert f"no space left on device writing {written[0]} (the part of it written is removed)" in line
    assert written and not written[0].exists()
    unnamed = out_of_space(OSError(errno.ENOSPC, "No space left on device"))  # a write to an open file
    assert "writing a file of the run, or a temporary file in" in unnamed


def test_the_warm_up_note_names_the_highest_rate_the_schedule_reaches():
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    from training.fit import warm_up_note

    warmup, max_steps = 20, 5
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = get_cosine_with_min_lr_schedule_with_warmup(optimizer, warmup, max_steps, min_lr_rate=0.1)
    rates = []
    for _ in range(max_steps):  # the rate each optimizer step uses, then the scheduler's step
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    [note] = warm_up_note({"warmup_steps": warmup}, {"max_steps": max_steps})
    assert note.endswith(f"at most {max(rates):.2f} of their peak"), (note, rates)


def test_token_lengths_past_the_encoders_positions_are_one_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as refused:
        main(["--config", str(REPO / "configs" / "isq_minilm_dailydialog_cpu.yaml"),
              "--data.root", "synthetic", "--data.max_context_tokens", "1000",
              "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"),
              "--data.cache_dir", str(tmp_path / "cache")])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert "--data.max_context_tokens is 1000: this encoder takes at most 512 tokens" in err


def test_two_process_ddp_keeps_codebooks_identical(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    args = smoke_args(tmp_path, 4, "--trainer.strategy", "ddp", "--trainer.devices", "2",
                      "--model.isq.revive_every", "2")
    proc = subprocess.run([sys.executable, "-m", "training.fit", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sync_dist" not in proc.stderr, "values already equal on every rank drew a sync_dist warning"
    rows = read_metrics(tmp_path / "runs")
    divergence = [float(r["val/codebook_rank_divergence"]) for r in rows
                  if r.get("val/codebook_rank_divergence")]
    assert divergence and max(divergence) == 0.0
    revived = [float(r["train/revived_codes"]) for r in rows if r.get("train/revived_codes")]
    assert max(revived) > 0, "revival never ran, so its cross-rank agreement was not exercised"


@pytest.mark.parametrize("precision", ["16-mixed", "bf16-true"])
def test_fp16_and_bf16_true_are_refused_in_one_line(tmp_path, precision, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(smoke_args(tmp_path, 1, "--trainer.precision", precision))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --trainer.precision {precision} is refused: ") and err.count("\n") == 1


@pytest.mark.parametrize("seed", ["-1", str(2**32)])
def test_a_seed_numpy_cannot_take_is_refused_before_anything_runs(tmp_path, seed, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(smoke_args(tmp_path, 1, "--seed_everything", seed))
    assert exit_info.value.code == 2
    refusal = capsys.readouterr().err.strip().splitlines()[-1]
    assert refusal == (f"error: seed_everything is {seed}: allowed is true (a random seed), false (none) "
                       "or a whole number from 0 to 4294967295")
    assert not (tmp_path / "runs").exists()


def test_a_mistyped_option_names_the_command_to_ask_for_help(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(smoke_args(tmp_path, 1, "--model.nope", "1"))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err == ("error: unrecognized arguments: --model.nope 1 (python -m training.fit --help lists the "
                   "options)\n")


@pytest.mark.parametrize("config",
                         ["smoke.yaml", "isq_t5base_dailydialog.yaml", "isq_minilm_dailydialog_cpu.yaml"])
def test_print_config(config, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", str(REPO / "configs" / config), "--print_config"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "num_codes:" in out and "tokenizer:" in out


def test_missing_and_malformed_data_give_one_clear_line(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    missing = subprocess.run(
        [sys.executable, "-m", "training.fit",
         *smoke_args(tmp_path, 1, "--data.root", str(tmp_path / "absent"))],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert missing.returncode == 2
    assert "DailyDialog directory not found" in missing.stderr and "Traceback" not in missing.stderr
    bad = tmp_path / "bad"
    for split in ("train", "validation", "test"):
        (bad / split).mkdir(parents=True)
        (bad / split / f"dialogues_{split}.txt").write_text("A . __eou__ B . __eou__\n")
    (bad / "train" / "dialogues_train.txt").write_text("A . __eou__ B . __eou__\nbroken line\n")
    malformed = subprocess.run(
        [sys.executable, "-m", "training.fit", *smoke_args(tmp_path, 1, "--data.root", str(bad))],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert malformed.returncode == 2
    assert "dialogues_train.txt:2" in malformed.stderr and "Traceback" not in malformed.stderr
    runs = tmp_path / "runs"  # the refused runs left no version directory to move the next one's number
    assert [path for path in runs.rglob("*") if path.name.startswith("version_")] == [], list(runs.rglob("*"))


def test_wandb_logger_works_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    cli = main(smoke_args(tmp_path, 2)[:-4] + [
        "--trainer.logger", "lightning.pytorch.loggers.WandbLogger",
        "--trainer.logger.offline", "true", "--trainer.logger.save_dir", str(tmp_path / "wandb"),
        "--trainer.logger.project", "isq-test",
        "--data.cache_dir", str(tmp_path / "cache"), "--data.batch_size", "8",
    ])
    assert cli.trainer.global_step == 2
    assert list((tmp_path / "wandb").glob("**/*.wandb"))
    # Config, metrics and export of the run share its own directory, runs/<project>/<run id>.
    run = exported(cli).parent
    assert run.parent == tmp_path / "wandb" / "isq-test" and run.name == cli.trainer.logger.version
    assert (run / "config.yaml").is_file() and not (tmp_path / "wandb" / "config.yaml").exists()
    assert "val/ce_loss" in set(read_metrics(run)[0])


def test_wandb_without_offline_mode_or_login_is_one_error_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(PYTHONPATH=str(REPO), HOME=str(tmp_path), WANDB_CONFIG_DIR=str(tmp_path),
               WANDB_DIR=str(tmp_path))
    args = smoke_args(tmp_path, 1, "--trainer.logger", "WandbLogger",
                      "--trainer.logger.save_dir", str(tmp_path / "w"))
    proc = subprocess.run([sys.executable, "-m", "training.fit", *args], cwd=REPO, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "error: wandb could not start" in proc.stderr and "WANDB_MODE=offline" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_run_prints_what_matters_and_not_third_party_noise(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    args = smoke_args(tmp_path, 2, "--model.isq.freeze_encoder", "true")  # a frozen encoder sits in eval mode
    proc = subprocess.run([sys.executable, "-m", "training.fit", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    noises = ("Tip:", "litlogger", "eval mode at the start", "LeafSpec", "tokenising test", "Loading weights")
    for noise in noises:
        assert noise not in output, noise
    assert "tokenising train" in output and "exported fingerprinter to" in output
    assert "trainable parameters: encoder 0 of" in output


def test_a_run_whose_standard_output_goes_away_trains_and_exports(tmp_path):
    """Piped into ``| head -1``, the run lost its reader after the first line: the progress bar's
    next write exited the process with status 1 and nothing saved. Started with standard output
    closed (``>&-``), it failed at the first step. Both now train and export."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    args = [sys.executable, "-m", "training.fit", *smoke_args(tmp_path / "piped", 24),
            "--trainer.enable_progress_bar", "true"]
    run = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert run.stdout is not None and run.stdout.readline()
    run.stdout.close()  # as head does after its line
    _, err = run.communicate(timeout=600)
    assert run.returncode == 0 and "note: standard output's reader went away" in err, err[-2000:]
    closed = subprocess.run(["bash", "-c", 'exec "$@" >&-', "fit",
                             *[sys.executable, "-m", "training.fit", *smoke_args(tmp_path / "closed", 2)]],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert closed.returncode == 0, closed.stderr[-2000:]
    for run_dir in ("piped", "closed"):
        assert list((tmp_path / run_dir / "runs").glob("**/fingerprinter/model.safetensors")), run_dir


def test_validate_only_reports_codebook_metrics_without_training(tmp_path):
    cli = main(smoke_args(tmp_path, 3, "--validate_only", "true"))
    assert cli.trainer.global_step == 0
    assert not (tmp_path / "runs").exists(), "a validation is not a run: no runs/<name>/version_N for it"
    metrics = cli.trainer.callback_metrics
    assert 0 < float(metrics["val/codes_used"]) <= 256
    assert float(metrics["val/codebook_perplexity"]) >= 1.0


def test_overfit_batches_trains_on_the_loader_lightning_rebuilds(tmp_path):
    """Lightning rebuilds the training loader with a sequential sampler of its own to overfit a
    few batches: the resumable loader must allow that, and then keeps no state."""
    cli = main(smoke_args(tmp_path, 2, "--trainer.overfit_batches", "2"))
    assert cli.trainer.global_step == 2
    assert cli.trainer.train_dataloader.state_dict() == {}
