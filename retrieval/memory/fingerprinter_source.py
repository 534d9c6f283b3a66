"""Where a store's fingerprinter came from, so a reader need not name it again.

The store binds the fingerprinter's identity (its codebook's and its encoder's checksums:
:meth:`AMUStore.bind`);
ingestion also records the directory it was loaded from (a mutable record: a checkpoint may be
moved and named again). The command lines that open a built store (``retrieval.query``,
``retrieval.serve``, ``retrieval.mcp``, ``retrieval.consolidate``, ``retrieval.evaluate --store``,
and ``retrieval.ingest`` adding to one) load it from there when ``--fingerprinter`` is not given
(:func:`named_or_recorded`, :func:`recorded_or_refused`), and the identity check still refuses a
directory that now holds another codebook.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from retrieval.memory.backends import open_store
from retrieval.memory.cache import model_identity
from retrieval.memory.connection import DB_NAME
from retrieval.memory.errors import StoreError
from retrieval.memory.meta_keys import bound_alike
from retrieval.memory.store_contract import Store
from retrieval.memory.targets import local_directory

PATH_KEY = "fingerprinter_path"


def remember_fingerprinter(store: Store, directory: Path, fingerprinter: Any) -> None:
    """Record ``directory`` as the source of ``fingerprinter``, unless the store is bound to another."""
    saved = store.meta("fingerprinter")
    if saved is None or bound_alike("fingerprinter", saved, model_identity(fingerprinter)):
        store.put_meta(PATH_KEY, str(Path(directory).resolve()))


def recorded_fingerprinter(store: Store) -> Path | None:
    """The directory the store's fingerprinter was loaded from, when it was built with one,
    recorded where, and that directory still exists (None otherwise: stores written before this
    record, a checkpoint since moved; the reader then names it)."""
    if store.meta("fingerprinter") in (None, "none") or store.meta(PATH_KEY) is None:
        return None
    recorded = Path(store.meta(PATH_KEY))
    return recorded if recorded.is_dir() else None


def named_or_recorded(target: str | Path, named: Path | None, *, writer: bool = False) -> Path | None:
    """The fingerprinter a command line loads for the store at ``target``: the one ``named``, else
    the one the store recorded (None for a store not made yet, or one that cannot be read now:
    opening the memory then says why). A ``writer`` (the caller opens the store for writing next)
    reads it through a writing open, which migrates a store of an older schema that a read-only
    open would refuse; a store directory without a store is not made one here. A writer of a
    store built with a fingerprinter it cannot find is refused here (:class:`StoreError`), naming
    the directory that is gone, since the memory would refuse it without saying where to look."""
    if named is not None:
        return named
    directory = local_directory(target)
    if directory is not None and not (directory / DB_NAME).is_file():
        return None
    try:
        with open_store(target, read_only=not writer) as store:
            return recorded_or_refused(store) if writer else recorded_fingerprinter(store)
    except UnfoundFingerprinter:
        raise
    except StoreError:
        return None


def recorded_or_refused(store: Store) -> Path | None:
    """:func:`recorded_fingerprinter` of an open store about to be written, refusing one built
    with a fingerprinter it cannot find (:class:`UnfoundFingerprinter`, naming where it looked)."""
    recorded = recorded_fingerprinter(store)
    unfound = _unfound(store) if recorded is None else None
    if unfound is not None:
        raise UnfoundFingerprinter(unfound)
    return recorded


class UnfoundFingerprinter(StoreError):
    """A store built with a fingerprinter is opened for writing without one it can find."""


def _unfound(store: Store) -> str | None:
    """Why ``store`` cannot be written without naming its fingerprinter (None when it can): it
    holds turns built with one whose recorded directory is gone, or that none recorded (only
    ``retrieval.ingest`` records it)."""
    if store.meta("fingerprinter") in (None, "none") or not store.holds_turns():
        return None
    recorded = store.meta(PATH_KEY)
    where = (f"loaded from {recorded}, which is no longer a directory" if recorded is not None
             else "whose directory it does not record")
    return (f"{store.location} was built with a fingerprinter {where}: pass --fingerprinter DIR, the same "
            "exported fingerprinter")
