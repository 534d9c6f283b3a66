"""What a store target is (what the user typed for ``--store`` or ``Memory.open``): a
``scheme://`` URL, never taken as a path, or the path of a store directory. Light to import (the
key commands read it without loading the store); :func:`retrieval.memory.backends.open_store`
opens one.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from urllib.parse import urlsplit

POSTGRES_SCHEMES = ("postgresql", "postgres")
_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


def url_scheme(target: str | Path) -> str | None:
    """The scheme of a URL target (``postgresql``), None for a path."""
    found = _URL.match(target) if isinstance(target, str) else None
    return None if found is None else found.group(1).lower()


def local_directory(target: str | Path) -> Path | None:
    """The store directory a target names, None for a URL (a store on a database server)."""
    return None if url_scheme(target) else Path(target)


_SECRET_PARAMETERS = re.compile(r"(?<=[?&])(password|sslpassword)=[^&#]*")
"""The query parameters of a PostgreSQL URL that hold a secret (libpq takes ``?password=``)."""


def redacted(target: str | Path) -> str:
    """``target`` fit for messages: a URL's password, in its user part or its query
    (``?password=``, ``?sslpassword=``), replaced by ``***``."""
    text = str(target)
    if url_scheme(text) is None:
        return text
    text = _SECRET_PARAMETERS.sub(r"\1=***", text)
    try:
        parts = urlsplit(text)
    except ValueError:  # unparsable (a bracket left open): whatever stands between "//" and "@" goes
        return re.sub(r"(?<=//)[^/?#]*@", "***@", text, count=1)
    if parts.password is None:
        return text
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{parts.username or ''}:***@{host}").geturl()


def store_target(text: str) -> str | Path:
    """``--store``'s argparse type: a URL stays text (a ``Path`` would fold its ``//``), anything
    else is a path; an empty one (an unset shell variable) is refused, not read as ``.``."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a store directory or URL, got an empty value")
    return text if url_scheme(text) else Path(text)
