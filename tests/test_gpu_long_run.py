"""benchmarks/gpu_long_run.py: the GPU config parses as the recipe ~100x longer, and the script's
--tiny CPU form trains it (LoRA on the warm start), evaluates the export and summarises."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.test_evaluate import write_locomo

REPO = Path(__file__).resolve().parents[1]
SCRIPT = [sys.executable, "benchmarks/gpu_long_run.py"]


def test_the_gpu_config_is_the_cpu_recipe_100x_longer_in_bf16_within_9_minutes():
    cpu = yaml.safe_load((REPO / "configs" / "isq_minilm_dailydialog_cpu.yaml").read_text())
    gpu = yaml.safe_load((REPO / "configs" / "isq_minilm_dailydialog_gpu.yaml").read_text())
    pairs = {name: c["trainer"]["max_steps"] * c["data"]["batch_size"]
             for name, c in (("cpu", cpu), ("gpu", gpu))}
    assert pairs["gpu"] == 100 * pairs["cpu"]
    assert gpu["trainer"]["precision"] == "bf16-mixed" and gpu["trainer"]["max_time"] == "00:00:09:00"
    assert gpu["model"]["init_from"] == cpu["model"]["init_from"] and gpu["model"]["isq"]["lora_rank"] == 8
    same = ("encoder", "code_dim", "kernel_size", "num_codes", "lambda_nce", "beta", "decoder")
    assert {k: gpu["model"]["isq"][k] for k in same} == {k: cpu["model"]["isq"][k] for k in same}
    # the revival rate per token is the recipe's: threshold scaled with the pairs per step
    ratio = gpu["data"]["batch_size"] / cpu["data"]["batch_size"]
    assert gpu["model"]["isq"]["revive_threshold"] == pytest.approx(ratio
                                                                    * cpu["model"]["isq"]["revive_threshold"])


@pytest.mark.slow
def test_tiny_run_trains_evaluates_and_summarises(tmp_path):
    locomo = write_locomo(tmp_path / "locomo.json")
    result = subprocess.run([*SCRIPT, "--tiny", "--seed", "3", "--locomo", locomo, "--out",
                             str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["trained_steps"] == 2 and summary["exported_step"] <= 2 and summary["seed"] == 3
    assert set(summary["seconds"]) == {"train", "evaluate"}
    config = json.loads((Path(summary["fingerprinter"]) / "config.json").read_text())
    assert '"lora_rank": 8' in json.dumps(config)
    results = json.loads((tmp_path / "out" / "eval" / "results.json").read_text())
    assert summary["recall"] == {name: s["overall"]["recall"] for name, s in results["configs"].items()}
    key = "multi+code − multi+kmeans"
    assert summary["paired"][key]["overall"]["n"] == 5
    assert summary["paired"][key]["overall"]["mean"] == pytest.approx(
        100 * (summary["recall"]["multi+code"] - summary["recall"]["multi+kmeans"]))
    assert key in result.stdout and "seed 3: 2 steps" in result.stdout


def test_bad_input_is_one_error_line_and_exit_2(tmp_path):
    result = subprocess.run([*SCRIPT, "--tiny", "--locomo", str(tmp_path / "absent.json"), "--out",
                             str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.startswith("error:") and "absent.json" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_without_a_gpu_the_full_run_stops_at_once_naming_tiny(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the full run would start")
    locomo = write_locomo(tmp_path / "locomo.json")
    (tmp_path / "dd" / "train").mkdir(parents=True)
    result = subprocess.run([*SCRIPT, "--data-root", str(tmp_path / "dd"), "--locomo", locomo, "--out",
                             str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr == (
        "error: no CUDA device is available; run it on a GPU machine, or pass --tiny for the same path "
        "on the CPU\n")


def test_max_minutes_is_lightnings_max_time(tmp_path):
    from benchmarks.gpu_long_run import max_time

    assert [max_time(m) for m in (4, 90, 1500)] == ["00:00:04:00", "00:01:30:00", "01:01:00:00"]


@pytest.mark.parametrize(("extra", "message"), [
    (["--max-minutes", "0"], "argument --max-minutes: expected a whole number at least 1, got '0'"),
    (["--seed", "-1"], "argument --seed: expected a whole number from 0 to 4294967295, got '-1'"),
    (["--out", "{file}/out"], "is not a directory this process may write in"),
])
def test_unusable_arguments_are_refused_before_training(tmp_path, extra, message):
    locomo = write_locomo(tmp_path / "locomo.json")
    (tmp_path / "a_file").write_text("x")
    extra = [value.format(file=tmp_path / "a_file") for value in extra]
    result = subprocess.run([*SCRIPT, "--tiny", "--locomo", locomo, "--out", str(tmp_path / "out"), *extra],
                            cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()
