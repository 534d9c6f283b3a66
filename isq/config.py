"""``ISQConfig``: every hyper-parameter of the ISQ model, with MemCode's defaults (docs/design.md §1).

Saved inside every exported fingerprinter (``config.json``, key ``isq_config``) and read back by
:meth:`ISQConfig.from_dict`, which names the first unknown field. Every field is type-checked
and every numeric one range-checked on construction (:data:`RANGES`), from YAML, the command
line, Python or an export alike, so a value such as ``max_length 0`` or ``num_codes 2.5`` is
refused instead of changing meaning; so is a ``decoder`` key T5 does not know (a typo there would
silently leave the default size).
"""

from __future__ import annotations

import functools
import types
import typing
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from isq.projection import NORMALIZATIONS
from isq.ranges import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, TOKEN_LENGTH, OutOfRange, Range, check_ranges

DECODER_SIZES = ("d_model", "d_ff", "num_decoder_layers", "num_heads", "d_kv")

@dataclass
class ISQConfig:
    """Every hyper-parameter of the ISQ model (defaults: MemCode's, docs/design.md §1)."""

    encoder: str = "t5-base"
    """Hugging Face name or path of the encoder (or ``offline:all-MiniLM-L6-v2``)."""
    encoder_config: dict[str, Any] | None = None
    """Build a randomly initialised encoder from this config instead (tests, smoke runs)."""
    tokenizer: str | None = None
    """Tokenizer name or path; defaults to ``encoder``."""
    freeze_encoder: bool = False
    lora_rank: int = 0
    """Rank of low-rank adapters (LoRA, via ``peft``) on the encoder's attention projections;
    0 = none. With a frozen pretrained encoder they are the only encoder weights that train, and
    an export stores them beside a checksum reference to the installed encoder (kilobytes)."""
    lora_alpha: float = 16.0
    lora_targets: list[str] | None = None
    """Module names that get adapters; default: the attention query and value projections
    (``query``/``value`` in BERT-style encoders, ``q``/``v`` in T5)."""
    code_dim: int = 256
    kernel_size: int = 3
    normalize_projection: str = "none"
    """Normalisation of z after the convolution: "none" (the paper's), "token" or "layer"
    (see :class:`isq.projection.StrideOneProjection`); guards against codebook collapse."""
    num_codes: int = 1024
    ema_decay: float = 0.99
    ema_eps: float = 1e-5
    beta: float = 0.10
    lambda_vq: float = 1.0
    lambda_ent: float = 0.01
    lambda_rec: float = 0.0
    """Weight of an optional token-reconstruction term (not in the papers, docs/design.md §1.10;
    0 = off): CE of each input token given its own quantized code, through a linear head. It asks
    every code to name its token; in the CPU ablations (docs/results.md) that made codes more word-like but
    did not improve LoCoMo recall, so it is off in every shipped config."""
    lambda_nce: float = 0.0
    """Weight of an optional contrastive predictive-coding term (not in the papers,
    docs/design.md §1.10; 0 = off): InfoNCE between the soft code bags
    (:meth:`isq.quantizer.EMAQuantizer.code_distribution`) of each context and of its own next turn,
    symmetric: each context against the batch's next turns and each next turn against its contexts
    (the others as negatives). It rewards what Path B's code matching needs:
    related utterances sharing codes."""
    nce_temperature: float = 0.1
    entropy_temperature: float = 1.0
    revive_every: int = 20
    revive_threshold: float = 1.0
    kmeans_init: bool = False
    """Place the codes by k-means on the first training batch's z instead of a random init. Not
    in the paper (docs/design.md §1.10; so off by default and in the paper config); the smoke config uses
    it to be useful within 120 steps."""
    decoder: dict[str, Any] = field(default_factory=dict)
    """T5 decoder sizes (``d_model``, ``d_ff``, ``num_decoder_layers``, ``num_heads``, ``d_kv``)
    for a fresh decoder. Ignored when the encoder is a pretrained T5, whose decoder is reused."""
    max_length: int = 512
    """Tokens per text; longer texts are truncated (there is no "no truncation" value)."""

    def __post_init__(self) -> None:
        hints = _field_types()
        for item in fields(self):
            value = getattr(self, item.name)
            if not _has_type(value, hints[item.name]):
                raise OutOfRange(f"ISQConfig field {item.name!r} must be {_type_name(hints[item.name])}, "
                                 f"got {value!r}")
        check_ranges("ISQConfig", asdict(self), RANGES)
        if self.kernel_size % 2 != 1:
            raise OutOfRange(f"ISQConfig field 'kernel_size' is {self.kernel_size}: "
                             "it must be odd (keeps the length)")
        if self.normalize_projection not in NORMALIZATIONS:
            raise OutOfRange(f"ISQConfig field 'normalize_projection' is {self.normalize_projection!r}: "
                             f"allowed values are {', '.join(NORMALIZATIONS)}")
        if self.encoder_config is not None and "model_type" not in self.encoder_config:
            raise OutOfRange("ISQConfig field 'encoder_config' needs a 'model_type' (such as 't5' or 'bert')")
        unknown = sorted(set(self.decoder) - _t5_settings())
        if unknown:
            raise OutOfRange(f"ISQConfig field 'decoder.{unknown[0]}' is not a T5 setting "
                             f"(the sizes are {', '.join(DECODER_SIZES)})")
        sizes = {name: AT_LEAST_ONE for name in DECODER_SIZES if name in self.decoder}
        check_ranges("ISQConfig.decoder", self.decoder, sizes)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ISQConfig:
        """Build from saved values; a ValueError names the first unknown or mistyped field."""
        if not isinstance(values, dict):
            raise ValueError(f"ISQConfig needs a JSON object, got {type(values).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown ISQConfig field(s): {', '.join(unknown)}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def encoder_is_pretrained(self) -> bool:
        return self.encoder_config is None


RANGES: dict[str, Range] = {
    "lora_rank": NON_NEGATIVE,
    "lora_alpha": POSITIVE,
    "code_dim": AT_LEAST_ONE,
    "kernel_size": AT_LEAST_ONE,
    "num_codes": AT_LEAST_ONE,
    # 1 would never move a code; 0 would zero every code a step leaves unused (and divide 0 by 0 in
    # a step without real tokens)
    "ema_decay": Range(0, 1, low_open=True, high_open=True),
    "ema_eps": POSITIVE,
    "beta": NON_NEGATIVE,
    "lambda_vq": NON_NEGATIVE,
    "lambda_ent": NON_NEGATIVE,
    "lambda_rec": NON_NEGATIVE,
    "lambda_nce": NON_NEGATIVE,
    "nce_temperature": POSITIVE,
    "entropy_temperature": POSITIVE,
    "revive_every": AT_LEAST_ONE,
    "revive_threshold": NON_NEGATIVE,
    "max_length": TOKEN_LENGTH,
}
"""Allowed range of every numeric field (each of the decoder's :data:`DECODER_SIZES` must be at least 1)."""


def _has_type(value: Any, hint: Any) -> bool:
    """Whether a JSON value fits a field annotation (str, int, float, bool, dict, optional)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_has_type(value, arm) for arm in typing.get_args(hint))
    if hint is type(None):
        return value is None
    origin = typing.get_origin(hint) or hint
    if origin is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, origin)


@functools.cache
def _field_types() -> dict[str, Any]:
    """:class:`ISQConfig`'s field annotations, resolved once (they are strings until resolved)."""
    return typing.get_type_hints(ISQConfig)


@functools.cache
def _t5_settings() -> frozenset[str]:
    """The keys a T5 config takes (``decoder``'s allowed keys), read once."""
    from transformers import T5Config

    return frozenset(T5Config().to_dict())


def _type_name(hint: Any) -> str:
    return str(hint).replace("typing.", "").replace("<class '", "").replace("'>", "")
