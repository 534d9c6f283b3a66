"""A consistent renaming of a LoCoMo file, to see how much a result owes to the names its people have.

    python scripts/rename_speakers.py write LOCOMO OUT.json OLD=NEW [OLD=NEW ...]
    python scripts/rename_speakers.py align BASE/questions.jsonl RENAMED/questions.jsonl OUT.jsonl

``write`` replaces each OLD by its NEW as a whole word (case-sensitive) in every string of the file:
turns, captions, speaker fields, questions and answers alike. ``align`` copies the renamed run's
``questions.jsonl`` with the base run's question texts, after checking that every question is the
same one (conversation, position, category, evidence), so that ``python -m retrieval.paired
BASE/questions.jsonl --with OUT.jsonl:renamed`` pairs each question with itself (it refuses runs
whose question texts differ). ``docs/results.md`` ("A consistent renaming") reports what it showed.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any


def renamed(value: Any, pattern: re.Pattern[str], names: dict[str, str]) -> Any:
    """``value`` with every string (keys too) renamed."""
    if isinstance(value, dict):
        return {renamed(k, pattern, names): renamed(v, pattern, names) for k, v in value.items()}
    if isinstance(value, list):
        return [renamed(v, pattern, names) for v in value]
    if isinstance(value, str):
        return pattern.sub(lambda match: names[match[0]], value)
    return value


def write(source: Path, out: Path, pairs: list[str]) -> None:
    names = dict(pair.split("=", 1) for pair in pairs)
    if not names or any(not old or not new for old, new in names.items()):
        raise SystemExit("error: give one or more OLD=NEW pairs, neither side empty")
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")\b")
    text = source.read_text(encoding="utf-8")
    data = renamed(json.loads(text), pattern, names)
    out.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    print(f"wrote {out}: {len(pattern.findall(text))} names replaced")


def align(base: Path, other: Path, out: Path) -> None:
    rows = [json.loads(line) for line in base.read_text(encoding="utf-8").splitlines()]
    others = [json.loads(line) for line in other.read_text(encoding="utf-8").splitlines()]
    key = ("conversation", "qa_index", "category", "evidence")
    if [[row[k] for k in key] for row in rows] != [[row[k] for k in key] for row in others]:
        raise SystemExit(f"error: {other} does not hold the questions of {base} in the same order")
    aligned = [{**b, "question": a["question"]} for a, b in zip(rows, others, strict=True)]
    out.write_text("".join(json.dumps(row) + "\n" for row in aligned), encoding="utf-8")
    print(f"wrote {out}: {len(rows)} questions")


if __name__ == "__main__":
    command, *args = sys.argv[1:] or ["--help"]
    if command == "write" and len(args) >= 3:
        write(Path(args[0]), Path(args[1]), args[2:])
    elif command == "align" and len(args) == 3:
        align(Path(args[0]), Path(args[1]), Path(args[2]))
    else:
        raise SystemExit(__doc__)
