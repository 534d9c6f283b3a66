"""ISQ: a stride-1 isometric discrete semantic quantizer (MemCode) in plain PyTorch + Hugging Face.

Importable without Lightning. One concept per module:
``quantizer`` (EMA codebook), ``projection`` (stride-1 conv), ``model`` (encoder -> codes ->
predictive-coding decoder), ``fingerprint`` (frozen export), ``analysis`` (codebook health).
"""

from isq.encoders import MINILM_ALIAS, resolve_encoder_path

__all__ = ["MINILM_ALIAS", "resolve_encoder_path"]
