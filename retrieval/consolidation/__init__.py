"""Asynchronous memory consolidation (MemCode key design 4; docs/design.md §8).

Off the ingestion path, the active AMUs of a conversation are clustered (HAC on cosine distances
of their embeddings), the clusters pass strict gates (no count-sensitive facts, one speaker, a
time window), and each goes to one operation (AGGREGATE, MERGE or UPDATE; an LLM chooses, or the
offline operator merges near duplicates). Pointer forwarding archives the old AMUs, never
deletes them, and gives the new AMU the union of their source pointers; every archived AMU
names its successor. Modules: ``config`` (all settings), ``members``, ``clustering``, ``gates``,
``plan``, ``operations`` (offline operator), ``llm_operator``, ``prefix``, ``forward``,
``engine`` (:func:`consolidate_user`), ``report``, ``audit``, ``worker`` (background
thread beside ingestion). Command line: ``python -m retrieval.consolidate``.
"""
