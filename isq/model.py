"""ISQ model: encoder -> stride-1 projection -> EMA codebook -> predictive-coding decoder.

SPEC section 1. The decoder (a T5 decoder, T5's own when the encoder is T5) cross-attends to
the up-projected quantized context and is trained with teacher forcing to produce the next
turn of the dialogue, so the codes must carry what predicts the conversation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoTokenizer,
    PreTrainedTokenizerBase,
    T5Config,
    T5EncoderModel,
    T5ForConditionalGeneration,
)

from isq.encoders import resolve_encoder_path
from isq.projection import StrideOneProjection
from isq.quantizer import EMAQuantizer, fp32_island

if TYPE_CHECKING:  # isq.fingerprint imports this module
    from isq.fingerprint import Fingerprinter


@dataclass
class ISQConfig:
    """Every hyper-parameter of the ISQ model (defaults = SPEC / MemCode paper)."""

    encoder: str = "t5-base"
    """Hugging Face name or path of the encoder (or ``offline:all-MiniLM-L6-v2``)."""
    encoder_config: dict[str, Any] | None = None
    """Build a randomly initialised encoder from this config instead (tests, smoke runs)."""
    tokenizer: str | None = None
    """Tokenizer name or path; defaults to ``encoder``."""
    freeze_encoder: bool = False
    code_dim: int = 256
    kernel_size: int = 3
    normalize_projection: str = "none"
    """Normalisation of z after the convolution: "none" (SPEC), "token" or "layer"
    (see :class:`isq.projection.StrideOneProjection`); guards against codebook collapse."""
    num_codes: int = 1024
    ema_decay: float = 0.99
    ema_eps: float = 1e-5
    beta: float = 0.10
    lambda_vq: float = 1.0
    lambda_ent: float = 0.01
    lambda_rec: float = 0.0
    """Weight of an optional token-reconstruction term (not in the SPEC; 0 = off): CE of each
    input token given its own quantized code, through a linear head. It asks every code to
    name its token; in the CPU ablations (docs/results.md) that made codes more word-like but
    did not improve LoCoMo recall, so it is off in every shipped config."""
    lambda_nce: float = 0.0
    """Weight of an optional contrastive predictive-coding term (not in the SPEC; 0 = off):
    InfoNCE between the soft code bags (:meth:`isq.quantizer.EMAQuantizer.code_distribution`)
    of each context and of its own next turn, the other next turns of the batch as negatives.
    It rewards what Path B's code matching needs: related utterances sharing codes."""
    nce_temperature: float = 0.1
    entropy_temperature: float = 1.0
    revive_every: int = 20
    revive_threshold: float = 1.0
    kmeans_init: bool = True
    decoder: dict[str, Any] = field(default_factory=dict)
    """T5 decoder sizes (``d_model``, ``d_ff``, ``num_decoder_layers``, ``num_heads``, ``d_kv``)
    for a fresh decoder. Ignored when the encoder is a pretrained T5, whose decoder is reused."""
    max_length: int = 512

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ISQConfig:
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


def load_tokenizer(config: ISQConfig) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(resolve_encoder_path(config.tokenizer or config.encoder))


def build_encoder(config: ISQConfig, architecture: dict[str, Any] | None = None) -> nn.Module:
    """The encoder: pretrained from ``config.encoder``, or random from a config dict.

    ``architecture`` (a saved ``encoder.config.to_dict()``) rebuilds an encoder whose weights
    are loaded afterwards. Poolers are dropped: only token states are used.
    """
    spec = architecture if architecture is not None else config.encoder_config
    if spec is not None:
        spec = dict(spec)
        enc_config = AutoConfig.for_model(spec.pop("model_type"), **spec)
        encoder = T5EncoderModel(enc_config) if enc_config.model_type == "t5" else AutoModel.from_config(enc_config)
    else:
        path = resolve_encoder_path(config.encoder)
        enc_config = AutoConfig.from_pretrained(path)
        cls = T5EncoderModel if enc_config.model_type == "t5" else AutoModel
        encoder = cls.from_pretrained(path)
    if getattr(encoder, "pooler", None) is not None:
        encoder.pooler = None
    return encoder


def encoder_width(encoder: nn.Module) -> int:
    cfg = encoder.config
    return int(getattr(cfg, "d_model", None) or cfg.hidden_size)


class SemanticEncoder(nn.Module):
    """Encoder + stride-1 projection: token ids (B, L) -> continuous codes z (B, L, code_dim)."""

    def __init__(self, encoder: nn.Module, projection: StrideOneProjection, frozen: bool = False) -> None:
        super().__init__()
        self.encoder = encoder
        self.projection = projection
        self.frozen = frozen
        if frozen:
            self.encoder.requires_grad_(False)
            self.encoder.eval()

    def train(self, mode: bool = True) -> SemanticEncoder:
        super().train(mode)
        if self.frozen:  # a frozen encoder keeps dropout off
            self.encoder.eval()
        return self

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.frozen):
            hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.projection(hidden, attention_mask)


def build_decoder(config: ISQConfig, tokenizer: PreTrainedTokenizerBase) -> T5ForConditionalGeneration:
    """A T5 decoder + LM head without its encoder stack (the ISQ codes replace it)."""
    if config.encoder_is_pretrained and AutoConfig.from_pretrained(resolve_encoder_path(config.encoder)).model_type == "t5":
        seq2seq = T5ForConditionalGeneration.from_pretrained(resolve_encoder_path(config.encoder))
    else:
        sizes = {"d_model": 256, "d_ff": 1024, "num_decoder_layers": 2, "num_heads": 4, "d_kv": 64}
        sizes.update(config.decoder)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
        seq2seq = T5ForConditionalGeneration(T5Config(
            vocab_size=len(tokenizer), num_layers=1, pad_token_id=pad, eos_token_id=eos,
            decoder_start_token_id=pad, tie_word_embeddings=True, **sizes,
        ))
    seq2seq.encoder = None  # never run: encoder_outputs are always given
    return seq2seq


@dataclass
class ISQOutput:
    """Total loss and each component (SPEC "loss"), plus codebook statistics of the batch."""

    loss: Tensor
    ce_loss: Tensor
    codebook_loss: Tensor
    commitment_loss: Tensor
    entropy_loss: Tensor
    reconstruction_loss: Tensor
    contrastive_loss: Tensor
    perplexity: Tensor
    codes_used: Tensor
    indices: Tensor


def info_nce(context: Tensor, following: Tensor, temperature: float) -> Tensor:
    """Symmetric InfoNCE over a batch of paired vectors (B, N): row i of each is the positive
    of row i of the other, the other rows are negatives; cosine similarity / ``temperature``."""
    logits = nn.functional.normalize(context, dim=1) @ nn.functional.normalize(following, dim=1).t() / temperature
    target = torch.arange(logits.shape[0], device=logits.device)
    return 0.5 * (nn.functional.cross_entropy(logits, target) + nn.functional.cross_entropy(logits.t(), target))


class ISQModel(nn.Module):
    """The trainable model. ``forward`` returns an :class:`ISQOutput`.

    L = CE(next turn | quantized context) + λ_vq · mean_t(||sg[z]−z̄||² + β ||z−sg[z̄]||²) + λ_ent · L_ent
    (+ λ_rec · CE(input token | its own code) when ``lambda_rec`` > 0, and
    + λ_nce · InfoNCE(context codes, next-turn codes) when ``lambda_nce`` > 0, both outside the SPEC).
    """

    def __init__(self, config: ISQConfig, tokenizer: PreTrainedTokenizerBase | None = None) -> None:
        super().__init__()
        self.config = config
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config)
        encoder = build_encoder(config)
        self.semantic_encoder = SemanticEncoder(
            encoder, StrideOneProjection(encoder_width(encoder), config.code_dim, config.kernel_size,
                                         config.normalize_projection),
            frozen=config.freeze_encoder,
        )
        self.quantizer = EMAQuantizer(
            num_codes=config.num_codes, dim=config.code_dim, decay=config.ema_decay, eps=config.ema_eps,
            beta=config.beta, entropy_temperature=config.entropy_temperature,
            revive_every=config.revive_every, revive_threshold=config.revive_threshold,
            kmeans_init=config.kmeans_init,
        )
        self.decoder = build_decoder(config, self.tokenizer)
        self.up_projection = nn.Linear(config.code_dim, self.decoder.config.d_model)
        self.token_head = nn.Linear(config.code_dim, len(self.tokenizer)) if config.lambda_rec > 0 else None

    @property
    def encoder(self) -> nn.Module:
        return self.semantic_encoder.encoder

    def forward(self, input_ids: Tensor, attention_mask: Tensor, labels: Tensor) -> ISQOutput:
        """``labels``: next-turn token ids with -100 at padding (teacher forcing shifts them right)."""
        mask = attention_mask.bool()
        z = self.semantic_encoder(input_ids, attention_mask)
        q = self.quantizer(z, mask, with_entropy=self.config.lambda_ent > 0)
        context = self.up_projection(q.quantized.to(z.dtype))
        ce = self.decoder(encoder_outputs=(context,), attention_mask=attention_mask, labels=labels).loss
        vq = q.codebook_loss + self.config.beta * q.commitment_loss
        loss = ce + self.config.lambda_vq * vq + self.config.lambda_ent * q.entropy_loss
        reconstruction = ce.new_zeros(())
        if self.token_head is not None:
            # Only real tokens; the straight-through q passes the gradient on to the projection.
            logits = self.token_head(q.quantized[mask].to(z.dtype))
            reconstruction = nn.functional.cross_entropy(logits.float(), input_ids[mask])
            loss = loss + self.config.lambda_rec * reconstruction
        contrastive = ce.new_zeros(())
        if self.config.lambda_nce > 0:
            next_mask = labels >= 0
            pad = self.tokenizer.pad_token_id or 0
            z_next = self.semantic_encoder(labels.masked_fill(~next_mask, pad), next_mask.long())
            with fp32_island():  # cosine logits / 0.1 would lose digits in bf16
                contrastive = info_nce(self.quantizer.code_distribution(z, mask),
                                       self.quantizer.code_distribution(z_next, next_mask), self.config.nce_temperature)
            loss = loss + self.config.lambda_nce * contrastive
        return ISQOutput(
            loss=loss, ce_loss=ce, codebook_loss=q.codebook_loss, commitment_loss=q.commitment_loss,
            entropy_loss=q.entropy_loss, reconstruction_loss=reconstruction, contrastive_loss=contrastive,
            perplexity=q.perplexity,
            codes_used=q.codes_used, indices=q.indices,
        )

    def parameter_groups(self) -> dict[str, list[nn.Parameter]]:
        """Trainable parameters split as the SPEC's two learning rates: encoder vs the rest."""
        encoder_ids = {id(p) for p in self.encoder.parameters()}
        trainable = [(n, p) for n, p in self.named_parameters() if p.requires_grad]
        return {
            "encoder": [p for _, p in trainable if id(p) in encoder_ids],
            "head": [p for _, p in trainable if id(p) not in encoder_ids],
        }

    @torch.no_grad()
    def warm_start(self, fingerprinter: Fingerprinter) -> None:
        """Start training from an exported fingerprinter: its encoder, projection and codebook.

        With the k-means control (``training.kmeans_control``) as the source, step 0 of training
        fingerprints exactly like the control, so the run measures what the objective adds to it.
        The decoder and up-projection stay freshly initialised. Raises ValueError naming the
        first setting in which the two differ.
        """
        ours, theirs = self.config, fingerprinter.config
        for name in ("encoder", "code_dim", "num_codes", "kernel_size", "normalize_projection"):
            if getattr(ours, name) != getattr(theirs, name):
                raise ValueError(f"{name} is {getattr(theirs, name)!r} in the fingerprinter but "
                                 f"{getattr(ours, name)!r} in this model")
        if fingerprinter.tokenizer.get_vocab() != self.tokenizer.get_vocab():
            raise ValueError("the fingerprinter's tokenizer differs from this model's")
        self.semantic_encoder.load_state_dict(fingerprinter.semantic_encoder.state_dict())
        self.quantizer.load_codebook(fingerprinter.codebook)

    def export_fingerprinter(self, directory: str | Path, run_record: dict[str, Any] | None = None) -> Path:
        """Save the frozen encoder + projection + codebook as a fingerprinter directory."""
        from isq.fingerprint import Fingerprinter

        fingerprinter = Fingerprinter(self.config, self.tokenizer, self.semantic_encoder, self.quantizer.codebook)
        return fingerprinter.save_pretrained(directory, run_record=run_record)
