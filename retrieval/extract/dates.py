"""Dates in text: relative dates resolved against the session time ("yesterday" -> "on 7 May
2023"), with the preposition that bounds them ("since yesterday" starts a validity interval),
and absolute dates read as ISO values ("7 May 2023" -> ``2023-05-07``). The one date resolver of
the project: the rule extractor and the rule planner both use it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from retrieval.memory.times import time_interval

WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_WEEKDAY_ABBREVIATIONS = {"mon": 0, "tue": 1, "tues": 1, "wed": 2, "thu": 3, "thur": 3, "thurs": 3, "fri": 4,
                          "sat": 5, "sun": 6}
"""Short weekday names as people write them ("last Fri"); each maps to its index in WEEKDAYS. Only
capitalised ("I last sat there" is no Saturday), and not before a hyphen or a capitalised word
("this Sun Valley trip", "last Wed-Fri"). "This past" is said of a weekend or a weekday; "this
past year" is the last twelve months, no calendar year, and stays as written."""
_DETERMINERS = ("the", "my", "our", "their", "your", "its")
"""Before "last"/"next"/"this", a word that makes the phrase a thing, not a date ("my last year of
college", "the next month"); not "her" or "his", which as often stand alone before a date ("I saw
her last week", "I borrowed his last Friday")."""
MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
          "november", "december")
_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
            "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "a couple of": 2}
_PREPOSITIONS = ("since", "until", "till", "from", "by", "before", "after", "on", "in", "during", "of",
                 "over", "through", "around", "for")

_RELATIVE_DATE = re.compile(
    r"\b(?:(?P<prep>" + "|".join(_PREPOSITIONS) + r")\s+)?"
    r"(?P<expr>the\s+day\s+before\s+yesterday|the\s+day\s+after\s+tomorrow|yesterday|today|tonight|tomorrow"
    r"|last\s+night"
    r"|" + "".join(rf"(?<!\b{word}\s)" for word in _DETERMINERS)
    + r"(?P<rel>last|next|this\s+past(?=\s+(?:weekend|" + "|".join(WEEKDAYS) + r")\b)|this)"
    r"\s+(?P<unit>weekend|week|month|year|" + "|".join(WEEKDAYS)
    + "|(?-i:(?:" + "|".join(sorted((a.title() for a in _WEEKDAY_ABBREVIATIONS), key=len, reverse=True))
    + r")(?!-|\s+(?!I\b)[A-Z])))"
    r"|(?P<num>\d+|" + "|".join(sorted(_NUMBERS, key=len, reverse=True)) + r")"
    r"\s+(?P<agounit>day|weekend|week|month|year)s?\s+ago)"
    r"\b(?P<poss>['’]s)?(?P<subject>(?=\s+(?:was|is|has|had|will|were|would)\b))?",
    re.IGNORECASE,
)


def _day_text(day: date) -> str:
    return f"{day.day} {_month_text(day)}"


def _month_text(day: date) -> str:
    # The year written out, not strftime's %Y: that gives "523", not "0523", on some platforms.
    return f"{day:%B} {day.year}"


def _year(year: int) -> str:
    """A year as an ISO value (four digits); ``ValueError`` outside Python's years 1 to 9999."""
    if not date.min.year <= year <= date.max.year:
        raise ValueError(f"year {year} is out of range")
    return f"{year:04d}"


def _week(day: date) -> str:
    iso = day.isocalendar()
    return f"{_year(iso.year)}-W{iso.week:02d}"


def _month(day: date) -> str:
    return f"{_year(day.year)}-{day.month:02d}"


def _shift_months(day: date, months: int) -> date:
    index = day.year * 12 + day.month - 1 + months
    return date(index // 12, index % 12 + 1, 1)


def _weekend(today: date, step: int) -> tuple[str, str, str]:
    """The weekend ``step`` weeks from the one of today's Monday-to-Sunday week (-1: last weekend,
    also on a Saturday or Sunday, when "this weekend" is the current one)."""
    saturday = today - timedelta(days=today.weekday()) + timedelta(days=5 + 7 * step)
    sunday = saturday + timedelta(days=1)
    return f"the weekend of {_day_text(saturday)}", f"{saturday.isoformat()}/{sunday.isoformat()}", "on"


def _resolve(match: re.Match[str], today: date) -> tuple[str, str, str]:
    """(absolute phrase, ISO value, default preposition) for one relative expression."""
    expr = " ".join(match["expr"].lower().split())
    fixed = {"the day before yesterday": -2, "yesterday": -1, "today": 0, "tomorrow": 1,
             "the day after tomorrow": 2}
    if expr in fixed:
        day = today + timedelta(days=fixed[expr])
        return _day_text(day), day.isoformat(), "on"
    if expr in ("tonight", "last night"):
        day = today - timedelta(days=1 if expr == "last night" else 0)
        return f"the night of {_day_text(day)}", day.isoformat(), "on"
    if match["num"]:
        count = (int(match["num"]) if match["num"].isdigit()
                 else _NUMBERS[" ".join(match["num"].lower().split())])
        unit = match["agounit"].lower()
        if unit == "day":
            day = today - timedelta(days=count)
            return _day_text(day), day.isoformat(), "on"
        if unit == "week":
            day = today - timedelta(weeks=count)
            monday = day - timedelta(days=day.weekday())
            return f"the week of {_day_text(monday)}", _week(day), "in"
        if unit == "weekend":  # one weekend ago is last weekend
            return _weekend(today, -count)
        if unit == "month":
            month = _shift_months(today, -count)
            return _month_text(month), _month(month), "in"
        return str(today.year - count), _year(today.year - count), "in"
    step = {"last": -1, "this past": -1, "this": 0, "next": 1}[" ".join(match["rel"].lower().split())]
    unit = match["unit"].lower()
    monday = today - timedelta(days=today.weekday())
    if unit == "week":
        words = {-1: "the week before", 0: "the week of", 1: "the week after"}[step]
        return f"{words} {_day_text(today)}", _week(today + timedelta(weeks=step)), "in"
    if unit == "weekend":
        return _weekend(today, step)
    if unit == "month":
        month = _shift_months(today, step)
        return _month_text(month), _month(month), "in"
    if unit == "year":
        return str(today.year + step), _year(today.year + step), "in"
    target = WEEKDAYS.index(unit) if unit in WEEKDAYS else _WEEKDAY_ABBREVIATIONS[unit]
    if step == -1:  # the most recent such day strictly before today
        day = today - timedelta(days=(today.weekday() - target) % 7 or 7)
    elif step == 1:  # the first such day strictly after today
        day = today + timedelta(days=(target - today.weekday()) % 7 or 7)
    else:  # that day of the current Monday-to-Sunday week
        day = monday + timedelta(days=target)
    return f"{day:%A}, {_day_text(day)}", day.isoformat(), "on"


@dataclass(frozen=True)
class ResolvedDate:
    """One relative date: its ISO value and the preposition before it in the text (lower case), if
    any. ``value`` is None for a phrase that lies outside the representable years 1 to 9999
    ("30000 months ago"): it stays in the text as written, with no date attached."""

    value: str | None
    preposition: str | None = None


def resolve_relative_dates(text: str, when: datetime | date | None) -> tuple[str, list[str]]:
    """Rewrite relative dates against the session time; returns the text and the distinct ISO
    values (:func:`resolve_dates` also says which preposition preceded each)."""
    text, found = resolve_dates(text, when)
    return text, list(dict.fromkeys(date.value for date in found if date.value is not None))


def resolve_dates(text: str, when: datetime | date | None) -> tuple[str, list[ResolvedDate]]:
    """Rewrite relative dates against the session time; returns the text and each resolved date.

    Handled: yesterday, today, tonight, tomorrow, last night, the day before yesterday / after
    tomorrow, last/this/next week|weekend|month|year|<weekday>, and ``<n> days|weeks|months|years
    ago`` (digits or number words; vague "a few" is left alone). Conventions: "last week" is
    "the week before <session date>" (ISO week of session - 7 days, LoCoMo's answer wording);
    weekends are Saturday/Sunday intervals; "last Friday" is the latest Friday strictly before
    the session day, "next Friday" the first strictly after, "this Friday" the one in the session's
    Monday-Sunday week. A preceding preposition is kept ("since yesterday" -> "since 7 May 2023");
    otherwise "on"/"in" is added ("yesterday" -> "on 7 May 2023"), except for possessives and
    subjects ("Yesterday was fun" -> "7 May 2023 was fun"). A phrase that resolves outside the
    years 1 to 9999 ("1000000 days ago", "tomorrow" in a session of 31 December 9999) is left as
    written and reported with value None, so a turn is never refused for what it says.
    """
    if when is None:
        return text, []
    today = when.date() if isinstance(when, datetime) else when
    found: list[ResolvedDate] = []

    def replace(match: re.Match[str]) -> str:
        try:
            phrase, value, default_prep = _resolve(match, today)
            time_interval(value)  # a week whose Sunday is past 9999-12-31 is written but not readable
        except (OverflowError, ValueError):  # date arithmetic past year 1 or 9999
            found.append(ResolvedDate(None, match["prep"].lower() if match["prep"] else None))
            return match[0]
        found.append(ResolvedDate(value, match["prep"].lower() if match["prep"] else None))
        if match["poss"] or (match["subject"] is not None and not match["prep"]):
            # A possessive or grammatical subject ("Yesterday was fun") takes no preposition.
            replacement = f"{match['prep'] + ' ' if match['prep'] else ''}{phrase}{match['poss'] or ''}"
        else:
            replacement = f"{match['prep'] or default_prep} {phrase}"
        return replacement[0].upper() + replacement[1:] if match[0][0].isupper() else replacement

    return _RELATIVE_DATE.sub(replace, text), found


_AFTER_A_YEAR = tuple("""
and or but when while where because as so that which who i we he she they it you my our his her their
the a an to in on at for with was were is are had has have did will would then too already until before
after since""".split())
"""The words a year after a preposition may be followed by ("in 2019 we moved"); any other lower-case
word makes the number a count ("a crowd of 2000 people", "by 2010 votes")."""
_MONTH = r"(?P<month>" + "|".join([*(f"{name[:3]}(?:{name[3:]})?" if len(name) > 3 else name
                                     for name in MONTHS), "sept"]) + r")\.?"
"""A month by name, abbreviation ("Sep", "Sept.") or in full."""
_ABSOLUTE_DATE = re.compile(
    r"\b(?:(?P<prep>since|from|until|till|by)\s+)?"
    r"(?:(?P<day1>\d{1,2})(?:st|nd|rd|th)?\s+(?:of\s+)?" + _MONTH + r",?\s+(?P<year1>\d{4})"
    r"|" + _MONTH.replace("month", "month2") + r"\s+(?P<day2>\d{1,2})(?:st|nd|rd|th)?,?\s+(?P<year2>\d{4})"
    r"|" + _MONTH.replace("month", "month3") + r",?\s+(?P<year3>\d{4})"
    r"|(?P<iso>\d{4}-\d{2}(?:-\d{2})?)"
    r"|(?P<yprep>in|since|until|during|of|by|from|before|after)\s+(?P<year4>(?:19|20)\d{2})(?!-\d)"
    r"(?=\s*(?:[^\w\s]|$)|\s+(?-i:[A-Z])|\s+(?:" + "|".join(_AFTER_A_YEAR) + r")\b))\b",
    re.IGNORECASE,
)


def _month_number(name: str) -> int:
    return next(i for i, full in enumerate(MONTHS, start=1) if full.startswith(name.lower().rstrip(".")[:3]))


def absolute_dates(text: str) -> list[str]:
    """ISO values of the absolute dates written in ``text``, in order, without repeats: days
    ("7 May 2023", "May 7, 2023", "2023-05-07"), months ("May 2023", "2023-05") and years after a
    preposition ("in 2022"; not a count: "of 2000 people"). Impossible dates (30 February) are skipped."""
    return list(dated_absolutes(text))


def dated_absolutes(text: str) -> dict[str, str | None]:
    """:func:`absolute_dates` with the preposition before each ("since", "from", "until", "till",
    "by", or a year's own; None without one), the first one's for a repeated value: what decides
    whether a date opens or closes a validity interval (:func:`retrieval.extract.rules.temporal_scope`)."""
    values: dict[str, str | None] = {}
    for match in _ABSOLUTE_DATE.finditer(text):
        groups = match.groupdict()
        try:
            if groups["iso"]:
                value = groups["iso"]
                date.fromisoformat(value if len(value) == 10 else value + "-01")
            elif groups["year4"]:
                value = groups["year4"]
            else:
                month = groups["month"] or groups["month2"] or groups["month3"]
                year = groups["year1"] or groups["year2"] or groups["year3"]
                day = groups["day1"] or groups["day2"]
                moment = date(int(year), _month_number(month), int(day) if day else 1)
                value = moment.isoformat() if day else _month(moment)
        except ValueError:
            continue
        preposition = groups["prep"] or groups["yprep"]
        values.setdefault(value, preposition.lower() if preposition else None)
    return values
