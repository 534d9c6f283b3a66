"""Epoch-level codebook statistics as a torchmetrics ``Metric``: per-code counts summed over
batches and, under DDP, over ranks (``dist_reduce_fx="sum"``), so the validation perplexity is
that of the whole split, not a mean of per-batch perplexities."""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric

from isq.codebook import perplexity


class CodebookUsage(Metric):
    """Counts of every code over the epoch's real tokens; ``compute`` gives the codebook
    perplexity, the number of codes used and their share of the codebook."""

    full_state_update = False

    counts: Tensor  # per-code counts, a torchmetrics state (add_state)

    def __init__(self, num_codes: int) -> None:
        super().__init__()
        self.num_codes = num_codes
        self.add_state("counts", default=torch.zeros(num_codes), dist_reduce_fx="sum")

    def update(self, indices: Tensor) -> None:  # type: ignore[override]
        """``indices``: code per position, -1 at padding."""
        codes = indices[indices >= 0]
        self.counts += torch.bincount(codes, minlength=self.num_codes).to(self.counts.dtype)

    def compute(self) -> dict[str, Tensor]:  # type: ignore[override]
        used = (self.counts > 0).sum().float()
        return {"codebook_perplexity": perplexity(self.counts), "codes_used": used,
                "codes_used_frac": used / self.num_codes}
