"""The project's own small dialogue corpus, written in DailyDialog's release layout.

Template dialogues about plans, prices, times, places and people, generated from a seed, so
the demo and the tests never need third-party text. The layout (``train/dialogues_train.txt``
and so on, `` __eou__ ``-separated, space-split punctuation) is the release's, so the corpus
goes through exactly the same reader as DailyDialog.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

SYNTHETIC = "synthetic"
"""The value of ``--data.root`` or ``$ISQ_DAILYDIALOG`` that selects this corpus."""

NAMES = ["Anna", "Ben", "Carla", "David", "Elif", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Keiko", "Luis"]
PLACES = ["the library", "the gym", "the station", "the market", "the museum", "the park", "the cinema",
          "the office"]
ITEMS = ["coat", "laptop", "bike", "ticket", "lamp", "camera", "sofa", "phone"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
FOODS = ["pizza", "noodles", "salad", "curry", "soup", "sushi"]

TEMPLATES = [
    [
        "Hi {a} , are you free on {day} ?",
        "I think so . What do you have in mind ?",
        "Shall we meet at {place} at {hour} o'clock ?",
        "Sounds good . I'll bring {b} too .",
        "Great , see you on {day} then .",
    ],
    [
        "Excuse me , how much is this {item} ?",
        "It's {price} dollars .",
        "That's a bit expensive . Can you do {lower} ?",
        "Sorry , the lowest I can go is {mid} .",
        "OK , I'll take it .",
    ],
    [
        "{a} , what did you have for lunch ?",
        "I had {food} at the place near {place} .",
        "Was it good ?",
        "Yes , it cost only {price} dollars .",
        "I should try it on {day} .",
    ],
    [
        "Did you hear that {b} moved to a new flat ?",
        "No , when did that happen ?",
        "Last {day} . It's close to {place} .",
        "How many rooms does it have ?",
        "It has {rooms} rooms and a small garden .",
    ],
    [
        "My {item} is broken again .",
        "Oh no . When did you buy it ?",
        "About {months} months ago , at {place} .",
        "You should ask for a refund .",
        "Good idea , I'll go there on {day} .",
    ],
]


def synthetic_dialogues(count: int, seed: int) -> list[list[str]]:
    """``count`` dialogues of 4-5 utterances each, deterministic for a seed."""
    rng = random.Random(seed)
    dialogues = []
    for _ in range(count):
        template = rng.choice(TEMPLATES)
        a, b = rng.sample(NAMES, 2)
        price = rng.randint(20, 400)
        values = dict(
            a=a, b=b, day=rng.choice(DAYS), place=rng.choice(PLACES), hour=rng.randint(1, 12),
            item=rng.choice(ITEMS), price=price, lower=price // 2, mid=(3 * price) // 4,
            food=rng.choice(FOODS), rooms=rng.randint(1, 5), months=rng.randint(2, 11),
        )
        turns = [t.format(**values) for t in template]
        dialogues.append(turns[: rng.randint(4, len(turns))])
    return dialogues


def write_synthetic_corpus(root: str | Path, sizes: tuple[int, int, int] = (600, 80, 80),
                           seed: int = 0) -> Path:
    """Write train/validation/test files in the DailyDialog release layout under ``root``.

    Each file is written beside its target and moved into place, because under DDP every rank
    writes the same corpus while another may already be reading it: a reader sees the previous
    complete file or the new one, never a truncated one."""
    root = Path(root)
    for offset, (split, count) in enumerate(zip(("train", "validation", "test"), sizes, strict=False)):
        (root / split).mkdir(parents=True, exist_ok=True)
        lines = [" __eou__ ".join(turns) + " __eou__\n"
                 for turns in synthetic_dialogues(count, seed + offset)]
        target = root / split / f"dialogues_{split}.txt"
        staging = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        staging.write_text("".join(lines), encoding="utf-8")
        os.replace(staging, target)
    return root
