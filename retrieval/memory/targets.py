"""What a store target is (what the user typed for ``--store`` or ``Memory.open``): a
``scheme://`` URL, never taken as a path, or the path of a store directory. Light to import (the
key commands read it without loading the store); :func:`retrieval.memory.backends.open_store`
opens one.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from urllib.parse import unquote

POSTGRES_SCHEMES = ("postgresql", "postgres")
_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


def url_scheme(target: str | Path) -> str | None:
    """The scheme of a URL target (``postgresql``), None for a path."""
    found = _URL.match(target) if isinstance(target, str) else None
    return None if found is None else found.group(1).lower()


def local_directory(target: str | Path) -> Path | None:
    """The store directory a target names, None for a URL (a store on a database server)."""
    return None if url_scheme(target) else Path(target)


SECRET_PARAMETERS = ("password", "sslpassword")
"""The query parameters of a PostgreSQL URL that hold a secret (libpq reads ``?password=``)."""


def redacted(target: str | Path) -> str:
    """``target`` fit for messages: a URL's password replaced by ``***``, read as libpq reads one
    (its credentials end at the first ``@`` before any ``/``, so a password may hold ``#`` or
    ``?``; a query parameter's name is %-decoded, and its value ends at ``&``), in its user part
    and in the query (:data:`SECRET_PARAMETERS`, in any case)."""
    text = str(target)
    if url_scheme(text) is None:
        return text
    head, _, rest = text.partition("//")
    ends = [index for index in (rest.find("@"), rest.find("/")) if index >= 0]
    if ends and rest[min(ends)] == "@":
        user, colon, _ = rest[:min(ends)].partition(":")
        rest = (f"{user}:***" if colon else user) + rest[min(ends):]
    base, question, query = rest.partition("?")
    if not question:
        return f"{head}//{rest}"
    items = [f"{name}=***" if equals and unquote(name).lower() in SECRET_PARAMETERS
             else f"{name}{equals}{value}"
             for name, equals, value in (item.partition("=") for item in query.split("&"))]
    return f"{head}//{base}?{'&'.join(items)}"


def store_target(text: str) -> str | Path:
    """``--store``'s argparse type: a URL stays text (a ``Path`` would fold its ``//``), anything
    else is a path; an empty one (an unset shell variable) is refused, not read as ``.``."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a store directory or URL, got an empty value")
    return text if url_scheme(text) else Path(text)
