"""Callbacks: export the best checkpoint as a fingerprinter when fit ends."""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path

import lightning as L
import torch

from training.module import ISQLightningModule

log = logging.getLogger(__name__)


class ExportFingerprinter(L.Callback):
    """At the end of fit, load the best checkpoint (else the last weights) and export a
    fingerprinter to ``<dirpath>/<run_name>/`` with a record of the run."""

    def __init__(self, dirpath: str = "checkpoints", run_name: str = "run") -> None:
        self.dirpath, self.run_name = dirpath, run_name
        self.exported_to: Path | None = None

    def on_fit_end(self, trainer: L.Trainer, pl_module: ISQLightningModule) -> None:
        if not trainer.is_global_zero:
            return
        best = getattr(trainer.checkpoint_callback, "best_model_path", "") or ""
        if best and Path(best).is_file():
            state = torch.load(best, map_location=pl_module.device, weights_only=False)["state_dict"]
            pl_module.load_state_dict(state)
        datamodule = trainer.datamodule
        record = {
            "exported_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "checkpoint": best or None,
            "global_step": trainer.global_step,
            "epochs": trainer.current_epoch,
            "data": dict(getattr(datamodule, "stats", {})) | {"hparams": dict(getattr(datamodule, "hparams", {}))},
            "trainer": {"precision": str(trainer.precision), "world_size": trainer.world_size,
                        "accumulate_grad_batches": trainer.accumulate_grad_batches},
            "optim": {k: v for k, v in pl_module.hparams.items() if k != "isq"},
            "metrics": {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1},
        }
        self.exported_to = pl_module.model.export_fingerprinter(Path(self.dirpath) / self.run_name, run_record=record)
        log.info("exported fingerprinter to %s", self.exported_to)
        print(f"exported fingerprinter to {self.exported_to}")
