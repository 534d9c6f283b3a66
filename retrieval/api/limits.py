"""What one call may ask of the memory, defined once for Python, HTTP and MCP: the request models
of :mod:`retrieval.service.schemas` take these numbers, and :mod:`retrieval.api.inputs` checks
the same ones, so a value the server accepts is one the memory accepts and the reverse.

The text limit is the store's own (:data:`retrieval.memory.records.MAX_TURN_CHARS`).
"""

from __future__ import annotations

from retrieval.memory.records import MAX_TURN_CHARS

MAX_TEXT_CHARS = MAX_TURN_CHARS
"""Characters in one turn's text or image caption."""
MAX_ID_CHARS = 128
"""Characters in a user id, session id, speaker, time, idempotency key or job id (a turn id and a
memory id have their own limits, below)."""
MAX_TURN_ID_CHARS = MAX_ID_CHARS + 21
"""Characters in a turn id: room for one the memory numbers itself, ``<session id>:<n>`` (a colon
and up to 20 digits), so that such an id passed back, as a retry does, is taken."""
MAX_MEMORY_ID_CHARS = 3 * MAX_ID_CHARS
"""Characters in a memory id: an AMU id or ``<user>:turn:<turn id>``, both built from a user id
and more, so the limit leaves room for a user id and a turn id of the longest kind."""
MAX_QUERY_CHARS = 2_000
"""Characters in one search query."""
MAX_K = 100
"""Hits one search may return."""
DEFAULT_K = 10
MAX_PAGE = 100
"""Items in one page of ``list``."""
DEFAULT_PAGE = 20
MAX_TURNS = 100
"""Turns in one HTTP or MCP add (a request's size; a Python ``add`` may pass a whole session)."""
MAX_PENDING_TURNS = 10_000
"""Turns of one user stored and not yet processed by the ingestion worker from which an add is
refused (:class:`retrieval.api.errors.MemoryBusy`, to retry): the worker holds them in memory
until it has, so adds faster than it (a few hundred turns a second against its tens) would
otherwise grow the process without bound. A flush or a drain waits for them; an add under the
bound may take the backlog past it by its own turns."""
MAX_OPEN_SESSIONS = 32
"""Sessions of one user holding turns (an open segment or a turn waiting for its reply) in the
ingestion worker's stream: a turn that would make one more first closes the sessions whose latest
turn came earliest, as a flush after the turn before it would
(:meth:`retrieval.api.online.UserStream.push`; docs/design.md §5.2). Without a flush or a boundary
a session's tail stays open for ever, held in memory (about 10 KiB each), fed again at every
reload and never extracted; an agent that starts a session per conversation and never flushes
would grow all three without bound."""
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$"
"""What a served user id (a key's), session id or turn id may look like: each appears in URLs
(a memory id is built from the user id and the turn id), so no slashes or spaces. Python callers
may use any id :func:`retrieval.api.inputs.check_id` accepts."""
