"""The one place that opens a store from what the user typed (``Memory.open(path)``, every
command line's ``--store``; :mod:`retrieval.memory.targets`): a ``postgresql://`` or
``postgres://`` URL selects the PostgreSQL backend, anything else is the directory of a SQLite
store (:class:`retrieval.memory.store.AMUStore`). A URL is never taken as a path: one of another
scheme is refused, and without the PostgreSQL support installed a PostgreSQL URL is one
:class:`BackendUnavailable` error.
"""

from __future__ import annotations

from pathlib import Path

from retrieval.memory.errors import BackendUnavailable, StoreError
from retrieval.memory.store import AMUStore
from retrieval.memory.store_contract import Store
from retrieval.memory.targets import POSTGRES_SCHEMES, redacted, url_scheme


def open_store(target: str | Path, *, read_only: bool = False, role: str = "ingest") -> Store:
    """The store at ``target`` (a directory path or a PostgreSQL URL), opened read-only or for
    writing in ``role`` (see :class:`retrieval.memory.store.AMUStore`)."""
    scheme = url_scheme(target)
    if scheme is None:
        return AMUStore(target, read_only=read_only, role=role)
    if scheme not in POSTGRES_SCHEMES:
        raise StoreError(f"{redacted(target)}: a store is a directory or a postgresql:// URL, "
                         f"not a {scheme}:// URL")
    try:
        from retrieval.memory.postgres.store import PostgresStore
    except ModuleNotFoundError as err:
        raise BackendUnavailable(f"{redacted(target)}: PostgreSQL support is not installed "
                                 f"({err.name} is missing)") from None
    return PostgresStore(str(target), read_only=read_only, role=role)
