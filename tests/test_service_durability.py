"""What the server acknowledged is stored: ``kill -9`` during a burst of adds, then a restart,
finds every acknowledged turn exactly once (and retries add nothing twice); SIGTERM during a
burst drains the running writes, so every turn answered 200 is in the store after exit."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from benchmarks.service_process import Server, bearer
from retrieval.memory.store import AMUStore
from retrieval.service.keys import KeyStore

pytestmark = pytest.mark.slow
CLIENTS, TURNS_PER_ADD = 4, 2


class Burst:
    """``CLIENTS`` threads adding turns with unique ids until stopped; remembers what was acknowledged."""

    def __init__(self, url: str, key: str, tag: str) -> None:
        self.url, self.key, self.tag = url, key, tag
        self.acknowledged: list[str] = []
        self.sent: list[list[dict]] = []
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(n,)) for n in range(CLIENTS)]

    def turns(self, client: int, number: int) -> list[dict]:
        return [{"speaker": ("Maria", "Jon")[part], "turn_id": f"{self.tag}-{client}-{number}-{part}",
                 "text": f"Burst {self.tag} client {client} request {number} part {part}."}
                for part in range(TURNS_PER_ADD)]

    def _run(self, client: int) -> None:
        with httpx.Client(base_url=self.url, headers=bearer(self.key), timeout=60) as http:
            number = 0
            while not self.stop.is_set():
                turns = self.turns(client, number)
                with self._lock:
                    self.sent.append(turns)
                try:
                    response = http.post(f"/v1/sessions/{self.tag}-{client}/turns", json={"turns": turns})
                except httpx.TransportError:
                    return  # the server is gone: this request was never acknowledged
                if response.status_code == 200:
                    with self._lock:
                        self.acknowledged += response.json()["turn_ids"]
                elif response.status_code != 503:  # 503: refused while draining, nothing stored
                    raise AssertionError(response.text)
                number += 1

    def run_until(self, acknowledged: int, timeout_s: float = 300) -> None:
        for thread in self.threads:
            thread.start()
        deadline = time.monotonic() + timeout_s
        while len(self.acknowledged) < acknowledged and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(self.acknowledged) >= acknowledged, "the burst did not get going"

    def join(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(120)


def stored_turns(store: Path, user: str) -> Counter:
    with AMUStore(store, read_only=True) as reader:
        return Counter(turn.turn_id for turn in reader.turns(user))


def test_kill_9_then_sigterm_lose_no_acknowledged_turn(tmp_path: Path) -> None:
    store = tmp_path / "store"
    keys = KeyStore(store)
    key = keys.create("alice")
    first = Server(store).start()
    burst = Burst(first.url, key, "kill")
    try:
        burst.run_until(acknowledged=20)
        first.process.kill()  # SIGKILL while requests are in flight
        first.process.wait(30)
    finally:
        burst.join()
        first.kill()
    assert burst.acknowledged and stored_turns(store, "alice")  # something was in flight and stored

    second = Server(store).start()
    try:
        with httpx.Client(base_url=second.url, headers=bearer(key), timeout=120) as http:
            for turn_id in burst.acknowledged:
                assert http.get(f"/v1/memories/alice:turn:{turn_id}").status_code == 200, turn_id
            for turns in burst.sent:  # a client retries everything it sent: nothing is stored twice
                session = turns[0]["turn_id"].rsplit("-", 2)[0]
                assert http.post(f"/v1/sessions/{session}/turns", json={"turns": turns}).status_code == 200
        drained = Burst(second.url, key, "term")
        try:
            drained.run_until(acknowledged=20)
            assert second.stop() == 0  # SIGTERM mid-burst: running writes finish, then it exits
        finally:
            drained.join()
    finally:
        second.kill()
        keys.close()
    stored = stored_turns(store, "alice")
    assert max(stored.values()) == 1
    assert set(burst.acknowledged) <= set(stored) and set(drained.acknowledged) <= set(stored)
    assert {turn["turn_id"] for turns in burst.sent for turn in turns} <= set(stored)
    assert "Traceback" not in second.log_tail(100_000)
