"""A thin LightningModule around :class:`isq.model.ISQModel`."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from transformers import get_cosine_with_min_lr_schedule_with_warmup

from isq.config import ISQConfig
from isq.fingerprint import Fingerprinter
from isq.model import ISQModel, ISQOutput
from isq.ranges import NON_NEGATIVE, POSITIVE, UNIT, check_ranges
from training.metrics import CodebookUsage


class WarmStartError(ValueError):
    """``init_from`` names no fingerprinter, or one that does not fit the model config."""


ALREADY_EQUAL_ON_EVERY_RANK: dict[str, Any] = {"sync_dist": True, "reduce_fx": "max"}
"""How to log a value every rank already holds (the usage metric is reduced across ranks,
val/ce_loss synced, the divergence all-gathered): the max of equal values is exact, unlike a
mean, and declaring the sync keeps Lightning from warning that it is missing."""

RANDOM_STATE = "random_state"
"""The checkpoint key of the random generators' state (:meth:`ISQLightningModule.on_save_checkpoint`)."""
SCHEDULE_STEPS = "isq_schedule_steps"
"""The checkpoint key of the optimizer steps its learning-rate schedule ran over."""
RUN_SEED = "isq_seed"
"""The checkpoint key of the run's global seed (``seed_everything``; None: unseeded)."""

RANGES = {"encoder_lr": POSITIVE, "head_lr": POSITIVE, "weight_decay": NON_NEGATIVE,
          "warmup_steps": NON_NEGATIVE, "min_lr_ratio": UNIT}
"""Allowed range of every numeric argument (``--model.encoder_lr -1.0`` is refused)."""


class ISQLightningModule(L.LightningModule):
    """Trains the ISQ codebook with the predictive-coding objective (docs/design.md §1).

    Args:
        isq: the model configuration.
        encoder_lr: AdamW learning rate of the encoder (1e-4).
        head_lr: learning rate of projection, up-projection and decoder (1e-3).
        weight_decay: AdamW weight decay.
        warmup_steps: linear warm-up length in optimizer steps.
        min_lr_ratio: final learning rate as a share of the peak.
        init_from: an exported fingerprinter directory to start from (its encoder, projection
            and codebook; see :meth:`isq.model.ISQModel.warm_start`), e.g. the k-means control.
    """

    def __init__(
        self,
        isq: ISQConfig,
        encoder_lr: float = 1e-4,
        head_lr: float = 1e-3,
        weight_decay: float = 0.01,
        warmup_steps: int = 500,
        min_lr_ratio: float = 0.1,
        init_from: str | None = None,
    ) -> None:
        super().__init__()
        check_ranges("model", locals(), RANGES)
        self.save_hyperparameters()
        self.model = ISQModel(isq)
        if init_from is not None:
            try:
                self.model.warm_start(Fingerprinter.from_pretrained(init_from))
            except (OSError, ValueError) as err:
                raise WarmStartError(f"--model.init_from {init_from}: {err}") from err
        self.val_usage = CodebookUsage(isq.num_codes)
        self._step_clock: float | None = None
        self._revival_candidates: torch.Tensor | None = None
        """The last training batch's real-token z: training_step hands it to optimizer_step."""
        self._random_state: dict[str, Any] | None = None
        """A resumed checkpoint's random state, restored when training starts."""
        self._schedule_steps: int | None = None
        """A resumed checkpoint's schedule length, compared with this run's when training starts."""

    def on_fit_start(self) -> None:
        """Say which weights train: the model summary counts the decoder with the encoder, so a
        LoRA run would read "Trainable 10.2 M" while the encoder trains only its adapters."""
        if self.trainer.is_global_zero:
            print(trainable_summary(self.model))

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep the random generators' state (dropout, revival draws) with the checkpoint, so a
        run resumed from it draws what the uninterrupted run drew (with the training order that
        :class:`training.data.ResumableLoader` keeps)."""
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
        checkpoint[RANDOM_STATE] = {"cpu": torch.get_rng_state(), "cuda": cuda}
        checkpoint[SCHEDULE_STEPS] = int(self.trainer.estimated_stepping_batches)
        checkpoint[RUN_SEED] = global_seed()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Set the checkpoint's random state aside for :meth:`on_train_start`: a checkpoint is
        restored before the run's set-up and sanity check, which draw from the generator."""
        self._random_state = checkpoint.get(RANDOM_STATE)  # None: written before the state was kept
        self._schedule_steps = checkpoint.get(SCHEDULE_STEPS)

    def on_train_start(self) -> None:
        steps, now = self._schedule_steps, int(self.trainer.estimated_stepping_batches)
        if steps is not None and steps != now and self.trainer.is_global_zero:
            # the schedule is rebuilt from this run's length: the rates from the resumed step on
            # are those of a cosine over the new length, not the checkpoint's (a rise, extending)
            print(f"note: the checkpoint's learning-rate schedule ran over {steps} steps, this run's over "
                  f"{now}: from step {self.trainer.global_step} the rates follow the new cosine, so the run "
                  f"is neither the {steps}-step run continued nor a {now}-step run from the start",
                  file=sys.stderr)
        saved, self._random_state = self._random_state, None
        if saved is None:
            return
        torch.set_rng_state(saved["cpu"])
        if saved["cuda"] and torch.cuda.is_available() and len(saved["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(saved["cuda"])

    def forward(self, batch: dict[str, torch.Tensor]) -> ISQOutput:
        return self.model(batch["input_ids"], batch["attention_mask"], batch["labels"])

    def _log_output(self, prefix: str, out: ISQOutput, batch_size: int, **kw: Any) -> None:
        terms = {
            f"{prefix}/loss": out.loss, f"{prefix}/ce_loss": out.ce_loss,
            f"{prefix}/codebook_loss": out.codebook_loss, f"{prefix}/commitment_loss": out.commitment_loss,
            f"{prefix}/entropy_loss": out.entropy_loss,
        }
        if self.model.token_head is not None:
            terms[f"{prefix}/reconstruction_loss"] = out.reconstruction_loss
        if self.model.config.lambda_nce > 0:
            terms[f"{prefix}/contrastive_loss"] = out.contrastive_loss
        self.log_dict(terms, batch_size=batch_size, sync_dist=prefix == "val", **kw)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        out = self(batch)
        self._revival_candidates = out.revival_candidates
        size = batch["input_ids"].shape[0]
        self._log_output("train", out, size, prog_bar=False)
        self.log_dict({"train/perplexity": out.perplexity, "train/codes_used": out.codes_used.float()},
                      batch_size=size)
        self.log("train/ce", out.ce_loss, prog_bar=True, logger=False, batch_size=size)
        tokens = batch["attention_mask"].sum() + (batch["labels"] >= 0).sum()
        now = time.perf_counter()
        if self._step_clock is not None:
            self.log("train/tokens_per_s", tokens.float() / (now - self._step_clock), batch_size=size)
        self._step_clock = now
        return out.loss

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        """After each *optimizer* step (not micro-batch), advance the dead-code window."""
        super().optimizer_step(*args, **kwargs)  # runs the closure: training_step sets the candidates
        if self._revival_candidates is None:
            raise RuntimeError("optimizer_step ran before any training_step")
        revived = self.model.quantizer.optimizer_step(self._revival_candidates)
        self.log("train/revived_codes", float(revived))
        self.log("train/dead_codes", float(self.model.quantizer.dead_codes))  # the same on every rank
        for i, group in enumerate(self.trainer.optimizers[0].param_groups):
            self.log(f"lr/{group.get('name', i)}", group["lr"])

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        out = self(batch)
        self._log_output("val", out, batch["input_ids"].shape[0])
        self.val_usage.update(out.indices)

    def on_validation_epoch_end(self) -> None:
        metrics = {f"val/{name}": value for name, value in self.val_usage.compute().items()}
        self.val_usage.reset()
        ce = self.trainer.callback_metrics.get("val/ce_loss")
        if ce is not None:
            metrics["val/next_turn_ppl"] = torch.exp(ce)
        self.log_dict(metrics, **ALREADY_EQUAL_ON_EVERY_RANK)
        self._log_rank_divergence()

    def _log_rank_divergence(self) -> None:
        """Max |codebook_rank - codebook_rank0| across ranks: 0 when the EMA sync works."""
        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return
        codebook = self.model.quantizer.codebook.vectors
        gathered = [torch.empty_like(codebook) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, codebook)
        divergence = max(float((g - gathered[0]).abs().max()) for g in gathered)
        self.log("val/codebook_rank_divergence", divergence, **ALREADY_EQUAL_ON_EVERY_RANK)

    def configure_optimizers(self):
        groups = self.model.parameter_groups()
        h = self.hparams
        param_groups = [{"params": groups["head"], "lr": h.head_lr, "name": "head"}]
        if groups["encoder"]:
            param_groups.append({"params": groups["encoder"], "lr": h.encoder_lr, "name": "encoder"})
        optimizer = torch.optim.AdamW(param_groups, weight_decay=h.weight_decay)
        scheduler = get_cosine_with_min_lr_schedule_with_warmup(
            optimizer, h.warmup_steps, int(self.trainer.estimated_stepping_batches),
            min_lr_rate=h.min_lr_ratio)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def global_seed() -> int | None:
    """The run's global seed: what ``seed_everything`` set (``PL_GLOBAL_SEED``), None if unseeded."""
    return int(os.environ["PL_GLOBAL_SEED"]) if "PL_GLOBAL_SEED" in os.environ else None


def trainable_summary(model: ISQModel) -> str:
    """One line: trainable / total parameters of the encoder (and whether only adapters train)
    and of the rest (projection, codebook head, decoder)."""
    encoder = list(model.encoder.parameters())
    encoder_ids = {id(p) for p in encoder}
    rest = [p for p in model.parameters() if id(p) not in encoder_ids]
    trainable = sum(p.numel() for p in encoder if p.requires_grad)
    adapters_only = model.config.lora_rank > 0 and model.semantic_encoder.frozen
    what = " (LoRA adapters only)" if adapters_only else ""
    total = _count(sum(p.numel() for p in encoder))
    return (f"trainable parameters: encoder {_count(trainable)} of {total}{what}; "
            f"projection + decoder {_count(sum(p.numel() for p in rest if p.requires_grad))}")


def _count(n: int) -> str:
    if n >= 1e6:
        return f"{n / 1e6:.1f} M"
    return f"{n / 1e3:.1f} k" if n >= 1e3 else str(n)
