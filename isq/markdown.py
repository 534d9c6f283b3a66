"""The one Markdown-table writer of the project (reports, evaluation results, paired statistics).

Pure Python: importing it loads neither torch nor numpy.
"""

from __future__ import annotations

from collections.abc import Sequence


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]],
                   align: Sequence[str] | None = None, float_format: str = ".4g") -> str:
    """A GitHub-flavoured Markdown table. Floats are written with ``float_format``, every cell is
    escaped for '|'; ``align`` gives one of "l" (default) or "r" per column."""
    def cell(value: object) -> str:
        return (format(value, float_format) if isinstance(value, float) else str(value)).replace("|", "\\|")

    marks = {"l": "---", "r": "---:"}
    rule = [marks[a] for a in (align or ["l"] * len(headers))]
    if len(rule) != len(headers):
        raise ValueError(f"{len(rule)} alignments for {len(headers)} columns")
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(rule) + "|"]
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"a row of {len(row)} cells under {len(headers)} headers")
        lines.append("| " + " | ".join(cell(v) for v in row) + " |")
    return "\n".join(lines)
