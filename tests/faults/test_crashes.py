"""Fault class 6 (training side) and crash recovery: a run killed mid-training resumes from its
last checkpoint and finishes; a truncated checkpoint is refused in one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.test_fit import Planted
from training.fit import main as fit_main

REPO = Path(__file__).resolve().parents[2]


def fit_args(tmp: Path, steps: int, *extra: str) -> list[str]:
    return ["--config", str(REPO / "configs" / "smoke.yaml"), "--trainer.max_steps", str(steps),
            "--trainer.val_check_interval", "4", "--trainer.limit_val_batches", "1",
            "--trainer.enable_progress_bar", "false", "--trainer.logger.init_args.save_dir",
            str(tmp / "runs"), "--data.cache_dir", str(tmp / "cache"), "--data.batch_size", "8", *extra]


def test_a_killed_run_resumes_from_its_last_checkpoint(tmp_path: Path) -> None:
    saves = tmp_path / "saves"
    args = fit_args(tmp_path, 12,
                    "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
                    "--trainer.callbacks.dirpath", str(saves), "--trainer.callbacks.every_n_train_steps", "2",
                    "--trainer.callbacks.save_last", "true",
                    "--trainer.callbacks+=tests.faults.killer.KillAfterStep", "--trainer.callbacks.step", "5")
    code = f"from training.fit import main; main({args!r})"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                            timeout=600, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    last = saves / "last.ckpt"
    saved_step = torch.load(last, weights_only=False, map_location="cpu")["global_step"]
    assert 4 <= saved_step <= 5
    assert not list(tmp_path.glob("runs/**/fingerprinter"))  # killed: nothing exported half-way
    resumed = fit_main(fit_args(tmp_path, 12, "--ckpt_path", str(last)))
    assert resumed.trainer.global_step == 12
    assert {int(state["step"]) for state in resumed.trainer.optimizers[0].state.values()} == {12}


def test_a_truncated_checkpoint_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    first = fit_main(fit_args(tmp_path, 2))
    last = next((tmp_path / "runs").glob("**/checkpoints/last.ckpt"))
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(last.read_bytes()[: last.stat().st_size // 3])
    for path in (truncated, tmp_path / "absent.ckpt"):
        with pytest.raises(SystemExit) as exit_info:
            fit_main(fit_args(tmp_path, 4, "--ckpt_path", str(path)))
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and str(path) in err and "Traceback" not in err
        assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1
    assert first.trainer.global_step == 2


def test_a_checkpoint_of_other_settings_or_not_of_lightning_is_refused_in_one_line(tmp_path: Path,
                                                                                   capsys) -> None:
    fit_main(fit_args(tmp_path, 2))
    last = next((tmp_path / "runs").glob("**/checkpoints/last.ckpt"))
    runs = sorted(tmp_path.glob("runs/*/*"))
    plain = tmp_path / "plain.ckpt"
    torch.save({"a": 1}, plain)
    planted = tmp_path / "planted.ckpt"  # a checkpoint handed over, holding code: never run
    torch.save({**torch.load(last, weights_only=True), "x": Planted(tmp_path / "ran")}, planted)
    for path, extra, message in ((last, ["--model.isq.num_codes", "16"], "do not fit this model's settings"),
                                 (plain, [], "not a Lightning checkpoint"),
                                 (planted, [], "which loading would run as code")):
        with pytest.raises(SystemExit) as exit_info:
            fit_main(fit_args(tmp_path, 4, "--ckpt_path", str(path), *extra))
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and message in err and "Traceback" not in err, err
    assert sorted(tmp_path.glob("runs/*/*")) == runs  # no run directory left behind
    assert not (tmp_path / "ran").exists()
