"""The "[T_start to T_end]" prefix of a merged AMU whose statements span more than minutes
(MemCode key design 4): days as ISO dates, or minutes when the span lies within one day."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

PREFIX = re.compile(r"^\[(\d{4}-\d{2}-\d{2}(?: \d{2}:\d{2})?) to (\d{4}-\d{2}-\d{2}(?: \d{2}:\d{2})?)\]\s*")
"""A prefix this module wrote (stripped before a merged text is merged again)."""


def time_prefix(start: datetime | None, end: datetime | None, min_span: timedelta) -> str:
    """``"[2023-05-08 to 2023-06-27] "`` when ``end - start`` exceeds ``min_span``, else ``""``."""
    if start is None or end is None or end - start <= min_span:
        return ""
    minutes = start.date() == end.date()
    return f"[{_stamp(start, minutes)} to {_stamp(end, minutes)}] "


def _stamp(moment: datetime, minutes: bool) -> str:
    """The ISO date (its year in four digits: strftime's ``%Y`` writes the year 523 as ``523``,
    which :data:`PREFIX` would not strip) and, with ``minutes``, the time to the minute."""
    day = f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}"
    return f"{day} {moment:%H:%M}" if minutes else day


def strip_prefix(text: str) -> str:
    """``text`` without a leading time prefix."""
    return PREFIX.sub("", text, count=1)
