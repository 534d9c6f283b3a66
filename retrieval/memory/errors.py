"""Why a store cannot be used: each error's message names the store file and what to do."""

from __future__ import annotations


class StoreError(RuntimeError):
    """The store cannot be used as asked (not a database, unknown schema, not writable, ...)."""


class StoreMismatch(StoreError):
    """The store was built with other models or other input than this run's."""


class StoreBusy(StoreError):
    """Another process holds the store open for writing in the same role, or, where this one would
    migrate the store, in any role."""


class StoreFault(StoreError):
    """SQLite failed on an open store (damaged page, missing table, full disk, I/O error); the
    message names the store, the SQLite error and what to do (:mod:`retrieval.memory.faults`)."""


class StoreOutage(StoreFault):
    """The database server or the connection to it failed (a PostgreSQL outage): every call fails
    alike until it is back, so none may carry on past it as past a full disk."""


class StoreGone(StoreFault):
    """The store's file was removed or replaced while this process had it open: no retry mends it,
    so background work stops on it rather than try again (an operator must put the store back)."""


class BackendUnavailable(StoreError):
    """The store's backend is not installed here (a PostgreSQL URL without the PostgreSQL support)."""


class TurnsChanged(StoreError):
    """Another writer added to the user between an add's checks and its transaction (another
    server over the same database): nothing was stored; bind and check the turns again."""
