"""``python -m training.fit --config configs/smoke.yaml`` — train ISQ with LightningCLI.

Everything is set from YAML or the command line (``--print_config`` shows the full config);
``training/trainer_defaults.yaml`` (package data: an installed package has it too) is read before
the ``--config`` files, so the configs share their trainer and callback blocks. ``--ckpt_path
PATH`` resumes a run; with ``--validate_only true`` it is only validated. Precision defaults to
``bf16-mixed`` with CUDA and fp32 otherwise; fp16 and ``bf16-true`` are refused (T5 overflows in
fp16; ``bf16-true`` would cast the EMA codebook buffers). Bad input (data, encoder, checkpoint,
export directory) ends with one ``error:`` line and exit code 2.
"""

from __future__ import annotations

import dataclasses
import errno
import pickle
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

import torch
from lightning import Trainer
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger, WandbLogger

from isq.dailydialog import DataFormatError
from isq.encoder import EncoderUnavailable
from isq.export import ExportExistsError, NonFiniteWeights
from isq.outputs import UnwritableOutput
from isq.ranges import AT_LEAST_ONE, NON_NEGATIVE, OutOfRange, Range, check_ranges
from training.callbacks import ExportFingerprinter, RunConfigSaver, StepProgressBar
from training.data import DialogueDataModule
from training.module import RUN_SEED, ISQLightningModule, WarmStartError, global_seed
from training.quiet import quiet_third_party_noise
from training.spared_stdout import spared_stdout

DEFAULTS = Path(__file__).resolve().with_name("trainer_defaults.yaml")

_FP16 = "fp16 overflows in T5 (use bf16-mixed on CUDA or 32-true)"
_BF16_TRUE = "bf16-true casts the EMA codebook buffers to bf16 (use bf16-mixed)"
REFUSED_PRECISION = {"16": _FP16, "16-mixed": _FP16, "16-true": _FP16, "bf16": _BF16_TRUE,
                     "bf16-true": _BF16_TRUE}


def default_precision() -> str:
    return "bf16-mixed" if torch.cuda.is_available() else "32-true"


class OneLineErrors(LightningArgumentParser):
    """The parser of ``python -m training.fit``: a malformed config file or an unknown option ends
    with one ``error:`` line, not after the 89 lines of usage (``--help`` prints them) and a YAML
    parser's report over several lines."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:  # jsonargparse trying a parse it may recover from: the exception
            super().error(message, ex)
        sys.stderr.write(f"error: {' '.join(message.split())} (python -m training.fit --help lists the "
                         "options)\n")
        self.exit(2)


class ISQCLI(LightningCLI):
    notes: list[str]
    """What the CLI changed in the configuration, printed when the run starts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.notes = []
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument("--ckpt_path", type=str | None, default=None, help="checkpoint to resume from")
        parser.add_argument("--validate_only", type=bool, default=False,
                            help="only run validation (of --ckpt_path, if given) and print the metrics")
        parser.link_arguments(
            ("model.isq.tokenizer", "model.isq.encoder"), "data.tokenizer",
            compute_fn=lambda tokenizer, encoder: tokenizer or encoder,
        )
        parser.set_defaults({"trainer.precision": default_precision()})

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse, then refuse a global seed numpy cannot take (Lightning seeds right after parsing)."""
        super().parse_arguments(parser, args)
        seed = self.config.get("seed_everything")
        if isinstance(seed, int) and not isinstance(seed, bool) and not SEED.contains(seed):
            raise OutOfRange(f"seed_everything is {seed}: allowed is true (a random seed), false (none) "
                             f"or a whole number from 0 to {int(SEED.high or 0)}")

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """The configured trainer, plus :class:`StepProgressBar` unless the progress bar is off,
        and a CSV of the metrics in the run directory whatever the logger (``isq.report --log``)."""
        trainer_config = self._get(self.config_init, "trainer", default={})
        if trainer_config.get("enable_progress_bar") is not False:
            kwargs["callbacks"] = [*(trainer_config.get("callbacks") or []), StepProgressBar()]
        logger = trainer_config.get("logger")
        if isinstance(logger, WandbLogger):
            trainer_config["logger"] = [logger, metrics_csv_beside(logger)]
        return super().instantiate_trainer(**kwargs)

    def before_instantiate_classes(self) -> None:
        trainer = self.config.get("trainer", {})
        precision = str(trainer.get("precision"))
        if precision in REFUSED_PRECISION:
            raise OutOfRange(f"--trainer.precision {precision} is refused: {REFUSED_PRECISION[precision]}")
        check_trainer(trainer)
        if self.config.get("validate_only"):
            trainer["logger"] = False  # a validation is printed, not a run: no runs/<name>/version_N for it
        else:
            if trainer.get("logger") is False or trainer.get("logger") == []:
                raise OutOfRange("--trainer.logger false is refused for training: a run's checkpoints, "
                                 "config and export go to its logger's run directory, and without one "
                                 "they would land in the working directory (another place: "
                                 "--trainer.logger.init_args.save_dir DIR)")
            self.notes.extend(validate_at_the_end(trainer))
            self.notes.extend(warm_up_note(self.config.get("model", {}), trainer))


SEED = Range(0, 2**32 - 1)
"""A global seed: numpy's, an unsigned 32-bit integer."""
EPOCH_FRACTION = Range(0, 1, low_open=True)
"""A ``val_check_interval`` given as a float: the share of an epoch between validations."""


def check_trainer(trainer: Any) -> None:
    """The trainer's counts, checked as the project's own settings are (:class:`OutOfRange`):
    Lightning divides by a zero interval or accumulation; ``max_steps``, ``max_epochs`` or
    ``limit_train_batches`` of 0 train nothing and ``limit_val_batches`` 0 validates nothing, yet
    each would export a fingerprinter no validation chose; a negative ``gradient_clip_val`` turns
    clipping by norm into a step against the gradient; a negative ``log_every_n_steps`` logs every
    step (0 is Lightning's "log no training step")."""
    ranges = {"accumulate_grad_batches": AT_LEAST_ONE, "gradient_clip_val": NON_NEGATIVE,
              "log_every_n_steps": NON_NEGATIVE}
    check_ranges("trainer", {name: trainer.get(name) for name in ranges}, ranges)
    for name in ("max_steps", "max_epochs"):
        limit = trainer.get(name)
        if limit is not None and limit != -1 and not (isinstance(limit, int) and limit >= 1):
            raise OutOfRange(f"trainer field {name!r} is {limit!r}: allowed is -1 (no limit) or >= 1")
    for name in ("val_check_interval", "limit_train_batches", "limit_val_batches"):
        batches = trainer.get(name)
        fraction = isinstance(batches, float) and EPOCH_FRACTION.contains(batches)
        count = (isinstance(batches, (int, float)) and not isinstance(batches, bool) and batches >= 1
                 and float(batches).is_integer())  # 2.0 is a count to Lightning, as the parser may give "2"
        if batches is not None and not (fraction or count):
            raise OutOfRange(f"trainer field {name!r} is {batches!r}: allowed is a number of batches >= 1 "
                             "or a fraction of the epoch in (0, 1]")


def validate_at_the_end(trainer: Any) -> list[str]:
    """With ``max_steps`` below the validation interval no validation would run, so no checkpoint
    would be chosen and the export would record ``"checkpoint": null``: validate at the last
    step instead; with ``max_steps`` past a validation but not on one, the steps after it are
    trained and never validated, which the note says. Returns the note (printed once the run is
    accepted)."""
    interval, max_steps = trainer.get("val_check_interval"), trainer.get("max_steps") or -1
    batches = max_steps * (trainer.get("accumulate_grad_batches") or 1)
    if not (isinstance(interval, int) and not isinstance(interval, bool) and 0 < batches):
        return []
    if batches % interval and batches > interval:
        return [f"note: the last {batches % interval} of {batches} training batches come after the last "
                f"validation (batch {batches - batches % interval}; --trainer.val_check_interval "
                f"{interval}): no checkpoint holds them, so the export is the best validated one"]
    if batches < interval:
        trainer["val_check_interval"] = batches
        return [f"note: --trainer.max_steps {max_steps} is below --trainer.val_check_interval {interval}: "
                f"validating after batch {batches} instead"]
    return []


def warm_up_note(model: Any, trainer: Any) -> list[str]:
    """A note when the linear warm-up is not shorter than the run: the learning rate then never
    reaches its peak (the configs' 100- and 500-step warm-ups cut short by a small ``max_steps``)."""
    warmup, max_steps = model.get("warmup_steps"), trainer.get("max_steps")
    if isinstance(warmup, int) and isinstance(max_steps, int) and 0 < max_steps <= warmup:
        # the rate of optimizer step i (from 0) is i / warmup of its peak: the last is max_steps - 1
        return [f"note: --model.warmup_steps {warmup} is not below --trainer.max_steps {max_steps}: the "
                f"learning rates stay in their warm-up, at most {(max_steps - 1) / warmup:.2f} of their peak"]
    return []


def check_lengths(model: ISQLightningModule, data: DialogueDataModule) -> None:
    """The token lengths the encoder is given must fit its positions (:class:`OutOfRange`, before the
    data is tokenised): contexts always, targets when the contrastive term encodes them too."""
    positions = getattr(model.model.encoder.config, "max_position_embeddings", None)
    if positions is None:  # T5's are relative
        return
    lengths = {"max_context_tokens": data.hparams["max_context_tokens"]}
    if model.model.config.lambda_nce > 0:
        lengths["max_target_tokens"] = data.hparams["max_target_tokens"]
    for name, length in lengths.items():
        if length > positions:
            raise OutOfRange(f"--data.{name} is {length}: this encoder takes at most {positions} tokens")


class LoggerUnavailable(RuntimeError):
    """The configured experiment logger cannot start (wandb without a login or offline mode)."""


def metrics_csv_beside(logger: WandbLogger) -> CSVLogger:
    """Start the wandb run (so its id names the run directory) and return a CSV logger writing
    ``metrics.csv`` into that directory, beside the checkpoints and the export."""
    from wandb.errors import Error as WandbError

    try:
        logger.experiment  # noqa: B018 - starting the run is the point
    except WandbError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise LoggerUnavailable(f"wandb could not start ({first}); set WANDB_MODE=offline to log locally, "
                                "or log in with `wandb login`") from None
    return CSVLogger(save_dir=logger.save_dir or ".", name=str(logger.name), version=str(logger.version))


class CheckpointError(ValueError):
    """--ckpt_path names no readable Lightning checkpoint."""


def check_checkpoint(path: str | None, model: torch.nn.Module, resume: bool = False,
                     data: DialogueDataModule | None = None) -> None:
    """A checkpoint to resume from or validate must exist, be a complete torch zip archive (a
    truncated file has no central directory), hold tensors and plain values only (it is read as
    ``weights_only``, as Lightning reads it: any other pickled object is code that loading would
    run, and a checkpoint this project writes has none), be a Lightning checkpoint and hold weights of this
    model's shapes (one made with other settings does not fit); one to resume from, of a run with
    this model's settings and ``data``'s (:func:`changed_settings`, :func:`changed_data`): refused
    before the run starts."""
    if path is None:
        return
    if not Path(path).is_file():
        raise CheckpointError(f"--ckpt_path {path}: no such file")
    try:
        with zipfile.ZipFile(path) as archive:
            archive.namelist()
        saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError:
        raise CheckpointError(
            f"--ckpt_path {path}: holds objects other than tensors and plain values, which loading would "
            "run as code (a checkpoint this project writes holds none): refused") from None
    except (zipfile.BadZipFile, OSError, RuntimeError) as err:
        raise CheckpointError(
            f"--ckpt_path {path}: not a readable checkpoint (truncated or corrupt: {err})") from None
    weights = saved.get("state_dict") if isinstance(saved, dict) else None
    if not isinstance(weights, dict) or "pytorch-lightning_version" not in saved:
        raise CheckpointError(f"--ckpt_path {path}: not a Lightning checkpoint (no state_dict and version)")
    expected = {name: tuple(value.shape) for name, value in model.state_dict().items()}
    found = {name: tuple(value.shape) for name, value in weights.items() if isinstance(value, torch.Tensor)}
    for name in sorted(expected.keys() | found.keys()):
        if expected.get(name) != found.get(name):
            raise CheckpointError(
                f"--ckpt_path {path}: its weights do not fit this model's settings ({name}: "
                f"{found.get(name, 'absent')} in the checkpoint, {expected.get(name, 'absent')} here); "
                "give the settings it was trained with")
    if resume and (changed := changed_settings(saved.get("hyper_parameters") or {},
                                               dict(getattr(model, "hparams", {})))
                   + changed_data(saved.get("datamodule_hyper_parameters") or {}, data)):
        raise CheckpointError(
            f"--ckpt_path {path}: the run was trained with {changed[0]}; a resume continues a run with its "
            "own model and data settings (the optimiser state holds the first; its best checkpoint was "
            "scored on the second's validation split and its epoch's position counts their batches), so "
            "give those, or start a new run from its export with --model.init_from")
    if resume and RUN_SEED in saved and saved[RUN_SEED] != (seed := global_seed()):
        raise CheckpointError(
            f"--ckpt_path {path}: the run was trained with seed_everything {saved[RUN_SEED]}, not "
            f"{seed}; a resume goes on with the run's own random state (the checkpoint's), so "
            "the run it records would not be the run it is: give its seed")


NOT_COMPARED = {"_instantiator", "init_from"}
"""Hyperparameters a resume may give otherwise: Lightning's own, and the warm start (the
checkpoint's weights replace it)."""


DATA_NOT_COMPARED = {"num_workers", "cache_dir"}
"""Data settings a resume may give otherwise: how batches are loaded, not which."""


def changed_data(saved: Mapping[str, Any], data: DialogueDataModule | None) -> list[str]:
    """The data settings (``--data.*``) a checkpoint's give otherwise than ``data``'s, but
    :data:`DATA_NOT_COMPARED` and a directory the checkpoint does not name (one written before
    the data module recorded the directory it read from the environment)."""
    if data is None:
        return []
    kept = {name: value for name, value in saved.items()
            if name not in DATA_NOT_COMPARED and not (name == "root" and value is None)}
    return changed_settings(kept, dict(data.hparams), "data")


def changed_settings(saved: Any, current: Any, prefix: str = "model") -> list[str]:
    """The settings (``--model.*``, or ``prefix``'s) a checkpoint's hyperparameters give otherwise
    than the current ones, as ``model.head_lr 0.003, not 0.5``. Restoring the optimiser would keep the
    checkpoint's learning rates whatever the settings say, and a frozen or thawed encoder changes
    its parameter groups. A setting the checkpoint does not have (one added since) is not compared,
    nor :data:`NOT_COMPARED`; two spellings of one existing path are the same setting."""
    if dataclasses.is_dataclass(current) and not isinstance(current, type):
        current = dataclasses.asdict(current)
    if isinstance(saved, dict) and isinstance(current, dict):
        names = sorted(saved.keys() - NOT_COMPARED)
        return [change for name in names
                for change in changed_settings(saved[name], current.get(name), f"{prefix}.{name}")]
    if isinstance(saved, (list, tuple)) and isinstance(current, (list, tuple)):
        if len(saved) != len(current):
            return [f"{prefix} {saved!r}, not {current!r}"]
        return [change for index, (old, new) in enumerate(zip(saved, current, strict=True))
                for change in changed_settings(old, new, f"{prefix}[{index}]")]
    if isinstance(saved, str) and isinstance(current, str) and saved != current \
            and Path(saved).exists() and Path(current).exists():
        saved, current = str(Path(saved).resolve()), str(Path(current).resolve())
    return [] if saved == current else [f"{prefix} {saved!r}, not {current!r}"]


BAD_INPUT = (FileNotFoundError, DataFormatError, WarmStartError, EncoderUnavailable, ExportExistsError,
             UnwritableOutput, CheckpointError, OutOfRange, LoggerUnavailable, MisconfigurationException,
             NonFiniteWeights)
"""Failures that are the input's fault (a diverged run's are its settings'): reported in one line,
exit code 2."""


def out_of_space(err: OSError) -> str:
    """The line for a disk that filled under the run. A checkpoint being written then is a part of
    one (a resume refuses it, and the file it replaced is gone already): it is removed."""
    target = err.filename2 or err.filename
    if target is None:  # a file open for writing, or a checkpoint's temporary file
        target = f"a file of the run, or a temporary file in {tempfile.gettempdir()}"
    said = f"no space left on device writing {target}"
    if str(target).endswith(".ckpt") and Path(target).is_file():
        Path(target).unlink()
        said += " (the part of it written is removed)"
    return said + ": free space, then resume from one of the run's checkpoints (--ckpt_path) or start again"


def remove_empty_run_directories(trainer: Trainer) -> None:
    """The run directories (``runs/<name>/version_N``) a refused run left empty: kept, they would
    move the next run's version on, and ``runs/<name>/version_0`` would name an empty one."""
    for logger in trainer.loggers:
        directory = getattr(logger, "log_dir", None)
        if directory and Path(directory).is_dir() and not any(Path(directory).iterdir()):
            Path(directory).rmdir()


def main(args: list[str] | None = None) -> ISQCLI:
    with spared_stdout():
        return _main(args)


def _main(args: list[str] | None) -> ISQCLI:
    quiet_third_party_noise()
    cli: ISQCLI | None = None
    try:
        cli = ISQCLI(
            ISQLightningModule, DialogueDataModule, run=False, args=args, parser_class=OneLineErrors,
            save_config_callback=RunConfigSaver,
            save_config_kwargs={"overwrite": True}, seed_everything_default=0,
            parser_kwargs={"default_config_files": [str(DEFAULTS)], "prog": "python -m training.fit"},
        )
        ckpt_path = cli.config.get("ckpt_path")
        check_lengths(cli.model, cli.datamodule)
        check_checkpoint(ckpt_path, cli.model, resume=not cli.config.get("validate_only"),
                         data=cli.datamodule)
        # an occupied export directory: refused before data setup
        for callback in getattr(cli.trainer, "callbacks", []):
            if isinstance(callback, ExportFingerprinter) and callback.dirpath is not None:
                callback.refuse_occupied(Path(callback.dirpath))
        for note in cli.notes:
            print(note, file=sys.stderr)
        if cli.config.get("validate_only"):
            cli.trainer.validate(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt_path)
        else:
            cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=ckpt_path)
    except BAD_INPUT as err:
        if cli is not None:
            remove_empty_run_directories(cli.trainer)
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except OSError as err:  # a path that is a file where a directory must be, unreadable, a full disk
        if cli is not None:
            remove_empty_run_directories(cli.trainer)
        print(f"error: {out_of_space(err) if err.errno == errno.ENOSPC else err}", file=sys.stderr)
        raise SystemExit(2) from None
    return cli


if __name__ == "__main__":
    main()
