"""The strict gates of consolidation (MemCode key design 4; docs/design.md §8).

1. Count-sensitive facts are never consolidated: merging "Melanie has two kids" with "Melanie has
   three kids", or summarising "went running 3 times" with "goes running every day", would lose
   or invent a count. A fact is count-sensitive when, after its dates and clock times are
   blanked (the extractor writes "on 7 May 2023" into most records), it still contains a digit,
   a number word (two ... ninety, hundred, thousand, million, dozen, couple), a multiplicative
   or frequency expression (once, twice, "N times", every day/week/..., daily, weekly, per week,
   "a week"/"a month" after a number) or a counting phrase ("how many", "how much", "how often",
   "number of", "the first/second ... time"). A lexicon, not a model: it errs towards skipping.
2. Speakers: a cluster never mixes AMUs of different speakers (:func:`~retrieval.consolidation.
   members.speaker_key`); clustering runs per speaker key.
3. Time window: a cluster whose statement times span more than the window is split into
   consecutive sub-clusters (members ordered by first statement time; a new sub-cluster starts
   when a member was last stated more than the window after the sub-cluster's first member).
   Undated members form their own sub-cluster.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import timedelta

from retrieval.consolidation.members import Member

_MONTH = (r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|jun(?:e)?|jul(?:y)?|aug(?:ust)?"
          r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?")
_TIME_WORD = (r"(?:in|since|until|till|through|during|before|after|early|late|mid|at|year"
              r"|summer|winter|spring|autumn|fall)")
"""A word after which a bare year (2022) or clock time (17:30) is a time, not a quantity: none that
also precedes amounts ("about 2000", "to 2000", "of 2000", "by 2010 votes"; "from 2019 to 2021"
then counts, erring towards holding a fact back)."""
DATES_AND_TIMES = re.compile(
    r"\b\d{1,2}(?:st|nd|rd|th)?\s+(?:of\s+)?" + _MONTH + r"(?:,?\s+\d{4})?\b"   # 7 May 2023, 7th of May
    r"|\b" + _MONTH + r"\s+\d{1,2}(?:st|nd|rd|th)?(?:,?\s+\d{4})?\b"            # May 7, 2023
    r"|\b" + _MONTH + r",?\s+\d{4}\b"                                            # May 2023
    r"|\b\d{4}-\d{2}(?:-\d{2})?(?:T[\d:.]+)?\b|\b\d{4}-W\d{2}\b"                # ISO values
    r"|\b" + _TIME_WORD + r"[\s-]+(?:the\s+)?(?:19|20)\d{2}\b(?![-/]\d)"           # in 2022, mid-2021
    r"|\b(?:19|20)\d0s\b"                                                        # the 1990s
    r"|\b\d{1,2}(?::\d{2})?\s*(?:a\.?m\.?|p\.?m\.?)(?!\w)"                       # 5 pm, 5:30 a.m.
    r"|\b" + _TIME_WORD + r"\s+\d{1,2}:\d{2}\b",                                   # at 17:30
    re.IGNORECASE,
)
"""Dates and clock times: blanked before the count test (they are times, not counts). A bare year or
clock time is one only after a word that says so (:data:`_TIME_WORD`): "saved 2000 dollars" or
"won 21:15" states a quantity."""

_NUMBER_WORDS = (r"two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen"
                 r"|sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety"
                 r"|hundreds?|thousands?|millions?|billions?|dozens?|couple")
COUNT_SENSITIVE = re.compile(
    r"\d"
    r"|\b(?:" + _NUMBER_WORDS + r")\b"
    r"|\b(?:once|twice|thrice)\b"
    r"|\b(?:many|several|multiple|few|" + _NUMBER_WORDS + r")\s+times\b"
    r"|\bevery\s+(?:single\s+|other\s+)?(?:day|night|morning|evening|week|weekend|month|year|hour)s?\b"
    r"|\b(?:daily|nightly|weekly|monthly|yearly|annually|hourly)\b"
    r"|\bper\s+(?:day|night|week|month|year|hour)\b"
    r"|\bhow\s+(?:many|much|often)\b|\bnumber\s+of\b"
    r"|\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|last)\s+time\b",
    re.IGNORECASE,
)
"""A quantity, frequency or count left once dates and times are blanked (module docstring)."""


def is_count_sensitive(text: str) -> bool:
    """Whether the fact states a quantity, a frequency or a count (gate 1)."""
    return COUNT_SENSITIVE.search(DATES_AND_TIMES.sub(" ", text)) is not None


def split_by_window(cluster: Sequence[Member], window: timedelta) -> list[list[Member]]:
    """Gate 3: consecutive sub-clusters whose statements span at most ``window`` (singletons
    included; the caller drops them). Order: first statement time, then the given order."""
    dated = sorted((m for m in cluster if m.first is not None), key=lambda m: m.first)  # type: ignore[arg-type,return-value]
    parts: list[list[Member]] = []
    for member in dated:
        if parts and member.last - parts[-1][0].first <= window:  # type: ignore[operator]
            parts[-1].append(member)
        else:
            parts.append([member])
    undated = [m for m in cluster if m.first is None]
    return parts + ([undated] if undated else [])

