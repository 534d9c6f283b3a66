"""The report's input files: the text sample and a Lightning CSV training log."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from isq.dailydialog import EOU, DataFormatError, read_dialogues


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
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from err
    if any(EOU in line for line in lines):
        try:
            return [utterance for dialogue in read_dialogues(path) for utterance in dialogue]
        except DataFormatError as err:
            raise InputError(f"not a DailyDialog dialogue file: {err}") from err
    texts = [line.strip() for line in lines if line.strip()]
    if not texts:
        raise InputError(f"texts file has no text: {path}")
    return texts


def read_metrics_log(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each metric column of a Lightning CSV log as (steps, values), skipping empty cells.

    CSVLogger writes one row per logging call with only that call's columns filled, so every
    column is its own sparse series over the ``step`` column.
    """
    if not path.is_file():
        raise InputError(f"training log not found: {path}")
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if "step" not in (reader.fieldnames or []):
            raise InputError(f"{path}: not a Lightning CSV log (no 'step' column)")
        series: dict[str, tuple[list[float], list[float]]] = {}
        for row in reader:
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
    return {column: (np.array(steps), np.array(values)) for column, (steps, values) in series.items()}
