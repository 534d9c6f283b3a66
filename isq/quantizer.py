"""EMA vector quantizer: straight-through estimator and losses over a :class:`Codebook`.

docs/design.md §1.3 and §1.6. The codebook itself (lookup, EMA update, revival) is
:class:`isq.codebook.Codebook`; this module adds what training needs around it: the masked
forward pass, the plain STE, the VQ and entropy losses, first-batch k-means initialisation and
the dead-code window.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from isq.codebook import Codebook, distributed, fp32_island, kmeans, perplexity, squared_distances


@dataclass
class QuantizerOutput:
    """What one quantizer call returns.

    ``quantized`` carries the straight-through gradient to ``z``; ``indices`` is -1 at padding.
    Losses are scalars averaged over the non-padding positions; ``vq_loss`` is the weighted sum
    ``codebook_loss + β · commitment_loss``. ``revival_candidates`` are the batch's real-token
    vectors (detached), what :meth:`EMAQuantizer.optimizer_step` revives dead codes from.
    """

    quantized: Tensor
    indices: Tensor
    commitment_loss: Tensor
    codebook_loss: Tensor
    vq_loss: Tensor
    entropy_loss: Tensor
    perplexity: Tensor
    codes_used: Tensor
    revival_candidates: Tensor


class EMAQuantizer(nn.Module):
    """Euclidean codebook updated by exponential moving averages, with a plain STE.

    Args (named as in :class:`isq.config.ISQConfig`):
        num_codes: N_c, codebook size (default 1024, docs/design.md §1.3).
        code_dim: code dimension (the projection's output width).
        ema_decay: EMA decay of cluster sizes and embedding sums (0.99).
        ema_eps: Laplace smoothing constant for cluster sizes (1e-5).
        beta: commitment weight β in ``vq_loss = ||sg[z] - e||² + β ||z - sg[e]||²`` (0.10); the
            quantizer alone applies it.
        entropy_temperature: τ of the entropy regulariser's soft assignment (1.0).
        revive_every: optimizer steps per dead-code window (20).
        revive_threshold: a code is dead when its mean per-step count over the window is below this (1.0).
        kmeans_init: initialise the codebook by k-means on the first training batch (not in the
            paper, docs/design.md §1.10: off in the paper config, on in the smoke config).
        kmeans_iters: Lloyd iterations for that initialisation.
    """

    initialized: Tensor
    dead_codes: Tensor

    def __init__(
        self,
        num_codes: int = 1024,
        code_dim: int = 256,
        ema_decay: float = 0.99,
        ema_eps: float = 1e-5,
        beta: float = 0.10,
        entropy_temperature: float = 1.0,
        revive_every: int = 20,
        revive_threshold: float = 1.0,
        kmeans_init: bool = False,
        kmeans_iters: int = 10,
    ) -> None:
        super().__init__()
        self.codebook = Codebook(num_codes, code_dim, ema_decay, ema_eps)
        self.num_codes, self.code_dim = num_codes, code_dim
        self.beta = beta
        self.entropy_temperature = entropy_temperature
        self.revive_every, self.revive_threshold = revive_every, revive_threshold
        self.kmeans_iters = kmeans_iters
        self.register_buffer("initialized", torch.tensor(not kmeans_init))
        self.register_buffer("dead_codes", torch.zeros((), dtype=torch.long))

    # ------------------------------------------------------------------ forward
    def forward(
        self, z: Tensor, mask: Tensor | None = None, update: bool | None = None, with_entropy: bool = True
    ) -> QuantizerOutput:
        """Quantize ``z`` (B, L, D) with ``mask`` (B, L; True = real token).

        ``update`` (default: ``self.training``) applies the EMA step from the masked positions;
        ``with_entropy=False`` skips the entropy regulariser (its loss is then 0).
        """
        if z.shape[-1] != self.code_dim:
            raise ValueError(f"expected last dimension {self.code_dim}, got shape {tuple(z.shape)}")
        if mask is None:
            mask = torch.ones(z.shape[:-1], dtype=torch.bool, device=z.device)
        mask = mask.bool()
        update = self.training if update is None else update

        with fp32_island():
            flat = z.float().reshape(-1, self.code_dim)
            valid = mask.reshape(-1)
            z_valid = flat[valid]
            if update and not bool(self.initialized):
                self._kmeans_initialise(z_valid.detach())

            lookup = self.codebook.nearest(z_valid)
            codes = self.codebook.vectors[lookup.indices]  # a copy: the EMA step below edits the buffer

            # Per-position squared norms, averaged over real tokens (docs/design.md §1.6).
            codebook_loss = _masked_mean((z_valid.detach() - codes).pow(2).sum(1))
            commitment_loss = _masked_mean((z_valid - codes.detach()).pow(2).sum(1))
            vq_loss = codebook_loss + self.beta * commitment_loss
            entropy_loss = self._entropy_loss(lookup.distances) if with_entropy else flat.new_zeros(())

            counts = torch.bincount(lookup.indices, minlength=self.num_codes).float()
            if update:
                self.codebook.ema_update(z_valid.detach(), lookup.indices, counts)

            quantized_valid = z_valid + (codes - z_valid).detach()  # straight-through estimator
            quantized = torch.zeros_like(flat).masked_scatter(valid.unsqueeze(1), quantized_valid)
            indices = torch.full(valid.shape, -1, dtype=torch.long, device=z.device)
            indices[valid] = lookup.indices

        return QuantizerOutput(
            quantized=quantized.reshape(*z.shape[:-1], self.code_dim),
            indices=indices.reshape(z.shape[:-1]),
            commitment_loss=commitment_loss,
            codebook_loss=codebook_loss,
            vq_loss=vq_loss,
            entropy_loss=entropy_loss,
            perplexity=perplexity(counts),
            codes_used=(counts > 0).sum(),
            revival_candidates=z_valid.detach(),
        )

    def code_distribution(self, z: Tensor, mask: Tensor) -> Tensor:
        """Soft bag of codes per sequence (B, N): the mean over real tokens of
        softmax(-||z_t - e_j||² / τ). Differentiable in ``z``; the codebook is not changed."""
        with fp32_island():
            flat = z.float().reshape(-1, self.code_dim)
            p = F.softmax(-squared_distances(flat, self.codebook.vectors) / self.entropy_temperature, dim=1)
            weights = mask.float().reshape(z.shape[0], -1, 1)
            summed = (p.reshape(z.shape[0], -1, self.num_codes) * weights).sum(1)
            return summed / weights.sum(1).clamp_min(1.0)

    def _entropy_loss(self, distances: Tensor) -> Tensor:
        """L_ent = mean_t H(p_t) - H(mean_t p_t), p_t = softmax(-d_t / τ) (docs/design.md §1.6)."""
        if distances.shape[0] == 0:
            return distances.sum()
        log_p = F.log_softmax(-distances / self.entropy_temperature, dim=1)
        p = log_p.exp()
        per_token = -(p * log_p).sum(1).mean()
        mean_p = p.mean(0)
        marginal = -(mean_p * torch.log(mean_p.clamp_min(1e-12))).sum()
        return per_token - marginal

    # ------------------------------------------------------------------ revival and init
    @torch.no_grad()
    def optimizer_step(self, revival_candidates: Tensor) -> int:
        """Count one optimizer step; at the end of each window, revive dead codes from
        ``revival_candidates`` (the last training batch's :attr:`QuantizerOutput.revival_candidates`).
        Call once per optimizer step (not per micro-batch); returns the number of codes revived."""
        dead = self.codebook.close_window_if_due(self.revive_every, self.revive_threshold)
        if dead is None:
            return 0
        self.dead_codes.fill_(int(dead.sum()))
        return self.codebook.revive(dead, revival_candidates)

    @torch.no_grad()
    def load_codebook(self, vectors: Tensor) -> None:
        """Start from given code vectors (e.g. a fingerprinter's codebook) instead of an init;
        first-batch k-means is then skipped."""
        self.codebook.load(vectors)
        self.initialized.fill_(True)

    @torch.no_grad()
    def _kmeans_initialise(self, z: Tensor) -> None:
        """k-means on the first batch (rank 0's result broadcast), then seed the EMAs.

        With fewer vectors than codes only the first ``n`` codes are fitted (k = n): duplicated
        centroids would be exact ties; the rest keep their random init until revived.
        """
        k_local = torch.tensor(min(z.shape[0], self.num_codes), device=z.device)
        if distributed():  # every rank must fit (and broadcast) the same number of centroids
            dist.all_reduce(k_local, op=dist.ReduceOp.MIN)
        k = int(k_local)
        if k == 0:
            return
        centroids = kmeans(z, k, self.kmeans_iters)
        if distributed():
            dist.broadcast(centroids, src=0)
        self.load_codebook(torch.cat([centroids, self.codebook.vectors[k:]]))


def _masked_mean(values: Tensor) -> Tensor:
    return values.mean() if values.numel() else values.sum()
