"""Indexes over memory records: sentence embedder, dense (faiss) and lexical (BM25)."""
