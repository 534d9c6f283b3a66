"""Deletion that is honest: deleting a record removes its words from every read and from the store's
files; deleting one turn of a merged record keeps what the other turns stated; every path to
"nothing of this user" (turn by turn, session by session) leaves the same nothing as ``forget``."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import uvicorn

from benchmarks.service_process import bearer, free_port
from retrieval import Memory
from retrieval.api.errors import NotFound
from retrieval.memory.cache import text_key
from retrieval.memory.meta_keys import COMPACTION_OWED
from retrieval.memory.purge_selection import Stored, select
from retrieval.memory.records import SegmentRecord
from retrieval.memory.store import AMUStore
from retrieval.service.app import create_app
from retrieval.service.keys import KeyStore
from tests.multi_route_fixtures import WordEmbedder, WordFingerprinter

SECRET = "Quenfrithal"
HIKE = "I love hiking in the Alps every summer."
USER_TABLES = ("turns", "segments", "amus", "evidence_nodes", "idempotency", "jobs")


def open_memory(path: Path) -> Memory:
    return Memory.open(path, embedder=WordEmbedder(), fingerprinter=WordFingerprinter())


def chat(prefix: str, n: int, session: str = "s") -> list[dict]:
    speakers = ("Ann", "Bob")
    return [{"speaker": speakers[i % 2], "text": f"{prefix} story number {i} about gardens and tomatoes.",
             "time": "2023-05-08T10:00:00", "turn_id": f"{session}-{prefix}-{i}"} for i in range(n)]


def store_files(path: Path) -> bytes:
    """The store's database and write-ahead log, lower-cased."""
    return b"".join(p.read_bytes() for p in sorted(path.glob("amus.sqlite3*"))).lower()


def listed(mem: Memory, user: str) -> list:
    """Every active record of the user, page after page."""
    page = mem.list(user_id=user)
    items = list(page.items)
    while page.next_cursor is not None:
        page = mem.list(user_id=user, cursor=page.next_cursor)
        items += page.items
    return items


def every_text(mem: Memory, user: str, query: str) -> str:
    """All a user can read back: search hits, the list, each listed record and its history."""
    items = listed(mem, user)
    texts = [hit.text for hit in mem.search(query, user_id=user, k=50).hits]
    texts += [item.text for item in items] + [mem.get(item.id, user_id=user).text for item in items]
    texts += [old.text for item in items for old in mem.history(item.id, user_id=user)]
    return "\n".join(texts)


def covered(mem: Memory, user: str) -> set[str]:
    """The turn ids the user's active records name."""
    return {turn for item in listed(mem, user) for turn in item.turns}


def test_deleting_a_record_removes_its_words_from_every_read_and_the_files(tmp_path):
    secret = {"speaker": "Ann", "text": f"My neighbour {SECRET} repairs old violins in Lisbon.",
              "time": "2023-05-08T10:00:00", "turn_id": "secret"}
    with open_memory(tmp_path) as mem:
        mem.add(chat("u", 6) + [secret] + chat("v", 6), user_id="u", session_id="s")
        mem.flush(user_id="u", session_id="s")
        query = f"{SECRET} violins Lisbon neighbour"
        assert SECRET in every_text(mem, "u", query) and SECRET.lower().encode() in store_files(tmp_path)
        [record] = [item for item in mem.list(user_id="u", limit=100).items if SECRET in item.text]
        assert record.turns == ("secret",)
        kept = covered(mem, "u") - {"secret"}
        mem.delete(record.id, user_id="u")
        for gone in (record.id, "u:turn:secret"):
            with pytest.raises(NotFound):
                mem.get(gone, user_id="u")
        assert SECRET not in every_text(mem, "u", query)
        assert covered(mem, "u") == kept  # the other turns' records stay
        assert mem.search("story number 3 gardens", user_id="u", k=3).hits
    assert SECRET.lower().encode() not in store_files(tmp_path)


def test_http_delete_of_a_record_removes_its_words_from_search_and_the_files(tmp_path):
    store = tmp_path / "store"
    mem, keys = open_memory(store), KeyStore(store)
    server = uvicorn.Server(uvicorn.Config(create_app(mem, keys, store), host="127.0.0.1", port=free_port(),
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(600):  # at most 60 s
            if server.started:
                break
            time.sleep(0.1)
        client = httpx.Client(base_url=f"http://127.0.0.1:{server.config.port}",
                              headers=bearer(keys.create("alice")), timeout=120)
        turns = [{"speaker": "Bob", "text": f"My neighbour {SECRET} repairs old violins."}] + chat("u", 30)
        added = client.post("/v1/sessions/s/turns", json={"turns": turns})
        assert added.status_code == 200, added.text
        mem.drain(timeout_s=120)  # the segments the add closed are processed behind it
        [record] = [item for item in client.get("/v1/memories").json()["items"] if SECRET in item["text"]]
        assert client.delete(f"/v1/memories/{record['id']}").status_code == 200
        found = client.post("/v1/search", json={"query": f"{SECRET} violins", "k": 20})
        assert found.status_code == 200 and found.json()["hits"] and SECRET not in found.text
        assert client.get(f"/v1/memories/alice:turn:{record['turns'][0]}").status_code == 404
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        keys.close()
        mem.close()
    assert SECRET.lower().encode() not in store_files(store)


def hikes(user_session: str, numbers: range) -> list[dict]:
    return [{"speaker": "Ann", "text": HIKE, "time": "2023-05-08T10:00:00", "turn_id": f"{user_session}{n}"}
            for n in numbers]


def consolidated(mem: Memory, user: str) -> dict:
    """Consolidate; returns the merged record of the hiking turns."""
    assert mem.consolidate(user_id=user, wait=True, timeout_s=120).state == "done"
    items = listed(mem, user)
    [merged] = [item for item in items if mem.history(item.id, user_id=user)]
    return {"id": merged.id, "turns": merged.turns,
            "history": [old.id for old in mem.history(merged.id, user_id=user)]}


def test_deleting_one_turn_of_a_merged_record_keeps_what_the_others_stated(tmp_path):
    with open_memory(tmp_path) as mem:
        mem.add(chat("u", 4) + hikes("c", range(1, 4)) + chat("w", 4), user_id="u", session_id="s")
        mem.flush(user_id="u", session_id="s")
        merged = consolidated(mem, "u")
        assert merged["turns"] == ("c1", "c2", "c3") and len(merged["history"]) == 3
        before = covered(mem, "u")
        mem.delete("u:turn:c1", user_id="u")
        with pytest.raises(NotFound):
            mem.get(merged["id"], user_id="u")
        assert covered(mem, "u") == before - {"c1"}
        items = listed(mem, "u")
        restored = [item for item in items if item.turns in (("c2",), ("c3",))]
        assert [item.id for item in restored] == merged["history"][1:]
        assert all(not item.archived and item.successor is None and "hiking in the Alps" in item.text
                   for item in restored)
        assert any(hit.kind == "record" and hit.turns in (("c2",), ("c3",))
                   for hit in mem.search("hiking Alps summer", user_id="u", k=5).hits)
        again = consolidated(mem, "u")  # the restored records merge again, as any others would
        assert again["turns"] == ("c2", "c3") and again["history"] == merged["history"][1:]
        mem.delete(again["id"], user_id="u")  # a merged record's words are all its turns'
        assert covered(mem, "u") == before - {"c1", "c2", "c3"}
        assert "hiking" not in every_text(mem, "u", "hiking Alps summer")


def build(path: Path) -> None:
    """Bob's memory beside alice's: two sessions, a merged record, an open segment, searches."""
    with open_memory(path) as mem:
        mem.add(chat("bob", 8), user_id="bob", session_id="b1")
        mem.flush(user_id="bob", session_id="b1")
        mem.search("gardens tomatoes", user_id="bob", k=5)
        mem.add(chat("alice", 6, "s1") + hikes("s1-h", range(3)), user_id="alice", session_id="s1",
                idempotency_key="first")
        mem.flush(user_id="alice", session_id="s1")
        mem.add(chat("more", 5, "s2") + hikes("s2-h", range(1)), user_id="alice", session_id="s2")
        mem.search("hiking", user_id="alice", k=5)
        consolidated(mem, "alice")
        mem.search(f"hiking {SECRET}", user_id="alice", k=5)


def residue(path: Path) -> dict:
    """Alice's rows in every table that names a user, the meta keys naming her, and the store-wide
    index and cache rows (links, FTS5 rows, cached vectors and codes)."""
    db = sqlite3.connect(path / "amus.sqlite3")
    try:
        found = {table: sorted(map(tuple, db.execute(f"SELECT * FROM {table} WHERE conversation_id = ?",
                                                     ("alice",))))
                 for table in USER_TABLES}
        found["meta"] = sorted(map(tuple, db.execute("SELECT * FROM meta WHERE key LIKE '%alice%'")))
        found["links"] = db.execute("SELECT COUNT(*) FROM evidence_links").fetchone()[0]
        found["fts"] = db.execute("SELECT COUNT(*) FROM amu_fts").fetchone()[0]
        for table in ("vectors", "codes"):
            found[table] = sorted(map(tuple, db.execute(f"SELECT model, item FROM {table}")))
        return found
    finally:
        db.close()


def test_every_path_to_nothing_leaves_the_same_nothing_as_forget(tmp_path):
    build(tmp_path / "built")
    with open_memory(tmp_path / "bob-only") as mem:  # the same store had alice never written
        mem.add(chat("bob", 8), user_id="bob", session_id="b1")
        mem.flush(user_id="bob", session_id="b1")
        mem.search("gardens tomatoes", user_id="bob", k=5)
    paths = {name: shutil.copytree(tmp_path / "built", tmp_path / name)
             for name in ("forget", "turns", "sessions")}
    with open_memory(paths["forget"]) as mem:
        assert residue(paths["forget"])["jobs"] and residue(paths["forget"])["meta"]
        mem.forget(user_id="alice")
    with open_memory(paths["turns"]) as mem:
        turns = [f"alice:turn:{turn.turn_id}" for turn in mem.store.turns("alice")]
        for number, item in enumerate(turns[1::2] + turns[::2]):  # partial segments on the way
            mem.delete(item, user_id="alice")
            if number % 3 == 0 and number < len(turns) - 1:  # searches cache new snapshot texts
                mem.search("hiking gardens story", user_id="alice", k=5)
    with open_memory(paths["sessions"]) as mem:
        mem.forget(user_id="alice", session_id="s2")
        mem.search("hiking gardens story", user_id="alice", k=5)
        mem.forget(user_id="alice", session_id="s1")
    after_forget = residue(paths["forget"])
    assert all(not after_forget[table] for table in (*USER_TABLES, "meta"))
    assert residue(paths["turns"]) == after_forget
    assert residue(paths["sessions"]) == after_forget
    bob_only = residue(tmp_path / "bob-only")
    assert (after_forget["links"], after_forget["fts"]) == (bob_only["links"], bob_only["fts"])
    for table in ("vectors", "codes"):  # what is cached is what a store without alice caches
        assert set(after_forget[table]) <= set(bob_only[table]), table


def test_a_stale_delete_of_a_purged_id_finds_nothing_new(tmp_path):
    """Ids are never given again: the client that retries a delete (or reads an id it kept) after
    the user was forgotten, or after a turn went, reaches nothing the user said since."""
    with open_memory(tmp_path / "store") as mem:
        mem.add(chat("old", 4), user_id="alice", session_id="s")
        old_records = list(mem.flush(user_id="alice", session_id="s").amu_ids)
        last = mem.add([{"speaker": "Ann", "text": "My old locker code is 1234."}],
                       user_id="alice", session_id="t")
        mem.delete(f"alice:turn:{last.turn_ids[0]}", user_id="alice")
        again = mem.add([{"speaker": "Ann", "text": "My new locker code is 9876."}],
                        user_id="alice", session_id="t")
        assert again.turn_ids != last.turn_ids
        mem.forget(user_id="alice")
        mem.add(chat("new", 4), user_id="alice", session_id="s")
        new_records = list(mem.flush(user_id="alice", session_id="s").amu_ids)
        assert old_records and new_records and not set(old_records) & set(new_records)
        for stale in old_records:
            with pytest.raises(NotFound):
                mem.delete(stale, user_id="alice")
        assert [record.id for record in listed(mem, "alice")] == new_records


KILLED_AFTER_THE_PURGE = """
import os, signal, sys
from retrieval import Memory
from retrieval.memory.store import AMUStore
from tests.multi_route_fixtures import WordEmbedder, WordFingerprinter
def killed_when_owed(store):  # dies after the purge commits, before the files are compacted
    if store._db.execute("SELECT 1 FROM meta WHERE key = 'compaction_owed'").fetchone():
        os.kill(os.getpid(), signal.SIGKILL)
AMUStore.compact_owed = killed_when_owed
with Memory.open(sys.argv[1], embedder=WordEmbedder(), fingerprinter=WordFingerprinter()) as mem:
    mem.delete(sys.argv[2], user_id="alice")
"""


def test_a_delete_killed_after_its_purge_commits_leaves_nothing_once_the_store_reopens(tmp_path):
    secret = {"speaker": "Ann", "text": f"My secret word is {SECRET}.", "turn_id": "secret"}
    with open_memory(tmp_path) as mem:
        mem.add(chat("alice", 6) + [secret], user_id="alice", session_id="s1")
        mem.flush(user_id="alice", session_id="s1")
        text = mem.store.turn("alice", "secret").render()
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", KILLED_AFTER_THE_PURGE, str(tmp_path), "alice:turn:secret"],
                          cwd=root, timeout=300, env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == -signal.SIGKILL
    with sqlite3.connect(tmp_path / "amus.sqlite3") as db:  # the purge committed its cached arrays' removal
        assert db.execute("SELECT count(*) FROM vectors WHERE item = ?", (text_key(text),)).fetchone() == (0,)
    with open_memory(tmp_path) as mem:  # a writer opening the store compacts it as the killed one owed
        assert SECRET not in every_text(mem, "alice", "secret word")
    assert SECRET.lower().encode() not in store_files(tmp_path)


def test_a_reader_holding_an_old_snapshot_leaves_the_compaction_owed_until_it_can_run(tmp_path):
    """Another process's long read keeps the write-ahead log's frames: the forget's compaction
    waits a second at most, stays owed, and runs when the memory closes after the read ends (the
    reader still connected, so SQLite's own checkpoint at close would leave the log)."""
    secret = {"speaker": "Ann", "text": f"My secret word is {SECRET}.", "turn_id": "secret"}
    mem = open_memory(tmp_path)
    mem.add(chat("alice", 6) + [secret], user_id="alice", session_id="s1")
    mem.flush(user_id="alice", session_id="s1")
    reader = sqlite3.connect(f"file:{tmp_path / 'amus.sqlite3'}?mode=ro", uri=True, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM turns").fetchone()  # a snapshot held open
    try:
        mem.forget(user_id="alice")
        owed = mem.store.meta(COMPACTION_OWED)
        assert owed is True and SECRET.lower().encode() in store_files(tmp_path)
    finally:
        reader.execute("COMMIT")
        mem.close()
    assert SECRET.lower().encode() not in store_files(tmp_path)
    reader.close()
    with open_memory(tmp_path) as mem:
        assert mem.store.meta(COMPACTION_OWED) is None


def test_the_exchanges_a_purged_turn_was_part_of_are_among_the_texts_forgotten() -> None:
    """The segmenter embedded each turn paired with its neighbours: those pairs' cached vectors
    hold the turn's words too, on both sides of it."""
    from retrieval.api.purge import derived_texts
    from retrieval.memory.purge import Purged
    from retrieval.memory.records import Exchange, Turn
    from tests.test_amu_store import WHEN

    turns = [Turn("u", "s", f"t{n}", ("Ann", "Bob")[n % 2], f"words {n}", WHEN) for n in range(3)]
    texts = derived_texts(Purged(turns=[turns[1]]), turns)
    assert Exchange((turns[0], turns[1])).text in texts and Exchange((turns[1], turns[2])).text in texts



def test_a_purge_decodes_only_the_records_it_touches(tmp_path, monkeypatch):
    """A purge reads every record row of the user to decide what goes, but decodes whole only
    those it deletes, restores, re-texts or whose segment it touches: decoding a user's every
    record held every writer of the store for seconds at 100,000 records."""
    import retrieval.memory.reads as reads

    decoded, real = [], reads.stored_amu
    monkeypatch.setattr(reads, "stored_amu", lambda **fields: decoded.append(fields["id"]) or real(**fields))
    with open_memory(tmp_path) as mem:
        for session in ("s1", "s2", "s3", "s4"):
            mem.add(chat("u", 12, session), user_id="u", session_id=session)
            mem.flush(user_id="u", session_id=session)
        records = len(listed(mem, "u"))
        decoded.clear()
        mem.delete("u:turn:s3-u-5", user_id="u")
        during = set(decoded)
        assert "s3-u-5" not in covered(mem, "u")
    assert records >= 40 and during and len(during) <= records // 3  # one of four sessions, and a few


def test_a_job_whose_user_is_forgotten_stops_and_never_consolidates_what_comes_after(tmp_path):
    """The forget deletes the running job with the user's data; the job, held in its first pass
    meanwhile, must not go on to merge the two equal turns the user adds after the forget."""
    from tests.test_write_behind import WAIT_S, HeldOperator

    operator = HeldOperator()
    alps = "I love hiking in the Alps."
    models = {"embedder": WordEmbedder(), "fingerprinter": WordFingerprinter()}
    memory = Memory.open(tmp_path, operator=operator, **models)
    try:
        memory.add([{"speaker": "Ann", "text": alps} for _ in range(6)], user_id="u", session_id="s")
        memory.flush(user_id="u", session_id="s")
        job = memory.consolidate(user_id="u")
        assert operator.hold.entered.wait(WAIT_S)
        memory.forget(user_id="u")
        memory.add([{"speaker": "Ann", "text": alps, "turn_id": f"again-{i}"} for i in range(2)], user_id="u",
                   session_id="s")
        memory.flush(user_id="u", session_id="s")
        operator.hold.released.set()
    finally:
        memory.close()  # the running job finishes first
    with Memory.open(tmp_path, read_only=True, **models) as reader:
        records = list(reader.store.amus("u", include_archived=True))
        assert sorted(a.source.turn_ids for a in records) == [("again-0",), ("again-1",)]
        assert not any(a.archived for a in records)
        with pytest.raises(NotFound):
            reader.job(job.id, user_id="u")


def test_a_forget_landing_as_a_job_starts_leaves_what_comes_after_unconsolidated(tmp_path, monkeypatch):
    """The runner found the job's row, then the forget, an add of two equal turns and a flush land
    before the job's first pass: that pass must not merge them."""
    import threading

    import retrieval.api.jobs as jobs

    alps = "I love hiking in the Alps."
    models = {"embedder": WordEmbedder(), "fingerprinter": WordFingerprinter()}
    memory = Memory.open(tmp_path, **models)
    consolidate_user, started = jobs.consolidate_user, threading.Event()

    def forget_first(store, user, *args, **options):
        def forget_and_add():
            memory.forget(user_id="u")
            memory.add([{"speaker": "Ann", "text": alps, "turn_id": f"again-{i}"} for i in range(2)],
                       user_id="u", session_id="s")
            memory.flush(user_id="u", session_id="s")

        racing = threading.Thread(target=forget_and_add)
        racing.start()
        racing.join()
        started.set()
        return consolidate_user(store, user, *args, **options)

    monkeypatch.setattr(jobs, "consolidate_user", forget_first)
    try:
        memory.add([{"speaker": "Ann", "text": alps} for _ in range(6)], user_id="u", session_id="s")
        memory.flush(user_id="u", session_id="s")
        memory.consolidate(user_id="u")
        assert started.wait(60)
    finally:
        memory.close()  # the running job finishes first
    with Memory.open(tmp_path, read_only=True, **models) as reader:
        records = list(reader.store.amus("u", include_archived=True))
        assert sorted(a.source.turn_ids for a in records) == [("again-0",), ("again-1",)]


def test_a_delete_drops_the_users_finished_jobs_and_a_job_it_overlaps_keeps_no_counts(tmp_path, monkeypatch):
    """A consolidation job covers the user's whole memory whatever session names it, so its
    progress counts every session's records: once some go, the finished jobs go too, and a job
    running meanwhile finishes without its counts, never showing them even in passing."""
    from tests.test_write_behind import WAIT_S, HeldOperator, finished

    written: list[tuple[str, dict | None]] = []
    update_job = AMUStore.update_job

    def recording(self, job_id, state, progress=None, **options):
        written.append((state, progress))
        return update_job(self, job_id, state, progress, **options)

    monkeypatch.setattr(AMUStore, "update_job", recording)
    operator = HeldOperator()
    operator.hold.released.set()  # held only once cleared
    statements = ["I love hiking in the Alps.", "My sister bakes bread on Sundays."]
    with Memory.open(tmp_path, embedder=WordEmbedder(), fingerprinter=WordFingerprinter(),
                     operator=operator) as memory:
        for session in ("s1", "s2", "s3"):
            memory.add([{"speaker": "Ann", "text": statements[i % 2]} for i in range(8)], user_id="u",
                       session_id=session)
            memory.flush(user_id="u", session_id=session)
        named = memory.consolidate(user_id="u", session_id="s2", wait=True, timeout_s=WAIT_S)
        assert named.state == "done" and named.progress["amus_before"] == 24
        memory.forget(user_id="u", session_id="s1")
        with pytest.raises(NotFound):
            memory.job(named.id, user_id="u")
        operator.hold.entered.clear()  # set by the first job
        operator.hold.released.clear()
        running = memory.consolidate(user_id="u")
        assert operator.hold.entered.wait(WAIT_S)
        memory.forget(user_id="u", session_id="s3")
        operator.hold.released.set()
        ended = finished(memory, running.id, "u")
        assert (ended.state, ended.progress) == ("done", {"resumed": False, "purged_meanwhile": True})
        assert written[-1] == ("done", {"resumed": False, "purged_meanwhile": True})
        assert written[-2][0] == "running"  # its counts were never written


class _CountedRows(list):
    """A user's stored rows that count how often they are walked whole."""

    walks = 0

    def __iter__(self):
        type(self).walks += 1
        return super().__iter__()


def _walks_of_a_purge_of_everything(segments: int) -> int:
    """How often selecting a purge of everything walks the user's rows, ``segments`` segments of
    two records each (the second archived into the first's place by a retried extraction)."""
    rows = _CountedRows()
    for seq in range(segments):
        for n in range(2):
            row = Stored(2 * seq + n, f"u:{seq}:{n}", seq, (f"s:{seq}",), n == 0, None, row=None)
            row.__dict__["amu"] = SimpleNamespace(text=f"record {n} of segment {seq}")  # no row to decode
            rows.append(row)
    stored = [SegmentRecord("u", seq, "s", (f"s:{seq}",), "boundary") for seq in range(segments)]
    _CountedRows.walks = 0
    picked = select(rows, stored, {f"s:{seq}" for seq in range(segments)}, set(), True)
    assert picked.frames[:2] == [["record 0 of segment 0"], ["record 1 of segment 0"]], picked.frames
    assert len(picked.chosen) == 2 * segments
    return _CountedRows.walks


def test_a_purge_of_everything_walks_the_users_records_a_fixed_number_of_times():
    """Forgetting a user touches every segment: the event frames' past states were found by walking
    all the user's records once per segment, inside the purge's write transaction (49,000 records:
    six minutes, every other user's add waiting)."""
    assert _walks_of_a_purge_of_everything(40) == _walks_of_a_purge_of_everything(4)


def test_a_purge_collects_the_event_frames_of_every_segment_it_touches():
    """The frames' past member texts are what a forget looks for in the shared LLM cache, to drop
    the answers that quote them: those of every touched segment are collected (here the first and
    the last of three, each a record archived by a retried extraction and its successor), in
    segment order, and none of the untouched segment between them."""
    rows = []
    for seq in range(3):
        for n in range(2):
            row = Stored(2 * seq + n, f"u:{seq}:{n}", seq, (f"s:{seq}",), n == 0, None, row=None)
            row.__dict__["amu"] = SimpleNamespace(text=f"record {n} of segment {seq}")  # no row to decode
            rows.append(row)
    stored = [SegmentRecord("u", seq, "s", (f"s:{seq}",), "boundary") for seq in range(3)]
    picked = select(rows, stored, {"s:0", "s:2"}, set(), False)
    assert [s.seq for s in picked.touched] == [0, 2] and picked.dropped == {0, 2}
    assert picked.frames == [["record 0 of segment 0"], ["record 1 of segment 0"], ["record 1 of segment 0"],
                             ["record 0 of segment 2"], ["record 1 of segment 2"], ["record 1 of segment 2"]]
