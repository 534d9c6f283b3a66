"""The codebook: N_c Euclidean code vectors, their nearest-code lookup, EMA update and revival.

docs/design.md §1.3-§1.5 (lookup, EMA update, dead-code revival). One module serves
training (:class:`isq.quantizer.EMAQuantizer` adds the straight-through estimator and the
losses on top) and inference (:class:`isq.fingerprint.Fingerprinter` holds a frozen one).

Everything here runs in an fp32 island with autocast disabled, so bf16-mixed training never
rounds distances, EMA statistics or code vectors.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor, nn


def fp32_island() -> contextlib.ExitStack:
    """Disable autocast for every device type torch knows here (cpu, cuda, ...)."""
    stack = contextlib.ExitStack()
    for device_type in ("cpu", "cuda", "xpu", "mps"):
        with contextlib.suppress(RuntimeError, ValueError):
            stack.enter_context(torch.autocast(device_type=device_type, enabled=False))
    return stack


def squared_distances(z: Tensor, vectors: Tensor) -> Tensor:
    """||z_i - e_j||^2 for z (n, d) and vectors (N, d), via one matmul: |z|^2 - 2 z e^T + |e|^2."""
    return torch.addmm(
        z.pow(2).sum(1, keepdim=True) + vectors.pow(2).sum(1).unsqueeze(0),
        z, vectors.t(), beta=1.0, alpha=-2.0,
    ).clamp_min_(0.0)


def perplexity(counts: Tensor) -> Tensor:
    """exp(entropy) of the code distribution given by per-code counts; 0 when nothing was counted."""
    total = counts.sum()
    if total == 0:
        return torch.zeros((), device=counts.device)
    p = counts / total
    return torch.exp(-(p * torch.log(p.clamp_min(1e-12))).sum())


def distributed() -> bool:
    """True inside an initialised process group of more than one rank (checked per call)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class Lookup(NamedTuple):
    """Nearest codes of n vectors: ``indices`` (n,), ``errors`` ||z - e_k||² (n,) and the full
    squared ``distances`` (n, N_c), all fp32."""

    indices: Tensor
    errors: Tensor
    distances: Tensor


class Codebook(nn.Module):
    """N_c code vectors of dimension D (buffer ``vectors``), and, unless ``frozen``, their EMA
    statistics: Laplace-smoothed cluster sizes and embedding sums, and the per-window code
    counts that decide which codes are dead.

    Args (named as in :class:`isq.config.ISQConfig`):
        num_codes: N_c (default 1024, docs/design.md §1.3).
        code_dim: code dimension.
        ema_decay: EMA decay of cluster sizes and embedding sums (0.99).
        ema_eps: Laplace smoothing constant of the cluster sizes (1e-5).
        frozen: only the vectors (a fingerprinter's codebook): no statistics, no update.
    """

    vectors: Tensor
    cluster_size: Tensor
    embed_sum: Tensor
    window_counts: Tensor
    window_steps: Tensor

    def __init__(self, num_codes: int = 1024, code_dim: int = 256, ema_decay: float = 0.99,
                 ema_eps: float = 1e-5, frozen: bool = False) -> None:
        super().__init__()
        if num_codes < 1 or code_dim < 1:
            raise ValueError(f"num_codes and code_dim must be positive, got {num_codes} and {code_dim}")
        self.num_codes, self.code_dim = num_codes, code_dim
        self.ema_decay, self.ema_eps, self.frozen = ema_decay, ema_eps, frozen
        vectors = torch.empty(num_codes, code_dim)
        if frozen:
            vectors.zero_()  # filled by the caller (an exported codebook)
        else:
            nn.init.kaiming_uniform_(vectors)
        self.register_buffer("vectors", vectors)
        if not frozen:
            # Size 1 and sum = code make the first EMA steps a gentle blend rather than a jump.
            self.register_buffer("cluster_size", torch.ones(num_codes))
            self.register_buffer("embed_sum", vectors.clone())
            self.register_buffer("window_counts", torch.zeros(num_codes))
            self.register_buffer("window_steps", torch.zeros((), dtype=torch.long))

    @classmethod
    def from_vectors(cls, vectors: Tensor) -> Codebook:
        """A frozen codebook holding a copy of ``vectors`` (N_c, D) as fp32."""
        codebook = cls(vectors.shape[0], vectors.shape[1], frozen=True)
        codebook.vectors.copy_(vectors.detach().float())
        return codebook

    # ------------------------------------------------------------------ lookup
    def nearest(self, z: Tensor) -> Lookup:
        """The nearest code of every row of z (n, D), the one lookup of the project.

        While autograd records ``z``, the distances are taken against a copy of the vectors, so
        their backward (the entropy regulariser's) survives an in-place EMA update before it.
        """
        with fp32_island():
            vectors = self.vectors.clone() if torch.is_grad_enabled() and z.requires_grad else self.vectors
            distances = squared_distances(z.float(), vectors)
            errors, indices = distances.min(dim=1)
        return Lookup(indices, errors, distances)

    # ------------------------------------------------------------------ EMA
    @torch.no_grad()
    def ema_update(self, z: Tensor, indices: Tensor, counts: Tensor | None = None) -> None:
        """One EMA step from the real-token vectors z (n, D), their codes and (if already computed)
        the per-code counts of this step; counts and sums are SUM-all-reduced across ranks."""
        self._require_statistics()
        with fp32_island():
            counts = (torch.bincount(indices, minlength=self.num_codes).float() if counts is None
                      else counts.clone())
            sums = torch.zeros(self.num_codes, self.code_dim, device=z.device)
            sums.index_add_(0, indices, z.float())
            if distributed():  # checked per call: a module built before init_process_group still syncs
                dist.all_reduce(counts, op=dist.ReduceOp.SUM)
                dist.all_reduce(sums, op=dist.ReduceOp.SUM)
            self.cluster_size.mul_(self.ema_decay).add_(counts, alpha=1 - self.ema_decay)
            self.embed_sum.mul_(self.ema_decay).add_(sums, alpha=1 - self.ema_decay)
            self.window_counts.add_(counts)
            self._refresh()

    @torch.no_grad()
    def _refresh(self) -> None:
        """Codes = EMA sums / Laplace-smoothed EMA sizes."""
        total = self.cluster_size.sum()
        smoothed = (self.cluster_size + self.ema_eps) / (total + self.num_codes * self.ema_eps) * total
        self.vectors.copy_(self.embed_sum / smoothed.unsqueeze(1))

    @torch.no_grad()
    def load(self, vectors: Tensor) -> None:
        """Start from given code vectors: each code's EMA size is set to 1 and its EMA sum to the
        code, as at construction, so the first EMA steps blend new assignments into them."""
        if tuple(vectors.shape) != (self.num_codes, self.code_dim):
            raise ValueError(f"codebook of shape {tuple(vectors.shape)} does not fit a codebook of "
                             f"{self.num_codes} codes x {self.code_dim} dimensions")
        self.vectors.copy_(vectors)
        if not self.frozen:
            self.cluster_size.fill_(1.0)
            self.embed_sum.copy_(self.vectors)

    # ------------------------------------------------------------------ revival
    @torch.no_grad()
    def close_window_if_due(self, revive_every: int, revive_threshold: float) -> Tensor | None:
        """Count one optimizer step; after ``revive_every`` steps return the dead codes (bool mask:
        mean per-step count over the window below ``revive_threshold``) and start a new window."""
        self._require_statistics()
        self.window_steps += 1
        if int(self.window_steps) < revive_every:
            return None
        dead = self.window_counts / self.window_steps.float() < revive_threshold
        self.window_counts.zero_()
        self.window_steps.zero_()
        return dead

    @torch.no_grad()
    def revive(self, dead: Tensor, candidates: Tensor) -> int:
        """Re-initialise the ``dead`` codes (bool mask) from random rows of ``candidates``.

        Code vector, EMA size and EMA sum are reset together, so the next EMA step starts from
        the sample instead of overwriting it. Rank 0 draws; the draw is broadcast to all ranks,
        which revive whenever rank 0 has candidates, whether or not they have any (``dead`` is the
        same on every rank: the window counts are reduced across them).
        """
        self._require_statistics()
        dead_idx = dead.nonzero().squeeze(1)
        n_dead, n_cand = dead_idx.numel(), candidates.shape[0]
        drawn = n_cand if not distributed() else self._rank_zero_count(n_cand, candidates.device)
        if n_dead == 0 or drawn == 0:
            return 0
        if n_cand:
            pick = (torch.randperm(n_cand, device=candidates.device)[:n_dead] if n_dead <= n_cand
                    else torch.randint(n_cand, (n_dead,), device=candidates.device))
            samples = candidates[pick].float().contiguous()
        else:  # a rank without candidates of its own receives rank 0's draw
            samples = torch.zeros((n_dead, self.code_dim), dtype=torch.float32, device=candidates.device)
        if distributed():
            dist.broadcast(samples, src=0)
        self.vectors[dead_idx] = samples
        self.cluster_size[dead_idx] = 1.0
        self.embed_sum[dead_idx] = samples
        # Re-derive every code from the updated statistics (the total size changed).
        self._refresh()
        return n_dead

    @staticmethod
    def _rank_zero_count(count: int, device: torch.device) -> int:
        """Rank 0's ``count``, on every rank (whether rank 0 draws decides whether all revive)."""
        shared = torch.tensor([count], dtype=torch.int64, device=device)
        dist.broadcast(shared, src=0)
        return int(shared.item())

    def _require_statistics(self) -> None:
        if self.frozen:
            raise RuntimeError("a frozen codebook has no EMA statistics to update")


@torch.no_grad()
def kmeans(z: Tensor, k: int, iters: int = 10) -> Tensor:
    """Lloyd's k-means of the rows of z (n, D) into k <= n centroids, seeded by k random rows."""
    centroids = z[torch.randperm(z.shape[0], device=z.device)[:k]].clone()
    for _ in range(iters):
        assign = squared_distances(z, centroids).argmin(1)
        counts = torch.bincount(assign, minlength=k).float()
        sums = torch.zeros_like(centroids).index_add_(0, assign, z)
        filled = counts > 0
        centroids[filled] = sums[filled] / counts[filled].unsqueeze(1)
    return centroids
