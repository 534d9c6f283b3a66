"""Relative dates resolved against the session time ("yesterday" -> "on 7 May 2023")."""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta

WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
            "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "a couple of": 2}
_PREPOSITIONS = ("since", "until", "till", "from", "by", "before", "after", "on", "in", "during", "of",
                 "over", "through", "around", "for")

_RELATIVE_DATE = re.compile(
    r"\b(?:(?P<prep>" + "|".join(_PREPOSITIONS) + r")\s+)?"
    r"(?P<expr>the\s+day\s+before\s+yesterday|the\s+day\s+after\s+tomorrow|yesterday|today|tonight|tomorrow"
    r"|last\s+night"
    r"|(?P<rel>last|next|this)\s+(?P<unit>week|weekend|month|year|" + "|".join(WEEKDAYS) + r")"
    r"|(?P<num>\d+|" + "|".join(sorted(_NUMBERS, key=len, reverse=True)) + r")"
    r"\s+(?P<agounit>day|week|month|year)s?\s+ago)"
    r"\b(?P<poss>['’]s)?(?P<subject>(?=\s+(?:was|is|has|had|will|were|would)\b))?",
    re.IGNORECASE,
)


def _day_text(day: date) -> str:
    return f"{day.day} {day:%B %Y}"


def _week(day: date) -> str:
    iso = day.isocalendar()
    return f"{iso.year}-W{iso.week:02d}"


def _shift_months(day: date, months: int) -> date:
    index = day.year * 12 + day.month - 1 + months
    return date(index // 12, index % 12 + 1, 1)


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
        count = int(match["num"]) if match["num"].isdigit() else _NUMBERS[" ".join(match["num"].lower().split())]
        unit = match["agounit"].lower()
        if unit == "day":
            day = today - timedelta(days=count)
            return _day_text(day), day.isoformat(), "on"
        if unit == "week":
            day = today - timedelta(weeks=count)
            monday = day - timedelta(days=day.weekday())
            return f"the week of {_day_text(monday)}", _week(day), "in"
        if unit == "month":
            month = _shift_months(today, -count)
            return f"{month:%B %Y}", f"{month:%Y-%m}", "in"
        return str(today.year - count), str(today.year - count), "in"
    step = {"last": -1, "this": 0, "next": 1}[match["rel"].lower()]
    unit = match["unit"].lower()
    monday = today - timedelta(days=today.weekday())
    if unit == "week":
        words = {-1: "the week before", 0: "the week of", 1: "the week after"}[step]
        return f"{words} {_day_text(today)}", _week(today + timedelta(weeks=step)), "in"
    if unit == "weekend":
        saturday = monday + timedelta(days=5 + 7 * step)
        sunday = saturday + timedelta(days=1)
        return f"the weekend of {_day_text(saturday)}", f"{saturday.isoformat()}/{sunday.isoformat()}", "on"
    if unit == "month":
        month = _shift_months(today, step)
        return f"{month:%B %Y}", f"{month:%Y-%m}", "in"
    if unit == "year":
        return str(today.year + step), str(today.year + step), "in"
    target = WEEKDAYS.index(unit)
    if step == -1:  # the most recent such day strictly before today
        day = today - timedelta(days=(today.weekday() - target) % 7 or 7)
    elif step == 1:  # the first such day strictly after today
        day = today + timedelta(days=(target - today.weekday()) % 7 or 7)
    else:  # that day of the current Monday-to-Sunday week
        day = monday + timedelta(days=target)
    return f"{day:%A}, {_day_text(day)}", day.isoformat(), "on"


def resolve_relative_dates(text: str, when: datetime | date | None) -> tuple[str, list[str]]:
    """Rewrite relative dates against the session time; returns the text and the ISO values.

    Handled: yesterday, today, tonight, tomorrow, last night, the day before yesterday / after
    tomorrow, last/this/next week|weekend|month|year|<weekday>, and ``<n> days|weeks|months|years
    ago`` (digits or number words; vague "a few" is left alone). Conventions: "last week" is
    "the week before <session date>" (ISO week of session - 7 days, LoCoMo's answer wording);
    weekends are Saturday/Sunday intervals; "last Friday" is the latest Friday strictly before
    the session day, "next Friday" the first strictly after, "this Friday" the one in the session's
    Monday-Sunday week. A preceding preposition is kept ("since yesterday" -> "since 7 May 2023");
    otherwise "on"/"in" is added ("yesterday" -> "on 7 May 2023"), except for possessives and
    subjects ("Yesterday was fun" -> "7 May 2023 was fun").
    """
    if when is None:
        return text, []
    today = when.date() if isinstance(when, datetime) else when
    values: list[str] = []

    def replace(match: re.Match[str]) -> str:
        phrase, value, default_prep = _resolve(match, today)
        values.append(value)
        if match["poss"] or (match["subject"] is not None and not match["prep"]):
            # A possessive or grammatical subject ("Yesterday was fun") takes no preposition.
            replacement = f"{match['prep'] + ' ' if match['prep'] else ''}{phrase}{match['poss'] or ''}"
        else:
            replacement = f"{match['prep'] or default_prep} {phrase}"
        return replacement[0].upper() + replacement[1:] if match[0][0].isupper() else replacement

    return _RELATIVE_DATE.sub(replace, text), list(dict.fromkeys(values))
