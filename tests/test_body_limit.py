"""The body limit's JSON check never holds the event loop for a long body: other requests,
keyless ones and ``/healthz`` included, are answered while it parses."""

from __future__ import annotations

import json
import threading

import anyio
import pytest

from retrieval.memory import strict_json
from retrieval.service import body_limit
from retrieval.service.body_limit import BodyLimit
from retrieval.service.limits import INLINE_JSON_BYTES


async def _answer(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def _call(app: BodyLimit, body: bytes) -> int:
    sent = False
    statuses: list[int] = []

    async def receive():
        nonlocal sent
        if sent:
            await anyio.sleep_forever()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    await app({"type": "http", "path": "/v1/search", "headers": []}, receive, send)
    return statuses[0]


def test_a_long_body_is_parsed_off_the_event_loop_while_short_ones_are_answered(monkeypatch) -> None:
    held, release = threading.Event(), threading.Event()
    loop_thread: list[threading.Thread] = []
    real = strict_json.loads

    def parse(text):
        if len(text) > INLINE_JSON_BYTES:
            assert threading.current_thread() is not loop_thread[0]
            held.set()
            release.wait(30)
        return real(text)

    monkeypatch.setattr(body_limit.strict_json, "loads", parse)
    app = BodyLimit(_answer)
    long_body = json.dumps([{}] * INLINE_JSON_BYTES).encode()
    short: list[int] = []

    async def main() -> list[int]:
        loop_thread.append(threading.current_thread())
        statuses: list[int] = []
        async with anyio.create_task_group() as tasks:
            async def long_request() -> None:
                statuses.append(await _call(app, long_body))
            tasks.start_soon(long_request)
            await anyio.to_thread.run_sync(held.wait, 30)
            short.append(await _call(app, b'{"query": "x"}'))
            short.append(await _call(app, b""))
            assert not statuses  # the long body is still being parsed
            release.set()
        return statuses

    assert anyio.run(main) == [200] and short == [200, 200]


@pytest.mark.parametrize("size", [INLINE_JSON_BYTES, INLINE_JSON_BYTES + 1])
def test_duplicate_keys_are_refused_on_either_side_of_the_inline_length(size: int) -> None:
    body = b'{"k": 1, "k": 2, "pad": "' + b"x" * (size - 27) + b'"}'
    assert len(body) == size
    assert anyio.run(_call, BodyLimit(_answer), body) == 422
