"""A local OpenAI-style chat endpoint for tests (loopback only, stopped by the context manager)."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = tuple[int, Any, float]
"""HTTP status, body (a JSON-able object or a raw string) and a delay in seconds; status 0 closes
the connection without an answer."""

DROP = 0
_ids = itertools.count()


def completion_body(content: str, prompt_tokens: int, completion_tokens: int,
                    model: str = "fake-model") -> dict[str, Any]:
    """A ``chat.completion`` body as OpenAI's API returns it (one choice, with usage)."""
    return {"id": f"chatcmpl-{next(_ids)}", "object": "chat.completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


class FakeChatServer:
    """Serves POST /v1/chat/completions on 127.0.0.1 with ``respond(request_body) -> Reply``.

    Every request body and its headers (names in lower case) are recorded before ``respond`` runs;
    ``answer_headers`` are sent with every answer."""

    def __init__(self, respond: Callable[[dict[str, Any]], Reply]) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.answer_headers: dict[str, str] = {}
        self.trickle_s = 0.0  # > 0: each answer's body is sent a byte at a time, this far apart
        self.stopping = threading.Event()  # set on exit: a trickling answer sends its rest at once
        self.answered = 0  # answers sent whole
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append(body)
                owner.headers.append({name.lower(): value for name, value in self.headers.items()})
                status, payload, delay = respond(body)
                time.sleep(delay)
                if status == DROP:
                    self.close_connection = True
                    return
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                for name, value in owner.answer_headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    while owner.trickle_s and data and not owner.stopping.wait(owner.trickle_s):
                        self.wfile.write(data[:1])
                        self.wfile.flush()
                        data = data[1:]
                    self.wfile.write(data)
                    owner.answered += 1
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout tests)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # A short poll interval, so that stopping the server takes no half second per test.
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> FakeChatServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()
