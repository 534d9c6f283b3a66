"""What a merged AMU must keep of its members (docs/design.md §8.2: consolidation loses no fact).

Turns are not enough: a merged AMU that points to fifteen turns but keeps one statement still
covers every turn. So a merge must also state what each member stated, at least:

- every entity a member names in its own text appears in the merged text (case-insensitive,
  as a whole word; entities an extractor attached without writing them are not "stated");
- every date a member mentions (its ``timestamps``: the dates its text states) is one of the
  merged AMU's (``t_ref`` is left out: it defaults to the day a fact was stated, and a merge of
  a fact restated later keeps the newer day);

and it may state no name or number that none of them states in its text, entities, speakers or
dates (:func:`added_content`: an operator that invents a person or an amount; a capitalised word
opening a sentence is not taken for a name, so a sentence that begins with one passes), nor give
itself an entity no member names or an event time that meets none of its members' times (the
evidence indexes file a record under its entities and times: a name the operator made canonical,
"Melanie" for a member's "Mel", a plural's singular, or a day it resolved from a "yesterday" the
members left unresolved is refused too, and an invented span wide enough to meet a member's time
passes), and it may absorb at most :data:`MAX_MERGE_MEMBERS` AMUs. The engine refuses a draft that
breaks these (the members stay active), and the audit checks every forwarded AMU against the
active end of its chain, so settings loose enough to lump unrelated facts fail loudly, not
silently.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from retrieval.consolidation.prefix import strip_prefix
from retrieval.index.stopwords import STOPWORDS
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


_LETTERS = re.compile(r"[^\W\d_]+")
_DIGITS = re.compile(r"\d+")
_GROUPING = re.compile(r"(?<=\d)[,\u202f](?=\d{3}(?!\d))")
"""A thousands separator ("5,000"), dropped before numbers are compared."""
_OPENS_SENTENCE = ".!?:"
_TITLES = frozenset("Dr Mr Mrs Ms Mx Prof St Jr Sr".split())
_CARDINALS = {word: str(number) for number, word in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split()) if number > 1} | {
    "thirty": "30", "forty": "40", "fifty": "50", "sixty": "60", "seventy": "70", "eighty": "80",
    "ninety": "90", "hundred": "100", "thousand": "1000", "million": "1000000", "dozen": "12"}
"""Number words a merged text states an amount with ("three hundred" is 3 and 100)."""
_ALSO_NUMBERS = {"zero": "0", "one": "1"} | {word: str(number) for number, word in enumerate(
    "first second third fourth fifth sixth seventh eighth ninth tenth".split(), start=1)}
"""Words that state a number where a member writes them ("the 1st step" restates "the first"), too
common to be taken for a claim of the merged text ("one day", "for the first time")."""


def _names_in(text: str) -> list[str]:
    """The capitalised words of two letters or more that open no sentence (a possessive's or a
    compound's parts apart: "Caroline's", "LGBTQ-friendly"), titles and stopwords ("She",
    "His": a merged list's items begin with them) aside."""
    return [word for match in _LETTERS.finditer(text) if (word := match.group())[0].isupper()
            and len(word) > 1 and word not in _TITLES and word.casefold() not in STOPWORDS
            and (before := text[:match.start()].rstrip()) and before[-1] not in _OPENS_SENTENCE]


def _ascii(run: str) -> str:
    """A run of digits of any script ("٧", "２０２３") in ASCII digits."""
    return "".join(str(unicodedata.digit(digit)) for digit in run)


def _numbers_in(text: str, words: Mapping[str, str] = _CARDINALS) -> set[str]:
    """The numbers ``text`` writes: digit runs without leading zeros ("2023-05-07" is 2023, 5 and
    7; "5,000" is 5000; "3pm" holds 3) and the number ``words`` it uses. Compared as text: a
    run of thousands of digits is a number too, past what ``int`` reads."""
    digits = {_ascii(run).lstrip("0") or "0" for run in _DIGITS.findall(_GROUPING.sub("", text))}
    return digits | {words[word] for word in _LETTERS.findall(text.casefold()) if word in words}


def _times(amu: AMU) -> list[str]:
    """The AMU's time values: its dates stated, observed, referred to, valid from and to, and the
    span it is valid over."""
    span = [f"{amu.valid_from}/{amu.valid_to}"] if amu.valid_from and amu.valid_to else []
    return [value for value in (*amu.timestamps, amu.observed_at, amu.t_ref, amu.valid_from, amu.valid_to)
            if value] + span


def _intervals(values: Iterable[str]) -> list[tuple[str, tuple[datetime, datetime]]]:
    """Each time value that parses, with its interval (:func:`time_interval`)."""
    parsed = []
    for value in values:
        try:
            parsed.append((value, time_interval(value)))
        except ValueError:
            continue
    return parsed


def _dates_written(amu: AMU) -> list[str]:
    """The AMU's dates (:func:`_times`) as a text may write them: each day an interval starts and
    ends on as its year (also as two digits), month and day numbers, month and weekday names, and
    a stated time of day's hour (24- and 12-hour) and minute."""
    words: list[str] = []
    for value, days in _intervals(_times(amu)):
        words += [part for day in days for part in (
            str(day.year), f"{day.year % 100:02d}", str(day.month), str(day.day), day.strftime("%B"),
            day.strftime("%b"), "Sept" if day.month == 9 else "", day.strftime("%A"))]
        if len(value) > 10 and value[10] in "T ":  # a time of day: "at 13:56", "at 1:56 pm"
            words += [str(days[0].hour), str(days[0].hour % 12 or 12), str(days[0].minute)]
    return words


def added_content(members: Sequence[AMU], merged: AMU) -> list[str]:
    """The names and numbers ``merged`` states that no member states in its text, its entities, its
    speakers or its dates (names as whole words and case-insensitively, numbers as numbers, a
    number word standing for its digits; a merged text's time prefix, which the engine writes, left
    out), then its entities that none of those name and its event times (``timestamps``) that
    overlap none of the members' times (:func:`_times`: "2023-05" from a member's "2023-05-07" is
    kept)."""
    stated = " ".join(" ".join([strip_prefix(member.text), *member.entities, *member.source.speakers,
                                *_dates_written(member)]) for member in members)
    numbers = _numbers_in(stated, {**_CARDINALS, **_ALSO_NUMBERS})
    text = strip_prefix(merged.text)
    names = [name for name in dict.fromkeys(_names_in(text)) if not _names(stated, name)]
    claims = [repr(claim) for claim in names + sorted(_numbers_in(text) - numbers, key=lambda n: (len(n), n))]
    entities = [f"entity {entity!r}" for entity in merged.entities if not _names(stated, entity)]
    held = [days for member in members for _, days in _intervals(_times(member))]
    times = [f"time {value!r}" for value, (start, end) in _intervals(merged.timestamps)
             if not any(start <= last and first <= end for first, last in held)]
    return claims + entities + times


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
