"""How the server treats connections: uvicorn's settings, and the read deadlines uvicorn lacks.

uvicorn (0.54) closes an idle keep-alive connection after ``timeout_keep_alive`` but has no
deadline for a request that is still arriving: a client that sends half a request head, or a
head and part of its body (declared or chunked), holds the connection (and on shutdown the
server) forever. :class:`DeadlineH11Protocol`, uvicorn's h11 protocol with two deadlines, closes
such a connection: the request head must arrive within ``header_s`` of the connection opening or
of the previous response, its body within ``body_s`` of the head. The application then reads a
disconnect and answers no one.

On SIGTERM uvicorn stops accepting, closes idle connections and waits ``drain_s`` for the others.
A connection whose request body is still arriving is closed at once: no route runs before its
body is whole, so nothing of that request was done; the client retries it elsewhere. A second
SIGTERM or SIGINT while it drains ends the process at once (:class:`DrainingServer`).
"""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass
from types import FrameType
from typing import Any

import h11
import uvicorn
from uvicorn.config import LOGGING_CONFIG
from uvicorn.protocols.http.h11_impl import H11Protocol

from retrieval.service import limits


@dataclass(frozen=True)
class ConnectionTimeouts:
    """The seconds of :mod:`retrieval.service.limits`; tests pass shorter ones."""

    keep_alive_s: float = limits.KEEP_ALIVE_S
    header_s: float = limits.HEADER_TIMEOUT_S
    body_s: float = limits.BODY_TIMEOUT_S
    drain_s: float = limits.DRAIN_S


class DeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request head or body arrives too slowly.

    After every event it looks at what the client still owes (h11's ``their_state``): a head
    (``IDLE``), a body (``SEND_BODY``) or nothing, and keeps one deadline for it. Each deadline
    runs from the moment that part became due, however the client paces its bytes.
    """

    timeouts = ConnectionTimeouts()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._owed: object | None = None
        self._deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._follow()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start the next request cycle (IDLE again)
        self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        if (self.conn.their_state is h11.SEND_BODY and self.cycle is not None
                and not self.cycle.response_started):
            self.transport.close()  # the body never arrived whole: no route ran for it
            return
        super().shutdown()

    def _follow(self) -> None:
        owed = self.conn.their_state
        if owed not in (h11.IDLE, h11.SEND_BODY):
            self._owed = None
            self._cancel_deadline()
        elif owed is not self._owed:
            self._owed = owed
            self._cancel_deadline()
            seconds = self.timeouts.header_s if owed is h11.IDLE else self.timeouts.body_s
            self._deadline = self.loop.call_later(seconds, self._expire)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.transport.close()


class DrainingServer(uvicorn.Server):
    """uvicorn's server, whose second SIGTERM or SIGINT ends the process at once, by that signal, as
    one after the drain does (:func:`retrieval.serve.run`). uvicorn ignored a second SIGTERM, and
    answered a second SIGINT by cancelling the running requests (a bare 500 and a traceback each)
    and skipping the lifespan, whose write drain then never ran. A request killed so was not
    answered; the turns it logged resume at the next start, as after a crash."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit:
            signal.signal(sig, signal.SIG_DFL)
            signal.raise_signal(sig)
        super().handle_exit(sig, frame)


def logging_config() -> dict[str, Any]:
    """uvicorn's logging, with this package's warnings and errors (``retrieval.*``) in its format,
    and every other logger's warnings and errors in the same format through the root logger: the
    ``mcp`` SDK puts a rich-text handler at INFO there, which logged each tool refusal with its
    user's ids, and which, out of file descriptors, failed to import its traceback module inside
    the event loop's error handler and stopped the server."""
    config = {**LOGGING_CONFIG, "loggers": dict(LOGGING_CONFIG["loggers"])}
    config["loggers"]["retrieval"] = {"handlers": ["default"], "level": "WARNING", "propagate": False}
    config["root"] = {"handlers": ["default"], "level": "WARNING"}
    return config


def uvicorn_config(app: Any, host: str, port: int, timeouts: ConnectionTimeouts,
                   **options: Any) -> uvicorn.Config:
    """The server's uvicorn settings (``options`` override them, e.g. ``log_config`` in tests)."""
    protocol = type("DeadlineH11Protocol", (DeadlineH11Protocol,), {"timeouts": timeouts})
    settings: dict[str, Any] = dict(host=host, port=port, http=protocol, access_log=False,
                                    log_config=logging_config(), timeout_keep_alive=timeouts.keep_alive_s,
                                    timeout_graceful_shutdown=timeouts.drain_s)
    return uvicorn.Config(app, **{**settings, **options})
