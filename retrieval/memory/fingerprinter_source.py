"""Where a store's fingerprinter came from, so a reader need not name it again.

The store binds the fingerprinter's identity (its codebook checksum: :meth:`AMUStore.bind`);
ingestion also records the directory it was loaded from (a mutable record: a checkpoint may be
moved and named again). ``retrieval.query`` loads it from there when ``--fingerprinter`` is not
given, and the identity check still refuses a directory that now holds another codebook.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from retrieval.memory.cache import model_identity
from retrieval.memory.store_contract import Store

PATH_KEY = "fingerprinter_path"


def remember_fingerprinter(store: Store, directory: Path, fingerprinter: Any) -> None:
    """Record ``directory`` as the source of ``fingerprinter``, unless the store is bound to another."""
    if store.meta("fingerprinter") in (None, model_identity(fingerprinter)):
        store.put_meta(PATH_KEY, str(Path(directory).resolve()))


def recorded_fingerprinter(store: Store) -> Path | None:
    """The directory the store's fingerprinter was loaded from, when it was built with one,
    recorded where, and that directory still exists (None otherwise: stores written before this
    record, a checkpoint since moved; the reader then names it)."""
    if store.meta("fingerprinter") in (None, "none") or store.meta(PATH_KEY) is None:
        return None
    recorded = Path(store.meta(PATH_KEY))
    return recorded if recorded.is_dir() else None

