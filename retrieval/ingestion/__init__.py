"""Ingestion: the online segmenter, the pipeline that turns a conversation into stored AMUs, and the
JSONL turn stream."""
