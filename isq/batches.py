"""The one token-encoding loop: texts -> length-sorted batches -> tokenizer -> semantic encoder.

Used by the fingerprinter, the codebook analysis and the k-means control, so all three see
exactly the same z_t for a text. Texts are sorted by character length (shortest first) so a
batch pads little; the order, and with it each batch's padding, is a pure function of the texts,
which keeps fingerprints reproducible run to run.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import BatchEncoding, PreTrainedTokenizerBase

from isq.encoder import SemanticEncoder


@dataclass
class EncodedBatch:
    """One batch: ``positions`` of its texts in the input, their token ids and attention mask
    (B, L; 1 = real token) and the projected states ``z`` (B, L, code_dim); padding rows of z
    are meaningless."""

    positions: list[int]
    input_ids: Tensor
    attention_mask: Tensor
    z: Tensor

    @property
    def mask(self) -> Tensor:
        return self.attention_mask.bool()


def length_order(texts: Sequence[str]) -> list[int]:
    """Text positions, shortest text first (stable for equal lengths)."""
    return sorted(range(len(texts)), key=lambda i: len(texts[i]))


def tokenize_batch(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str],
                   max_length: int) -> BatchEncoding:
    """One batch's token ids and attention mask: padded to its longest text, truncated to
    ``max_length`` tokens."""
    batch: BatchEncoding = tokenizer(list(texts), padding=True, truncation=True, max_length=max_length,
                                     return_tensors="pt")
    return batch


@torch.inference_mode()
def encode_batches(semantic_encoder: SemanticEncoder, tokenizer: PreTrainedTokenizerBase,
                   texts: Sequence[str], max_length: int, batch_size: int = 64) -> Iterator[EncodedBatch]:
    """Encode ``texts`` (truncated to ``max_length`` tokens) batch by batch, in length order."""
    if isinstance(texts, str):
        raise TypeError("encode_batches() takes a sequence of texts, not a single string")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    device = next(semantic_encoder.parameters()).device
    order = length_order(texts)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        batch = tokenize_batch(tokenizer, [texts[i] for i in chunk], max_length).to(device)
        z = semantic_encoder(batch["input_ids"], batch["attention_mask"])
        yield EncodedBatch(chunk, batch["input_ids"], batch["attention_mask"], z)
