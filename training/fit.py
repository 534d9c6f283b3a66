"""``python -m training.fit --config configs/smoke.yaml`` — train ISQ with LightningCLI.

Everything is set from YAML or the command line (``--print_config`` shows the full config).
``--ckpt_path PATH`` resumes a run; with ``--validate_only true`` it is only validated. Precision defaults to ``bf16-mixed`` with CUDA and fp32
otherwise; fp16 and ``bf16-true`` are refused (T5 overflows in fp16; ``bf16-true`` would cast
the EMA codebook buffers).
"""

from __future__ import annotations

import sys

import torch
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from training.data import DataFormatError, DialogueDataModule
from training.module import ISQLightningModule, WarmStartError

_FP16 = "fp16 overflows in T5 (use bf16-mixed on CUDA or 32-true)"
_BF16_TRUE = "bf16-true casts the EMA codebook buffers to bf16 (use bf16-mixed)"
REFUSED_PRECISION = {"16": _FP16, "16-mixed": _FP16, "16-true": _FP16, "bf16": _BF16_TRUE, "bf16-true": _BF16_TRUE}


def default_precision() -> str:
    return "bf16-mixed" if torch.cuda.is_available() else "32-true"


class ISQCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument("--ckpt_path", type=str | None, default=None, help="checkpoint to resume from")
        parser.add_argument("--validate_only", type=bool, default=False,
                            help="only run validation (of --ckpt_path, if given) and print the metrics")
        parser.link_arguments(
            ("model.isq.tokenizer", "model.isq.encoder"), "data.tokenizer",
            compute_fn=lambda tokenizer, encoder: tokenizer or encoder,
        )
        parser.set_defaults({"trainer.precision": default_precision()})

    def before_instantiate_classes(self) -> None:
        precision = str(self.config.get("trainer", {}).get("precision"))
        if precision in REFUSED_PRECISION:
            self.parser.error(f"--trainer.precision {precision} is refused: {REFUSED_PRECISION[precision]}")


def main(args: list[str] | None = None) -> ISQCLI:
    try:
        cli = ISQCLI(
            ISQLightningModule, DialogueDataModule, run=False, args=args,
            save_config_kwargs={"overwrite": True}, seed_everything_default=0,
        )
    except WarmStartError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        if cli.config.get("validate_only"):
            cli.trainer.validate(cli.model, datamodule=cli.datamodule, ckpt_path=cli.config.get("ckpt_path"))
        else:
            cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=cli.config.get("ckpt_path"))
    except (FileNotFoundError, DataFormatError) as err:  # bad input: one clear line, no traceback
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    return cli


if __name__ == "__main__":
    main()
