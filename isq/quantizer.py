"""EMA vector quantizer with dead-code reactivation (SPEC section 1, "EMA codebook").

Everything that touches the codebook runs in an fp32 island with autocast disabled, so
bf16-mixed training never rounds distances, EMA statistics or code vectors.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class QuantizerOutput:
    """What one quantizer call returns.

    ``quantized`` carries the straight-through gradient to ``z``; ``indices`` is -1 at padding.
    Losses are scalars averaged over the non-padding positions.
    """

    quantized: Tensor
    indices: Tensor
    commitment_loss: Tensor
    codebook_loss: Tensor
    entropy_loss: Tensor
    perplexity: Tensor
    codes_used: Tensor


def fp32_island() -> contextlib.ExitStack:
    """Disable autocast for every device type torch knows here (cpu, cuda, ...)."""
    stack = contextlib.ExitStack()
    for device_type in ("cpu", "cuda", "xpu", "mps"):
        with contextlib.suppress(RuntimeError, ValueError):
            stack.enter_context(torch.autocast(device_type=device_type, enabled=False))
    return stack


def squared_distances(z: Tensor, codebook: Tensor) -> Tensor:
    """||z_i - e_j||^2 for z (n, d) and codebook (N, d), via one matmul: |z|^2 - 2 z e^T + |e|^2."""
    return torch.addmm(
        z.pow(2).sum(1, keepdim=True) + codebook.pow(2).sum(1).unsqueeze(0),
        z, codebook.t(), beta=1.0, alpha=-2.0,
    ).clamp_min_(0.0)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class EMAQuantizer(nn.Module):
    """Euclidean codebook updated by exponential moving averages, with a plain STE.

    Args:
        num_codes: N_c, codebook size (SPEC default 1024).
        dim: code dimension (the projection's ``code_dim``).
        decay: EMA decay of cluster sizes and embedding sums (0.99).
        eps: Laplace smoothing constant for cluster sizes (1e-5).
        beta: commitment weight β in ``||sg[z] - e||² + β ||z - sg[e]||²`` (0.10).
        entropy_temperature: τ of the entropy regulariser's soft assignment (1.0).
        revive_every: optimizer steps per dead-code window (20).
        revive_threshold: a code is dead when its mean per-step count over the window is below this (1.0).
        kmeans_init: initialise the codebook by k-means on the first training batch.
        kmeans_iters: Lloyd iterations for that initialisation.
    """

    def __init__(
        self,
        num_codes: int = 1024,
        dim: int = 256,
        decay: float = 0.99,
        eps: float = 1e-5,
        beta: float = 0.10,
        entropy_temperature: float = 1.0,
        revive_every: int = 20,
        revive_threshold: float = 1.0,
        kmeans_init: bool = False,
        kmeans_iters: int = 10,
    ) -> None:
        super().__init__()
        if num_codes < 1 or dim < 1:
            raise ValueError(f"num_codes and dim must be positive, got {num_codes} and {dim}")
        self.num_codes, self.dim = num_codes, dim
        self.decay, self.eps, self.beta = decay, eps, beta
        self.entropy_temperature = entropy_temperature
        self.revive_every, self.revive_threshold = revive_every, revive_threshold
        self.kmeans_init, self.kmeans_iters = kmeans_init, kmeans_iters

        codebook = torch.empty(num_codes, dim)
        nn.init.kaiming_uniform_(codebook)
        self.register_buffer("codebook", codebook)
        # Size 1 and sum = code make the first EMA steps a gentle blend rather than a jump.
        self.register_buffer("ema_cluster_size", torch.ones(num_codes))
        self.register_buffer("ema_embed_sum", codebook.clone())
        self.register_buffer("window_counts", torch.zeros(num_codes))
        self.register_buffer("window_steps", torch.zeros((), dtype=torch.long))
        self.register_buffer("initialized", torch.tensor(not kmeans_init))
        self.register_buffer("dead_codes", torch.zeros((), dtype=torch.long))
        self._last_batch: Tensor | None = None

    # ------------------------------------------------------------------ forward
    def forward(
        self, z: Tensor, mask: Tensor | None = None, update: bool | None = None, with_entropy: bool = True
    ) -> QuantizerOutput:
        """Quantize ``z`` (B, L, D) with ``mask`` (B, L; True = real token).

        ``update`` (default: ``self.training``) applies the EMA step from the masked positions;
        ``with_entropy=False`` skips the entropy regulariser (its loss is then 0).
        """
        if z.shape[-1] != self.dim:
            raise ValueError(f"expected last dimension {self.dim}, got shape {tuple(z.shape)}")
        if mask is None:
            mask = torch.ones(z.shape[:-1], dtype=torch.bool, device=z.device)
        mask = mask.bool()
        update = self.training if update is None else update

        with fp32_island():
            flat = z.float().reshape(-1, self.dim)
            valid = mask.reshape(-1)
            z_valid = flat[valid]
            if update and not bool(self.initialized):
                self._kmeans_initialise(z_valid.detach())

            # Autograd keeps the codebook for backward; the EMA step below edits it in place.
            codebook = self.codebook.clone() if update else self.codebook
            distances = squared_distances(z_valid, codebook)
            idx_valid = distances.argmin(dim=1)
            codes = codebook[idx_valid]

            # Per-position squared norms, averaged over real tokens (SPEC "loss").
            codebook_loss = _masked_mean((z_valid.detach() - codes).pow(2).sum(1))
            commitment_loss = _masked_mean((z_valid - codes.detach()).pow(2).sum(1))
            entropy_loss = self._entropy_loss(distances) if with_entropy else distances.new_zeros(())

            counts = torch.bincount(idx_valid, minlength=self.num_codes).float()
            perplexity, codes_used = _perplexity(counts), (counts > 0).sum()

            if update:
                self._ema_update(z_valid.detach(), idx_valid, counts)
                self._last_batch = z_valid.detach()

            quantized_valid = z_valid + (codes - z_valid).detach()  # straight-through estimator
            quantized = torch.zeros_like(flat).masked_scatter(valid.unsqueeze(1), quantized_valid)
            indices = torch.full(valid.shape, -1, dtype=torch.long, device=z.device)
            indices[valid] = idx_valid

        return QuantizerOutput(
            quantized=quantized.reshape(*z.shape[:-1], self.dim),
            indices=indices.reshape(z.shape[:-1]),
            commitment_loss=commitment_loss,
            codebook_loss=codebook_loss,
            entropy_loss=entropy_loss,
            perplexity=perplexity,
            codes_used=codes_used,
        )

    @torch.no_grad()
    def assign(self, z: Tensor, mask: Tensor | None = None) -> Tensor:
        """Nearest-code indices (B, L), -1 at padding; no losses, no update."""
        with fp32_island():
            flat = z.float().reshape(-1, self.dim)
            idx = squared_distances(flat, self.codebook).argmin(dim=1).reshape(z.shape[:-1])
        if mask is not None:
            idx = idx.masked_fill(~mask.bool(), -1)
        return idx

    def code_distribution(self, z: Tensor, mask: Tensor) -> Tensor:
        """Soft bag of codes per sequence (B, N): the mean over real tokens of
        softmax(-||z_t - e_j||² / τ). Differentiable in ``z``; the codebook is not changed."""
        with fp32_island():
            flat = z.float().reshape(-1, self.dim)
            p = F.softmax(-squared_distances(flat, self.codebook) / self.entropy_temperature, dim=1)
            weights = mask.float().reshape(z.shape[0], -1, 1)
            summed = (p.reshape(z.shape[0], -1, self.num_codes) * weights).sum(1)
            return summed / weights.sum(1).clamp_min(1.0)

    def _entropy_loss(self, distances: Tensor) -> Tensor:
        """L_ent = mean_t H(p_t) - H(mean_t p_t), p_t = softmax(-d_t / τ) (SPEC "loss")."""
        if distances.shape[0] == 0:
            return distances.sum()
        log_p = F.log_softmax(-distances / self.entropy_temperature, dim=1)
        p = log_p.exp()
        per_token = -(p * log_p).sum(1).mean()
        mean_p = p.mean(0)
        marginal = -(mean_p * torch.log(mean_p.clamp_min(1e-12))).sum()
        return per_token - marginal

    # ------------------------------------------------------------------ EMA
    @torch.no_grad()
    def _ema_update(self, z: Tensor, idx: Tensor, counts: Tensor) -> None:
        sums = torch.zeros(self.num_codes, self.dim, device=z.device).index_add_(0, idx, z)
        if _distributed():  # checked per call: a module built before init_process_group still syncs
            dist.all_reduce(counts, op=dist.ReduceOp.SUM)
            dist.all_reduce(sums, op=dist.ReduceOp.SUM)
        self.ema_cluster_size.mul_(self.decay).add_(counts, alpha=1 - self.decay)
        self.ema_embed_sum.mul_(self.decay).add_(sums, alpha=1 - self.decay)
        self.window_counts.add_(counts)
        self._refresh_codebook()

    @torch.no_grad()
    def _refresh_codebook(self) -> None:
        """Codes = EMA sums / Laplace-smoothed EMA sizes."""
        total = self.ema_cluster_size.sum()
        smoothed = (self.ema_cluster_size + self.eps) / (total + self.num_codes * self.eps) * total
        self.codebook.copy_(self.ema_embed_sum / smoothed.unsqueeze(1))

    # ------------------------------------------------------------------ revival
    @torch.no_grad()
    def optimizer_step(self) -> int:
        """Count one optimizer step; at the end of each window, revive dead codes.

        Call once per optimizer step (not per micro-batch). Returns the number of codes revived.
        """
        self.window_steps += 1
        if int(self.window_steps) < self.revive_every:
            return 0
        mean_counts = self.window_counts / self.window_steps.float()
        dead = mean_counts < self.revive_threshold
        self.dead_codes.fill_(int(dead.sum()))
        self.window_counts.zero_()
        self.window_steps.zero_()
        if self._last_batch is None or self._last_batch.shape[0] == 0 or not bool(dead.any()):
            return 0
        return self.revive(dead, self._last_batch)

    @torch.no_grad()
    def revive(self, dead: Tensor, candidates: Tensor) -> int:
        """Re-initialise the ``dead`` codes (bool mask) from random rows of ``candidates``.

        Code vector, EMA size and EMA sum are reset together, so the next EMA step starts from
        the sample instead of overwriting it. Rank 0 draws; the draw is broadcast to all ranks.
        """
        dead_idx = dead.nonzero().squeeze(1)
        n_dead = dead_idx.numel()
        n_cand = candidates.shape[0]
        if n_dead <= n_cand:
            pick = torch.randperm(n_cand, device=candidates.device)[:n_dead]
        else:
            pick = torch.randint(n_cand, (n_dead,), device=candidates.device)
        samples = candidates[pick].float().contiguous()
        if _distributed():
            dist.broadcast(samples, src=0)
        self.codebook[dead_idx] = samples
        self.ema_cluster_size[dead_idx] = 1.0
        self.ema_embed_sum[dead_idx] = samples
        # Re-derive every code from the updated statistics (total size changed).
        self._refresh_codebook()
        return n_dead

    @torch.no_grad()
    def load_codebook(self, codebook: Tensor) -> None:
        """Start from given code vectors (e.g. a fingerprinter's codebook) instead of an init.

        Each code's EMA size is set to 1 and its EMA sum to the code, as at construction, so
        the first EMA steps blend new assignments into these vectors; k-means init is skipped.
        """
        if tuple(codebook.shape) != (self.num_codes, self.dim):
            raise ValueError(f"codebook of shape {tuple(codebook.shape)} does not fit a quantizer of "
                             f"{self.num_codes} codes x {self.dim} dimensions")
        self.codebook.copy_(codebook)
        self.ema_cluster_size.fill_(1.0)
        self.ema_embed_sum.copy_(self.codebook)
        self.initialized.fill_(True)

    @torch.no_grad()
    def _kmeans_initialise(self, z: Tensor) -> None:
        """Lloyd's k-means on the first batch (rank 0's result broadcast), then seed the EMAs.

        With fewer vectors than codes only the first ``n`` codes are fitted (k = n): duplicated
        centroids would be exact ties; the rest keep their random init until revived.
        """
        k_local = torch.tensor(min(z.shape[0], self.num_codes), device=z.device)
        if _distributed():  # every rank must fit (and broadcast) the same number of centroids
            dist.all_reduce(k_local, op=dist.ReduceOp.MIN)
        k = int(k_local)
        if k == 0:
            return
        centroids = z[torch.randperm(z.shape[0], device=z.device)[:k]].clone()
        for _ in range(self.kmeans_iters):
            assign = squared_distances(z, centroids).argmin(1)
            counts = torch.bincount(assign, minlength=k).float()
            sums = torch.zeros_like(centroids).index_add_(0, assign, z)
            filled = counts > 0
            centroids[filled] = sums[filled] / counts[filled].unsqueeze(1)
        if _distributed():
            dist.broadcast(centroids, src=0)
        self.load_codebook(torch.cat([centroids, self.codebook[k:]]))


def _masked_mean(values: Tensor) -> Tensor:
    return values.mean() if values.numel() else values.sum()


def _perplexity(counts: Tensor) -> Tensor:
    total = counts.sum()
    if total == 0:
        return torch.zeros((), device=counts.device)
    p = counts / total
    return torch.exp(-(p * torch.log(p.clamp_min(1e-12))).sum())


