"""Codebook report: the analysis figures as PNG files plus a Markdown summary.

    python -m isq.report DIR [--texts FILE] --out REPORT_DIR [--log RUN_DIR_OR_CSV] [--sample N]

``DIR`` is an exported fingerprinter; ``FILE`` holds one text per line, or is a DailyDialog
``dialogues_*.txt`` file (detected by its ``__eou__`` separators, read as training reads it:
detokenised utterances). Without ``--texts`` the DailyDialog validation split under
``$ISQ_DAILYDIALOG`` is read when that is set, else the project's synthetic corpus
(:func:`isq.report.inputs.default_sample`; the command prints which). ``--log`` adds the
training-time view from a training run's directory or its ``metrics.csv``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import matplotlib

from isq.analysis import sample_texts
from isq.fingerprint import Fingerprinter
from isq.outputs import unwritable
from isq.report.analyse import analyse
from isq.report.document import write_report
from isq.report.inputs import InputError, default_sample, read_metrics_log, read_texts


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m isq.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("fingerprinter", type=Path, help="exported fingerprinter directory")
    parser.add_argument("--texts", type=Path,
                        help="one text per line, or a DailyDialog dialogues_*.txt file (default: DailyDialog "
                             "validation from $ISQ_DAILYDIALOG, else the synthetic corpus)")
    parser.add_argument("--out", type=Path, required=True,
                        help="report directory (created; its earlier report files are replaced)")
    parser.add_argument("--log", type=Path,
                        help="a training run's directory (runs/<name>/version_N) or its metrics.csv")
    parser.add_argument("--sample", type=int, help="analyse a random sample of N texts (seed 0)")
    parser.add_argument("--words", help="comma-separated words whose codes to list (default: frequent words)")
    parser.add_argument("--batch-size", type=int, default=64)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status (2 with one error line on bad input)."""
    args = _parser().parse_args(argv)
    try:
        if not (args.fingerprinter / "config.json").is_file():
            raise InputError(f"fingerprinter directory not found (no config.json): {args.fingerprinter}")
        if args.sample is not None and args.sample < 1:
            raise InputError(f"--sample must be positive, got {args.sample}")
        if args.batch_size < 1:
            raise InputError(f"--batch-size must be positive, got {args.batch_size}")
        if (problem := unwritable(args.out, directory=True)) is not None:
            raise InputError(f"--out {problem}")
        texts, source = (read_texts(args.texts), str(args.texts)) if args.texts else default_sample()
        log = read_metrics_log(args.log) if args.log else None
        try:
            fingerprinter = Fingerprinter.from_pretrained(args.fingerprinter)
        except (OSError, ValueError) as err:
            raise InputError(f"cannot load fingerprinter {args.fingerprinter}: {err}") from err
    except InputError as err:
        print(f"isq.report: error: {err}", file=sys.stderr)
        return 2
    matplotlib.use("Agg")  # files only: no window even if something imports pyplot
    if args.sample:
        texts = sample_texts(texts, args.sample)
    print(f"{len(texts)} texts from {source}")
    words = [w.strip() for w in args.words.split(",") if w.strip()] if args.words else []
    analysis = analyse(fingerprinter, texts, words, args.batch_size)
    path = write_report(analysis, args.out, str(args.fingerprinter), source, log)
    print(f"wrote {path}")
    return 0
