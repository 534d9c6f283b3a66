"""Sentence embedders shared by the segmenter and the dense index."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch

from isq.encoder import (
    MINILM_ALIAS,
    EncoderUnavailable,
    configuration_digest,
    load_offline_first,
    quiet_loading,
    resolve_encoder_path,
    weights_checksum,
)
from retrieval.memory.meta_keys import PIPELINE_KEY


def _sentence_transformer(path: str, *, local_files_only: bool = False, **kwargs: Any) -> Any:
    """``SentenceTransformer(path, ...)``; from the Hugging Face cache alone (``local_files_only``),
    its transformer's adapter lookup too: transformers asks the hub for an ``adapter_config.json``
    however it is told, which with the hub unreachable costs the hub client's retries."""
    from sentence_transformers import SentenceTransformer

    if local_files_only:
        kwargs["model_kwargs"] = {"adapter_kwargs": {"local_files_only": True}}
    return SentenceTransformer(path, local_files_only=local_files_only, **kwargs)


class SentenceEmbedder:
    """A sentence-transformers model by name or path (offline all-MiniLM-L6-v2 by default).

    Vectors are L2-normalised, so inner product is cosine similarity.
    """

    def __init__(self, model: str = MINILM_ALIAS, batch_size: int = 64, device: str = "cpu") -> None:
        self.name = model
        self.batch_size = batch_size
        if (Path(model).is_absolute() or model.startswith(".")) and not Path(model).is_dir():
            raise EncoderUnavailable(f"embedder {model!r}: no such directory (give a sentence-transformers "
                                     f"model's directory, a hub name, or {MINILM_ALIAS!r}, the default)")
        try:
            with quiet_loading():
                self._model = load_offline_first(_sentence_transformer, model, device=device)
        except EncoderUnavailable as err:  # it names the model and what to give instead
            raise EncoderUnavailable(f"embedder: {err}") from None
        except (OSError, ValueError) as err:  # a directory, but not a sentence-transformers model's
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise EncoderUnavailable(f"embedder {model!r}: {first}") from None
        getter = (getattr(self._model, "get_embedding_dimension", None)
                  or self._model.get_sentence_embedding_dimension)
        dim = getter()
        if dim is None:
            raise ValueError(f"{model}: the sentence-transformers model does not say its embedding dimension")
        self.dim = int(dim)

    @cached_property
    def identity(self) -> dict[str, Any]:
        """Name, the SHA-256 of a local model directory's weights, and of the pipeline that turns
        them into vectors (:meth:`pipeline_checksum`): what a store records to refuse vectors of
        another model, or of the same weights pooled, truncated or tokenised otherwise."""
        path = Path(resolve_encoder_path(self.name))
        return {"name": self.name, "sha256": weights_checksum(path) if path.is_dir() else None,
                PIPELINE_KEY: self.pipeline_checksum()}

    def pipeline_checksum(self) -> str:
        """SHA-256 of what the loaded model does with its weights: each module's kind and settings
        (pooling mode, normalisation), the longest input, the prompts, the truncated dimension,
        the transformer's configuration (:func:`isq.encoder.configuration_digest`) and its
        tokenizer (:func:`_tokenizer_text`), read from the model as loaded, so a hub model is
        named as fully as a directory."""
        modules = []
        for module in self._model:
            settings = module.get_config_dict() if callable(getattr(module, "get_config_dict", None)) else {}
            config = getattr(getattr(module, "auto_model", None), "config", None)
            tokenizer = getattr(module, "tokenizer", None)
            vocabulary = _tokenizer_text(tokenizer)
            modules.append({"kind": type(module).__name__, "settings": settings,
                            "config": None if config is None else configuration_digest(config),
                            "tokenizer": hashlib.sha256(vocabulary.encode()).hexdigest()})
        pipeline = {"modules": modules, "max_seq_length": self._model.max_seq_length,
                    "prompts": self._model.prompts, "default_prompt": self._model.default_prompt_name,
                    "truncate_dim": self._model.truncate_dim}
        return hashlib.sha256(json.dumps(pipeline, sort_keys=True, default=str).encode()).hexdigest()

    @property
    def device(self) -> torch.device:
        return self._model.device

    @property
    def mean_pooled(self) -> bool:
        """Whether the model is a transformer, mean pooling and (optionally) normalisation:
        then :meth:`pooled` of its token states is its sentence vector."""
        from sentence_transformers.base.modules.normalize import Normalize
        from sentence_transformers.base.modules.transformer import Transformer
        from sentence_transformers.sentence_transformer.modules.pooling import Pooling

        modules = list(self._model)
        return (len(modules) in (2, 3) and type(modules[0]) is Transformer and type(modules[1]) is Pooling
                and modules[1].pooling_mode == "mean" and all(type(m) is Normalize for m in modules[2:]))

    def features(self, texts: Sequence[str]) -> dict[str, Any]:
        """The model's own input for one batch of ``texts`` (token ids, attention mask, ...)."""
        features: dict[str, Any] = self._model.preprocess(list(texts))
        return features

    def pooled(self, token_states: torch.Tensor, attention_mask: torch.Tensor) -> np.ndarray:
        """Sentence vectors from one batch's transformer token states, by the model's own pooling
        and normalisation modules and :meth:`encode`'s final normalisation: the same floats."""
        with torch.inference_mode():
            features = {"token_embeddings": token_states, "attention_mask": attention_mask}
            for module in list(self._model)[1:]:
                features = module(features)
            vectors = torch.nn.functional.normalize(features["sentence_embedding"], p=2, dim=1)
        return np.ascontiguousarray(vectors.cpu().numpy(), dtype=np.float32)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self._model.encode(
            list(texts), batch_size=self.batch_size, normalize_embeddings=True,
            convert_to_numpy=True, show_progress_bar=False,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32)


def _tokenizer_text(tokenizer: Any) -> str:
    """What a tokenizer does to a text (vocabulary, normalisation, splitting, added tokens), as
    text: a fast tokenizer's serialised form without its truncation and padding, which each
    ``encode`` sets for its batch (the longest input is named apart, ``max_seq_length``)."""
    if tokenizer is None:
        return ""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return json.dumps(sorted(tokenizer.get_vocab().items()))
    described = json.loads(backend.to_str())
    kept = {key: value for key, value in described.items() if key not in ("truncation", "padding")}
    return json.dumps(kept, sort_keys=True)
