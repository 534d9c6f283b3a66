"""Keys bound to users (salted hashes only), the ``retrieval.serve`` command line (keys, the
loopback default, one-line errors) and the write gate that drains on shutdown."""

from __future__ import annotations

import os
import re
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from benchmarks.service_process import ROOT, child_env
from retrieval.api.errors import StoreUnavailable
from retrieval.api.limits import ID_PATTERN
from retrieval.memory.errors import StoreError
from retrieval.service.drain import ShuttingDown, WriteGate
from retrieval.service.keys import KEYS_FILE, METRICS, KeyCommandError, KeyStore, UnservableKey
from retrieval.service.launch import is_loopback


def serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "retrieval.serve", *args], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=300)


def test_a_key_belongs_to_its_user_and_only_its_hash_is_kept(tmp_path: Path) -> None:
    keys = KeyStore(tmp_path)
    alice, bob = keys.create("alice"), keys.create("bob")
    assert alice != bob and keys.user(alice) == "alice" and keys.user(bob) == "bob"
    stored = (tmp_path
              / KEYS_FILE).read_bytes() + b"".join(p.read_bytes() for p in tmp_path.glob(f"{KEYS_FILE}-*"))
    secret = alice.split("_", 2)[2]
    assert secret.encode() not in stored and alice.encode() not in stored
    rows = sqlite3.connect(tmp_path / KEYS_FILE).execute("SELECT salt, digest FROM api_keys").fetchall()
    assert len({salt for salt, _ in rows}) == 2 and all(len(digest) == 32 for _, digest in rows)
    for wrong in ("", "alice", alice + "x", alice[:-1], alice.replace("isqm_", "abcd_"),
                  f"isqm_{bob.split('_')[1]}_"
                  + secret):
        assert keys.user(wrong) is None, wrong
    info = keys.revoke(alice.split("_")[1])
    assert info.user_id == "alice" and info.revoked and keys.user(alice) is None and keys.user(bob) == "bob"
    assert keys.revoke(alice).revoked == info.revoked  # revoking twice keeps the first time
    with pytest.raises(KeyCommandError, match="no key with id"):
        keys.revoke("0000")
    with pytest.raises(KeyCommandError, match="user id"):
        keys.create(" ")
    with pytest.raises(KeyCommandError, match="letters, digits"):
        keys.create("org/dave")  # its memory ids could not be named in a URL
    assert [(k.user_id, k.revoked is None) for k in keys.list()] == [("alice", False), ("bob", True)]
    assert [k.user_id for k in keys.list("bob")] == ["bob"]


def test_keys_command_line(tmp_path: Path) -> None:
    created = serve("keys", "create", "--store", str(tmp_path), "--user", "alice")
    assert created.returncode == 0
    key = created.stdout.strip().splitlines()[-1]
    assert KeyStore(tmp_path).user(key) == "alice"
    listed = serve("keys", "list", "--store", str(tmp_path))
    key_id = key.split("_")[1]
    assert key_id in listed.stdout and "user=alice" in listed.stdout and "active" in listed.stdout
    assert key.split("_", 2)[2] not in listed.stdout
    assert serve("keys", "revoke", "--store", str(tmp_path), key_id).returncode == 0
    assert "revoked=" in serve("keys", "list", "--store", str(tmp_path), "--user", "alice").stdout
    old = KeyStore(tmp_path)  # a key an older keys create made for a user id no URL can name
    old.rows.add_key("00legacy", "team/alice", b"0" * 16, b"digest", "2026-01-01T00:00:00")
    old.close()
    assert "00legacy  user=team/alice  created=2026-01-01T00:00:00  active (its user id cannot be served: " \
        "revoke it)" in serve("keys", "list", "--store", str(tmp_path)).stdout
    missing = serve("keys", "revoke", "--store", str(tmp_path), "nope")
    assert (missing.returncode == 2 and missing.stderr.startswith("error: ")
            and missing.stderr.count("\n") == 1)
    mistyped = tmp_path / "no" / "such store"
    unservable_id = serve("keys", "create", "--store", str(mistyped), "--user", "team/alice")
    assert unservable_id.returncode == 2 and unservable_id.stderr.startswith("error: --user: ")
    assert not mistyped.parent.exists()  # refused before a key store (and its directories) is made


def test_a_metrics_key_is_bound_to_no_user(tmp_path: Path) -> None:
    created = serve("keys", "create", "--store", str(tmp_path), "--metrics")
    assert created.returncode == 0 and "/metrics" in created.stdout
    key = created.stdout.strip().splitlines()[-1]
    keys = KeyStore(tmp_path)
    assert keys.holder(key) == METRICS and not re.fullmatch(ID_PATTERN, METRICS)  # never a user's id
    with pytest.raises(UnservableKey, match="metrics key"):
        keys.user(key)
    assert f"{key.split('_')[1]}  user={METRICS}" in serve("keys", "list", "--store", str(tmp_path)).stdout
    both = serve("keys", "create", "--store", str(tmp_path), "--metrics", "--user", "alice")
    assert both.returncode == 2 and "not allowed with" in both.stderr


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "::"])
def test_the_server_refuses_a_remote_host_without_allow_remote(tmp_path: Path, host: str) -> None:
    refused = serve("--store", str(tmp_path), "--host", host)
    assert refused.returncode == 2 and "--allow-remote" in refused.stderr and refused.stderr.count("\n") == 1
    assert not (tmp_path / "amus.sqlite3").exists()


def test_the_server_names_a_host_that_does_not_resolve_as_such(tmp_path: Path) -> None:
    """A mistyped name is not a remote machine to allow (``.invalid`` never resolves, RFC 2606)."""
    refused = serve("--store", str(tmp_path), "--host", "no-such-host.invalid")
    assert refused.returncode == 2 and refused.stderr.startswith("error: --host no-such-host.invalid: ")
    assert "--allow-remote" not in refused.stderr and refused.stderr.count("\n") == 1
    assert not (tmp_path / "amus.sqlite3").exists()


def test_loopback_hosts() -> None:
    assert all(map(is_loopback, ("127.0.0.1", "127.0.0.2", "::1", "localhost")))
    assert not any(map(is_loopback, ("0.0.0.0", "::", "10.0.0.1")))
    with pytest.raises(ValueError, match="^--host no-such-host.invalid: "):
        is_loopback("no-such-host.invalid")
    with pytest.raises(ValueError, match="^--host a..b: .*idna"):  # a name IDNA cannot encode
        is_loopback("a..b")


def test_bad_port_is_one_error_line(tmp_path: Path) -> None:
    refused = serve("--store", str(tmp_path), "--port", "70000")
    assert refused.returncode == 2 and refused.stderr.startswith("error: --port")


def test_a_port_in_use_is_one_error_line_before_anything_is_opened(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        refused = serve("--store", str(tmp_path / "store"), "--port", str(taken.getsockname()[1]))
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.startswith("error: cannot listen on 127.0.0.1:") and refused.stderr.count("\n") == 1
    assert not (tmp_path / "store").exists()


def test_two_servers_starting_at_once_cannot_both_take_the_port() -> None:
    """The port is listened on as soon as it is bound: two sockets with SO_REUSEADDR may both bind
    one port while neither listens, so the second server would only fail once loaded."""
    from retrieval.serve import listening

    with listening("127.0.0.1", 0) as first:
        with pytest.raises(ValueError, match="cannot listen on 127.0.0.1:"):
            listening("127.0.0.1", first.getsockname()[1])


def test_a_refused_memory_leaves_no_key_file(tmp_path: Path) -> None:
    refused = serve("--store", str(tmp_path), "--fingerprinter", str(tmp_path / "absent"))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("blocker", ["a directory", "a file above"])
def test_a_key_file_that_cannot_be_opened_is_one_error_line_not_called_corrupt(tmp_path: Path,
                                                                                blocker: str) -> None:
    if blocker == "a directory":
        (tmp_path / KEYS_FILE).mkdir()
        store = tmp_path
    else:
        (tmp_path / "file").write_text("")
        store = tmp_path / "file" / "store"
    refused = serve("keys", "create", "--store", str(store), "--user", "alice")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    said = "not a key file (a directory" if blocker == "a directory" else "cannot open"
    assert refused.stderr.startswith("error: ") and said in refused.stderr
    assert "restore it" not in refused.stderr
    if blocker == "a directory":  # listing says what is there too, not that no key store is
        listed = serve("keys", "list", "--store", str(store))
        assert listed.returncode == 2 and listed.stderr == refused.stderr


@pytest.mark.parametrize("threads", ["0", str(len(os.sched_getaffinity(0)) + 1), "100000"])
def test_threads_must_be_a_whole_number_from_one_to_the_cores(tmp_path: Path, threads: str) -> None:
    """100,000 threads ended in a traceback and a MemoryError once the system refused to start more."""
    refused = serve("--store", str(tmp_path), "--threads", threads)
    cores = len(os.sched_getaffinity(0))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert f"argument --threads: expected a whole number from 1 to {cores}" in refused.stderr
    assert not (tmp_path / "amus.sqlite3").exists()


def test_the_gate_waits_for_running_writes_and_refuses_new_ones() -> None:
    gate, finished = WriteGate(), []

    def slow_write() -> None:
        with gate.write():
            time.sleep(0.3)
            finished.append(True)

    writer = threading.Thread(target=slow_write)
    writer.start()
    time.sleep(0.05)
    assert gate.close(timeout_s=10) and finished == [True]
    with pytest.raises(ShuttingDown), gate.write():
        pass
    writer.join()


def test_the_gate_reports_a_write_still_running_after_the_timeout() -> None:
    gate, release = WriteGate(), threading.Event()

    def stuck() -> None:
        with gate.write():
            release.wait(10)

    writer = threading.Thread(target=stuck)
    writer.start()
    time.sleep(0.05)
    assert gate.close(timeout_s=0.1) is False
    release.set()
    writer.join()


def test_a_damaged_key_file_is_one_error_line(tmp_path: Path) -> None:
    (tmp_path / "keys.sqlite").write_text("junk that is not a database")
    for command in (["keys", "list", "--store", str(tmp_path)], ["keys", "create", "--store", str(tmp_path),
                                                                   "--user", "alice"]):
        done = serve(*command)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.strip() == (f"error: {tmp_path / 'keys.sqlite'}: not a key file this server can "
                                       "read (file is not a database); restore it from a copy, or move it "
                                       "aside and create the keys again")


def test_a_file_given_as_the_store_is_one_error_line_naming_it(tmp_path: Path) -> None:
    store = tmp_path / "notes.txt"
    store.write_text("not a store")
    for command in (["keys", "create", "--store", str(store), "--user", "alice"],
                    ["keys", "list", "--store", str(store)]):
        done = serve(*command)
        assert done.returncode == 2 and done.stderr.strip() == \
            f"error: {store}: not a store directory (a file is there)", done.stderr
    assert store.read_text() == "not a store"


def test_a_key_read_from_a_database_does_not_hold_the_event_loop() -> None:
    """Keys on a database server are read on a worker thread: while one read stalls (a database
    restarting), the event loop, and every other request on it, goes on."""
    import asyncio

    from retrieval.service.auth import user_of_key

    release = threading.Event()

    class StalledKeys:
        local = False

        def user(self, key: str) -> str:
            assert release.wait(10), "the loop was held while the key was read"
            return "alice"

    async def main() -> str:
        reading = asyncio.create_task(user_of_key(StalledKeys(), "k"))  # type: ignore[arg-type]
        await asyncio.sleep(0.05)  # other requests' turn: the loop is not held by the stalled read
        assert not reading.done()
        release.set()
        return await reading

    assert asyncio.run(main()) == "alice"



def test_the_servers_connections_send_at_once_without_nagle() -> None:
    """The server's accepted connections have TCP_NODELAY, which asyncio sets only on sockets
    whose protocol is named TCP: without it, every request after the first on a keep-alive
    connection waited about 40 ms for the client's delayed acknowledgement."""
    import asyncio

    from retrieval.serve import listening

    async def main() -> int:
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            connection = writer.get_extra_info("socket")
            seen.set_result(connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        with listening("127.0.0.1", 0) as listener:
            server = await asyncio.start_server(accepted, sock=listener)
            _, writer = await asyncio.open_connection(*listener.getsockname()[:2])
            nodelay = await asyncio.wait_for(seen, 10)
            writer.close()
            server.close()
            return nodelay

    assert asyncio.run(main()) != 0


def test_a_new_store_and_its_key_file_are_readable_by_their_owner_only(tmp_path: Path) -> None:
    """Every user's memories and the list of users are not left to the umask (commonly 022, which
    made them readable by every local account): a new store directory is 0700, the databases, their
    -wal and -shm files and the lock files 0600; in a directory that existed, the files too."""
    import os
    import stat

    from retrieval import Memory
    from tests.multi_route_fixtures import WordEmbedder

    previous = os.umask(0o022)
    try:
        for store, made in ((tmp_path / "new" / "store", True), (tmp_path / "existing", False)):
            if not made:
                store.mkdir(mode=0o755)
            keys = KeyStore(store)
            try:
                with Memory.open(store, embedder=WordEmbedder()) as memory:
                    memory.add([{"speaker": "A", "text": "My PIN is 4321."}], user_id="u", session_id="s")
                    keys.create("u")
                    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in store.iterdir()
                             if path.is_file()}
            finally:
                keys.close()
            assert {"amus.sqlite3", "amus.sqlite3-wal", KEYS_FILE, f"{KEYS_FILE}-wal"} <= set(modes), modes
            assert all(mode == 0o600 for mode in modes.values()), modes
            assert stat.S_IMODE(store.stat().st_mode) == (0o700 if made else 0o755)
    finally:
        os.umask(previous)


def test_a_store_directory_another_user_may_write_into_is_refused(tmp_path: Path) -> None:
    """Who may write into the directory may plant the database, its lock or a link to another file
    there, and read and rewrite what is stored: the memory and the key file refuse it, before they
    create anything in it."""
    from retrieval import Memory
    from tests.multi_route_fixtures import WordEmbedder

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    others = [(shared, "may be written by other users (mode drwxrwxrwx)")]
    if os.geteuid() == 0:  # root may give a directory away
        owned = tmp_path / "theirs"
        owned.mkdir(mode=0o755)
        os.chown(owned, 23452, 23452)
        others.append((owned, "is owned by another user (uid 23452)"))
    for directory, message in others:
        with pytest.raises(StoreUnavailable, match=re.escape(message)):
            Memory.open(directory, embedder=WordEmbedder())
        with pytest.raises(StoreError, match=re.escape(message)):
            KeyStore(directory)
        assert not list(directory.iterdir())


@pytest.mark.parametrize(("mode", "shown"), [(0o775, "drwxrwxr-x"), (0o770, "drwxrwx---"),
                                            (0o777, "drwxrwxrwx")])
def test_a_store_directory_its_group_may_write_into_is_refused_like_one_all_may(tmp_path: Path, mode: int,
                                                                                  shown: str) -> None:
    """A group-writable directory (0775, as a shared project folder often is) lets every member of
    the group plant the database, its lock or a link there, as a world-writable one lets everyone:
    both are refused, before anything is created in them; an owner-only writable one (0755) is
    kept as it is."""
    from retrieval.memory.private import private_directory

    shared, own = tmp_path / "shared", tmp_path / "own"
    shared.mkdir()
    shared.chmod(mode)
    message = f"{shared} may be written by other users (mode {shown})"
    with pytest.raises(StoreError, match=re.escape(message)):
        private_directory(shared)
    with pytest.raises(StoreError, match=re.escape(message)):
        KeyStore(shared)
    assert not list(shared.iterdir())
    own.mkdir()
    own.chmod(0o755)
    private_directory(own)
    assert own.stat().st_mode & 0o777 == 0o755


def test_revoking_a_key_again_keeps_the_first_revocation_time(tmp_path: Path, monkeypatch) -> None:
    from retrieval.service import keys as keys_module

    keys = KeyStore(tmp_path)
    alice = keys.create("alice")
    monkeypatch.setattr(keys_module, "_now", lambda: "2026-01-01T00:00:00+00:00")
    first = keys.revoke(alice)
    monkeypatch.setattr(keys_module, "_now", lambda: "2026-06-01T00:00:00+00:00")
    assert first.revoked == keys.revoke(alice).revoked == "2026-01-01T00:00:00+00:00"


def _guarded(keys: KeyStore, headers: list[str]) -> tuple[int, list[str]]:
    """The status the MCP mount's key guard answers for a request with these Authorization
    headers, and the users it let through to the app behind it."""
    import anyio

    from retrieval.service.auth import KeyGuard

    let_through, sent = [], []

    async def app(scope, receive, send):
        let_through.append(scope["state"]["user_id"])
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": "/mcp", "headers": [(b"authorization", h.encode()) for h in headers]}
    anyio.run(KeyGuard(app, keys), scope, receive, send)
    return sent[0]["status"], let_through


def test_the_mcp_key_guard_takes_one_bearer_header_and_only_that(tmp_path: Path) -> None:
    keys = KeyStore(tmp_path)
    alice, bob = keys.create("alice"), keys.create("bob")
    assert _guarded(keys, [f"Bearer {alice}"]) == (200, ["alice"])
    assert _guarded(keys, [f"Bearer {alice}", f"Bearer {bob}"]) == (400, [])  # which counts is a guess
    assert _guarded(keys, [f"Basic {alice}"]) == (401, [])  # a valid key under another scheme


def test_two_authorization_headers_are_refused_on_the_rest_routes(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from retrieval import Memory
    from retrieval.service.app import create_app
    from tests.multi_route_fixtures import WordEmbedder, WordFingerprinter

    store = tmp_path / "store"
    memory = Memory.open(store, embedder=WordEmbedder(), fingerprinter=WordFingerprinter())
    keys = KeyStore(store)
    try:
        alice, bob = keys.create("alice"), keys.create("bob")
        with TestClient(create_app(memory, keys, store)) as client:
            one = client.get("/v1/memories", headers=[("Authorization", f"Bearer {alice}")])
            assert one.status_code == 200, one.text
            two = client.get("/v1/memories", headers=[("Authorization", f"Bearer {alice}"),
                                                      ("Authorization", f"Bearer {bob}")])
            assert two.status_code == 400 and "one Authorization header" in two.text, two.text
    finally:
        keys.close()
        memory.close()


def test_a_read_only_key_store_writes_nothing_and_sees_revocations_on_read_only_media(tmp_path: Path,
                                                                                    monkeypatch) -> None:
    """A read-only server (or ``keys list``) reads the key file as it is: nothing is made or
    changed, so a store on read-only media serves. Where the file's WAL index cannot be made
    (here: such media, stood in for by the first connection's refusal), the file is read as
    immutable and opened again once it changes, so a revocation made elsewhere still counts."""
    from retrieval.service import keys as keys_module

    writer = KeyStore(tmp_path)
    alice, bob = writer.create("alice"), writer.create("bob")
    writer.rows.close()
    (tmp_path / KEYS_FILE).chmod(0o644)
    before = (tmp_path / KEYS_FILE).read_bytes()
    connected = keys_module._connected

    def on_read_only_media(uri: str):
        if "immutable=1" not in uri:
            raise sqlite3.OperationalError("unable to open database file")
        return connected(uri)

    monkeypatch.setattr(keys_module, "_connected", on_read_only_media)
    reader = KeyStore(tmp_path, create=False, read_only=True)
    assert reader.user(alice) == "alice" and reader.user(bob) == "bob"
    assert (tmp_path / KEYS_FILE).stat().st_mode & 0o777 == 0o644  # not made private: not written
    assert (tmp_path / KEYS_FILE).read_bytes() == before
    monkeypatch.setattr(keys_module, "_connected", connected)  # the writer elsewhere
    elsewhere = KeyStore(tmp_path)
    elsewhere.revoke(alice.split("_")[1])
    elsewhere.rows.close()
    monkeypatch.setattr(keys_module, "_connected", on_read_only_media)
    assert reader.user(alice) is None and reader.user(bob) == "bob"
    listed = serve("keys", "list", "--store", str(tmp_path))
    assert listed.returncode == 0 and "user=alice" in listed.stdout and "revoked" in listed.stdout
    assert (tmp_path / KEYS_FILE).stat().st_mode & 0o777 == 0o644
