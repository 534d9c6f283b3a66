"""A LoCoMo-shaped stand-in at a larger scale, derived from a LoCoMo file: every conversation
copied N times, each copy with other speaker names throughout (so every text differs and no
copy is served from another's cache). Used to time construction and reruns at the scale of the
8 LoCoMo conversations kept outside the project (docs/performance.md).

    python -m benchmarks.locomo_standin --locomo ../shared/data/locomo/locomo_dev.json --copies 7
        --out /tmp/standin.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from isq.outputs import output_file

NAMES = [("Ana", "Ben"), ("Clara", "Dev"), ("Elena", "Farid"), ("Greta", "Hugo"), ("Ines", "Jonas"),
         ("Keiko", "Luis"), ("Mira", "Noah"), ("Olga", "Pavel"), ("Quinn", "Rosa")]


def standin(conversations: list[dict], copies: int) -> list[dict]:
    """``copies`` renamed copies of every conversation (sample ids suffixed ``-copy<i>``)."""
    if not 1 <= copies <= len(NAMES):
        raise ValueError(f"copies must lie in [1, {len(NAMES)}], got {copies}")
    out = []
    for copy, (first, second) in enumerate(NAMES[:copies]):
        for conversation in conversations:
            speakers = conversation["conversation"]["speaker_a"], conversation["conversation"]["speaker_b"]
            text = json.dumps(conversation)
            for old, new in zip(speakers, (first, second), strict=True):
                text = re.sub(rf"\b{re.escape(old)}\b", new, text)
            item = json.loads(text)
            item["sample_id"] = f"{conversation['sample_id']}-copy{copy}"
            out.append(item)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.locomo_standin",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--locomo", type=Path, required=True)
    parser.add_argument("--copies", type=int, default=7)
    parser.add_argument("--out", type=output_file, required=True)
    args = parser.parse_args(argv)
    try:
        data = standin(json.loads(args.locomo.read_text(encoding="utf-8")), args.copies)
    except (OSError, ValueError, KeyError, TypeError) as err:
        print(f"error: {args.locomo}: {err}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data))
    print(f"{len(data)} conversations -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
