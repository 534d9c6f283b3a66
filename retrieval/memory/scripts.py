"""Character classes of writing systems that the text rules need beyond Python's ``\\w``.

* Scripts written without spaces between words (Thai, Lao, Myanmar, Khmer, kana, CJK): a
  sentence of them is one whitespace "word", so token counts and informativeness count their
  characters instead, and the lexical channel indexes their letters as character pairs
  (:data:`PAIRED_RUN`).
* Composed form (NFC, :func:`composed`): the rules and the lexical channel take text composed, so
  that a word written with decomposed accents is the same word.
* Combining marks (Unicode categories Mn, Mc, Me): Devanagari's vowel signs, Thai's tone marks,
  a decomposed accent. They belong to the word they follow, but ``\\w`` does not match them, so a
  rule that keeps word characters only would cut "किताब" into "कत" + "ब".
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable

SOUTHEAST_ASIAN_BLOCKS = ((0x0E00, 0x0EFF), (0x1000, 0x109F), (0x1780, 0x17FF))
"""The Unicode blocks of Thai and Lao, Myanmar, and Khmer."""

UNSPACED = re.compile("[" + "".join(f"{chr(low)}-{chr(high)}" for low, high in SOUTHEAST_ASIAN_BLOCKS)
                      + "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
"""A character of a script written without spaces."""

IDEOGRAPHIC_RUN = re.compile("[\u3005-\u3007\u303b\u3041-\u3096\u309d-\u309f\u30a1-\u30fa\u30fc-\u30ff"
                             "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f]+")
"""A run of kana (half-width katakana too) and CJK ideographs, with the iteration marks (佐々木) and
the long vowel mark (ー):
letters written without spaces (the lexical channel pairs them, :func:`retrieval.index.fts.paired`);
the katakana middle dot (ジョン・スミス) and the voicing marks are not letters of a run."""


def _ranges(keep: Callable[[str], bool], low: int = 0, high: int = 0xFFFF) -> str:
    """The characters from ``low`` to ``high`` that ``keep`` takes, as character-class ranges."""
    ranges: list[tuple[int, int]] = []
    for code in range(low, high + 1):
        if not keep(chr(code)):
            continue
        if ranges and code == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], code)
        else:
            ranges.append((code, code))
    return "".join(f"\\u{first:04x}" if first == last else f"\\u{first:04x}-\\u{last:04x}"
                   for first, last in ranges)


MARKS = _ranges(lambda char: unicodedata.category(char).startswith("M"))
"""The ranges (for a regular expression's character class) of the combining marks of the Basic
Multilingual Plane."""
_MARK = re.compile(f"[{MARKS}]")

SOUTHEAST_ASIAN_LETTERS = "".join(_ranges(lambda char: unicodedata.category(char)[0] in "LM", low, high)
                                  for low, high in SOUTHEAST_ASIAN_BLOCKS)
"""The letters and combining marks of Thai, Lao, Myanmar and Khmer (their digits and punctuation,
such as Khmer's sentence end, are not letters of a run)."""

PAIRED_RUN = re.compile(f"{IDEOGRAPHIC_RUN.pattern}|[{SOUTHEAST_ASIAN_LETTERS}]+")
"""A run of letters written without spaces, which the lexical channel writes as character pairs
(:func:`retrieval.index.fts.paired`): kana and CJK (:data:`IDEOGRAPHIC_RUN`), or Thai, Lao,
Myanmar and Khmer letters with their vowel signs and tone marks (which the pairs leave out:
FTS5's tokenizer ends a word at a combining mark, so "แมว" would otherwise be found in no
sentence that holds it, and "ชื่อ" would be three words)."""


def unmarked(run: str) -> str:
    """``run`` without its combining marks (:data:`MARKS`)."""
    return _MARK.sub("", run)


def composed(text: str) -> str:
    """``text`` in Unicode's composed form (NFC). Written decomposed, a letter's accent is a mark of
    its own: a regular expression takes it for the end of a word ("même" holds the word "me"), and
    FTS5's tokenizer strips it but keeps a composed letter of two ("ở" of "phở"), so the two forms
    of one word would not match."""
    return unicodedata.normalize("NFC", text)
