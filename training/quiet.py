"""Quiet what is not the user's business in a training run, keep what is.

Third-party messages that say nothing about this run: Lightning's advertisement for a hosted
logger, a deprecation inside Lightning's own pytree helper, and the warning about modules in
eval mode (a frozen encoder is kept in eval mode on purpose, see ``isq.encoder``), and the
checkpoint callback's "dirpath has changed" when a checkpoint is resumed or validated (every run
has its own directory by design; the export still takes the best checkpoint of the whole
history, :class:`training.callbacks.ExportFingerprinter`). Device lines,
the model summary, progress, metrics and every error stay.
"""

from __future__ import annotations

import logging
import warnings

QUIET_WARNINGS = (
    r".*module\(s\) in eval mode at the start of training",
    r".*isinstance\(treespec, LeafSpec\)` is deprecated",
    r"The dirpath has changed from .* won't be reloaded",
)
ADVERTISEMENT = "💡 Tip:"


class _DropAdvertisement(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(ADVERTISEMENT)


def quiet_third_party_noise() -> None:
    """Install the filters (idempotent: each filter is added once)."""
    for message in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _DropAdvertisement) for f in rank_zero.filters):
        rank_zero.addFilter(_DropAdvertisement())
