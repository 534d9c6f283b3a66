"""What a merged AMU must keep of its members (docs/design.md §8.2: consolidation loses no fact).

Turns are not enough: a merged AMU that points to fifteen turns but keeps one statement still
covers every turn. So a merge must also state what each member stated, at least:

- every entity a member names in its own text appears in the merged text (case-insensitive,
  as a whole word; entities an extractor attached without writing them are not "stated");
- every date a member mentions (its ``timestamps``: the dates its text states) is one of the
  merged AMU's (``t_ref`` is left out: it defaults to the day a fact was stated, and a merge of
  a fact restated later keeps the newer day);

and it may state no name or number that none of them states in its text or its dates
(:func:`added_content`: an operator that invents a person or an amount; a capitalised word
opening a sentence is not taken for a name), and it may absorb at most :data:`MAX_MERGE_MEMBERS` AMUs.
The engine refuses a draft that breaks
these (the members stay active), and the audit checks every forwarded AMU against the active
end of its chain, so settings loose enough to lump unrelated facts fail loudly, not silently.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from retrieval.consolidation.prefix import strip_prefix
from retrieval.memory.records import AMU
from retrieval.memory.times import time_interval

MAX_MERGE_MEMBERS = 8
"""This project's bound on the AMUs one merge may absorb: near-duplicate groups in the LoCoMo dev
conversations have two to four members; a larger one means the clustering lumped topics."""


def _stated_entities(amu: AMU) -> list[str]:
    return [entity for entity in amu.entities if _names(amu.text, entity)]


def _names(text: str, entity: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(entity.casefold())}(?!\w)", text.casefold()) is not None


def lost_content(member: AMU, merged: AMU) -> list[str]:
    """What ``member`` stated that ``merged`` does not (empty: nothing lost)."""
    lost = [f"entity {entity!r}" for entity in _stated_entities(member) if not _names(merged.text, entity)]
    return lost + [f"date {value!r}" for value in sorted(set(member.timestamps) - set(merged.timestamps))]


_WORD = re.compile(r"\w[\w'-]*")
_NUMBER = re.compile(r"(?<!\w)\d(?:[\d.,:/-]*\d)?(?!\w)")
_OPENS_SENTENCE = ".!?:;\"'([“‘"


def _claims(text: str) -> list[str]:
    """The names (capitalised words not opening a sentence) and numbers (digits, with the
    separators a number or a date is written with) ``text`` states."""
    names = [match.group() for match in _WORD.finditer(text) if match.group()[0].isupper()
             and (before := text[:match.start()].rstrip()) and before[-1] not in _OPENS_SENTENCE]
    return list(dict.fromkeys(names + _NUMBER.findall(text)))


def _dates_written(amu: AMU) -> list[str]:
    """The AMU's dates (stated, observed, referred to, valid) as a text may write them: each day
    an interval starts and ends on as its year, month and day numbers, month and weekday names."""
    values = (*amu.timestamps, amu.observed_at, amu.t_ref, amu.valid_from, amu.valid_to)
    words: list[str] = []
    for value in filter(None, values):
        try:
            days = time_interval(value)
        except ValueError:
            continue
        words += [part for day in days for part in (
            str(day.year), str(day.month), f"{day.month:02d}", str(day.day), f"{day.day:02d}",
            day.strftime("%B"), day.strftime("%b"), day.strftime("%A"))]
    return words


def added_content(members: Sequence[AMU], merged: AMU) -> list[str]:
    """The names and numbers ``merged`` states that no member states, in its text or its dates,
    as whole words and case-insensitively (a merged text's time prefix, which the engine writes,
    left out)."""
    stated = " ".join(" ".join([strip_prefix(member.text), *_dates_written(member)]) for member in members)
    return [repr(claim) for claim in _claims(strip_prefix(merged.text)) if not _names(stated, claim)]


def merge_problems(members: Sequence[AMU], merged: AMU, forwarded: Sequence[AMU] = ()) -> list[str]:
    """Why ``merged`` may not replace ``members`` (empty: it may); ``forwarded``, the AMUs forwarded
    into the members earlier, must stay stated too (the audit checks each against the end of its
    chain: a member that kept a name in its text but not in its entities would pass it on unchecked)."""
    problems = [f"{amu.id}: {', '.join(lost)} not kept" for amu in (*members, *forwarded)
                if (lost := lost_content(amu, merged))]
    if added := added_content((*members, *forwarded), merged):
        problems.append(f"{', '.join(added)} stated by no member")
    if len(members) > MAX_MERGE_MEMBERS:
        problems.insert(0, f"{len(members)} members, over the bound of {MAX_MERGE_MEMBERS}")
    return problems
