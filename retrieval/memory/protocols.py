"""What the memory needs of the models that build and read it, as protocols: an embedder (texts →
L2-normalised vectors) and a fingerprinter (texts → :class:`isq.codes.Fingerprint`).
:class:`retrieval.index.embed.SentenceEmbedder`, :class:`isq.Fingerprinter` and the store's
caching wrappers (:mod:`retrieval.memory.cache`) all satisfy them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from isq.codes import Fingerprint


class Embedder(Protocol):
    """Anything that maps texts to L2-normalised float32 vectors of a fixed dimension."""

    dim: int

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


class TextFingerprinter(Protocol):
    """Anything that fingerprints texts with a codebook of ``codebook_size`` codes; ``identity``
    says which codebook (:mod:`isq.identity`)."""

    @property
    def codebook_size(self) -> int: ...

    @property
    def identity(self) -> dict[str, Any]: ...

    def fingerprint(self, texts: Sequence[str]) -> list[Fingerprint]: ...
