"""Command-line argument types of the benchmarks: a bad value is one ``error:`` line from argparse
before any work starts, not a traceback minutes into a run."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from benchmarks.paths import missing_locomo
from benchmarks.postgres import unreachable
from isq.export import is_export
from isq.outputs import output_file


def within(kind: type[int] | type[float], low: float, high: float = float("inf")) -> Callable[[str], float]:
    """An argument of ``kind`` (int or float) from ``low`` to ``high``, both included."""
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            shown = (lambda bound: str(int(bound))) if kind is int else (lambda bound: f"{bound:g}")
            bounds = (f"at least {shown(low)}" if high == float("inf")
                      else f"from {shown(low)} to {shown(high)}")
            raise argparse.ArgumentTypeError(f"expected {'a whole number' if kind is int else 'a number'} "
                                             f"{bounds}, got {text!r}")
        return value
    return parse


def add_json_option(parser: argparse.ArgumentParser) -> None:
    """``--json PATH``: where the run writes its figures (checked before the run, since the figures
    are written at its end)."""
    parser.add_argument("--json", type=output_file,
                        help="write the figures to this JSON file (replaced if it exists)")


def refuse_unusable(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """One ``error:`` line for the first input the run cannot use: the LoCoMo file, the
    fingerprinter (None: the run takes none), the database (None: none given)."""
    problem = (missing_locomo(args.locomo) or _not_locomo(args.locomo) or _not_an_export(args.fingerprinter)
               or unreachable(args.database))
    if problem is not None:
        parser.error(problem)


def exit_on_sigterm() -> None:
    """SIGTERM (what ``timeout`` sends) exits like Ctrl-C does, through the ``finally`` blocks and
    context managers that stop the servers and remove the scratch stores."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def _not_locomo(path: Path) -> str | None:
    from retrieval.eval.locomo import load_locomo
    from retrieval.memory.records import InputFormatError

    try:
        load_locomo(path)
    except InputFormatError as err:
        return f"--locomo {path}: {err}"
    return None


def _not_an_export(fingerprinter: Path | None) -> str | None:
    if fingerprinter is None or is_export(fingerprinter):
        return None
    return f"--fingerprinter {fingerprinter}: not an exported fingerprinter (no config.json of one)"
