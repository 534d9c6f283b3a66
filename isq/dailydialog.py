"""DailyDialog's original release layout: reading, detokenising and splitting it.

``train/dialogues_train.txt`` (and validation, test): one dialogue per line, utterances
separated by ``__eou__``, punctuation split off by spaces. docs/design.md §1.9. The reader
lives in ``isq`` because training, the k-means control and the codebook report must all see
the same (detokenised) utterances.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SPLITS = ("train", "validation", "test")
EOU = "__eou__"
ROOT_ENV = "ISQ_DAILYDIALOG"
"""Environment variable naming the release directory (training's, the notebook's and the report's default)."""


class DataFormatError(ValueError):
    """A malformed data file; the message names the file and line."""


# Release text is space-tokenised ("it ' s", "dinner ?"): glue punctuation back on.
_DETOK_RULES = [
    (re.compile(r"\s+([.,!?;:%)\]])"), r"\1"),
    (re.compile(r"([(\[$])\s+"), r"\1"),
    (re.compile(r"\s*(['’])\s*(s|t|re|ve|ll|d|m)\b", re.IGNORECASE), r"\1\2"),
    (re.compile(r"\s+"), " "),
]


def detokenize(text: str) -> str:
    for pattern, repl in _DETOK_RULES:
        text = pattern.sub(repl, text)
    return text.strip()


def read_dialogues(path: Path) -> list[list[str]]:
    """One dialogue per line; raises :class:`DataFormatError` with file and line on bad input."""
    if not path.is_file():
        raise FileNotFoundError(f"DailyDialog file not found: {path}")
    dialogues = []
    for number, line in enumerate(_utf8_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        if EOU not in line:
            raise DataFormatError(f"{path}:{number}: no '{EOU}' utterance separator in {line[:60]!r}")
        pieces = line.split(EOU)
        if not pieces[-1].strip():  # the separator after the last utterance
            pieces = pieces[:-1]
        try:
            dialogues.append(checked_dialogue([detokenize(t) for t in pieces]))
        except DataFormatError as err:
            raise DataFormatError(f"{path}:{number}: {err}") from None
    if not dialogues:
        raise DataFormatError(f"{path}: no dialogues")
    return dialogues


def _utf8_text(path: Path) -> str:
    """The file's text (newlines as ``\n``), or :class:`DataFormatError` naming it when it is not UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise DataFormatError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None


def checked_dialogue(turns: list[str]) -> list[str]:
    """``turns`` (detokenised utterances), or :class:`DataFormatError` (without a place: the
    reader adds it) when one is empty, which would shift every later speaker tag (tags follow
    the turns' order), or when there are fewer than two, which make no pair."""
    empty = [index for index, turn in enumerate(turns) if not turn]
    if empty:
        raise DataFormatError(f"utterance {empty[0] + 1} of {len(turns)} is empty")
    if len(turns) < 2:
        raise DataFormatError(f"a dialogue needs at least two utterances, found {len(turns)}")
    return turns


def count_label_mismatches(dialogue_path: Path, dialogues: list[list[str]]) -> int:
    """Dialogues whose act-label count differs from their utterance count.

    The release has a few such lines; labels are not used here, so they are counted and
    reported, not fatal.
    """
    act_path = dialogue_path.with_name(dialogue_path.name.replace("dialogues_", "dialogues_act_"))
    if not act_path.is_file():
        return 0
    acts = _utf8_text(act_path).splitlines()
    return sum(1 for turns, labels in zip(dialogues, acts, strict=False) if len(labels.split()) != len(turns))


def dialogue_pairs(dialogues: list[list[str]], context_turns: int) -> dict[str, list[str]]:
    """Every (up to ``context_turns`` previous utterances with speaker tags -> next utterance)."""
    contexts, targets = [], []
    for turns in dialogues:
        for i in range(1, len(turns)):
            window = range(max(0, i - context_turns), i)
            contexts.append(" ".join(f"{'AB'[j % 2]}: {turns[j]}" for j in window))
            targets.append(turns[i])
    return {"context": contexts, "target": targets}


@dataclass
class Splits:
    dialogues: dict[str, list[list[str]]]
    leaked: dict[str, int]
    label_mismatches: dict[str, int]


def load_splits(root: Path) -> Splits:
    """Read the three splits and drop evaluation dialogues that also occur in train."""
    if not root.is_dir():
        raise FileNotFoundError(
            f"DailyDialog directory not found: {root} (pass --data.root or set ${ROOT_ENV}; "
            f"it must hold train/dialogues_train.txt, validation/..., test/...)"
        )
    dialogues, mismatches = {}, {}
    for split in SPLITS:
        path = root / split / f"dialogues_{split}.txt"
        dialogues[split] = read_dialogues(path)
        mismatches[split] = count_label_mismatches(path, dialogues[split])
    kept, leaked = without_leaks(dialogues)
    return Splits(kept, leaked, mismatches)


_APOSTROPHES = str.maketrans({"’": "'", "‘": "'", "`": "'"})


def leak_key(text: str) -> str:
    """What two texts that are the same text share: ``text`` lower-cased, without whitespace, its
    apostrophes one character. The release repeats train dialogues in validation and test with
    only such differences ("sir.How" / "sir. How", "I’m" / "I'm", "do you" / "Do you")."""
    return "".join(text.translate(_APOSTROPHES).lower().split())


def without_leaks(dialogues: dict[str, list[list[str]]]) -> tuple[dict[str, list[list[str]]], dict[str, int]]:
    """The splits with the validation and test dialogues that also occur in train (compared by
    :func:`leak_key`) dropped, and how many each lost (docs/design.md §1.9), whichever source the
    splits came from."""
    seen = {tuple(map(leak_key, d)) for d in dialogues["train"]}
    kept, leaked = dict(dialogues), {}
    for split in ("validation", "test"):
        kept[split] = [d for d in dialogues[split] if tuple(map(leak_key, d)) not in seen]
        leaked[split] = len(dialogues[split]) - len(kept[split])
    return kept, leaked


def without_seen_pairs(pairs: dict[str, list[str]],
                       train: dict[str, list[str]]) -> tuple[dict[str, list[str]], int]:
    """``pairs`` (of :func:`dialogue_pairs`) without those whose context and target, compared by
    :func:`leak_key`, are a pair of ``train``: a validation dialogue that shares its opening turns
    with a train dialogue (and is no copy of it) holds pairs training saw. Returns how many went."""
    def keys(some: dict[str, list[str]]) -> list[tuple[str, str]]:
        return [(leak_key(c), leak_key(t)) for c, t in zip(some["context"], some["target"], strict=True)]

    seen = set(keys(train))
    keep = [key not in seen for key in keys(pairs)]
    kept = {name: [value for value, k in zip(values, keep, strict=True) if k]
            for name, values in pairs.items()}
    return kept, keep.count(False)
