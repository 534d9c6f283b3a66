"""One encoder forward per text: the sentence vector and the fingerprint codes together.

When the fingerprinter's encoder is the embedder's model (the same weights checksum, frozen,
without adapters: the committed recipe), the embedder's pooled, normalised vector and the
fingerprinter's codes are two readings of the same token states. :class:`JointEncoder` runs
that forward once per batch. It batches as :meth:`isq.Fingerprinter.fingerprint` does (length
order, :data:`isq.fingerprint.FINGERPRINT_BATCH` texts), so the codes are the fingerprinter's,
bit for bit, and a call of at most that many texts gives the embedder's vectors bit for bit
(one batch, padded to the same length); a longer call's vectors differ from the embedder's in
the last float bits only (other batches, other padding). A batch whose token ids the two models
would not both see (another maximum length, special tokens, truncation) is not shared: that call
runs both models as they are.

:class:`JointModels` gives the two halves (:class:`EmbedderHalf`, :class:`FingerprinterHalf`),
drop-ins with the separate models' ``identity``: ``encode(texts)`` computes the codes too and keeps them
for the same thread's next ``fingerprint`` call (and the other way round), so the retriever's
``encode`` then ``fingerprint`` of its route texts costs one forward.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from isq.batches import length_order, tokenize_batch
from isq.codes import Fingerprint
from isq.encoder import resolve_encoder_path, weights_checksum
from isq.fingerprint import FINGERPRINT_BATCH, Fingerprinter
from retrieval.index.embed import SentenceEmbedder
from retrieval.index.model_thread import on_model_thread


class Encoded(NamedTuple):
    """Texts' vectors (n, dim) and fingerprints, in the texts' order."""

    vectors: np.ndarray
    prints: list[Fingerprint]

    def part(self, start: int, stop: int) -> Encoded:
        return Encoded(self.vectors[start:stop], self.prints[start:stop])


def why_not_joined(embedder: Any, fingerprinter: Any) -> str | None:
    """None when one forward can serve both models, else the reason it cannot."""
    if not isinstance(embedder, SentenceEmbedder) or not isinstance(fingerprinter, Fingerprinter):
        return "not a SentenceEmbedder and a Fingerprinter"
    semantic = fingerprinter.semantic_encoder
    if not semantic.frozen or semantic.encoder_trains or fingerprinter.config.lora_rank:
        return "the fingerprinter's encoder is trained or adapted"
    if not on_model_thread(fingerprinter.references_encoder):  # loads and compares weights: torch
        # operators, which would give the calling thread an OpenMP team (retrieval.index.model_thread)
        return "the fingerprinter's encoder is not a referenced pretrained model"
    sha = embedder.identity["sha256"]
    if sha is None or weights_checksum(resolve_encoder_path(fingerprinter.config.encoder)) != sha:
        return "the fingerprinter's encoder has other weights than the embedder's model"
    if not embedder.mean_pooled:
        return "the embedder does not mean-pool its transformer's token states"
    if embedder.device != fingerprinter.device:
        return "the two models are on different devices"
    return None


class JointEncoder:
    """Vectors and fingerprints of texts from one forward of the shared encoder (see the module
    docstring). Thread-safe: one call at a time (the fast tokenizers refuse concurrent use)."""

    def __init__(self, embedder: SentenceEmbedder, fingerprinter: Fingerprinter) -> None:
        reason = why_not_joined(embedder, fingerprinter)
        if reason is not None:
            raise ValueError(f"cannot join the embedder and the fingerprinter: {reason}")
        self.embedder, self.fingerprinter = embedder, fingerprinter
        self.forwards = 0  # encoder forwards run, both models' own included
        self._lock = threading.Lock()

    def compute(self, texts: Sequence[str]) -> Encoded:
        with self._lock:
            return self._joint(texts) or self._separate(texts)

    def token_counts(self, texts: Sequence[str]) -> list[int]:
        """Each text's tokens as the forward sees them (special tokens in, truncated): what a
        forward of several texts pads to the longest of. Tokenised :data:`FINGERPRINT_BATCH` texts
        at a time: the tokenizer holds a text's every token before it cuts, so 2,000 texts of
        10,000 characters tokenised at once took 1.3 GB (a backlog of long turns)."""
        counts: list[int] = []
        tokenizer, longest = self.fingerprinter.tokenizer, self.fingerprinter.config.max_length
        for start in range(0, len(texts), FINGERPRINT_BATCH):
            with self._lock:
                ids = tokenizer(list(texts[start:start + FINGERPRINT_BATCH]), truncation=True,
                                max_length=longest)
            counts += [len(row) for row in ids["input_ids"]]
        return counts

    def _joint(self, texts: Sequence[str]) -> Encoded | None:
        vectors = np.zeros((len(texts), self.embedder.dim), dtype=np.float32)
        prints: list[Fingerprint | None] = [None] * len(texts)
        order = length_order(texts)
        batches = [order[start:start + FINGERPRINT_BATCH]
                   for start in range(0, len(order), FINGERPRINT_BATCH)]
        inputs = []
        for chunk in batches:
            batch = tokenize_batch(self.fingerprinter.tokenizer, [texts[i] for i in chunk],
                                   self.fingerprinter.config.max_length)
            if not _same_input(batch, self.embedder.features([texts[i] for i in chunk])):
                return None
            inputs.append(batch.to(self.fingerprinter.device))
        for chunk, batch in zip(batches, inputs, strict=True):
            mask = batch["attention_mask"]
            hidden, printed = self.fingerprinter.states_and_prints(batch["input_ids"], mask)
            self.forwards += 1
            vectors[chunk] = self.embedder.pooled(hidden, mask)
            for position, fingerprint in zip(chunk, printed, strict=True):
                prints[position] = fingerprint
        return Encoded(vectors, prints)  # type: ignore[arg-type]

    def _separate(self, texts: Sequence[str]) -> Encoded:
        self.forwards += -(-len(texts) // self.embedder.batch_size) - (-len(texts) // FINGERPRINT_BATCH)
        return Encoded(self.embedder.encode(texts), self.fingerprinter.fingerprint(texts))


def _same_input(batch: Any, features: dict[str, Any]) -> bool:
    """The fingerprinter's tokens of a batch are the embedder's: same ids, same mask, no segment
    ids but zeros (the fingerprinter passes none)."""
    segments = features.get("token_type_ids")
    return (torch.equal(batch["input_ids"], features["input_ids"])
            and torch.equal(batch["attention_mask"], features["attention_mask"])
            and (segments is None or not bool(segments.any())))


class _Kept(threading.local):
    """Per thread: the other half of the last call's computation, for the next call."""

    def __init__(self) -> None:
        self.vectors: dict[str, np.ndarray] = {}
        self.prints: dict[str, Fingerprint] = {}


class JointModels:
    """Both halves over one ``compute(texts) -> Encoded`` (a :class:`JointEncoder` or a
    :class:`retrieval.index.query_batcher.QueryBatcher` over one)."""

    def __init__(self, compute: Callable[[Sequence[str]], Encoded], embedder: SentenceEmbedder,
                 fingerprinter: Fingerprinter) -> None:
        self._compute, self._kept = compute, _Kept()
        self.embedder = EmbedderHalf(self, embedder)
        self.fingerprinter = FingerprinterHalf(self, fingerprinter)

    def vectors(self, texts: Sequence[str]) -> list[np.ndarray]:
        return self._serve(texts, "vectors")  # type: ignore[no-any-return]

    def prints(self, texts: Sequence[str]) -> list[Fingerprint]:
        return self._serve(texts, "prints")  # type: ignore[no-any-return]

    def _serve(self, texts: Sequence[str], half: str) -> Any:
        """``half`` ("vectors" or "prints") of ``texts``: what the thread's previous call kept of
        it, the rest computed now; the other half of what is computed now is kept for the next
        call (one call's worth per thread, dropped by the next call)."""
        other = "prints" if half == "vectors" else "vectors"
        found = dict(getattr(self._kept, half))
        self._kept.vectors, self._kept.prints = {}, {}
        missing = [text for text in dict.fromkeys(texts) if text not in found]
        if missing:
            encoded = self._compute(missing)
            found.update(zip(missing, getattr(encoded, half), strict=True))
            setattr(self._kept, other, dict(zip(missing, getattr(encoded, other), strict=True)))
        return [found[text] for text in texts]


class EmbedderHalf:
    """The embedder's side of :class:`JointModels`: its ``encode``, ``dim``, ``name``, ``identity``."""

    def __init__(self, models: JointModels, embedder: SentenceEmbedder) -> None:
        self._models = models
        self.name, self.dim, self.identity = embedder.name, embedder.dim, embedder.identity

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack(self._models.vectors(texts)).astype(np.float32, copy=False)


class FingerprinterHalf:
    """The fingerprinter's side of :class:`JointModels`: its ``fingerprint``, ``identity``,
    ``codebook_size``."""

    def __init__(self, models: JointModels, fingerprinter: Fingerprinter) -> None:
        self._models = models
        self.identity, self.codebook_size = fingerprinter.identity, fingerprinter.codebook_size

    def fingerprint(self, texts: Sequence[str]) -> list[Fingerprint]:
        if isinstance(texts, str):
            raise TypeError("fingerprint() takes a sequence of texts, not a single string")
        return self._models.prints(texts)
