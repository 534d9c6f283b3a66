"""The memory system of MemCode / LycheeMemory: it needs only an exported fingerprinter (``isq``),
never the training code or Lightning.

Layers from the floor up, one concept per file (``docs/architecture.md`` names every module):
``memory`` (records, the SQLite store, its FTS5 and evidence-node rows, cached vectors and codes);
``llm_client`` (the one OpenAI-compatible client) and ``contract`` (what every retriever
promises: ``Query`` in, ``Retrieval`` of ``Hit`` items out); ``extract`` (dates, pronouns, the rule
and LLM extractors) and ``index`` (embedder, dense, FTS5 lexical, evidence-node search, code
BM25); ``ingestion`` (the online segmenter, the pipeline into the store, the JSONL turn stream);
``multi_route`` (plan-guided multi-route retrieval); ``consolidation``; ``eval`` (LoCoMo, with the
dense + codebook dual-path ablation). The command lines are the top-level modules ``ingest``,
``query``, ``consolidate``, ``evaluate`` and ``paired`` (``python -m retrieval.<command>``).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what type checkers see; at run time the lazy __getattr__ below
    from retrieval.api.memory import Memory

__all__ = ["Memory"]


def __getattr__(name: str) -> type:
    """``from retrieval import Memory`` (the memory API, :mod:`retrieval.api.memory`), imported on
    first use so that ``import retrieval`` stays light."""
    if name == "Memory":
        from retrieval.api.memory import Memory

        return Memory
    raise AttributeError(f"module 'retrieval' has no attribute {name!r}")
