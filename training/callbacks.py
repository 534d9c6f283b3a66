"""Callbacks: export the best checkpoint as a fingerprinter when fit ends, never over an
existing export; the run's config saved in the run's own directory; a progress bar that counts
optimizer steps."""

from __future__ import annotations

import datetime as dt
import logging
import pickle
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.cli import SaveConfigCallback

from isq.export import refuse_occupied
from isq.outputs import UnwritableOutput, export_unwritable
from training.module import ISQLightningModule, global_seed

log = logging.getLogger(__name__)

EXPORT_NAME = "fingerprinter"
BEST_KEY = "isq_best_checkpoint"
"""The checkpoint key of the best validated checkpoint of the run's whole history
(:meth:`ExportFingerprinter.best`)."""


def run_directory(trainer: L.Trainer) -> Path:
    """The run's own directory, the parent of its ``checkpoints/``: ``<save_dir>/<name>/<version>``
    of the first logger, as Lightning's ModelCheckpoint resolves it (CSV: ``runs/smoke/version_3``;
    wandb: ``runs/<project>/<run id>``). Config, metrics and export of a run all go here."""
    dirpath = getattr(trainer.checkpoint_callback, "dirpath", None)
    if dirpath:
        return Path(dirpath).parent
    if trainer.loggers:
        logger = trainer.loggers[0]
        version = logger.version if isinstance(logger.version, str) else f"version_{logger.version}"
        return Path(logger.save_dir or trainer.default_root_dir) / str(logger.name) / version
    return Path(trainer.default_root_dir)


class ExportFingerprinter(L.Callback):
    """At the end of fit, load the best checkpoint (else the last weights) and export a
    fingerprinter with a record of the run.

    By default the export goes beside the run's checkpoint directory (e.g.
    ``runs/smoke/version_3/fingerprinter`` with the CSV logger, ``runs/<project>/<run id>/
    fingerprinter`` with wandb), which no earlier run can own. With ``dirpath`` it
    goes exactly there; an existing, non-empty ``dirpath`` is refused when fit *starts* (before
    any training) unless ``overwrite`` is true, so a committed reference checkpoint is never
    replaced by accident.

    A resumed run trains in a directory of its own, where Lightning's ``ModelCheckpoint`` tracks
    its best checkpoint afresh; every checkpoint therefore also records the best validated one of
    the run's whole history (:data:`BEST_KEY`), and the export is the better of that and the
    resumed run's own best: an interrupted run resumed exports what the uninterrupted run exports.
    """

    def __init__(self, dirpath: str | None = None, overwrite: bool = False) -> None:
        self.dirpath, self.overwrite = dirpath, overwrite
        self.exported_to: Path | None = None
        self.inherited: dict[str, Any] | None = None
        """The best validated checkpoint of the runs this one resumes: path, monitor and score."""

    def target(self, trainer: L.Trainer) -> Path:
        if self.dirpath is not None:
            return Path(self.dirpath)
        return run_directory(trainer) / EXPORT_NAME

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.refuse_occupied(self.target(trainer))

    def refuse_occupied(self, target: Path) -> None:
        """ExportExistsError if ``target`` holds files and overwriting was not asked for, or holds
        something other than an earlier export (:func:`isq.export.refuse_occupied`);
        UnwritableOutput if this process cannot write it (:func:`isq.outputs.export_unwritable`)."""
        refuse_occupied(target, self.overwrite, "choose another ExportFingerprinter dirpath, leave it "
                        "unset (export into the run's own directory) or set overwrite: true")
        if (problem := export_unwritable(target)) is not None:
            raise UnwritableOutput(f"the fingerprinter export directory: {problem}")

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        checkpoint[BEST_KEY] = self.best(trainer)

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        """Take the resumed history's best: recorded by this callback, or (a checkpoint made before
        it recorded one) its ``ModelCheckpoint`` state's best of the monitored value; its file
        where recorded, else the file of that name beside the checkpoint resumed (:func:`located`)."""
        inherited = checkpoint.get(BEST_KEY)
        if inherited is None:
            monitor = getattr(trainer.checkpoint_callback, "monitor", None)
            states = _checkpoint_states(checkpoint, monitor)
            if states and states[0].get("best_model_score") is not None:
                inherited = {"path": states[0]["best_model_path"], "monitor": monitor,
                             "score": float(states[0]["best_model_score"])}
        self.inherited = None if inherited is None else dict(
            inherited, path=located(inherited["path"], trainer.ckpt_path))

    def best(self, trainer: L.Trainer) -> dict[str, Any] | None:
        """The best validated checkpoint so far, of this run and the runs it resumes (absolute path,
        monitor, score; None before any): the inherited one wins a tie, as the earlier one does
        in ``ModelCheckpoint``. Its file need not be on disk yet (a top-k checkpoint is written
        after the checkpoints record it, and may be the best itself): the export checks it."""
        candidates = self._candidates(trainer)
        return candidates[0] if candidates else None

    def _candidates(self, trainer: L.Trainer) -> list[dict[str, Any]]:
        """The inherited best and this run's own, best first (without a monitored value:
        ``ModelCheckpoint``'s "best", its latest checkpoint)."""
        checkpoints = trainer.checkpoint_callback
        monitor, mode = getattr(checkpoints, "monitor", None), getattr(checkpoints, "mode", "min")
        own_path, own_score = getattr(checkpoints, "best_model_path", ""), getattr(checkpoints,
                                                                                   "best_model_score", None)
        own_path = str(Path(own_path).resolve()) if own_path else ""
        if monitor is None:  # only this run's own: a path restored from another run's state may not be
            directory = getattr(checkpoints, "dirpath", None)
            own = bool(own_path) and directory is not None and \
                Path(directory).resolve() in Path(own_path).parents
            return [{"path": own_path, "monitor": None, "score": None}] if own else []
        found = [] if self.inherited is None or self.inherited["monitor"] != monitor else [self.inherited]
        if own_path and own_score is not None:
            found.append({"path": own_path, "monitor": monitor, "score": float(own_score)})
        return sorted(found, key=lambda entry: entry["score"], reverse=mode == "max")  # ties keep their order

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        assert isinstance(pl_module, ISQLightningModule), "ExportFingerprinter exports an ISQLightningModule"
        best, step, score = "", trainer.global_step, None
        for chosen in self._candidates(trainer):
            saved = _saved_checkpoint(chosen, pl_module.device)
            if saved is None:
                print(f"note: the best validated checkpoint {chosen['path']} is gone or is another run's "
                      "(its score differs); the next best is exported", file=sys.stderr)
                continue
            pl_module.load_state_dict(saved["state_dict"])
            best, step = chosen["path"], int(saved["global_step"])
            score = None if chosen["score"] is None else {str(chosen["monitor"]): chosen["score"]}
            break
        else:
            print("note: no validated checkpoint is left to export (none was saved, or its file is gone): "
                  "the export holds the last weights", file=sys.stderr)
        datamodule = getattr(trainer, "datamodule", None)
        record = {
            "exported_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "checkpoint": best or None,
            "seed": global_seed(),
            # the exported weights' step and validation score (the best checkpoint's), then the
            # run's: a run trains on after its best checkpoint, and its last metrics are its own
            "global_step": step,
            "checkpoint_score": score,
            "trained_steps": trainer.global_step,
            "epochs": epochs_trained(trainer),
            "data": dict(getattr(datamodule, "stats", {}))
            | {"hparams": dict(getattr(datamodule, "hparams", {}))},
            "trainer": {"precision": str(trainer.precision), "world_size": trainer.world_size,
                        "accumulate_grad_batches": trainer.accumulate_grad_batches},
            # a CPU run is the same step for step only on as many threads, with the same torch: the
            # order of a reduction's float additions follows them (a last-bit difference, which grows)
            "torch": {"version": torch.__version__, "threads": torch.get_num_threads()},
            "optim": {k: v for k, v in pl_module.hparams.items() if k != "isq"},
            "last_metrics": {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1},
        }
        self.exported_to = pl_module.model.export_fingerprinter(self.target(trainer), run_record=record,
                                                                overwrite=self.overwrite)
        log.info("exported fingerprinter to %s", self.exported_to)
        print(f"exported fingerprinter to {self.exported_to}")


def located(path: str, resumed: str | Path | None) -> str:
    """The absolute path of an inherited best checkpoint: where recorded when that is an absolute
    path to a file; else the file of its name beside the checkpoint ``resumed`` (the run directory
    moved, or a path recorded relative to another working directory, as Lightning records them);
    else the recorded path taken from here."""
    recorded = Path(path)
    if recorded.is_absolute() and recorded.is_file():
        return str(recorded)
    if resumed is not None and (beside := Path(resumed).resolve().parent / recorded.name).is_file():
        return str(beside)
    return str(recorded.resolve())


def _saved_checkpoint(chosen: dict[str, Any], device: torch.device) -> dict[str, Any] | None:
    """The checkpoint file ``chosen`` names, if it is there and is the one chosen: its checkpoint
    callback's state holds the chosen score as the score it was saved with (a path taken from
    another working directory may name another run's file); a checkpoint saved with its weights
    only has no such state, and is taken as it is. A file holding pickled objects other than
    tensors and plain values is no checkpoint of a run's: loading them would run them as code."""
    if not Path(chosen["path"]).is_file():
        return None
    try:
        saved = torch.load(chosen["path"], map_location=device, weights_only=True)
    except pickle.UnpicklingError:
        return None
    if chosen["score"] is None or "callbacks" not in saved:  # a weights-only one: nothing to tell it by
        return saved
    scores = [state.get("current_score") for state in _checkpoint_states(saved, chosen["monitor"])]
    tolerance = 1e-6 * max(1.0, abs(chosen["score"]))
    same = any(value is not None and (float(value) == chosen["score"]  # an infinite score too
                                      or abs(float(value) - chosen["score"]) <= tolerance)
               for value in scores)
    return saved if same else None


def _checkpoint_states(checkpoint: dict[str, Any], monitor: str | None) -> list[dict[str, Any]]:
    """The states a checkpoint holds of ``ModelCheckpoint`` callbacks monitoring ``monitor``."""
    return [state for key, state in checkpoint.get("callbacks", {}).items()
            if key.startswith("ModelCheckpoint") and state.get("monitor") == monitor]


def epochs_trained(trainer: L.Trainer) -> float | None:
    """How many epochs of training batches the run trained on, a fraction when it stopped inside
    one (``max_steps``; ``current_epoch`` counts an interrupted epoch as done); None when an epoch
    has no known length (an iterable dataset)."""
    per_epoch = trainer.num_training_batches
    if not per_epoch or per_epoch == float("inf"):
        return None
    return round(trainer.global_step * trainer.accumulate_grad_batches / per_epoch, 4)


class RunConfigSaver(SaveConfigCallback):
    """Save a training run's full config as ``config.yaml`` in its own :func:`run_directory`,
    whatever the logger (the stock callback writes into the logger's ``log_dir``, which for wandb
    is the shared ``runs/``, so every run overwrote ``runs/config.yaml``). Validation-only runs
    save none."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or self.already_saved:
            return
        if trainer.is_global_zero:
            directory = run_directory(trainer)
            directory.mkdir(parents=True, exist_ok=True)
            self.parser.save(self.config, str(directory / self.config_filename), skip_none=False,
                             overwrite=self.overwrite, multifile=self.multifile)
        self.already_saved = True


class StepProgressBar(RichProgressBar):
    """Lightning's rich progress bar, with the optimizer step shown as ``step N/max_steps``.

    Runs here are bounded by ``max_steps`` (``max_epochs`` is then -1), where the stock bar
    reads "Epoch 0/-2" and counts batches of an epoch that training never finishes. Where the
    output is not a terminal (a log file, CI), rich draws only the final state, so a plain line
    is printed every ``plain_every`` optimizer steps instead.
    """

    def __init__(self, *args: Any, plain_every: int = 20, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.plain_every = plain_every

    def _get_train_description(self, current_epoch: int) -> str:  # the stock bar's hook for this text
        max_epochs = self.trainer.max_epochs
        return f"Epoch {current_epoch}" + (f"/{max_epochs - 1}" if max_epochs is not None and max_epochs > 0
                                           else "")

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)
        if trainer.max_steps > 0:
            items["step"] = f"{trainer.global_step}/{trainer.max_steps}"
        return items

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        step = trainer.global_step
        if not sys.stdout.isatty() and trainer.is_global_zero and step and step % self.plain_every == 0:
            metrics = ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                for k, v in self.get_metrics(trainer, pl_module).items() if k != "v_num")
            print(f"[train] {metrics}", flush=True)
