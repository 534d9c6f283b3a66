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
    """The store directory a target names, absolute (a later ``chdir`` does not move it), None
    for a URL (a store on a database server)."""
    return None if url_scheme(target) else Path(target).absolute()


SECRET_PARAMETERS = ("password", "sslpassword")
"""The query parameters of a PostgreSQL URL that hold a secret (libpq reads ``?password=``)."""


def redacted(target: str | Path) -> str:
    """``target`` fit for messages: a URL's password replaced by ``***``, in its query (the
    parameters :data:`SECRET_PARAMETERS`, their names %-decoded and in any case, each up to its
    ``&``) and in its credentials, taken to end at the URL's last ``@`` (HTTP clients read them so,
    and a password may hold ``@``, ``/``, ``?`` or ``#`` unencoded; where an ``@`` follows in the
    path or query, more than the password is hidden, never less)."""
    text = str(target)
    if url_scheme(text) is None:
        return text
    base, question, query = text.partition("?")
    if question:
        items = [f"{name}=***" if equals and unquote(name).lower() in SECRET_PARAMETERS
                 else f"{name}{equals}{value}"
                 for name, equals, value in (item.partition("=") for item in query.split("&"))]
        text = f"{base}?{'&'.join(items)}"
    head, _, rest = text.partition("//")
    user, colon, after = rest.partition(":")
    if colon and "@" in after and not any(mark in user for mark in "/?#"):
        rest = f"{user}:***{after[after.rindex('@'):]}"
    return f"{head}//{rest}"


def store_target(text: str) -> str | Path:
    """``--store``'s argparse type: a URL stays text (a ``Path`` would fold its ``//``), anything
    else is a path; an empty one (an unset shell variable) is refused, not read as ``.``."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a store directory or URL, got an empty value")
    return text if url_scheme(text) else Path(text)
