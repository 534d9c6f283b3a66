"""The one exception family of the memory API: every refusal is a :class:`MemoryAPIError` whose
message says which argument or field is wrong and what to do, never a traceback from deep inside
the store or a model."""

from __future__ import annotations


class MemoryAPIError(Exception):
    """Base of every error the memory API raises on purpose."""


class InvalidInput(MemoryAPIError, ValueError):
    """An argument or a turn field is missing or malformed (the message names it)."""


class NotFound(MemoryAPIError, LookupError):
    """No such record, turn, session or job for this user (another user's id is also not found)."""


class MemoryBusy(MemoryAPIError):
    """Another process holds the store open for writing (the message names its pid)."""


class StoreUnavailable(MemoryAPIError):
    """The store cannot be used (not a store, another model built it, read-only, ...)."""
