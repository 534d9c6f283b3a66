"""The one exception family of the memory API: every refusal is a :class:`MemoryAPIError` whose
message says which argument or field is wrong and what to do, never a traceback from deep inside
the store or a model. ``field`` names the argument as a dotted path (``turns.3.text``,
``cursor``), or is None when the refusal concerns no one argument (a busy or closed store)."""

from __future__ import annotations

from retrieval.memory.errors import StoreBusy, StoreError


class MemoryAPIError(Exception):
    """Base of every error the memory API raises on purpose."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class InvalidInput(MemoryAPIError, ValueError):
    """An argument or a turn field is missing or malformed (the message names it)."""


class NotFound(MemoryAPIError, LookupError):
    """No such record, turn, session or job for this user (another user's id is also not found)."""


class Conflict(MemoryAPIError):
    """A replay that is not one: an idempotency key or a stored turn id given again with another
    body (other turns, text, speaker, time or session). Nothing of the call is stored."""


class MemoryBusy(MemoryAPIError):
    """Another writer is in the way: another process holds the store open for writing (the message
    names its pid), or other servers kept adding to the user while an add was checked, or the
    user's backlog is full (:data:`retrieval.api.limits.MAX_PENDING_TURNS`): retry it."""


class StoreUnavailable(MemoryAPIError):
    """The store cannot be used (not a store, another model built it, read-only, closed, ...)."""


class ReadOnly(StoreUnavailable):
    """A write to a memory opened read-only (``Memory.open(..., read_only=True)``, ``retrieval.serve
    --read-only``): it answers every read and refuses every write, which belongs to the process that
    writes the store."""

    def __init__(self) -> None:
        super().__init__("this memory is open read-only: it answers reads; send writes to the process that "
                         "writes its store")


class IngestFailed(MemoryAPIError):
    """Closing a segment of this user failed in the ingestion worker (the message names the error).
    The user's turns are stored and stay searchable as raw turns; its backlog is kept and tried
    again by the next add or flush of the user."""


def refusal(err: StoreError) -> MemoryAPIError:
    """The API's error for a store's: :class:`MemoryBusy` when another writer holds the role,
    else :class:`StoreUnavailable`; both with the store's message."""
    return MemoryBusy(str(err)) if isinstance(err, StoreBusy) else StoreUnavailable(str(err))
