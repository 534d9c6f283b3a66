"""Where the benchmarks find the LoCoMo dev file: ``$ISQ_LOCOMO`` when set, else
``../shared/data/locomo/locomo_dev.json`` beside the checkout (``--locomo`` overrides both)."""

from __future__ import annotations

import os
from pathlib import Path

LOCOMO_ENV = "ISQ_LOCOMO"
ROOT = Path(__file__).resolve().parents[1]
FINGERPRINTER = ROOT / "checkpoints" / "isq_minilm_dailydialog_cpu"
"""The committed fingerprinter both serving benchmarks default to (the shipped form)."""


def default_locomo() -> Path:
    """The LoCoMo dev file the benchmarks read unless told another."""
    named = os.environ.get(LOCOMO_ENV)
    return Path(named) if named else ROOT.parent / "shared" / "data" / "locomo" / "locomo_dev.json"


LOCOMO_HELP = (f"the LoCoMo dev file (default: ${LOCOMO_ENV}, else ../shared/data/locomo/locomo_dev.json "
               "beside the checkout)")
"""``--locomo``'s help, the same in every benchmark that reads the file."""


def missing_locomo(path: Path) -> str | None:
    """One line saying what to pass when ``path`` is not a file, else None."""
    if path.is_file():
        return None
    return f"--locomo {path}: no such file (pass --locomo PATH or set {LOCOMO_ENV}=PATH)"
