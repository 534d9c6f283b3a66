"""The CPU recipe trained about 100x longer on one GPU, then evaluated on the LoCoMo dev file.

Trains ``configs/isq_minilm_dailydialog_gpu.yaml`` (bf16-mixed, LoRA rank 8, 10,000 steps of 128
pairs from the committed k-means control, stopped after 9 minutes at the latest) with
``python -m training.fit``, evaluates the export with ``python -m retrieval.evaluate`` against
the control (the code channel of multi-route retrieval and of the dual path, Path B alone, the
lexical baselines), and writes ``OUT/summary.json``: the steps reached, the wall times, overall
recall per configuration and the paired differences that say whether training beats its
starting point (trained − k-means as the code channel of ``multi+code``; each code channel −
``multi``), computed by :mod:`retrieval.eval.paired_differences` from the run's ``questions.jsonl``.

    python benchmarks/gpu_long_run.py --data-root ../shared/data/dailydialog \\
        --locomo ../shared/data/locomo/locomo_dev.json --out runs/gpu_long
    python benchmarks/gpu_long_run.py --tiny --locomo LOCOMO.json --out /tmp/gpu_long_tiny   # CPU, 2 steps
    python benchmarks/gpu_long_run.py --max-minutes 4 --out runs/gpu_long   # a shorter lease: train 4 minutes
    python benchmarks/gpu_long_run.py --seed 1 --out runs/gpu_long_seed1   # seed 1, not the config's 0

``--tiny`` runs the same config on the CPU (32-true) for 2 steps of 4 pairs of the project's
synthetic corpus, to check the whole path (LoRA on the warm start, export, evaluation, summary)
without a GPU. Bad input is one ``error:`` line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.arguments import within  # noqa: E402
from isq.outputs import output_directory  # noqa: E402
from retrieval.eval.paired_differences import compare  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "isq_minilm_dailydialog_gpu.yaml"
CONTROL = REPO / "checkpoints" / "kmeans_minilm_dailydialog"
RUN_NAME = "isq_minilm_dailydialog_gpu"
CONFIGS = ("dense40", "dense20+bm25_20", "dense20+code20", "dense20+kmeans20", "code40", "kmeans40", "multi",
           "multi+code", "multi+kmeans")
COMPARISONS = (("multi+code", "multi+kmeans"), ("multi+code", "multi"), ("multi+kmeans", "multi"),
               ("dense20+code20", "dense20+kmeans20"), ("code40", "kmeans40"))
TINY = ("--trainer.accelerator", "cpu", "--trainer.precision", "32-true", "--trainer.max_steps", "2",
        "--trainer.max_time", "null", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "1",
        "--data.batch_size", "4", "--data.num_workers", "0", "--data.limit_train_dialogues", "8",
        "--model.warmup_steps", "1")


class RunError(RuntimeError):
    """A step of the run failed; the message names the step and its last output line."""


def _run(step: str, command: Sequence[str]) -> None:
    result = subprocess.run(list(command), cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()[-1]
        raise RunError(f"{step} failed (exit {result.returncode}): {last.removeprefix('error: ')}")


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (torch imported only here: the run trains in a subprocess)."""
    import torch

    return bool(torch.cuda.is_available())


def max_time(minutes: int) -> str:
    """Lightning's ``DD:HH:MM:SS`` for a whole number of minutes (``--max-minutes``, at least 1)."""
    return f"{minutes // 1440:02d}:{minutes // 60 % 24:02d}:{minutes % 60:02d}:00"


def train(data_root: str, out: Path, tiny: bool, minutes: int | None = None, seed: int | None = None) -> Path:
    """Train the GPU config (or its tiny CPU form), stopped after ``minutes`` when given rather
    than the config's 9, seeded with ``seed`` when given rather than the config's; returns the
    exported fingerprinter."""
    limit = ("--trainer.max_time", max_time(minutes)) if minutes is not None else ()
    seeded = ("--seed_everything", str(seed)) if seed is not None else ()
    _run("training", [sys.executable, "-m", "training.fit", "--config", str(CONFIG), "--data.root", data_root,
                      "--data.cache_dir", str(out / "cache"), "--trainer.enable_progress_bar", "false",
                      "--trainer.logger.init_args.save_dir", str(out / "runs"), *(TINY if tiny else ()),
                      *limit, *seeded])
    exports = sorted((out / "runs" / RUN_NAME).glob("version_*/fingerprinter"),
                     key=lambda p: p.stat().st_mtime)
    if not exports:
        raise RunError(f"training wrote no fingerprinter under {out / 'runs' / RUN_NAME}")
    return exports[-1]


def evaluate(fingerprinter: Path, locomo: Path, out: Path) -> Path:
    """Evaluate ``fingerprinter`` against the control on ``locomo``; returns its questions.jsonl."""
    _run("evaluation", [sys.executable, "-m", "retrieval.evaluate", "--locomo", str(locomo),
                        "--fingerprinter",
                        str(fingerprinter), "--kmeans-fingerprinter", str(CONTROL), "--configs",
                        ",".join(CONFIGS), "--out", str(out / "eval"), "--no-progress"])
    return out / "eval" / "questions.jsonl"


def summarise(fingerprinter: Path, questions: Path, seconds: dict[str, float]) -> dict:
    """The seed the run used, steps reached, wall times, overall recall and the paired differences
    of COMPARISONS."""
    record = json.loads((fingerprinter / "training_run.json").read_text())
    results = json.loads((questions.parent / "results.json").read_text())
    paired = {f"{name} − {baseline}": {group: vars(d)
                                       for group, d in compare(questions, baseline, [name])[name].items()}
              for name, baseline in COMPARISONS}
    return {"fingerprinter": str(fingerprinter), "seed": record.get("seed"),
            # the steps trained, and the step of the exported (best) checkpoint; a record written
            # before it named both has only the first, as global_step
            "trained_steps": record.get("trained_steps", record.get("global_step")),
            "exported_step": record.get("global_step") if "trained_steps" in record else None,
            "seconds": {k: round(v, 1) for k, v in seconds.items()},
            "recall": {name: summary["overall"]["recall"] for name, summary in results["configs"].items()},
            "paired": paired}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", default="../shared/data/dailydialog",
                        help="DailyDialog release directory")
    parser.add_argument("--locomo", type=Path, default=Path("../shared/data/locomo/locomo_dev.json"))
    parser.add_argument("--out", type=output_directory, required=True,
                        help="directory for the run, the evaluation and summary.json")
    parser.add_argument("--tiny", action="store_true",
                        help="2 CPU steps on the synthetic corpus (a test of the path)")
    parser.add_argument("--max-minutes", type=within(int, 1),
                        help="stop training after this many minutes instead of the config's 9 "
                             "(to fit a shorter lease; the summary reports the steps reached)")
    parser.add_argument("--seed", type=within(int, 0, 2**32 - 1),
                        help="seed everything with this instead of the config's seed_everything "
                             "(the summary reports the seed the run used)")
    args = parser.parse_args(argv)
    locomo = args.locomo if args.locomo.is_absolute() else Path.cwd() / args.locomo
    out = args.out if args.out.is_absolute() else Path.cwd() / args.out
    data_root = "synthetic" if args.tiny else str(Path(args.data_root).absolute())
    try:
        if not locomo.is_file():
            raise RunError(f"{locomo}: no such LoCoMo file")
        if not args.tiny and not Path(data_root, "train").is_dir():
            raise RunError(f"{data_root}: not a DailyDialog release directory (no train/)")
        if not args.tiny and not cuda_available():
            raise RunError("no CUDA device is available; run it on a GPU machine, or pass --tiny for the "
                           "same path on the CPU")
        started = time.perf_counter()
        fingerprinter = train(data_root, out, args.tiny, args.max_minutes, args.seed)
        trained = time.perf_counter()
        questions = evaluate(fingerprinter, locomo, out)
        seconds = {"train": trained - started, "evaluate": time.perf_counter() - trained}
        summary = summarise(fingerprinter, questions, seconds)
    except (RunError, OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    key = "multi+code − multi+kmeans"
    mean = summary["paired"][key]["overall"]["mean"]
    print(f"seed {summary['seed']}: {summary['trained_steps']} steps (exported: step "
          f"{summary['exported_step']}) in {seconds['train']:.0f} s; {key}: {mean:+.1f} points "
          f"-> {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
