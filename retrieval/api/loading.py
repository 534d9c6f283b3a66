"""The models :meth:`retrieval.api.memory.Memory.open` names, loaded once per memory: each
argument is a name or path (loaded here), an object already loaded (used as is: the evaluation
and the tests pass theirs) or a zero-argument function returning one (:class:`Deferred`; called
after the store opened, so a busy or broken store is refused before any model loads), and the
store's binding to them (:meth:`MemoryModels.bind`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from isq.encoder import MINILM_ALIAS
from isq.fingerprint import FINGERPRINT_BATCH
from retrieval.api.errors import InvalidInput, StoreUnavailable
from retrieval.consolidation.worker import SerializedEmbedder, SerializedFingerprinter
from retrieval.index.joint import JointEncoder, JointModels, why_not_joined
from retrieval.index.model_thread import on_model_thread
from retrieval.index.query_batcher import QueryBatcher
from retrieval.memory.cache import model_identity
from retrieval.memory.errors import StoreError
from retrieval.memory.fingerprinter_source import PATH_KEY as FINGERPRINTER_PATH
from retrieval.memory.meta_keys import bound_alike, bound_otherwise
from retrieval.memory.store_contract import Store

LLM_CACHE = "llm_cache"
"""The store's subdirectory holding LLM answers (extraction, planning, consolidation)."""


def llm_cache(local_files: Path | None) -> Path | None:
    """Where a store's LLM answers are cached: ``llm_cache`` in its local files
    (:attr:`retrieval.memory.store_contract.Handle.local_files`); None, not cached, for a store
    without local files (a database server: an answer cached on one machine would outlive a
    purge made through another)."""
    return None if local_files is None else local_files / LLM_CACHE


class Deferred:
    """A model to load only once the store is open: ``Deferred(SentenceEmbedder, name)``."""

    def __init__(self, load: Any, *args: Any, **kwargs: Any) -> None:
        self.load, self.args, self.kwargs = load, args, kwargs

    def __call__(self) -> Any:
        return self.load(*self.args, **self.kwargs)


def _resolved(value: Any) -> Any:
    return value() if isinstance(value, Deferred) else value


@dataclass
class MemoryModels:
    embedder: Any
    extractor: Any
    fingerprinter: Any | None
    planner: Any | None
    operator: Any
    reranker: Any | None
    encoder: QueryBatcher | None = None
    """When the fingerprinter's encoder is the embedder's model: the one forward both share
    (:mod:`retrieval.index.joint`), batching concurrent calls; ``embedder`` and
    ``fingerprinter`` are then its halves."""

    def shared(self) -> tuple[Any, Any | None]:
        """The embedder and fingerprinter as several threads may call them: the joint halves as
        they are (their batcher runs one forward at a time), the others each call on the model thread."""
        if self.encoder is not None:
            return self.embedder, self.fingerprinter
        fingerprinter = None if self.fingerprinter is None else SerializedFingerprinter(self.fingerprinter)
        return SerializedEmbedder(self.embedder), fingerprinter

    def answer_caches(self, local_files: Path | None) -> list[Path]:
        """Every directory LLM answers for the memory's users may be cached in: the store's own
        (:func:`llm_cache`) and any other that the extractor, planner or operator caches in (one
        given as an object, with a ``cache_dir`` of its own), each once: a purge drops the user's
        answers from all of them."""
        own = llm_cache(local_files)
        given = [getattr(getattr(model, "client", None), "cache_dir", None)
                 for model in (self.extractor, self.planner, self.operator)]
        return list(dict.fromkeys(cache for cache in (own, *given) if isinstance(cache, Path)))

    def close(self) -> None:
        """Stop the joint encoder's batcher thread (the models stay loaded)."""
        if self.encoder is not None:
            self.encoder.close()

    def bind(self, store: Store, read_only: bool) -> None:
        """Bind ``store`` to the embedder, extractor and fingerprinter (a store refuses others once
        it holds a turn, another extractor once it holds a segment; a store opened but never added
        to, a server started and stopped, takes the models it is opened with next, and one whose
        turns no extraction has committed yet (an LLM endpoint that refused the first) another
        extractor, where this memory is its one writer: several nodes of a database may be serving
        it already); read-only, check that it was built with this embedder and fingerprinter."""
        bindings = {"embedder": model_identity(self.embedder), "extractor": model_identity(self.extractor),
                    "fingerprinter": "none" if self.fingerprinter is None
                    else model_identity(self.fingerprinter)}
        try:
            sole = not read_only and not store.concurrent_writers
            unbuilt = sole and not store.holds_turns()
            unextracted = sole and not store.users_with_segments()  # no turns: no segments either
            for key, value in bindings.items():
                saved = store.meta(key)
                checked = key == "embedder" or (key == "fingerprinter" and self.fingerprinter is not None)
                if read_only and saved is not None and checked and not bound_alike(key, saved, value):
                    raise StoreError(f"{store.location} {bound_otherwise(key, saved, value)}")
                if (unextracted if key == "extractor" else unbuilt) and saved is not None \
                        and not bound_alike(key, saved, value):
                    store.put_meta(key, value)
                    if key == "fingerprinter":  # a path ingest recorded names the one replaced
                        store.put_meta(FINGERPRINTER_PATH, None)
                if not read_only:
                    store.bind(key, value, hint=f"open it with the {key} it was built with, or use a new "
                                                "store")
        except StoreError as err:
            raise StoreUnavailable(str(err)) from None


def _joined(models: MemoryModels) -> MemoryModels:
    """``models`` with the embedder and fingerprinter sharing one forward when they can."""
    embedder, fingerprinter = models.embedder, models.fingerprinter
    if fingerprinter is None or why_not_joined(embedder, fingerprinter) is not None:
        return models
    batcher = QueryBatcher(JointEncoder(embedder, fingerprinter), FINGERPRINT_BATCH)
    halves = JointModels(batcher.run, embedder, fingerprinter)
    models.embedder, models.fingerprinter, models.encoder = halves.embedder, halves.fingerprinter, batcher
    return models


def _embedder(value: Any) -> Any:
    if isinstance(value, (str, Path)):
        from retrieval.index.embed import SentenceEmbedder

        return SentenceEmbedder(str(value))
    return value


def _fingerprinter(value: Any) -> Any | None:
    if isinstance(value, (str, Path)):
        from isq.fingerprint import Fingerprinter

        if not Path(value).is_dir():
            raise InvalidInput(f"fingerprinter {str(value)!r} is not a directory: give an exported ISQ "
                               "fingerprinter's (the committed ones are in a source checkout's checkpoints/; "
                               "a relative path is read from the current directory)", "fingerprinter")
        return Fingerprinter.from_pretrained(value)
    return value


def _extractor(value: Any, cache: Path | None) -> Any:
    if value == "rule":
        from retrieval.extract.rules import RuleExtractor

        return RuleExtractor()
    if value == "llm":
        from retrieval.extract.llm_extractor import LLMExtractor

        return LLMExtractor(cache_dir=cache)
    if isinstance(value, str):
        raise InvalidInput(f"extractor must be 'rule', 'llm' or an extractor object, not {value!r}",
                           "extractor")
    return value


def _planner(value: Any, cache: Path | None) -> Any | None:
    if value == "rule":
        return None  # the retriever's default, the rule planner
    if value == "llm":
        from retrieval.multi_route.planner_llm import LLMPlanner

        return LLMPlanner(cache_dir=cache)
    if isinstance(value, str):
        raise InvalidInput(f"planner must be 'rule', 'llm' or a planner object, not {value!r}", "planner")
    return value


def _operator(value: Any, cache: Path | None) -> Any:
    if isinstance(value, str):
        from retrieval.consolidation.options import make_operator

        try:
            return make_operator(value, cache)
        except ValueError as err:
            raise InvalidInput(f"operator: {err}", "operator") from None
    return value


def _reranker(value: Any) -> Any | None:
    if isinstance(value, (str, Path)):
        from retrieval.multi_route.rerank import CrossEncoderReranker

        return CrossEncoderReranker(value)
    return value


MODEL_METHODS = {"embedder": ("encode", "dim"), "extractor": ("extract",),
                 "fingerprinter": ("fingerprint", "codebook_size", "identity"), "planner": ("plan",),
                 "operator": ("decide",), "reranker": ("scores",)}
"""What each model given as an object must have; the fingerprinter, planner and reranker may be
None (no codebook channel, the rule planner, no reranking)."""


def _checked(models: MemoryModels) -> MemoryModels:
    """``models``, or :class:`InvalidInput` naming the first that lacks what it must have (else it
    would fail at the first call that uses it, or be recorded as the store's model)."""
    for name, needed in MODEL_METHODS.items():
        value = getattr(models, name)
        if value is None and name in ("fingerprinter", "planner", "reranker"):
            continue
        missing = [attribute for attribute in needed if not hasattr(value, attribute)]
        if missing:
            raise InvalidInput(f"{name} must be a name, a path or an object with {', '.join(needed)}; "
                               f"got {type(value).__name__} (no {missing[0]})", name)
    return models


def load_models(directory: Path | None, *, embedder: Any = MINILM_ALIAS, fingerprinter: Any = None,
                extractor: Any = "rule", planner: Any = "rule", operator: Any = "offline",
                reranker: Any = None) -> MemoryModels:
    """Load what is named, on the model thread (:mod:`retrieval.index.model_thread`: loading runs
    torch operators, which would give the calling thread an OpenMP team of its own); LLM answers are
    cached in ``llm_cache`` of the store's local files ``directory`` (purged with the data), not at
    all without one."""
    try:
        return on_model_thread(lambda: _load(llm_cache(directory), embedder, fingerprinter, extractor,
                                             planner, operator, reranker))
    except (OSError, ValueError) as err:
        if isinstance(err, InvalidInput):
            raise
        raise InvalidInput(f"cannot load the models: {err}") from None


def _load(cache: Path | None, embedder: Any, fingerprinter: Any, extractor: Any, planner: Any,
          operator: Any, reranker: Any) -> MemoryModels:
    embedder, extractor, fingerprinter = _resolved(embedder), _resolved(extractor), _resolved(fingerprinter)
    reranker, planner = _resolved(reranker), _resolved(planner)
    return _joined(_checked(MemoryModels(_embedder(embedder), _extractor(extractor, cache),
                                         _fingerprinter(fingerprinter), _planner(planner, cache),
                                         _operator(operator, cache), _reranker(reranker))))
