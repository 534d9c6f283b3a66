"""ISQ model: encoder -> stride-1 projection -> EMA codebook -> predictive-coding decoder.

docs/design.md §1.7. The decoder (a T5 decoder, T5's own when the encoder is T5) cross-attends to
the up-projected quantized context and is trained with teacher forcing to produce the next
turn of the dialogue, so the codes must carry what predicts the conversation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase, T5Config, T5ForConditionalGeneration

from isq.codebook import fp32_island
from isq.config import ISQConfig
from isq.encoder import (
    SemanticEncoder,
    build_encoder,
    built_from,
    check_vocabulary,
    encoder_model_type,
    from_pretrained,
    is_adapter,
    load_tokenizer,
)
from isq.fingerprint import Fingerprinter
from isq.projection import statistics_kept
from isq.quantizer import EMAQuantizer


def build_decoder(config: ISQConfig, tokenizer: PreTrainedTokenizerBase) -> T5ForConditionalGeneration:
    """A T5 decoder + LM head without its encoder stack (the ISQ codes replace it)."""
    seq2seq: T5ForConditionalGeneration
    if config.encoder_is_pretrained and encoder_model_type(config) == "t5":
        seq2seq = from_pretrained(T5ForConditionalGeneration, config.encoder)
    else:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
        # from_dict: config.decoder is a JSON object of T5Config fields (these sizes by default).
        values = {"d_model": 256, "d_ff": 1024, "num_decoder_layers": 2, "num_heads": 4, "d_kv": 64,
                  **config.decoder, "vocab_size": len(tokenizer), "num_layers": 1, "pad_token_id": pad,
                  "eos_token_id": eos, "decoder_start_token_id": pad, "tie_word_embeddings": True}
        with built_from("decoder", "decoder"):
            seq2seq = T5ForConditionalGeneration(T5Config.from_dict(values))
    seq2seq.register_module("encoder", None)  # never run: encoder_outputs are always given
    return seq2seq


@dataclass
class ISQOutput:
    """Total loss and each component (docs/design.md §1.6), plus codebook statistics of the batch."""

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
    revival_candidates: Tensor
    """The batch's real-token z (detached), for :meth:`isq.quantizer.EMAQuantizer.optimizer_step`."""


def info_nce(context: Tensor, following: Tensor, temperature: float) -> Tensor:
    """Symmetric InfoNCE over a batch of paired vectors (B, N): row i of each is the positive
    of row i of the other, the other rows are negatives; cosine similarity / ``temperature``."""
    logits = (nn.functional.normalize(context, dim=1) @ nn.functional.normalize(following, dim=1).t()
              / temperature)
    target = torch.arange(logits.shape[0], device=logits.device)
    return 0.5 * (nn.functional.cross_entropy(logits, target)
                  + nn.functional.cross_entropy(logits.t(), target))


class ISQModel(nn.Module):
    """The trainable model. ``forward`` returns an :class:`ISQOutput`.

    L = CE(next turn | quantized context) + λ_vq · mean_t(||sg[z]−z̄||² + β ||z−sg[z̄]||²) + λ_ent · L_ent
    (+ λ_rec · CE(input token | its own code) when ``lambda_rec`` > 0, and
    + λ_nce · InfoNCE(context codes, next-turn codes) when ``lambda_nce`` > 0, both outside the
    papers, docs/design.md §1.10).
    """

    def __init__(self, config: ISQConfig, tokenizer: PreTrainedTokenizerBase | None = None) -> None:
        super().__init__()
        self.config = config
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config)
        encoder = build_encoder(config)
        check_vocabulary(config, encoder, self.tokenizer)
        self.semantic_encoder = SemanticEncoder.build(config, encoder, frozen=config.freeze_encoder)
        self.quantizer = EMAQuantizer(
            num_codes=config.num_codes, code_dim=config.code_dim, ema_decay=config.ema_decay,
            ema_eps=config.ema_eps,
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
        loss = ce + self.config.lambda_vq * q.vq_loss + self.config.lambda_ent * q.entropy_loss
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
            with statistics_kept(self.semantic_encoder):
                z_next = self.semantic_encoder(labels.masked_fill(~next_mask, pad), next_mask.long())
            with fp32_island():  # cosine logits / 0.1 would lose digits in bf16
                contrastive = info_nce(self.quantizer.code_distribution(z, mask),
                                       self.quantizer.code_distribution(z_next, next_mask),
                                       self.config.nce_temperature)
            loss = loss + self.config.lambda_nce * contrastive
        return ISQOutput(
            loss=loss, ce_loss=ce, codebook_loss=q.codebook_loss, commitment_loss=q.commitment_loss,
            entropy_loss=q.entropy_loss, reconstruction_loss=reconstruction, contrastive_loss=contrastive,
            perplexity=q.perplexity,
            codes_used=q.codes_used, indices=q.indices, revival_candidates=q.revival_candidates,
        )

    def parameter_groups(self) -> dict[str, list[nn.Parameter]]:
        """Trainable parameters split by the two learning rates (docs/design.md §1.8): encoder, the rest."""
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
        The decoder and up-projection stay freshly initialised; adapters this model has and the
        source lacks keep their initialisation (LoRA's B = 0: the adapted encoder starts as the
        source's). Raises ValueError naming the first setting in which the two differ.
        """
        ours, theirs = self.config, fingerprinter.config
        for name in ("encoder", "code_dim", "num_codes", "kernel_size", "normalize_projection"):
            if getattr(ours, name) != getattr(theirs, name):
                raise ValueError(f"{name} is {getattr(theirs, name)!r} in the fingerprinter but "
                                 f"{getattr(ours, name)!r} in this model")
        if fingerprinter.tokenizer.get_vocab() != self.tokenizer.get_vocab():
            raise ValueError("the fingerprinter's tokenizer differs from this model's")
        source = fingerprinter.semantic_encoder.state_dict()
        # adapters wrap a layer: its weights move under base_layer
        for key in self.semantic_encoder.state_dict():
            plain = key.replace(".base_layer.", ".")
            if plain != key and plain in source:
                source[key] = source.pop(plain)
        shapes = {key: tensor.shape for key, tensor in self.semantic_encoder.state_dict().items()}
        for key, tensor in source.items():  # a wider layer or another adapter rank
            if key in shapes and shapes[key] != tensor.shape:
                raise ValueError(f"the fingerprinter's encoder does not fit this model's: {key} is "
                                 f"{tuple(tensor.shape)} there but {tuple(shapes[key])} here")
        missing, unexpected = self.semantic_encoder.load_state_dict(source, strict=False)
        if unexpected or [name for name in missing if not is_adapter(name)]:
            raise ValueError(f"the fingerprinter's encoder does not fit this model's: missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]}")
        self.quantizer.load_codebook(fingerprinter.codebook.vectors)

    def fingerprinter(self) -> Fingerprinter:
        """A frozen copy of the encoder + projection + codebook."""
        return Fingerprinter(self.config, self.tokenizer, self.semantic_encoder, self.quantizer.codebook)

    def export_fingerprinter(self, directory: str | Path, run_record: dict[str, Any] | None = None, *,
                             overwrite: bool = False) -> Path:
        """Save :meth:`fingerprinter` as a directory (see :meth:`Fingerprinter.save_pretrained`)."""
        return self.fingerprinter().save_pretrained(directory, run_record=run_record, overwrite=overwrite)
