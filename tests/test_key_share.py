"""One key's requests beyond KEY_CALLS wait at the door, holding no worker thread, while another
key's requests go in at once (a test of order, not of timing)."""

from __future__ import annotations

import anyio

from retrieval.service.key_share import CLIENT_GONE, KeyShare
from retrieval.service.limits import KEY_CALLS
from retrieval.service.metrics import LEFT_WAITING, route_label

SPELLINGS = [b"Bearer alice", b"bearer alice", b"BEARER  alice ", b"Bearer alice\t"]


def client(*messages):
    """A request's ``receive``: these messages, then nothing more (a client still waiting)."""
    left = list(messages)

    async def receive():
        if left:
            return left.pop(0)
        await anyio.sleep_forever()
    return receive


def test_a_keys_requests_past_its_share_wait_and_another_keys_go_in() -> None:
    inside: list[bytes] = []
    most: dict[bytes, int] = {}
    release = anyio.Event()

    async def app(scope, receive, send) -> None:
        key = dict(scope["headers"])[b"authorization"].split()[-1]  # the key, however the header spells it
        inside.append(key)
        most[key] = max(most.get(key, 0), inside.count(key))
        if key == b"alice":
            await release.wait()
        inside.remove(key)
        await send({"type": "http.response.start", "status": 200, "headers": []})

    share = KeyShare(app)

    async def request(key: bytes, answered: list) -> None:
        scope = {"type": "http", "path": "/v1/search", "headers": [(b"authorization", key)]}

        async def send(message) -> None:
            answered.append(key.split()[-1])

        await share(scope, client(), send)

    async def main() -> list:
        answered: list[bytes] = []
        async with anyio.create_task_group() as group:
            for n in range(KEY_CALLS + 5):  # one key however spelt: the key check reads each alike
                group.start_soon(request, SPELLINGS[n % len(SPELLINGS)], answered)
            await anyio.wait_all_tasks_blocked()
            assert inside.count(b"alice") == KEY_CALLS  # the others wait at the door
            await request(b"Bearer bob", answered)  # goes in and out while alice's wait
            assert answered == [b"bob"]
            release.set()
        return answered

    answered = anyio.run(main)
    assert answered.count(b"alice") == KEY_CALLS + 5 and most[b"alice"] == KEY_CALLS
    assert share._keys == {}  # nothing kept of a key once its requests are answered


def test_a_request_whose_client_left_while_it_waited_is_not_run() -> None:
    """A client that timed out and sent again would otherwise queue dead work ahead of its retry;
    one still there gets its body as it came."""
    read: list = []
    statuses: list[int] = []

    async def app(scope, receive, send) -> None:
        read.append(await receive())
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def send(message) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    share = KeyShare(app)
    scope = {"type": "http", "path": "/v1/search", "headers": [(b"authorization", b"Bearer alice")]}
    body = {"type": "http.request", "body": b'{"query": "lake"}', "more_body": False}
    anyio.run(share, scope, client(body, {"type": "http.disconnect"}), send)
    assert read == [] and statuses == [CLIENT_GONE] and route_label(scope) == LEFT_WAITING
    scope = {"type": "http", "path": "/v1/search", "headers": [(b"authorization", b"Bearer alice")]}
    anyio.run(share, scope, client(body), send)
    assert read == [body] and statuses == [CLIENT_GONE, 200] and route_label(scope) == "not_routed"


def test_a_request_without_a_key_passes_unlimited() -> None:
    calls: list[str] = []

    async def app(scope, receive, send) -> None:
        calls.append(scope["type"])

    share = KeyShare(app, calls=1)
    anyio.run(share, {"type": "http", "path": "/healthz", "headers": []}, None, None)
    anyio.run(share, {"type": "lifespan"}, None, None)
    assert calls == ["http", "lifespan"]


def test_the_servers_app_shares_each_keys_requests_inside_its_body_limit(tmp_path) -> None:
    """The server's app has the share, inside the body limit (a waiting request has its body)."""
    from retrieval.service.app import create_app
    from retrieval.service.body_limit import BodyLimit
    from retrieval.service.keys import KeyStore
    from tests.service_thread import open_memory

    memory = open_memory(tmp_path / "store")
    try:
        app = create_app(memory, KeyStore(tmp_path / "store"), tmp_path / "store")
        layers = [layer.cls for layer in app.user_middleware]
    finally:
        memory.close()
    assert layers.index(BodyLimit) < layers.index(KeyShare)  # outermost first
