"""The report's Markdown tables (written with :func:`isq.markdown.markdown_table`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from isq.analysis import Association, CodeConcordance, Stability
from isq.markdown import markdown_table


def _code_span(text: str) -> str:
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _code_label(code: int, entries: Mapping[int, CodeConcordance]) -> str:
    tokens = entries[code].tokens[:3] if code in entries else []
    return f"{code} ({', '.join(_code_span(t) for t, _ in tokens)})" if tokens else str(code)


def concordance_table(entries: Mapping[int, CodeConcordance], limit: int = 20) -> str:
    """The ``limit`` most used codes with their top tokens and contexts."""
    rows = [
        (entry.code, entry.count,
         ", ".join(f"{_code_span(t)} ×{n}" for t, n in entry.tokens),
         "<br>".join(f"{_code_span(c)} ×{n}" for c, n in entry.contexts[:3]))
        for entry in list(entries.values())[:limit]
    ]
    return markdown_table(("code", "tokens", "top tokens", "top contexts"), rows)


def words_table(words: Mapping[str, tuple[list[str], Counter[tuple[int, ...]]]]) -> str:
    """For each word: its tokens, occurrences and the code sequences it gets."""
    rows = []
    for word, (pieces, found) in words.items():
        codes = ", ".join(f"{'-'.join(map(str, seq))} ×{n}" for seq, n in found.most_common(5))
        spans = " ".join(_code_span(p) for p in pieces)
        rows.append((word, spans, sum(found.values()), len(found), codes or "-"))
    return markdown_table(("word", "tokens", "occurrences", "distinct codings", "top code sequences"), rows)


def associations_table(associations: Sequence[Association], entries: Mapping[int, CodeConcordance]) -> str:
    """S_code associations with each code labelled by its top tokens."""
    rows = [(_code_label(a.source, entries), _code_label(a.target, entries), a.score, a.cooccurrences)
            for a in associations]
    return markdown_table(("source code", "target code", "S_code", "M_ab"), rows)


def stability_table(results: Mapping[str, Stability]) -> str:
    """Per edit: texts edited, compared and skipped, and the shares of identical codes."""
    rows = [(name, r.compared + r.skipped, r.compared, r.skipped, r.share, r.share_unedited)
            for name, r in results.items()]
    return markdown_table(("edit", "texts edited", "compared", "skipped (length changed)",
                           "identical codes", "identical codes, unedited tokens"), rows)
