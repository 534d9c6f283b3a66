"""A callback that SIGKILLs its own process after a given optimizer step (a crash mid-run)."""

from __future__ import annotations

import os
import signal

import lightning as L


class KillAfterStep(L.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step >= self.step:
            os.kill(os.getpid(), signal.SIGKILL)
