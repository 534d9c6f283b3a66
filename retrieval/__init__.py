"""The memory system of MemCode / LycheeMemory: it needs only an exported fingerprinter (``isq``),
never the training code or Lightning.

Subpackages, one concept per file: ``memory`` (records, the SQLite store and its evidence
indexes, the segmenter, ingestion, the JSONL turn stream), ``extract`` (dates, pronouns, the
rule and LLM extractors), ``index`` (embedder, dense, FTS5 lexical, evidence nodes),
``routes`` (plan-guided multi-route retrieval: plans, planners, channels, fusion, selection,
reranking), ``eval`` (LoCoMo loading and evidence, metrics, configuration names, construction,
the run, rendering, paired statistics). Beside them: ``llm`` (the one OpenAI-compatible client)
and ``retriever`` (dense + codebook dual-path retrieval). The command lines are the top-level
modules ``ingest``, ``query``, ``evaluate`` and ``paired`` (``python -m retrieval.<command>``).
"""

__all__ = ["Memory"]


def __getattr__(name: str) -> object:
    """``from retrieval import Memory`` (the memory API, :mod:`retrieval.api.memory`), imported on
    first use so that ``import retrieval`` stays light."""
    if name == "Memory":
        from retrieval.api.memory import Memory

        return Memory
    raise AttributeError(f"module 'retrieval' has no attribute {name!r}")
