"""Stride-1 convolutional projection from encoder states to code space (SPEC section 1)."""

from __future__ import annotations

from torch import Tensor, nn


class StrideOneProjection(nn.Module):
    """``Conv1d(d_model -> code_dim, kernel_size, stride=1, padding=kernel_size // 2)``.

    Stride 1 keeps one code per token, so digits, names and timestamps are not blurred
    together; the output length equals the input length for every L (including 1).
    Padding positions are zeroed before the convolution so a real token's projection never
    depends on what the batch padded next to it.
    """

    def __init__(self, d_model: int, code_dim: int = 256, kernel_size: int = 3) -> None:
        super().__init__()
        if kernel_size % 2 != 1:
            raise ValueError(f"kernel_size must be odd to keep the length, got {kernel_size}")
        self.conv = nn.Conv1d(d_model, code_dim, kernel_size, stride=1, padding=kernel_size // 2)

    def forward(self, hidden: Tensor, mask: Tensor | None = None) -> Tensor:
        """(B, L, d_model) -> (B, L, code_dim)."""
        if mask is not None:
            hidden = hidden * mask.unsqueeze(-1).to(hidden.dtype)
        return self.conv(hidden.transpose(1, 2)).transpose(1, 2)
