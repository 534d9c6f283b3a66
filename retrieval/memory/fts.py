"""The store's FTS5 tables and their ``bm25()`` ranking (LycheeMemory Table 13's "SQLite + FTS5";
docs/design.md §7.1): the tokenizer every FTS5 table uses and the one ranking query.

Queries arrive here as FTS5 MATCH expressions; turning free text into one (stopwords, quoting)
is the lexical channel's job (:func:`retrieval.index.fts.match_expression`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

FTS_TOKENIZER = "porter unicode61"
"""Unicode word splitting, case folding and diacritics removal, then Porter stemming."""


def bm25_rows(db: sqlite3.Connection, table: str, expression: str, k: int, *, join: str = "",
              where: str = "", params: Sequence[object] = (), select: str = "") -> list[tuple]:
    """Up to ``k`` rows ``(select, score)`` of FTS5 table ``table`` matching the MATCH
    ``expression``, best first: score = -bm25() (Okapi BM25, k1 = 1.2, b = 0.75, columns weighted
    equally; higher is better), ties by rowid. ``join`` and ``where`` (with ``params``) restrict
    the rows, e.g. to one conversation's active records; ``select`` is the first column (default
    the rowid)."""
    if k <= 0:
        return []
    sql = (f"SELECT {select or table + '.rowid'}, -bm25({table}) AS score FROM {table} {join} "
           f"WHERE {table} MATCH ? {('AND ' + where) if where else ''} ORDER BY bm25({table}), {table}.rowid "
           "LIMIT ?")
    return db.execute(sql, [expression, *params, k]).fetchall()
