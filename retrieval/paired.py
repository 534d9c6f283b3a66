"""Paired comparison of retrieval configurations, from an evaluation's ``questions.jsonl``.

    python -m retrieval.paired OUT/questions.jsonl --baseline dense40 dense20+code20 dense20+kmeans20

Every configuration of one evaluation answers the same questions, so the per-question
difference in evidence recall cancels how hard each question is. For each configuration against
the baseline this prints, overall and per category, the mean difference in recall points, a 95%
percentile-bootstrap interval over questions (``scipy.stats.bootstrap`` with a fixed seed), and
how many questions got better and worse. The interval treats the questions as independent draws;
those of one conversation share a memory, so on few conversations it is if anything too narrow
and holds for these conversations only (``--by-conversation`` shows each apart). Runs pooled with
``--pool`` (seeds) are averaged question by question and the interval leaves out how much they
differ, unless ``--resample-runs`` draws them too (which holds only part of it: a resample of
n runs from n spans no more than the runs do, docs/design.md §6.2). Questions of a conversation
that cite a common evidence turn are one draw with ``--evidence-units``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from isq.outputs import output_file
from retrieval.eval.forest import FOREST_TITLE, label, plot_forest
from retrieval.eval.paired_differences import compare, render

MIN_RESAMPLES, MAX_RESAMPLES = 1_000, 1_000_000
"""Fewer bootstrap resamples would leave each tail of a 95% interval a handful of resampled means
(one resample gives an interval that need not hold its own mean); more would hold gigabytes of
them for nothing."""


def whole_number(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high`` (argparse names the option)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected a whole number from {low} to {high:,}, got {text!r}")
        return value
    return parse


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m retrieval.paired", description=__doc__.split("\n\n")[0])
    parser.add_argument("questions", type=Path,
                        help="questions.jsonl written by python -m retrieval.evaluate")
    parser.add_argument("configs", nargs="+", help="configurations to compare with the baseline")
    parser.add_argument("--baseline", required=True, help="configuration to subtract, e.g. dense40")
    parser.add_argument("--pool", type=Path, action="append", default=[], metavar="QUESTIONS",
                        help="questions.jsonl of another run over the same questions (e.g. another training "
                             "seed); recalls are averaged over all runs question by question (repeatable)")
    parser.add_argument("--with", dest="tagged", action="append", default=[], metavar="QUESTIONS:TAG",
                        help="another run over the same questions whose configurations join as CONFIG@TAG, "
                             "e.g. --with consolidated/questions.jsonl:consolidated then "
                             "dense40@consolidated; runs given with the same TAG are averaged like --pool")
    parser.add_argument("--resample-runs", action="store_true",
                        help="each bootstrap resample also draws the pooled runs (--pool, --with) with "
                             "replacement, so the interval holds part of how much the runs (seeds) differ "
                             "(with few runs it stays too narrow: docs/design.md §6.2)")
    parser.add_argument("--by-conversation", action="store_true",
                        help="add one group per conversation to the table")
    parser.add_argument("--evidence-units", action="store_true",
                        help="resample the questions of a conversation that cite a common evidence turn "
                             "(transitively) as one draw, not as independent questions")
    parser.add_argument("--forest", type=output_file, metavar="PNG",
                        help="also draw the table as a forest plot (one panel per group) into this PNG file")
    parser.add_argument("--resamples", type=whole_number(MIN_RESAMPLES, MAX_RESAMPLES), default=2000,
                        help=f"bootstrap resamples per interval ({MIN_RESAMPLES:,} to {MAX_RESAMPLES:,})")
    parser.add_argument("--seed", type=whole_number(0, 2**32 - 1), default=0)
    args = parser.parse_args(argv)
    try:
        tagged: dict[str, list[Path]] = {}
        for item in args.tagged:
            path, _, tag = item.rpartition(":")
            if not path or not tag:
                raise ValueError(f"--with {item!r}: expected QUESTIONS:TAG")
            tagged.setdefault(tag, []).append(Path(path))
        inputs = [args.questions, *args.pool, *(p for paths in tagged.values() for p in paths)]
        if args.forest is not None and any(Path(p).resolve() == args.forest.resolve() for p in inputs):
            raise ValueError(f"--forest {args.forest} is a questions file this reads: it would be replaced")
        table = compare([args.questions, *args.pool], args.baseline, args.configs, args.resamples, args.seed,
                        tagged, resample_runs=args.resample_runs, by_conversation=args.by_conversation,
                        by_evidence_unit=args.evidence_units)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(render(args.baseline, table))
    if args.forest is not None:
        try:
            plot_forest({label(name, args.baseline): row for name, row in table.items()}, args.forest,
                        FOREST_TITLE)
        except OSError as err:
            print(f"error: {args.forest}: {err}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
