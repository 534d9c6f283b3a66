"""The benchmark scripts run end to end on tiny inputs and write their figures under stable keys."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import faiss
import numpy as np
import pytest
import torch

from benchmarks import bench_fingerprint, bench_quantizer, bench_retrieval, gpu_check, timing

REPO = Path(__file__).resolve().parents[1]

ROOT = Path(__file__).resolve().parents[1]


def read(path: Path) -> dict:
    figures = json.loads(path.read_text())
    assert {"host", "cpus", "load_average", "utc"} <= set(figures["machine"])
    return figures


def assert_positive_spread(stats: dict) -> None:
    """A ratio (or time) spread: finite, positive and ordered min <= q1 <= median <= q3 <= max."""
    values = [stats[key] for key in ("min", "q1", "median", "q3", "max")]
    assert all(math.isfinite(v) and v > 0 for v in values), stats
    assert values == sorted(values), stats


def test_ratio_spread_takes_per_round_ratios() -> None:
    stats = timing.ratio_spread([1.0, 2.0, 9.0], [2.0, 2.0, 3.0])
    assert stats == {"median": 1.0, "q1": 0.75, "q3": 2.0, "min": 0.5, "max": 3.0}
    assert timing.rotated(["a", "b", "c"], 4) == ["b", "c", "a"]


def test_gpu_check_tiny_runs_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--tiny", "--json", str(out)], cwd=ROOT,
                   check=True, capture_output=True, timeout=600)
    figures = read(out)
    keys = {"device", "precision", "steps", "tokens_per_step", "tokens_per_s", "step_ms_median",
            "peak_memory_bytes", "parameters", "model_flops_per_step", "achieved_tflops", "peak_tflops",
            "mfu",
            "flops_estimate", "final_loss", "dead_codes"}
    assert keys <= set(figures)
    assert figures["precision"] == "fp32" and figures["steps"] == 3
    assert math.isfinite(figures["tokens_per_s"]) and figures["tokens_per_s"] > 0
    assert math.isfinite(figures["final_loss"]) and figures["final_loss"] > 0
    assert math.isfinite(figures["step_ms_median"]) and figures["step_ms_median"] > 0
    assert figures["parameters"]["total"] > figures["parameters"]["encoder_side"] > 0


def test_gpu_check_profiles_further_steps_on_request(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    result = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--tiny", "--profile", "2", "--json",
                             str(out)], cwd=ROOT, check=True, capture_output=True, text=True, timeout=600)
    profiled = read(out)["profile"]
    assert profiled["steps"] == 2 and profiled["profiled_step_ms"] > 0
    assert "device_busy_ms" not in profiled  # kernels are timed on a GPU only
    assert "Self CPU time total" in result.stdout and "aten::mm" in result.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without a GPU")
def test_gpu_check_without_cuda_fails_in_one_line(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        gpu_check.main([])
    assert exit_info.value.code == 2
    message = capsys.readouterr().err
    assert message.count("\n") == 1 and "--tiny" in message


def test_gpu_check_peak_table() -> None:
    assert gpu_check.peak_tflops("NVIDIA H200", None) == 989.0
    assert gpu_check.peak_tflops("NVIDIA H100 PCIe", None) == 756.0
    assert gpu_check.peak_tflops("Some GPU", None) is None
    assert gpu_check.peak_tflops("NVIDIA H200", 500.0) == 500.0


def test_bench_retrieval_is_exact_and_its_ratios_are_positive(tmp_path: Path, capsys) -> None:
    out = tmp_path / "retrieval.json"
    threads = faiss.omp_get_max_threads()  # the process's OpenMP setting, torch's too: given back
    try:
        bench_retrieval.main(["--sizes", "2000", "4000", "--queries", "3", "--dim", "8", "--json", str(out)])
        assert faiss.omp_get_max_threads() == 1  # faiss on as many threads as Path B: one, unless asked
    finally:
        faiss.omp_set_num_threads(threads)
    assert f"wrote the figures to {out.resolve()}" in capsys.readouterr().out
    figures = read(out)
    for row in figures["sizes"].values():
        # Path B's pruned search returns exactly the brute-force top k on every query
        assert row["path_b_default_exact"] is True and row["path_b_paper_exact"] is True
        assert row["mismatches"] == 0
        for name in ("path_b_default", "path_b_paper", "bruteforce_default", "faiss_exact"):
            assert math.isfinite(row[f"{name}_ms"]) and row[f"{name}_ms"] > 0, name
        for ratio in ("ratio_default_over_faiss", "ratio_paper_over_faiss", "ratio_default_over_bruteforce"):
            assert_positive_spread(row[ratio])
        assert row["build_s"] > 0 and row["bruteforce_ms"] == row["bruteforce_default_ms"]
    assert figures["growth"]["2000->4000"]["size_factor"] == 2.0
    assert figures["settings"]["threads"] == 1


def test_code_model_draws_distinct_codes_within_bounds() -> None:
    rng = np.random.default_rng(0)
    model = bench_retrieval.CodeModel.build(rng, 64, 0.6, topics=4, topic_size=8, topic_share=0.5)
    indptr, codes = model.draw(rng, 300, 3, 10)
    lengths = np.diff(indptr)
    assert lengths.max() <= 10 and codes.min() >= 0 and codes.max() < 64
    assert all(len(set(codes[a:b])) == b - a for a, b in zip(indptr[:-1], indptr[1:], strict=True))


def test_bench_quantizer_writes_stable_keys(tmp_path: Path) -> None:
    pytest.importorskip("vector_quantize_pytorch")
    out = tmp_path / "quantizer.json"
    bench_quantizer.main(["--rounds", "2", "--steps", "1", "--warmup", "1", "--batch", "4", "--length", "8",
                          "--dim", "16", "--codes", "32", "--json", str(out)])
    figures = read(out)
    for name in ("floor_ms", "ours_ms", "theirs_ms"):
        assert math.isfinite(figures[name]) and figures[name] > 0, name
    assert_positive_spread(figures["ratio_ours_over_theirs"])
    assert_positive_spread(figures["ratio_ours_over_floor"])


def test_bench_fingerprint_writes_stable_keys(tmp_path: Path) -> None:
    checkpoint, locomo = ROOT / bench_fingerprint.DEFAULT_CHECKPOINT, ROOT / bench_fingerprint.DEFAULT_LOCOMO
    if not checkpoint.is_dir() or not locomo.is_file():
        pytest.skip("needs the committed fingerprinter and the shared LoCoMo file")
    out = tmp_path / "fingerprint.json"
    bench_fingerprint.main(["--checkpoint", str(checkpoint), "--path", str(locomo), "--texts", "6",
                            "--rounds", "2", "--batch-size", "4", "--json", str(out)])
    figures = read(out)
    assert figures["texts"] == 6
    # every round gave the same token codes (else the field says "differs between rounds")
    assert len(figures["codes_sha256"]) == 64 and int(figures["codes_sha256"], 16) >= 0
    assert_positive_spread(figures["ratio_spread"])
    assert figures["ratio"] == figures["ratio_spread"]["median"]
    assert figures["fingerprint_texts_per_s"] > 0 and figures["encoder_texts_per_s"] > 0


def test_the_locomo_standin_renames_every_copy(tmp_path) -> None:
    import json

    from benchmarks.locomo_standin import main as standin_main

    source = tmp_path / "l.json"
    source.write_text(json.dumps([{
        "sample_id": "c", "qa": [{"question": "Where did Anna go?"}], "conversation": {
            "speaker_a": "Anna", "speaker_b": "Bo",
            "session_1": [{"speaker": "Anna", "dia_id": "D1:1", "text": "Hi Bo"}]}}]))
    out = tmp_path / "new" / "s.json"  # its folder is made
    assert standin_main(["--locomo", str(source), "--copies", "2", "--out", str(out)]) == 0
    copies = json.loads(out.read_text())
    assert [c["sample_id"] for c in copies] == ["c-copy0", "c-copy1"]
    assert (copies[1]["conversation"]["session_1"][0]
            == {"speaker": "Clara", "dia_id": "D1:1", "text": "Hi Dev"})
    assert copies[0]["qa"][0]["question"] == "Where did Ana go?"
    assert standin_main(["--locomo", str(tmp_path / "absent.json"), "--out", str(tmp_path / "x.json")]) == 2


@pytest.mark.parametrize(("argv", "says"), [
    (["--sizes", "0"], "argument --sizes: expected a whole number at least 1, got '0'"),
    (["--add-turns", "-6"], "argument --add-turns"), (["--searches", "0"], "argument --searches"),
    (["--users", "-1"], "argument --users"),
    (["--sizes", "100", "--users", "1"], "--users 1 would be the memory of --sizes 100 again (1x100)"),
    (["--fingerprinter", "nowhere"], "--fingerprinter nowhere: not an exported fingerprinter"),
    (["--fingerprinter", "{tmp}"], "not an exported fingerprinter (no config.json of one)"),
    (["--embedder", "{tmp}/no-model"], "--embedder: "),
    (["--json", "{tmp}/" + "x" * 300 + ".json"], "cannot be written: File name too long")])
def test_bench_memory_refuses_bad_arguments_before_any_work(argv, says, tmp_path, capsys) -> None:
    """Each before any figure is measured: a directory that is not an export, a model that cannot be
    loaded, a path the system will not take, as well as the values argparse checks."""
    from benchmarks import bench_memory
    from tests.test_evaluate import write_locomo

    argv = [part.replace("{tmp}", str(tmp_path)) for part in argv]
    with pytest.raises(SystemExit) as stopped:
        bench_memory.main(["--locomo", str(write_locomo(tmp_path / "locomo.json")), *argv])
    assert stopped.value.code == 2 and says in capsys.readouterr().err


def test_bench_memory_refuses_a_file_that_is_not_locomo_in_one_line(tmp_path, capsys) -> None:
    from benchmarks import bench_memory

    other = tmp_path / "other.json"
    other.write_text('{"turns": []}')
    with pytest.raises(SystemExit) as stopped:
        bench_memory.main(["--locomo", str(other)])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and f"--locomo {other}: " in err and "Traceback" not in err


def test_bench_memory_stopped_by_sigterm_removes_its_scratch_stores(tmp_path) -> None:
    """``timeout`` sends SIGTERM: the run exits through its context managers as on Ctrl-C."""
    from tests.test_evaluate import write_locomo

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    locomo = write_locomo(tmp_path / "l.json")
    command = [sys.executable, "-m", "benchmarks.bench_memory", "--locomo", str(locomo), "--sizes", "20",
               "--users", "0", "--searches", "1"]
    run = subprocess.Popen(command, cwd=REPO, env={**os.environ, "TMPDIR": str(scratch)},
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while not list(scratch.iterdir()) and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert run.poll() is None and list(scratch.iterdir()), "the run made no scratch directory"
        run.send_signal(signal.SIGTERM)
        assert run.wait(120) == 128 + signal.SIGTERM
    finally:
        run.kill()
        run.wait()
    assert not list(scratch.iterdir())


def test_bench_memory_takes_the_ingest_ratio_as_turns_per_second_over_the_floors_and_judges_it() -> None:
    """300 turns ingested in 20 s where the batch floor took 6 s: 15 against 50 turns/s, 0.3 of
    the floor, short of the goal of half; 2 s would be 1.5 of it."""
    from benchmarks.bench_memory import GOALS, ingest_rates

    rates = ingest_rates(300, ingest_s=20.0, batch_s=6.0)
    assert (rates["ingest_turns_per_s"], rates["floor_turns_per_s"]) == (15.0, 50.0)
    assert rates["ingest_ratio_to_floor"] == pytest.approx(0.3)
    goal = "add.ingest_ratio_to_floor >= 0.5"
    assert timing.apply_goals({"add": rates}, GOALS)[goal] is False
    assert timing.apply_goals({"add": ingest_rates(300, ingest_s=2.0, batch_s=3.0)}, GOALS)[goal] is True


@pytest.mark.parametrize(("main", "argv", "says"), [
    (bench_fingerprint.main, ["--checkpoint", "/nowhere"], "/nowhere: fingerprinter directory not found"),
    (bench_fingerprint.main, ["--path", "/nowhere.json"], "/nowhere.json: cannot read"),
    (bench_fingerprint.main, ["--data", "dailydialog", "--path", "/nowhere"], "DailyDialog file not found"),
    (bench_fingerprint.main, ["--threads", "0"], "argument --threads"),
    (bench_fingerprint.main, ["--rounds", "1"], "argument --rounds: expected a whole number at least 2"),
    (bench_quantizer.main, ["--threads", "-2"], "argument --threads"),
    (bench_quantizer.main, ["--steps", "0"], "argument --steps"),
    (bench_quantizer.main, ["--rounds", "0"], "argument --rounds"),
    (bench_retrieval.main, ["--sizes", "0"], "argument --sizes"),
    (bench_retrieval.main, ["--queries", "0"], "argument --queries"),
    (bench_retrieval.main, ["--num-codes", "0"], "argument --num-codes"),
    (bench_retrieval.main, ["--sizes", "10", "--k", "20"],
     "--k 20 is more than the smallest of --sizes (10)"),
    (bench_retrieval.main, ["--num-codes", "16"], "--topic-size 32 is more than --num-codes (16)"),
    (bench_retrieval.main, ["--amu-codes", "9", "3"], "--amu-codes 9 3: LOW is more than HIGH"),
    (bench_retrieval.main, ["--topic-share", "2"], "argument --topic-share"),
    (gpu_check.main, ["--tiny", "--steps", "0"], "argument --steps: expected a whole number at least 1"),
    (gpu_check.main, ["--tiny", "--warmup", "-1"], "argument --warmup"),
    (gpu_check.main, ["--batch", "0"], "argument --batch"),
    (gpu_check.main, ["--tiny", "--profile", "-2"], "argument --profile"),
    (gpu_check.main, ["--peak-tflops", "0"], "argument --peak-tflops: expected a number at least 1")])
def test_the_model_benchmarks_refuse_bad_input_in_one_line(main, argv, says, capsys) -> None:
    """A bad value, or a checkpoint or data file that is not there, is one argparse ``error:`` line
    (exit status 2) before any work, not a traceback."""
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize("main", [bench_fingerprint.main, bench_quantizer.main, bench_retrieval.main,
                                  gpu_check.main, "bench_memory", "bench_service"])
def test_every_benchmark_refuses_a_json_path_it_cannot_write_before_any_work(main, tmp_path, capsys) -> None:
    """The figures are written at the end of a run: a directory, or a path under a file, is one
    ``error:`` line at the start instead of a traceback that loses them."""
    if isinstance(main, str):
        from importlib import import_module

        main = import_module(f"benchmarks.{main}").main
    (tmp_path / "afile").write_text("")
    for path, says in ((tmp_path, "is a directory"), (tmp_path / "afile" / "x.json", "cannot be written")):
        with pytest.raises(SystemExit) as stopped:
            main(["--json", str(path)])
        assert stopped.value.code == 2 and f"argument --json: {path} {says}" in capsys.readouterr().err

