"""The lexical channel: SQLite FTS5 and its ``bm25()`` ranking (LycheeMemory Table 13's
"SQLite + FTS5"; docs/design.md §7.1).

The store keeps an FTS5 table over every active record's text, entities and topic tags
(:mod:`retrieval.memory.schema`, ranked by :func:`retrieval.memory.fts.bm25_rows`); :class:`FTSIndex` is a
table of the same columns in memory for a bank given as texts (the dual-path retriever without
records), and :class:`RecordLexical` one over one user's records; these two write runs of letters
written without spaces (kana, CJK, Thai, ...) as character pairs (:func:`paired`) and the digits of
every script as ASCII digits (:func:`lexical_form`), the store's does neither. Every table
tokenises with :data:`FTS_TOKENIZER` (Porter stemming) and ranks with :func:`bm25_search`: a query
matches any of its words other than stopwords (OR), scored by FTS5's Okapi BM25 (k1 = 1.2,
b = 0.75, columns weighted equally), best first, ties by insertion order.

Search reads one user's table, never the store's: BM25's statistics (row count, average row length,
how many rows hold a word) are those of the table searched, so a score computed over the store's
table would move when another user writes. A user's scores are the ones it would get alone in
the store. (The store's table is still kept in step by its triggers and scrubbed by the purge;
no search reads it.)
"""

from __future__ import annotations

import json
import re
import sqlite3
import unicodedata
import weakref
from collections.abc import Iterable, Sequence

import numpy as np

from isq.topk import as_exclude_array, empty_result
from retrieval.index.stopwords import STOPWORDS
from retrieval.memory.fts import FTS_TOKENIZER, bm25_rows
from retrieval.memory.records import AMU
from retrieval.memory.scripts import IDEOGRAPHIC_RUN, PAIRED_RUN, composed, unmarked

_WORD = re.compile(r"\w+")
_OTHER_DIGIT = re.compile(r"(?![0-9])\d")


def lexical_form(text: str) -> str:
    """``text`` as the channel's tables index it and its queries match: composed
    (:func:`retrieval.memory.scripts.composed`), and every decimal digit written in ASCII, so that
    a number is one word in any script (٢٧, २७, ๒๗ and 27)."""
    return _OTHER_DIGIT.sub(lambda digit: str(unicodedata.digit(digit[0])), composed(text))


def paired(text: str, indexed: bool = False) -> str:
    """``text`` with each run of letters written without spaces (:data:`retrieval.memory.scripts.
    PAIRED_RUN`: kana, CJK ideographs, Thai, Lao, Myanmar, Khmer) written as its overlapping
    character pairs, space-separated (a lone character as itself), and when ``indexed`` its last
    character too, so that every character of the run begins a token: FTS5's tokenizer takes a
    whole run for one word, so a word inside a sentence (東京 in 東京で猫を飼っています) could only be
    found by the whole sentence. A run's combining marks (Thai's vowel signs and tone marks) are
    left out of its pairs: the tokenizer would end a word at each. So words that differ only in
    their marks are one word here (ไม่ "not" and ไม้ "wood"), and a word of one letter and its marks
    (ดี) matches that letter alone. A query's pairs match the record's, and a one-character kana or
    CJK query word is a prefix query (:func:`match_expression`). A run of n characters is n tokens
    of the record's length, about as many as its words would be had it spaces."""
    def tokens(run: str) -> str:
        run = unmarked(run)
        if not run:  # marks alone (a stray tone mark): no letter to index
            return " "
        pieces = [run[i:i + 2] for i in range(len(run) - 1)] + ([run[-1]] if indexed or len(run) == 1 else [])
        return " " + " ".join(pieces) + " "

    return PAIRED_RUN.sub(lambda run: tokens(run.group()), text)


def match_expression(text: str, pair: bool = True) -> str | None:
    """An FTS5 MATCH expression for free text: every distinct word (``\\w+``) that is not a
    stopword (all of them when there is nothing else) as a quoted string, joined by OR (quoting
    keeps FTS5 syntax such as NEAR, AND or a trailing * out of user text). None when the text has
    no word. Words go to FTS5 as written, which folds their case as it folded the indexed text's:
    Python lower-cases some letters otherwise ("İ" to "i" and a combining dot, Cherokee capitals to
    small letters FTS5 does not fold), which would leave a word unable to find itself; only the
    stopword test, and the distinctness of ASCII words, are taken lower-cased. Runs of letters written
    without spaces are ``pair``-ed as the channel's tables index them (:func:`paired`; the store's own
    table, which no search reads, is not), a lone kana or CJK character matching every token it
    begins. The text is taken in its :func:`lexical_form`, as the channel's tables index theirs."""
    text = lexical_form(text)
    tokens = _WORD.findall(paired(text) if pair else text)
    content = [word for word in tokens if word.lower() not in STOPWORDS]
    words: dict[str, str] = {}
    for word in content or tokens:
        words.setdefault(word.lower() if word.isascii() else word, word.replace("_", " "))
    quoted = [f'"{word}"' + ("*" if pair and len(word) == 1 and IDEOGRAPHIC_RUN.fullmatch(word) else "")
              for word in words.values() if word.strip()]
    return " OR ".join(quoted) if quoted else None


def bm25_search(db: sqlite3.Connection, table: str, query: str, k: int, **restrict: object) -> list[tuple]:
    """:func:`retrieval.memory.fts.bm25_rows` for free text (its :func:`match_expression`); no rows
    when the text has no word. ``restrict`` passes ``join``, ``where``, ``params`` and ``select`` on."""
    expression = match_expression(query)
    return ([] if expression is None
            else bm25_rows(db, table, expression, k, **restrict))  # type: ignore[arg-type]


CONNECTION_BYTES = 68 * 1024
"""What an in-memory FTS5 database holds beyond its pages: 1,000 indexes of five texts each grew
the process by 91 KiB each, 24 KiB of it pages (SQLite 3.40, CPython 3.11; its allocator's
lookaside and the schema's parse), which a search state of a small user is mostly made of."""


class FTSIndex:
    """FTS5 ``bm25()`` over a growing list of texts in an in-memory database; position i is the
    i-th text added (its rowid is i + 1). Entities and topics are optional extra columns."""

    def __init__(self) -> None:
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        # closed with the index, as a dropped search state lets it go: a connection and its
        # statement cache form a cycle, which would hold the table until the cyclic collector runs
        # (not at interpreter exit, where a daemon thread may still be reading it)
        weakref.finalize(self, self._db.close).atexit = False
        self._db.execute(f"CREATE VIRTUAL TABLE lexical USING fts5(text, entities, topics, "
                         f"tokenize='{FTS_TOKENIZER}')")
        self._count = 0

    def add(self, texts: Iterable[str], entities: Iterable[Sequence[str]] | None = None,
            topics: Iterable[Sequence[str]] | None = None) -> None:
        texts = list(texts)
        entities = list(entities) if entities is not None else [()] * len(texts)
        topics = list(topics) if topics is not None else [()] * len(texts)
        def indexed(text: str) -> str:  # ASCII is in its lexical form and holds no unspaced run: as it is
            return text if text.isascii() else paired(lexical_form(text), indexed=True)

        self.add_rows([(indexed(text), indexed(" ".join(e)), indexed(" ".join(t)))
                       for text, e, t in zip(texts, entities, topics, strict=True)])

    def add_rows(self, rows: Iterable[tuple[str, str, str]]) -> None:
        """Add rows as :meth:`rows` gives them (text, entities, topics as indexed)."""
        numbered = [(self._count + i + 1, *row) for i, row in enumerate(rows)]
        self._db.executemany("INSERT INTO lexical (rowid, text, entities, topics) VALUES (?, ?, ?, ?)",
                             numbered)
        self._count += len(numbered)

    def rows(self) -> list[tuple[str, str, str]]:
        """Every row's text, entities and topics as indexed (entities and topics each one string),
        in position order: what :meth:`add_rows` takes back."""
        return self._db.execute("SELECT text, entities, topics FROM lexical ORDER BY rowid").fetchall()

    def search(self, query: str, k: int, exclude: Iterable[int] = (),
               within: Iterable[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k (positions, scores), ``exclude`` left out and, when ``within`` is given, only those
        positions ranked (a filter before the cut, not after); ties by position."""
        excluded = set(as_exclude_array(exclude).tolist())
        restrict: dict[str, object] = {}
        if within is not None:
            rowids = [int(position) + 1 for position in within]
            restrict = {"where": "lexical.rowid IN (SELECT value FROM json_each(?))",
                        "params": [json.dumps(rowids)]}
        rows = bm25_search(self._db, "lexical", query, k + len(excluded), **restrict)
        kept = [(rowid - 1, score) for rowid, score in rows if rowid - 1 not in excluded][:k]
        if not kept:
            return empty_result()
        positions, scores = zip(*kept, strict=True)
        return np.asarray(positions, dtype=np.int64), np.asarray(scores, dtype=np.float64)

    def size_bytes(self) -> int:
        """The in-memory database's pages and its connection (:data:`CONNECTION_BYTES`), in bytes."""
        (pages,), (page_size,) = (self._db.execute(f"PRAGMA {name}").fetchone()
                                  for name in ("page_count", "page_size"))
        return int(pages) * int(page_size) + CONNECTION_BYTES


class RecordLexical(FTSIndex):
    """One user's lexical channel: an in-memory FTS5 table over its active records' text, entities
    and topic tags (the columns of the store's table), position i being the i-th record added;
    ``position`` maps a record id to its position."""

    def __init__(self, records: Iterable[AMU] = ()) -> None:
        super().__init__()
        self.position: dict[str, int] = {}
        self.add_records(records)

    def add_records(self, records: Iterable[AMU]) -> None:
        records = list(records)
        first = len(self.position)
        self.position.update((amu.id, first + offset) for offset, amu in enumerate(records))
        self.add([amu.text for amu in records], [amu.entities for amu in records],
                 [amu.tags for amu in records])
