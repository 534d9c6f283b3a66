"""The memory API end to end with its store in PostgreSQL (``Memory.open(URL)``): add, flush,
search, list, delete, forget, and a reopened memory finding what was committed."""

from __future__ import annotations

import pytest

from retrieval import Memory
from retrieval.api.errors import NotFound
from tests.multi_route_fixtures import WordEmbedder, WordFingerprinter

SECRET = "Quenfrithal"


def open_memory(url: str) -> Memory:
    return Memory.open(url, embedder=WordEmbedder(), fingerprinter=WordFingerprinter())


def chat(prefix: str, n: int) -> list[dict]:
    return [{"speaker": ("Ann", "Bob")[i % 2],
             "text": f"{prefix} story number {i} about gardens and tomatoes.",
             "time": "2023-05-08T10:00:00", "turn_id": f"{prefix}-{i}"} for i in range(n)]


def test_the_memory_api_on_postgresql(postgres_url):
    secret = {"speaker": "Ann", "text": f"My neighbour {SECRET} repairs old violins in Lisbon.",
              "time": "2023-05-08T10:00:00", "turn_id": "secret"}
    with open_memory(postgres_url) as mem:
        mem.add(chat("u", 6) + [secret] + chat("v", 6), user_id="alice", session_id="s")
        mem.add(chat("b", 8), user_id="bob", session_id="s")
        mem.flush(user_id="alice", session_id="s")
        mem.flush(user_id="bob", session_id="s")
        hits = mem.search(f"{SECRET} violins Lisbon", user_id="alice", k=5).hits
        assert any(SECRET in hit.text for hit in hits)
        found = mem.search(f"{SECRET} violins", user_id="bob", k=20).hits
        assert not any(SECRET in hit.text for hit in found)
        [record] = [item for item in mem.list(user_id="alice", limit=100).items if SECRET in item.text]
        mem.delete(record.id, user_id="alice")
        with pytest.raises(NotFound):
            mem.get(record.id, user_id="alice")
        found = mem.search(f"{SECRET} violins", user_id="alice", k=20).hits
        assert not any(SECRET in hit.text for hit in found)
        assert mem.search("story number 3 gardens", user_id="alice", k=3).hits
        kept = [item.id for item in mem.list(user_id="bob", limit=100).items]
        assert kept
    with open_memory(postgres_url) as mem:  # reopened: what was committed is there
        assert [item.id for item in mem.list(user_id="bob", limit=100).items] == kept
        mem.forget(user_id="alice")
        assert not mem.list(user_id="alice").items and not mem.search("gardens", user_id="alice", k=5).hits
        assert [item.id for item in mem.list(user_id="bob", limit=100).items] == kept
        assert mem.store.users() == ["bob"]


def test_consolidation_and_deleting_one_turn_of_a_merged_record_on_postgresql(postgres_url):
    hike = "I love hiking in the Alps every summer."
    hikes = [{"speaker": "Ann", "text": hike, "time": "2023-05-08T10:00:00", "turn_id": f"c{n}"}
             for n in range(1, 4)]
    turns = chat("u", 4) + hikes + chat("w", 4)
    with open_memory(postgres_url) as mem:
        mem.add(turns, user_id="u", session_id="s")
        mem.flush(user_id="u", session_id="s")
        assert mem.consolidate(user_id="u", wait=True, timeout_s=120).state == "done"
        items = mem.list(user_id="u", limit=100).items
        [merged] = [item for item in items if mem.history(item.id, user_id="u")]
        assert merged.turns == ("c1", "c2", "c3")
        mem.delete("u:turn:c1", user_id="u")
        restored = [item.turns for item in mem.list(user_id="u", limit=100).items if "hiking" in item.text]
        assert restored == [("c2",), ("c3",)]


def test_a_record_naming_something_very_long_is_stored_alike_on_both_backends(backend):
    """An unbroken run of a script without spaces, a pasted token or a ligature that NFKC spells out
    long is no entity, tag or evidence key (:data:`MAX_NAME_CHARS`): the records are stored and
    found on either backend, where PostgreSQL's index refused such a key on every retry before."""
    from retrieval.memory.records import MAX_NAME_CHARS

    run = "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(1000))
    turns = [{"speaker": "Ann", "text": run, "time": "2023-05-08T10:00:00", "turn_id": "t1"},
             {"speaker": "Bob", "text": f"I love {'x' * 3500} and Paris", "time": "2023-05-08T10:01:00",
              "turn_id": "t2"},
             {"speaker": "Ann", "text": f"We met {chr(0xFDFA) * 150} in Rome", "time": "2023-05-08T10:02:00",
              "turn_id": "t3"}]
    with open_memory(backend.target) as mem:
        mem.add(turns, user_id="u", session_id="s")
        mem.flush(user_id="u", session_id="s")
        records = list(mem.store.amus("u"))
        nodes = mem.store.evidence_nodes("u")
        found = mem.search("Rome", user_id="u", k=3).hits
    assert len(records) == 3 and {len(record.text) for record in records} == {1005, 3520, 170}
    assert max(len(name) for record in records for name in record.entities + record.tags) <= MAX_NAME_CHARS
    assert max(len(node.key) for node in nodes) <= 2 * MAX_NAME_CHARS + 1  # an entity|topic pair at most
    assert {"entity:bob", "entity:paris", "entity:rome"} <= {f"{node.node_type}:{node.key}" for node in nodes}
    assert found and "Rome" in found[0].text


def test_only_a_failed_server_or_connection_is_an_outage():
    """A statement over a program limit fails the same on every retry: it is not reported as the
    store's outage (which the ingestion worker waits out and retries for ever)."""
    import psycopg

    from retrieval.memory.postgres.database import outage

    assert not outage(psycopg.errors.ProgramLimitExceeded("index row size 3024 exceeds maximum 2704"))
    assert outage(psycopg.errors.AdminShutdown("terminating connection"))
    assert outage(psycopg.errors.SerializationFailure("could not serialize"))
    assert outage(psycopg.OperationalError("connection lost"))  # no SQLSTATE: the client's side


def test_a_write_waits_a_bounded_time_for_a_stuck_transaction_and_a_flush_waits_for_a_busy_node(
        postgres_url, monkeypatch):
    """Another connection sits in a write transaction of the user (a node stopped inside one): an
    add waits a bounded time, then fails as the store's fault (503 over HTTP), and goes through
    once the lock is let go. Another connection holds the user's ingestion lock (a node processing
    a long backlog): a flush waits for it as long as it is held, whatever lock timeout the database
    sets by default, then goes through; meanwhile this node's worker goes on with other users."""
    import threading

    import psycopg

    from retrieval.api.errors import StoreUnavailable
    from retrieval.memory.errors import StoreError
    from retrieval.memory.postgres import database

    monkeypatch.setattr(database, "LOCK_WAIT_S", 1.0)
    monkeypatch.setitem(database.KEEPALIVE, "tcp_no_such_setting", "1")  # an older server's missing one
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {postgres_url.rsplit('/', 1)[1]} SET lock_timeout = '200ms'")
    with open_memory(postgres_url) as mem, psycopg.connect(postgres_url, autocommit=True) as other:
        pooled = mem.store.db.row("SELECT current_setting('tcp_keepalives_idle') AS idle, "
                                  "current_setting('tcp_user_timeout') AS timeout")
        assert pooled == {"idle": database.KEEPALIVE["tcp_keepalives_idle"],
                          "timeout": database.KEEPALIVE["tcp_user_timeout"]}
        mem.add(chat("u", 4), user_id="u", session_id="s")
        with other.transaction():
            other.execute("SELECT pg_advisory_xact_lock(hashtextextended('u', 0))")
            with pytest.raises(StoreUnavailable, match="waited longer than its lock timeout") as refused:
                mem.add(chat("v", 1), user_id="u", session_id="s")
            assert isinstance(refused.value.__cause__, StoreError)  # 503 over HTTP
        assert mem.add(chat("v", 1), user_id="u", session_id="s").turn_ids == ("v-0",)
        other.execute("SELECT pg_advisory_lock(hashtextextended('u', %s))", (database.INGESTION_LOCKS,))
        flushed: list[object] = []
        flush = threading.Thread(target=lambda: flushed.append(mem.flush(user_id="u", session_id="s")))
        flush.start()
        flush.join(3 * database.LOCK_WAIT_S)
        assert flush.is_alive() and not flushed  # still waiting for the busy node, not refused
        mem.add(chat("w", 3), user_id="w", session_id="s")
        mem.drain(user_id="w", timeout_s=60)  # the worker does not wait behind u's flush
        assert mem.pending(user_id="w") == 0 and flush.is_alive()
        other.execute("SELECT pg_advisory_unlock_all()")
        flush.join(60)
        assert not flush.is_alive() and flushed[0].amu_ids  # type: ignore[attr-defined]


def test_a_read_waits_a_bounded_time_for_a_table_locked_whole(postgres_url, monkeypatch):
    """``VACUUM FULL`` (``retrieval.store compact``) or a migration locks a table whole: a search
    and an add, whose reads run outside any transaction, wait for it a bounded time, then fail as
    the store's fault (503 over HTTP), and go through once it is let go."""
    import psycopg

    from retrieval.api.errors import StoreUnavailable
    from retrieval.memory.postgres import database

    monkeypatch.setattr(database, "LOCK_WAIT_S", 1.0)
    with open_memory(postgres_url) as mem, psycopg.connect(postgres_url, autocommit=True) as other:
        mem.add(chat("u", 4), user_id="u", session_id="s")
        for table in ("commits", "turns"):
            with other.transaction():
                other.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
                with pytest.raises(StoreUnavailable, match="waited longer than its lock timeout"):
                    mem.search("gardens", user_id="u", k=3)
                with pytest.raises(StoreUnavailable, match="waited longer than its lock timeout"):
                    mem.add(chat("v", 1), user_id="u", session_id="s")
        assert mem.search("story number 3 gardens", user_id="u", k=3).hits
        assert mem.add(chat("v", 1), user_id="u", session_id="s").turn_ids == ("v-0",)


def test_flushes_held_in_extraction_leave_the_pool_and_the_other_users_alone(postgres_url, monkeypatch):
    """Five users' flushes whose extraction waits (an LLM taking its time) on a pool of six: each
    lock holder reads and commits on its lock's connection, and two flushes hold locks at a time
    (the others wait for a turn, holding no connection), so meanwhile another user searches, adds,
    is ingested by the worker and is forgotten, and every flush ends. Holding two connections each,
    the flushes took the whole pool and waited for each other until the pool's timeout; with every
    lock holder taking a turn, the forget and the worker waited for the others' extractions."""
    import threading

    from retrieval.extract.rules import RuleExtractor
    from retrieval.memory.postgres import database

    monkeypatch.setattr(database, "POOL_SIZE", 6)
    monkeypatch.setattr(database, "LOCK_HOLDERS", 2)
    monkeypatch.setattr(database, "POOL_WAIT_S", 3.0)
    release, entered = threading.Event(), threading.Semaphore(0)

    class HeldExtractor(RuleExtractor):
        def extract(self, segment, context):
            if segment.user_id.startswith("p"):
                entered.release()
                assert release.wait(60)
            return super().extract(segment, context)

    users = [f"p{n}" for n in range(5)]
    with Memory.open(postgres_url, embedder=WordEmbedder(), fingerprinter=WordFingerprinter(),
                     extractor=HeldExtractor()) as mem:
        for user in [*users, "other"]:
            mem.add(chat(user, 2), user_id=user, session_id="s")
        mem.drain(timeout_s=60)
        outcomes: dict[str, object] = {}

        def flush(user: str) -> None:
            try:
                outcomes[user] = mem.flush(user_id=user, session_id="s").amu_ids
            except Exception as err:  # noqa: BLE001 - the outcome is what the test reads
                outcomes[user] = err

        threads = [threading.Thread(target=flush, args=(user,)) for user in users]
        for thread in threads:
            thread.start()
        try:
            for _ in range(2):
                assert entered.acquire(timeout=30)  # two flushes inside their extraction
            assert mem.search("tomatoes", user_id="other", k=3).hits
            assert mem.add(chat("more", 12), user_id="other", session_id="s").turn_ids[0] == "more-0"
            mem.drain(user_id="other", timeout_s=30)  # the worker takes the lock without a turn
            assert mem.pending(user_id="other") == 0
            forget = threading.Thread(target=mem.forget, kwargs={"user_id": "other"})
            forget.start()
            forget.join(30)
            assert not forget.is_alive() and not mem.search("tomatoes", user_id="other", k=3).hits
            assert not entered.acquire(timeout=0.2)  # still two at a time
        finally:
            release.set()
            for thread in threads:
                thread.join(120)
    assert sorted(outcomes) == users
    assert all(isinstance(amus, tuple) and amus for amus in outcomes.values()), outcomes


def test_a_failed_user_whose_lock_another_node_holds_at_its_retry_is_tried_again(postgres_url, monkeypatch):
    """The extractor fails once; when the worker's retry comes, another node holds the user's
    ingestion lock: the worker looks again later, and the turns are processed once it is free
    (no drain or flush asks for them)."""
    import time

    import psycopg

    from retrieval.api import retries
    from retrieval.memory.postgres import database
    from tests.test_write_behind import FailingOnce

    monkeypatch.setattr(retries, "RETRY_S", 0.2)
    extractor = FailingOnce()
    failures = extractor.failures
    with Memory.open(postgres_url, embedder=WordEmbedder(), fingerprinter=WordFingerprinter(),
                     extractor=extractor) as mem, psycopg.connect(postgres_url, autocommit=True) as other:
        mem.add(chat("u", 30), user_id="u", session_id="s")
        deadline = time.monotonic() + 60
        while not failures and time.monotonic() < deadline:
            time.sleep(0.01)
        other.execute("SELECT pg_advisory_lock(hashtextextended('u', %s))", (database.INGESTION_LOCKS,))
        time.sleep(1.5)  # the retry (after 0.2 s) finds the lock taken, and so may the next look
        assert mem.pending(user_id="u") == 30
        other.execute("SELECT pg_advisory_unlock_all()")
        deadline = time.monotonic() + 60
        while mem.pending(user_id="u") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert failures == ["u"] and mem.pending(user_id="u") == 0
