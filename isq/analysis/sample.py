"""The one fingerprinter pass of the analysis: texts -> per-token tokens, codes, ||z_t|| and errors."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from isq.batches import encode_batches
from isq.fingerprint import Fingerprinter


@dataclass
class SampleCodes:
    """Per-text results of one fingerprinter pass (padding removed, one entry per text).

    ``tokens``: the tokenizer's token strings; ``token_codes``: the nearest code per token;
    ``z_norms``: ||z_t||; ``errors``: ||z_t - e_{kappa_t}||^2. ``num_codes``: N_c.
    """

    texts: list[str]
    tokens: list[list[str]]
    token_codes: list[np.ndarray]
    z_norms: list[np.ndarray]
    errors: list[np.ndarray]
    num_codes: int

    @property
    def all_codes(self) -> np.ndarray:
        """Every token code of the sample, texts concatenated in order."""
        return _concatenate(self.token_codes, np.int64)

    @property
    def all_z_norms(self) -> np.ndarray:
        return _concatenate(self.z_norms, np.float64)

    @property
    def all_errors(self) -> np.ndarray:
        return _concatenate(self.errors, np.float64)

    def select(self, indices: Sequence[int]) -> SampleCodes:
        """The texts at ``indices``, in that order."""
        return SampleCodes(
            texts=[self.texts[i] for i in indices],
            tokens=[self.tokens[i] for i in indices],
            token_codes=[self.token_codes[i] for i in indices],
            z_norms=[self.z_norms[i] for i in indices],
            errors=[self.errors[i] for i in indices],
            num_codes=self.num_codes,
        )


def _concatenate(arrays: Sequence[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(arrays).astype(dtype) if arrays else np.zeros(0, dtype=dtype)


@torch.inference_mode()
def collect(fingerprinter: Fingerprinter, texts: Sequence[str], batch_size: int = 64) -> SampleCodes:
    """Run the fingerprinter over ``texts`` (truncated to ``config.max_length`` tokens).

    Encoding (:func:`isq.batches.encode_batches`) and lookup (``Codebook.nearest``) are the
    fingerprinter's own, so the codes agree with :meth:`Fingerprinter.fingerprint`.
    """
    if isinstance(texts, str):
        raise TypeError("collect() takes a sequence of texts, not a single string")
    if not texts:
        raise ValueError("collect() needs at least one text")
    tokenizer = fingerprinter.tokenizer
    count = len(texts)
    tokens: list[list[str]] = [[] for _ in range(count)]
    codes: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * count
    norms: list[np.ndarray] = [np.zeros(0)] * count
    errors: list[np.ndarray] = [np.zeros(0)] * count
    max_length = fingerprinter.config.max_length
    for batch in encode_batches(fingerprinter.semantic_encoder, tokenizer, texts, max_length, batch_size):
        z = batch.z.float()
        lookup = fingerprinter.codebook.nearest(z.reshape(-1, z.shape[-1]))
        batch_codes = lookup.indices.reshape(z.shape[:-1]).cpu().numpy()
        batch_errors = lookup.errors.reshape(z.shape[:-1]).double().cpu().numpy()
        batch_norms = z.norm(dim=-1).double().cpu().numpy()
        mask = batch.mask.cpu().numpy()
        ids = batch.input_ids.cpu().numpy()
        for row, i in enumerate(batch.positions):
            keep = mask[row]
            # a list of ids in, a list of tokens out
            tokens[i] = list(tokenizer.convert_ids_to_tokens(ids[row][keep].tolist()))
            codes[i] = batch_codes[row][keep].astype(np.int64)
            norms[i] = batch_norms[row][keep]
            errors[i] = batch_errors[row][keep]
    return SampleCodes(list(texts), tokens, codes, norms, errors, fingerprinter.codebook_size)


def sample_texts(texts: Sequence[str], size: int, seed: int = 0) -> list[str]:
    """A reproducible random subset of ``size`` texts, kept in their original order."""
    if size >= len(texts):
        return list(texts)
    chosen = sorted(random.Random(seed).sample(range(len(texts)), size))
    return [texts[i] for i in chosen]
