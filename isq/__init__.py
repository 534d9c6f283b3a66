"""ISQ: a stride-1 isometric discrete semantic quantizer (MemCode) in plain PyTorch + Hugging Face.

Importable without Lightning. The public API is importable from the package root, as in
``transformers`` (``from isq import Fingerprinter``); like ``transformers``, the root loads a
submodule only when one of its names is first used, so ``import isq.markdown`` stays light.

Modules, one concept each: ``config`` (ISQConfig), ``encoder`` (pretrained encoders and the
semantic encoder), ``projection`` (stride-1 conv), ``codebook`` (code vectors, lookup, EMA,
revival), ``quantizer`` (STE and losses), ``model`` (encoder -> codes -> predictive-coding
decoder), ``batches`` (the token-encoding loop), ``fingerprint`` and ``export`` (the frozen
fingerprinter and its directory), ``topology`` and ``topk`` (code co-occurrence and Path B),
``identity``, ``dailydialog`` (the corpus reader), ``analysis`` and ``report`` (codebook health).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "ISQConfig": "isq.config",
    "ISQModel": "isq.model",
    "ISQOutput": "isq.model",
    "EMAQuantizer": "isq.quantizer",
    "QuantizerOutput": "isq.quantizer",
    "Codebook": "isq.codebook",
    "StrideOneProjection": "isq.projection",
    "SemanticEncoder": "isq.encoder",
    "MINILM_ALIAS": "isq.encoder",
    "EncoderUnavailable": "isq.encoder",
    "Fingerprint": "isq.codes",
    "Fingerprinter": "isq.fingerprint",
    "FingerprinterLoadError": "isq.export",
    "ExportExistsError": "isq.export",
    "CooccurrenceTopology": "isq.topology",
    "TopologyParams": "isq.topology",
    "IdentityMismatch": "isq.identity",
    "encode_batches": "isq.batches",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from isq.batches import encode_batches
    from isq.codebook import Codebook
    from isq.codes import Fingerprint
    from isq.config import ISQConfig
    from isq.encoder import MINILM_ALIAS, EncoderUnavailable, SemanticEncoder
    from isq.export import ExportExistsError, FingerprinterLoadError
    from isq.fingerprint import Fingerprinter
    from isq.identity import IdentityMismatch
    from isq.model import ISQModel, ISQOutput
    from isq.projection import StrideOneProjection
    from isq.quantizer import EMAQuantizer, QuantizerOutput
    from isq.topology import CooccurrenceTopology, TopologyParams


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'isq' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
