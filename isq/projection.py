"""Stride-1 convolutional projection from encoder states to code space (docs/design.md §1.2)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

NORMALIZATIONS = ("none", "token", "layer")
"""Values of ``normalize_projection``: none (the paper's), per-dimension over tokens, per token."""


class MaskedTokenNorm(nn.Module):
    """Standardise each code dimension over the batch's real tokens (BatchNorm without affine,
    padding excluded), with running statistics for eval. Fixing the spread of z across tokens
    removes the collapse where the projection shrinks or aligns every z_t onto a few codes."""

    running_mean: Tensor
    running_var: Tensor

    def __init__(self, dim: int, momentum: float = 0.01, eps: float = 1e-5) -> None:
        super().__init__()
        self.momentum, self.eps = momentum, eps
        self.register_buffer("running_mean", torch.zeros(dim))
        self.register_buffer("running_var", torch.ones(dim))
        self.tracking = True
        """Whether a training forward moves the running statistics (:func:`statistics_kept`)."""

    def forward(self, z: Tensor, mask: Tensor | None = None) -> Tensor:
        if self.training:
            flat = z.reshape(-1, z.shape[-1]).float()
            if mask is not None:
                flat = flat[mask.reshape(-1).bool()]
            if flat.shape[0] > 1:
                mean, var = flat.mean(0), flat.var(0, unbiased=False)
                if self.tracking:
                    with torch.no_grad():
                        self.running_mean.lerp_(mean, self.momentum)
                        self.running_var.lerp_(var, self.momentum)
                return ((z - mean) / torch.sqrt(var + self.eps)).to(z.dtype)
        return ((z - self.running_mean) / torch.sqrt(self.running_var + self.eps)).to(z.dtype)


@contextmanager
def statistics_kept(module: nn.Module) -> Iterator[None]:
    """Training forwards of ``module`` inside the block normalise by their batch as usual but leave
    every :class:`MaskedTokenNorm`'s running statistics as they are: a second pass in one step
    (the next turn's codes for the contrastive term) would move them twice, the second time by
    other text than the contexts the codes are trained on."""
    norms = [child for child in module.modules() if isinstance(child, MaskedTokenNorm)]
    for norm in norms:
        norm.tracking = False
    try:
        yield
    finally:
        for norm in norms:
            norm.tracking = True


class StrideOneProjection(nn.Module):
    """``Conv1d(d_model -> code_dim, kernel_size, stride=1, padding=kernel_size // 2)``.

    Stride 1 keeps one code per token, so digits, names and timestamps are not blurred
    together; the output length equals the input length for every L (including 1).
    Padding positions are zeroed before the convolution so a real token's projection never
    depends on what the batch padded next to it.

    ``normalize_projection`` (named as in :class:`isq.config.ISQConfig`) follows the convolution
    with a normalisation without affine parameters:
    ``"token"`` (:class:`MaskedTokenNorm`, each dimension standardised across real tokens) or
    ``"layer"`` (LayerNorm over each z_t's dimensions); ``"none"`` is the bare convolution.
    """

    def __init__(self, d_model: int, code_dim: int = 256, kernel_size: int = 3,
                 normalize_projection: str = "none") -> None:
        super().__init__()
        if kernel_size % 2 != 1:
            raise ValueError(f"kernel_size must be odd to keep the length, got {kernel_size}")
        self.conv = nn.Conv1d(d_model, code_dim, kernel_size, stride=1, padding=kernel_size // 2)
        if normalize_projection not in NORMALIZATIONS:
            raise ValueError(f"normalize_projection must be one of {', '.join(NORMALIZATIONS)}, "
                             f"got {normalize_projection!r}")
        self.normalize_projection = normalize_projection
        self.norm: nn.Module | None = None
        if normalize_projection == "token":
            self.norm = MaskedTokenNorm(code_dim)
        elif normalize_projection == "layer":
            self.norm = nn.LayerNorm(code_dim, elementwise_affine=False)

    def forward(self, hidden: Tensor, mask: Tensor | None = None) -> Tensor:
        """(B, L, d_model) -> (B, L, code_dim)."""
        if mask is not None:
            hidden = hidden * mask.unsqueeze(-1).to(hidden.dtype)
        z: Tensor = self.conv(hidden.transpose(1, 2)).transpose(1, 2)
        if isinstance(self.norm, MaskedTokenNorm):
            z = self.norm(z, mask)
        elif isinstance(self.norm, nn.LayerNorm):
            z = self.norm(z)
        return z
