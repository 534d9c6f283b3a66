"""Indexes over memory records: sentence embedder, dense (faiss), lexical (SQLite FTS5 bm25()) and
the structured evidence nodes."""
