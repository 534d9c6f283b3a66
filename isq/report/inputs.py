"""The report's input files: the text sample (given, or the default one) and a Lightning CSV
training log (a file, or the run directory holding it)."""

from __future__ import annotations

import csv
import io
import os
import tempfile
from pathlib import Path

import numpy as np

from isq.dailydialog import EOU, ROOT_ENV, DataFormatError, load_splits, read_dialogues
from isq.synthetic import SYNTHETIC, write_synthetic_corpus

REPO = Path(__file__).resolve().parents[2]
"""The source checkout's root (in an installed package: its site-packages, which has no
``pyproject.toml``)."""
METRICS_NAME = "metrics.csv"


class InputError(ValueError):
    """Bad command-line input; the message names the file."""


def read_texts(path: Path) -> list[str]:
    """Non-empty, stripped lines of ``path``; or, for a DailyDialog ``dialogues_*.txt`` file (one
    with ``__eou__`` separators), its detokenised utterances in order.

    A dialogue file goes through :func:`isq.dailydialog.read_dialogues`, the reader training
    uses, so the analysis sees the text the codebook was trained on ("it's", not "it ' s").
    """
    if not path.is_file():
        raise InputError(f"texts file not found: {path}")
    lines = utf8_text(path).splitlines()
    if any(EOU in line for line in lines):
        try:
            return [utterance for dialogue in read_dialogues(path) for utterance in dialogue]
        except DataFormatError as err:
            raise InputError(f"not a DailyDialog dialogue file: {err}") from err
    texts = [line.strip() for line in lines if line.strip()]
    if not texts:
        raise InputError(f"texts file has no text: {path}")
    return texts


def repository_root() -> Path:
    """The root relative paths are taken against (the notebooks' fingerprinters and samples): this
    source checkout, wherever the caller runs; where the package is installed, the working
    directory."""
    return REPO if (REPO / "pyproject.toml").is_file() else Path.cwd()


def default_sample(repo: Path | None = None) -> tuple[list[str], str]:
    """The texts analysed when none are given, and where they came from: the DailyDialog
    validation utterances under ``$ISQ_DAILYDIALOG``, less the dialogues train also holds (the
    validation split training read, :func:`isq.dailydialog.load_splits`; a relative path is taken against the
    repository root ``repo``, wherever the caller runs; by default this source checkout's, and
    the working directory where the package is installed instead); unset (or
    ``ISQ_DAILYDIALOG=synthetic``), the validation split of the project's synthetic corpus. A set
    ``$ISQ_DAILYDIALOG`` that holds no release (or is empty) is an error, never a silent fallback."""
    if repo is None:
        repo = repository_root()
    configured = os.environ.get(ROOT_ENV)
    if configured is not None and not configured.strip():  # a variable expanded from an unset one
        raise InputError(f"${ROOT_ENV} is set but empty: give a DailyDialog root, or unset it (or set it to "
                         f"{SYNTHETIC}) for the synthetic corpus")
    if configured is not None and configured != SYNTHETIC:
        validation = repo / Path(configured) / "validation" / "dialogues_validation.txt"  # absolute: as given
        if not validation.is_file():
            raise InputError(f"${ROOT_ENV}={configured}: no DailyDialog release there "
                             f"({validation} not found)")
        try:
            splits = load_splits(validation.parents[1])
        except (OSError, DataFormatError) as err:
            raise InputError(f"${ROOT_ENV}={configured}: {err}") from err
        texts = [utterance for dialogue in splits.dialogues["validation"] for utterance in dialogue]
        left_out = f"{splits.leaked['validation']} dialogues also in train left out"
        if not texts:
            raise InputError(f"${ROOT_ENV}={configured}: no validation utterances to analyse ({left_out}); "
                             "give texts with --texts")
        return texts, f"DailyDialog validation ({validation.resolve()}; {left_out})"
    with tempfile.TemporaryDirectory() as tmp:
        texts = read_texts(write_synthetic_corpus(tmp) / "validation" / "dialogues_validation.txt")
    return texts, "the project's synthetic corpus, validation split"


def read_metrics_log(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each metric column of a Lightning CSV log as (steps, values), skipping empty cells.

    ``path`` is a ``metrics.csv`` or a training run's directory holding one (every run writes
    it there, whatever its logger). CSVLogger writes one row per logging call with only that
    call's columns filled, so every column is its own sparse series over the ``step`` column.
    """
    if path.is_dir():
        path = path / METRICS_NAME
    if not path.is_file():
        raise InputError(f"training log not found: {path}")
    reader = csv.DictReader(io.StringIO(utf8_text(path), newline=""))
    if "step" not in (reader.fieldnames or []):
        raise InputError(f"{path}: not a Lightning CSV log (no 'step' column)")
    series: dict[str, tuple[list[float], list[float]]] = {}
    for row in reader:
        if None in row:  # DictReader's key for cells beyond the header's columns
            raise InputError(f"{path}:{reader.line_num}: more cells than the header has columns")
        if not row["step"]:
            continue
        for column, value in row.items():
            if column in ("step", "epoch") or not value:
                continue
            steps, values = series.setdefault(column, ([], []))
            try:
                steps.append(float(row["step"]))
                values.append(float(value))
            except ValueError as err:
                raise InputError(f"{path}:{reader.line_num}: column {column}: {err}") from err
    if not series:  # a report without its curves would not say why they are missing
        raise InputError(f"{path}: no values logged (a run stopped before its first logged step?); "
                         "leave --log out for a report without training curves")
    return {column: (np.array(steps), np.array(values)) for column, (steps, values) in series.items()}


def utf8_text(path: Path) -> str:
    """The file's text, or :class:`InputError` when it is not UTF-8 (a checkpoint given by mistake)."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from err
