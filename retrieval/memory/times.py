"""ISO 8601 time values of AMUs: the closed interval each one covers.

An AMU says "last month" as ``2023-05`` rather than inventing a day; every stored time value
is one of the forms :func:`time_interval` accepts, and the store indexes the intervals.
"""

from __future__ import annotations

import calendar
import re
from datetime import UTC, date, datetime, timedelta

_YEAR = re.compile(r"^(\d{4})$")
_MONTH = re.compile(r"^(\d{4})-(\d{2})$")
_WEEK = re.compile(r"^(\d{4})-?W(\d{2})$")


def time_interval(value: str) -> tuple[datetime, datetime]:
    """The closed interval of naive (UTC) datetimes an ISO 8601 time value covers.

    Accepted forms: year ``2023``, month ``2023-05``, ISO week ``2023-W18``, day ``2023-05-07``,
    datetime ``2023-05-08T13:56:00`` (an offset is converted to UTC), and intervals ``A/B`` of
    those. Reduced precision is how an AMU says "last month" without inventing a day. The other
    spellings of a week or a day that ISO 8601 allows and Python's ``fromisoformat`` reads (basic
    ``2023W18`` and ``20230507``, week date ``2023-W18-7``) cover the same week or day, not its
    first moment. Raises ``ValueError`` for anything else.
    """
    if "/" in value:
        first, _, second = value.partition("/")
        if "/" in second:
            raise ValueError(f"an interval time value has one '/', not {value.count('/')} (a value of "
                             f"{len(value)} characters)")
        start, end = time_interval(first)[0], time_interval(second)[1]
        if end < start:
            raise ValueError(f"interval {value!r} ends before it starts")
        return start, end
    try:
        if match := _YEAR.match(value):
            year = int(match[1])
            return datetime(year, 1, 1), _end_of_day(date(year, 12, 31))
        if match := _MONTH.match(value):
            year, month = int(match[1]), int(match[2])
            last = calendar.monthrange(year, month)[1]
            return datetime(year, month, 1), _end_of_day(date(year, month, last))
        if match := _WEEK.match(value):
            monday = date.fromisocalendar(int(match[1]), int(match[2]), 1)
            return datetime.combine(monday, datetime.min.time()), _end_of_day(monday + timedelta(days=6))
        try:
            day = date.fromisoformat(value)  # a day, however written
        except ValueError:
            moment = datetime.fromisoformat(value)
        else:
            return datetime.combine(day, datetime.min.time()), _end_of_day(day)
    except (ValueError, OverflowError) as err:  # OverflowError: a week or day past 9999-12-31
        raise ValueError(f"{value!r} is not a valid ISO 8601 time value ({err})") from None
    moment = naive_utc(moment)
    return moment, moment


_PAST_MICROSECONDS = re.compile(r"[.,]\d{7,}")


def parse_iso(text: str) -> datetime:
    """``datetime.fromisoformat``, refusing (ValueError) a fraction of a second finer than
    microseconds, which a datetime cannot keep and would cut."""
    if _PAST_MICROSECONDS.search(text):
        raise ValueError(f"{text!r} has more than 6 decimals of a second")
    return datetime.fromisoformat(text)


def naive_utc(moment: datetime) -> datetime:
    """``moment`` as a naive UTC datetime: one with an offset is converted, a naive one is kept as is.
    Raises ``ValueError`` when the conversion leaves the calendar (``9999-12-31T23:59:59-12:00``)."""
    if moment.tzinfo is None:
        return moment
    try:
        return moment.astimezone(UTC).replace(tzinfo=None)
    except OverflowError:
        raise ValueError(f"{moment.isoformat()} is outside years 1-9999 once converted to UTC") from None


def _end_of_day(day: date) -> datetime:
    return datetime.combine(day, datetime.max.time())


def iso_text(moment: datetime) -> str:
    # Fixed-width strings compare in time order, which the SQL range query relies on.
    return moment.isoformat(timespec="microseconds")
