"""The store's own FTS5 table read back, for tests of its maintenance (archived and purged records
leave it). Search ranks with each user's own table (:class:`retrieval.index.fts.RecordLexical`);
this one is what the purge scrubs."""

from __future__ import annotations

from retrieval.index.fts import match_expression
from retrieval.memory.fts import bm25_rows
from retrieval.memory.store import AMUStore


def lexical_search(store: AMUStore, query: str, user_id: str, k: int) -> list[tuple[str, float]]:
    """``bm25()`` over the user's active records in the store's table: up to ``k`` (AMU id, score)."""
    expression = match_expression(query, pair=False)  # the store's table is not paired
    if expression is None:
        return []
    rows = bm25_rows(store._db, "amu_fts", expression, k, join="JOIN amus a ON a.position = amu_fts.rowid",
                     where="a.conversation_id = ? AND a.archived = 0", params=[user_id], select="a.id")
    return [(row[0], float(row[1])) for row in rows]
