"""The store contract: the same tests, the same assertions, against the SQLite store and the
PostgreSQL store (the ``backend`` fixture runs each test once per backend)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from retrieval.api.inputs import TurnInput
from retrieval.memory.cache import text_key
from retrieval.memory.errors import StoreError, StoreMismatch
from retrieval.memory.records import AMU, SegmentRecord, SourcePointer, Turn, amu_id
from retrieval.memory.schema import EARLIER_IDS_BOUND
from tests.store_backends import SQLITE_BEFORE_VERSION_9
from tests.test_amu_store import WHEN, commit, make_amu, make_turn


def segment(seq: int, amus: list[AMU],
            session: str = "session_1") -> tuple[SegmentRecord, list[Turn], list[AMU]]:
    return (SegmentRecord("conv-x", seq, session, (f"D1:{seq}",), "semantic_boundary"),
            [make_turn(f"D1:{seq}", text=f"turn {seq}", session=session)], amus)


def test_round_trip_and_lookups(backend):
    with backend.open() as store:
        commit(store, 0, [
            make_amu(0, 0, "Caroline went to a support group on 7 May 2023.", memory_type="event",
                     timestamps=["2023-05-07"], entities=["Caroline", "LGBTQ"]),
            make_amu(0, 1, "Melanie painted a sunrise in 2022.", timestamps=["2022"], entities=["Melanie"]),
        ])
        commit(store, 1, [make_amu(1, 0, "Caroline plans a trip the week after.", timestamps=["2023-W20"],
                                   entities=["Caroline"], fingerprint=[5, 9, 5], session="session_2")],
               session="session_2")
    with backend.open() as store:  # reopened: everything persisted
        assert [amu.id for amu in store.amus("conv-x")] == ["conv-x:0:0", "conv-x:0:1", "conv-x:1:0"]
        first = store.get("conv-x:0:0")
        assert first == make_amu(0, 0, "Caroline went to a support group on 7 May 2023.", memory_type="event",
                                 timestamps=["2023-05-07"], entities=["Caroline", "LGBTQ"])
        assert store.get("conv-x:1:0").fingerprint == (5, 9, 5)
        assert [a.id for a in store.by_segment("conv-x", 0)] == ["conv-x:0:0", "conv-x:0:1"]
        source = store.source_turns(store.get("conv-x:0:1"))
        assert [(t.turn_id, t.text, t.session_time) for t in source] == [("D1:0", "turn 0", WHEN)]
        record = store.segment("conv-x", 1)
        assert record.session_id == "session_2" and record.state == "state" and record.amu_count == 1
        assert record.fallback is False and record.revision == 0 and len(record.content_sha256) == 64
        assert [s.seq for s in store.segments("conv-x")] == [0, 1] and store.segment("conv-x", 7) is None
        assert store.users_with_segments() == ["conv-x"] and store.count() == 3 and store.count("nobody") == 0
        first_session = store.page("conv-x", session_id="session_1", limit=3)
        assert [(p, a.id) for p, a in first_session][1][1] == "conv-x:0:1"
        after = store.page("conv-x", limit=1)[0][0]
        assert [a.id for _, a in store.page("conv-x", after=after, limit=3)] == ["conv-x:0:1", "conv-x:1:0"]
        nodes = {node.name: node.amu_ids for node in store.evidence_nodes("conv-x")}
        assert nodes["entity:caroline"] == ("conv-x:0:0", "conv-x:1:0")
        assert nodes["event_frame:1"] == ("conv-x:1:0",)
        frames = store.evidence_nodes("conv-x", "event_frame")
        assert [n.name for n in frames] == ["event_frame:0", "event_frame:1"]
        links = store.node_links(["conv-x:1:0"])
        names = [node.name for node, amu in links if amu == "conv-x:1:0"]
        assert len(names) == len(links) and names[0] == "entity:caroline" and "event_frame:1" in names
        with pytest.raises(KeyError, match="no AMU with id 'nope'"):
            store.get("nope")
        assert store.get("conv-x:0:0", "conv-x") == first
        with pytest.raises(KeyError, match="no AMU with id 'conv-x:0:0'"):  # another user's, read as missing
            store.get("conv-x:0:0", "conv-y")
        with pytest.raises(KeyError, match="no turn 'D9' in conversation 'conv-x'"):
            store.turn("conv-x", "D9")


def test_archive_and_fingerprints_are_the_only_updates(backend):
    with backend.open() as store:
        commit(store, 0, [make_amu(0, 0), make_amu(0, 1, "Melanie runs.")])
        store.archive(["conv-x:0:0"])
        assert [a.id for a in store.amus()] == ["conv-x:0:1"]
        assert store.get("conv-x:0:0").archived and len(list(store.amus(include_archived=True))) == 2
        assert [node.amu_ids for node in store.evidence_nodes("conv-x", "event_frame")] == [("conv-x:0:1",)]
        backend.raw(store, "UPDATE amus SET fingerprint = '[7, 8]' WHERE id = 'conv-x:0:1'")
        assert store.get("conv-x:0:1").fingerprint == (7, 8)
        for sql in ("UPDATE amus SET text = 'changed' WHERE id = 'conv-x:0:1'", "DELETE FROM amus",
                    "UPDATE turns SET text = 'changed'", "DELETE FROM turns", "DELETE FROM segments"):
            with pytest.raises(backend.integrity_error, match="append-only"):
                backend.raw(store, sql)
        with pytest.raises(backend.integrity_error, match="one-way"):
            backend.raw(store, "UPDATE amus SET archived = false WHERE id = 'conv-x:0:0'")
        with pytest.raises(KeyError):
            store.archive(["missing"])
        assert store.count() == 2 and store.turn("conv-x", "D1:0").text == "turn 0"


def test_segment_commit_is_atomic_and_unique(backend):
    with backend.open() as store:
        commit(store, 0, [make_amu(0, 0)])
        with pytest.raises(ValueError, match="segment 0 of 'conv-x' is already stored"):
            commit(store, 0, [make_amu(0, 5)])
        with pytest.raises(backend.integrity_error):  # a duplicate id after the turn and the first AMU
            store.commit_segment(SegmentRecord("conv-x", 1, "session_1", ("D1:1",), "semantic_boundary"),
                                 [make_turn("D1:1")], [make_amu(1, 0), make_amu(1, 1, id="conv-x:0:0")])
        assert store.segment("conv-x", 1) is None and store.count() == 1
        with pytest.raises(KeyError):
            store.turn("conv-x", "D1:1")
        for wrong in (SourcePointer("conv-y", "session_1", ("D1:2",), segment=2),
                      SourcePointer("conv-x", "session_9", ("D1:2",), segment=2),
                      SourcePointer("conv-x", "session_1", ("D1:2",), segment=3)):
            with pytest.raises(ValueError, match="belongs to"):
                commit(store, 2, [make_amu(2, 0, source=wrong)])


def test_segments_committed_together_all_land_or_none(backend):
    with backend.open() as store:
        store.commit_segments([segment(0, [make_amu(0, 0)]), segment(1, [make_amu(1, 0), make_amu(1, 1)])])
        assert [store.segment("conv-x", seq).amu_count for seq in (0, 1)] == [1, 2]
        with pytest.raises(ValueError, match="segment 1 of 'conv-x' is already stored"):
            store.commit_segments([segment(2, [make_amu(2, 0)]), segment(1, [make_amu(1, 5)])])
        assert store.segment("conv-x", 2) is None and store.count() == 3
        with pytest.raises(KeyError):
            store.turn("conv-x", "D1:2")


def test_a_cache_read_of_many_items_and_a_read_only_store(backend):
    with backend.open() as store:
        blobs = {f"item{i}": bytes([i % 256]) * 4 for i in range(1500)}
        store.cache("vectors", "m", "u", blobs)
        store.cache("vectors", "m", "u", {"item0": b"other"})  # the first array stays
        wanted = [*reversed(blobs), "absent", "item7", "item0"]  # any order, repeats, one never stored
        assert store.cached("vectors", "m", "u", wanted) == [blobs.get(item) for item in wanted]
        assert store.cached("codes", "m", "u", ["item0"]) == [None]
        assert store.cached("vectors", "m", "v", ["item0"]) == [None]  # another user's
        assert store.cached("vectors", "m", "u", []) == []
        commit(store, 0, [make_amu(0, 0)])
    with backend.open(read_only=True) as reader:
        assert [a.id for a in reader.amus()] == ["conv-x:0:0"]
        reader.cache("vectors", "m", "u", {"new": b"x"})  # nothing stored, nothing raised
        assert reader.cached("vectors", "m", "u", ["new"]) == [None]
        for write in (lambda: reader.put_meta("k", 1), lambda: reader.archive(["conv-x:0:0"]),
                      lambda: reader.append_turns("u", [make_turn("D2:0")])):
            with pytest.raises(StoreError, match="read-only"):
                write()


def test_cached_arrays_are_each_users_own_copied_scrubbed_and_forgotten_with_it(backend):
    with backend.open() as store:
        commit(store, 0, [make_amu(0, 0)])
        for user in ("conv-x", "other"):
            store.cache("vectors", "m", user, {"a": b"1", "b": b"2"})
            store.cache("codes", "f", user, {"a": b"3"})
            store.cache("vectors", "m", user, {text_key("said"): b"4"})
        store.copy_cache("conv-x", "copy")
        assert store.cached("vectors", "m", "copy", ["a", "b"]) == [b"1", b"2"]
        store.scrub("conv-x", ["said"])  # the user's own array of the text only
        assert store.cached("vectors", "m", "conv-x", [text_key("said"), "a"]) == [None, b"1"]
        assert store.cached("vectors", "m", "other", [text_key("said")]) == [b"4"]
        store.purge("conv-x", everything=True)
        assert store.cached("vectors", "m", "conv-x", ["a", "b"]) == [None, None]
        assert store.cached("codes", "f", "conv-x", ["a"]) == [None]
        assert store.cached("vectors", "m", "other", ["a", "b"]) == [b"1", b"2"]  # untouched
        assert store.cached("codes", "f", "other", ["a"]) == [b"3"]


def test_a_turns_time_comes_back_with_the_offset_it_was_given_with(backend):
    """Stored in UTC for order, read back on the speaker's clock too: the same turn."""
    given = datetime.fromisoformat("2023-05-08T01:00:00+09:00")
    with backend.open() as store:
        (stored,) = store.append_turns("u", [Turn("u", "s1", "s1:1", "Ann", "hi", given)])
        (read,) = store.turns("u")
    assert read == stored and read.session_time == datetime(2023, 5, 7, 16, 0)
    assert read.local_time == datetime(2023, 5, 8, 1, 0) and read.utc_offset == timedelta(hours=9)


def test_the_turn_log_idempotency_keys_and_the_backlog(backend):
    with backend.open() as store:
        turns = [Turn("u", "s1", f"s1:{i}", "Ann" if i % 2 else "Bob", f"text {i}", WHEN)
                 for i in range(1, 4)]
        assert not store.holds_turns()
        assert store.append_turns("u", turns[:2], key="k1") == turns[:2]
        assert store.holds_turns()
        assert store.append_turns("u", turns, key="k2") == turns[2:]  # the stored ones are skipped
        assert store.idempotent_turn_ids("u", "k2") == ["s1:1", "s1:2", "s1:3"]
        assert store.idempotent_turn_ids("u", "none") is None and store.idempotent_turn_ids("v", "k1") is None
        with pytest.raises(backend.integrity_error):  # a key is stored once
            store.append_turns("u", turns[:1], key="k1")
        assert store.stored_turn_ids("u", ["s1:1", "s1:9"]) == {"s1:1"}
        assert store.last_turn_number("u", "s1") == 3 and store.last_turn_number("u", "s2") == 0
        assert store.users() == ["u"] and store.has_user("u") and not store.has_user("v")
        assert store.has_session("u", "s1") and not store.has_session("u", "s2")
        assert store.speakers("u") == ("Ann", "Bob")
        assert store.backlog_users() == ["u"] and store.next_seq("u") == 0
        backlog, last, unread = store.backlog("u")
        assert backlog == turns and unread == 0 and store.backlog("u", after=last) == ([], last, 0)
        first, at, unread = store.backlog("u", after=0, limit=1)  # a step of one turn: two left
        assert (first, unread) == (turns[:1], 2)
        assert store.backlog("u", after=at, limit=5) == (turns[1:], last, 0)
        store.commit_stored_turns(SegmentRecord("u", 0, "s1", ("s1:1", "s1:2"), "semantic_boundary"), [])
        assert store.uncovered_turns("u") == turns[2:] and store.next_seq("u") == 1
        assert store.uncovered_turn_ids("u") == {"s1:3"} and store.uncovered_turn_ids("v") == set()
        assert store.backlog("u", after=last - 1) == ([turns[2]], last, 0)
        store.commit_stored_turns(SegmentRecord("u", 1, "s1", ("s1:3",), "session_end"), [])
        assert store.backlog_users() == [] and store.users_with_segments() == ["u"]
        assert store.uncovered_turn_ids("u") == set()
        with pytest.raises(ValueError, match="segment 1 of 'u' is already stored"):
            store.commit_stored_turns(SegmentRecord("u", 1, "s1", ("s1:3",), "session_end"), [])


def test_a_backlog_read_in_steps_from_a_reloaded_stream_never_cuts_before_the_last_covered_turn(backend):
    """Without ``after`` (a stream loaded again), a limited read gives the first ``limit`` uncovered
    turns, or every uncovered one before the last covered turn if there are more, and a position
    after which every turn is uncovered: the next read, after it, gives the rest, none twice."""
    sessions = ["a", "b", "a", "b", "c", "c", "c"]  # a and b stay open; c's first turn is covered
    turns = [Turn("u", session, f"t{i}", "Ann", f"text {i}", WHEN) for i, session in enumerate(sessions)]
    with backend.open() as store:
        store.append_turns("u", turns)
        store.commit_stored_turns(SegmentRecord("u", 0, "c", ("t4",), "semantic_boundary"), [])
        open_turns = [turn for turn in turns if turn.turn_id != "t4"]
        assert store.backlog("u") == (open_turns, store.backlog("u", after=0)[1], 0)
        first, at, unread = store.backlog("u", limit=2)  # the four before t4 are read whatever the limit
        assert first == open_turns[:4] and unread == 2
        assert store.backlog("u", after=at, limit=1) == (open_turns[4:5], at + 1, 1)  # t5 after t4; t6 left
        first, at, unread = store.backlog("u", limit=5)  # past t4: cut at the limit
        assert (first, unread) == (open_turns[:5], 1) and store.backlog("u", after=at)[0] == open_turns[5:]


def test_meta_binding_and_jobs(backend):
    with backend.open() as store:
        assert store.meta("model") is None
        store.bind("model", {"name": "a"})
        store.bind("model", {"name": "a"})
        with pytest.raises(StoreMismatch,
                           match=r"was built with model \{'name': 'a'\}, not \{'name': 'b'\} "
                                 r"\(they differ in name\); rebuild"):
            store.bind("model", {"name": "b"}, "rebuild")
        store.put_meta("cost", [1, 2])
        store.put_meta("cost", {"s": 3})
        assert store.meta("cost") == {"s": 3}
        store.put_meta("cost", None)  # removes the row: the key can be inserted afresh
        backend.raw(store, "INSERT INTO meta (key, value) VALUES ('cost', '1')")
        assert store.meta("cost") == 1
        job, created = store.create_job("u", None, "consolidate")
        again, created_again = store.create_job("u", None, "consolidate")
        assert created and not created_again and again == job and job.state == "queued"
        other, _ = store.create_job("u", "s1", "consolidate")
        store.update_job(job.id, "running", {"done": 1})
        assert store.job_row(job.id).progress == {"done": 1} and store.job_row(job.id).state == "running"
        assert [j.id for j in store.unfinished()] == [job.id, other.id]
        store.update_job(job.id, "failed", error="boom")
        failed = store.job_row(job.id)
        assert (failed.state, failed.error, failed.progress) == ("failed", "boom", {"done": 1})
        assert [j.id for j in store.unfinished()] == [other.id] and store.job_row(999) is None
        assert store.create_job("u", None, "consolidate")[1]  # the failed one is finished


def test_a_partial_purge_drops_the_users_finished_jobs(backend):
    """A job consolidates the user's whole memory whatever session names it, so its progress
    counts what a purge removes: the user's finished jobs go with any purge; another user's stay,
    and so do unfinished ones (they finish without counts, retrieval.api.jobs)."""
    with backend.open() as store:
        for seq, session in enumerate(["s1", "s2", "s3"]):
            commit(store, seq, [make_amu(seq, 0, session=session)], session=session)
        jobs = {}
        for user, session in (("conv-x", "s1"), ("conv-x", "s2"), ("conv-x", None), ("other", None)):
            jobs[user, session] = store.create_job(user, session, "consolidate")[0].id
            store.update_job(jobs[user, session], "done", {"amus_before": 3})
        running = store.create_job("conv-x", "s3", "consolidate")[0].id
        store.purge("conv-x", turn_ids=["D1:0"])  # the turn of session s1
        left = {key for key, job in jobs.items() if store.job_row(job) is not None}
        assert left == {("other", None)} and store.job_row(running).state == "queued"


def test_retried_extraction_and_forwarding(backend):
    with backend.open() as store:
        commit(store, 0, [make_amu(0, 0), make_amu(0, 1, "Melanie runs.")])
        record = SegmentRecord("conv-x", 0, "session_1", ("D1:0",), "semantic_boundary", "new state", True, 0,
                               None, 1)
        with pytest.raises(ValueError, match="revision 0 does not follow"):
            store.replace_extraction(SegmentRecord("conv-x", 0, "session_1", ("D1:0",), "x"), [])
        retried = make_amu(0, 0, "Caroline paints often.", id=amu_id("conv-x", 0, 0, 1))
        store.replace_extraction(record, [retried])
        assert [a.id for a in store.amus()] == ["conv-x:0:0:r1"]
        stored = store.segment("conv-x", 0)
        assert (stored.state, stored.fallback, stored.amu_count, stored.revision) == ("new state", True, 1, 1)
        commit(store, 1, [make_amu(1, 0, "Caroline paints a lot.")])
        merged = make_amu(1, 9, "Caroline paints often, a lot.",
                          source=SourcePointer("conv-x", "session_1", ("D1:0", "D1:1"), ("Caroline",), None))
        assert store.forward(["conv-x:0:0:r1", "conv-x:1:0"], merged, "merge")
        assert not store.forward(["conv-x:1:0"], make_amu(1, 8), "merge")  # no longer active
        assert [a.id for a in store.amus()] == [merged.id]
        assert store.successors("conv-x") == {"conv-x:0:0:r1": merged.id, "conv-x:1:0": merged.id}
        assert store.successor("conv-x:1:0") == merged.id and store.successor(merged.id) is None
        assert store.meta(f"consolidation:{merged.id}") == {"operation": "merge"}
        with pytest.raises(ValueError, match="need active AMUs"):
            store.forward([merged.id], merged, "merge")


def test_versions_move_with_every_commit_and_tracking_sees_each_transaction(backend):
    with backend.open() as store, backend.open(role="consolidate") as other:
        start, user_start = store.data_version(), store.user_version("conv-x")
        assert store.data_version() == start
        with store.tracking("conv-x") as marks:
            commit(store, 0, [make_amu(0, 0)])
            store.archive(["conv-x:0:0"])
        assert [before for before, _ in marks][0] == user_start and marks[0][1] == marks[1][0]
        assert marks[1][1] == store.user_version("conv-x") != user_start
        moved = store.data_version()
        assert moved != start
        other.put_meta("k", 1)  # another store's (another process's) commit moves it too
        assert store.data_version() != moved
        assert store.user_version("nobody") == (0, 0, 0, 0, 0, 0, 0)
        assert store.user_versions(["nobody", "conv-x"]) == {"nobody": (0, 0, 0, 0, 0, 0, 0),
                                                               "conv-x": store.user_version("conv-x")}


def test_a_turn_added_and_purged_again_leaves_the_users_version_moved(backend):
    """A reader that read the user's version before an add and after its purge must not take the
    two for the same rows: what it built between may hold the purged turn."""
    with backend.open() as store:
        store.append_turns("conv-x", [make_turn("D1:0")])
        before = store.user_version("conv-x")
        store.append_turns("conv-x", [make_turn("D1:1")])
        store.purge("conv-x", turn_ids=["D1:1"])
        after = store.user_version("conv-x")
        assert after[:-1] == before[:-1] and after != before  # counts and positions as they were
        assert store.user_versions(["conv-x"]) == {"conv-x": after}


def test_writes_inside_a_transaction_join_it_and_commit_or_roll_back_together(backend):
    with backend.open() as store:
        with pytest.raises(RuntimeError), store.transaction(["conv-x"]):
            store.append_turns("conv-x", [make_turn("D1:5")])
            commit(store, 0, [make_amu(0, 0)])
            raise RuntimeError("a fault after both writes")
        assert store.turns("conv-x") == [] and store.count("conv-x") == 0
        with store.transaction(["conv-x"]):
            store.append_turns("conv-x", [make_turn("D1:5")])
            commit(store, 0, [make_amu(0, 0)])
        assert [turn.turn_id for turn in store.turns("conv-x")] == ["D1:5", "D1:0"]
        assert store.count("conv-x") == 1


def test_ingestion_marks_move_with_segments_records_and_every_purge_not_with_adds(backend):
    with backend.open() as store:
        assert store.ingestion_marks("conv-x") == (0, 0, 0)
        store.append_turns("conv-x", [make_turn("D1:0"), make_turn("D1:1")])
        assert store.ingestion_marks("conv-x") == (0, 0, 0)  # an add of turns is not a change of them
        store.purge("conv-x", turn_ids=["D1:1"])  # no segment closed: number and records stay
        assert store.ingestion_marks("conv-x") == (0, 0, 1)
        store.purge("conv-x", everything=True)  # the count outlives the user's rows
        assert store.ingestion_marks("conv-x") == (0, 0, 2) and store.users() == []
        commit(store, 0, [make_amu(0, 0)])
        assert store.ingestion_marks("conv-x") == (1, 1, 2)
        assert store.ingestion_marks("nobody") == (0, 0, 0)


def merged_history(store) -> AMU:
    """Three turns whose records consolidation merged into one, beside a fourth turn's record."""
    for seq in range(4):
        commit(store, seq, [make_amu(seq, 0, f"Caroline hikes, part {seq}.")])
    merged = make_amu(9, 0, "Caroline hikes.", source=SourcePointer(
        "conv-x", "session_1", ("D1:0", "D1:1", "D1:2"), ("Caroline",), None))
    assert store.forward(["conv-x:0:0", "conv-x:1:0", "conv-x:2:0"], merged, "merge")
    return merged


def test_deleting_one_turn_of_a_merged_record_restores_what_the_others_stated(backend):
    with backend.open() as store:
        merged = merged_history(store)
        purged = store.purge("conv-x", turn_ids=["D1:0"])
        assert [t.turn_id for t in purged.turns] == ["D1:0"]
        assert sorted(a.id for a in purged.amus) == ["conv-x:0:0", merged.id]
        assert purged.restored == ["conv-x:1:0", "conv-x:2:0"]
        assert [a.id for a in store.amus()] == ["conv-x:1:0", "conv-x:2:0", "conv-x:3:0"]
        assert store.successors("conv-x") == {} and store.meta(f"consolidation:{merged.id}") is None
        assert [s.seq for s in store.segments("conv-x")] == [1, 2, 3]
        assert [n.name for n in store.evidence_nodes("conv-x", "event_frame")] == [
            "event_frame:1", "event_frame:2", "event_frame:3"]
        with pytest.raises(backend.integrity_error, match="append-only"):  # the purge's licence ended
            backend.raw(store, "DELETE FROM turns")


def test_a_purge_moves_a_flush_off_a_purged_turn_to_the_nearest_earlier_one_that_stays(backend):
    """A segment keeps the last turn fed when a flush closed it, of any session; purging that turn
    moves the flush to the nearest earlier turn left (its place among them), or empties it, so no
    purged id stays. Nothing else may change it."""
    turns = [make_turn("a1"), make_turn("b1", session="s2"), make_turn("b2", session="s2"),
             make_turn("a2"), make_turn("b3", session="s2")]
    with backend.open() as store:
        store.append_turns("conv-x", turns)
        for seq, (session, covered, after) in enumerate([("session_1", ("a1",), "b2"),
                                                         ("s2", ("b1", "b2"), None),
                                                         ("session_1", ("a2",), "b3")]):
            store.commit_stored_turns(SegmentRecord("conv-x", seq, session, covered, "session_flush",
                                                    flushed_after=after), [])
        assert [s.flushed_after for s in store.segments("conv-x")] == ["b2", None, "b3"]
        with pytest.raises(backend.integrity_error, match="flush moves only"):
            backend.raw(store, "UPDATE segments SET flushed_after = 'a1'")
        store.purge("conv-x", turn_ids=["b2", "b3"])
        assert [(s.seq, s.turn_ids, s.flushed_after) for s in store.segments("conv-x")] == [
            (0, ("a1",), "b1"), (1, ("b1",), None), (2, ("a2",), "a2")]
        store.purge("conv-x", session_id="s2")
        assert [s.flushed_after for s in store.segments("conv-x")] == ["a1", "a2"]
        store.purge("conv-x", turn_ids=["a1"])
        assert [(s.seq, s.flushed_after) for s in store.segments("conv-x")] == [(2, "a2")]
        assert store.integrity_problems() == []


def test_every_path_to_nothing_leaves_the_same_nothing(backend):
    def residue(store) -> tuple:
        return (store.turns("conv-x"), store.segments("conv-x"),
                list(store.amus("conv-x", include_archived=True)), store.evidence_nodes("conv-x"),
                store.idempotent_turn_ids("conv-x", "k"),
                [job for job in store.unfinished() if job.user_id == "conv-x"],
                store.meta("consolidation_plan:conv-x"), store.users(), store.backlog_users(),
                store.user_version("conv-x"))

    with backend.open() as store:
        merged_history(store)
        store.append_turns("conv-x", [make_turn("D2:0", session="session_2")], key="k")
        store.create_job("conv-x", None, "consolidate")
        store.put_meta("consolidation_plan:conv-x", {"plan": 1})
        purged = store.purge("conv-x", session_id="session_2")
        assert [t.turn_id for t in purged.turns] == ["D2:0"]
        assert store.idempotent_turn_ids("conv-x", "k") is None
        store.purge("conv-x", amu_ids=["conv-x:3:0"])
        assert [a.id for a in store.amus()][-1] != "conv-x:3:0" and store.segment("conv-x", 3) is None
        everything = store.purge("conv-x", turn_ids=["D1:0", "D1:1", "D1:2"])  # the last turns: everything
        assert len(everything.amus) == 4
        # no rows left; the user's version keeps its three purges, as the ingestion marks do
        assert residue(store) == ([], [], [], [], None, [], None, [], [], (0, 0, 0, 0, 0, 0, 3))
        assert store.count() == 0 and store.purge("conv-x", everything=True).empty


def test_a_kept_node_loses_the_spelling_of_a_purged_record(backend):
    """A node keeps the text of the record that made it: after that record's purge it reads as the
    first record still linked to it spells it, as had the purged one never been stored (its old
    text's cached arrays go with the purge)."""
    with backend.open() as store:
        commit(store, 0, [make_amu(0, 0, "Jon DeLuca paints.", entities=("Jon DeLuca",), tags=("Painting",))])
        commit(store, 1, [make_amu(1, 0, "Jon Deluca hikes.", entities=("Jon Deluca",), tags=("painting",))])
        texts = {n.name: n.text for n in store.evidence_nodes("conv-x") if n.node_type != "event_frame"}
        assert texts["entity:jon deluca"] == "Jon DeLuca" and texts["topic:painting"] == "Painting"
        purged = store.purge("conv-x", turn_ids=["D1:0"])
        texts = {n.name: n.text for n in store.evidence_nodes("conv-x") if n.node_type in ("entity", "topic",
                                                                                          "entity_topic")}
        assert texts == {"entity:jon deluca": "Jon Deluca", "topic:painting": "painting",
                         "entity_topic:jon deluca|painting": "Jon Deluca painting"}
        assert {"Jon DeLuca", "Painting", "Jon DeLuca Painting"} <= set(purged.node_texts)


def test_a_purge_clears_the_extractors_state_of_the_touched_segment_and_every_later_one(backend):
    """The disambiguation state is carried from segment to segment: the states written after a
    purged turn's segment may restate it; those before it cannot."""
    with backend.open() as store:
        for seq in range(4):
            session = "session_1" if seq < 2 else "session_2"
            commit(store, seq, [make_amu(seq, 0, f"Record {seq} about gardens.", session=session)],
                   session=session)
        store.purge("conv-x", turn_ids=["D1:1"])
        assert [(s.seq, s.state) for s in store.segments("conv-x")] == [(0, "state"), (2, ""), (3, "")]


def test_ids_are_never_given_again_after_a_purge(backend):
    """A record id names its segment's number and a generated turn id its number in the session:
    after a purge neither goes back, so a stale delete or read of a purged id finds nothing new."""
    with backend.open() as store:
        commit(store, 0, [make_amu(0, 0)])
        commit(store, 1, [make_amu(1, 0)])
        turns = [Turn("conv-x", "s2", f"s2:{i}", "Ann", f"text {i}", WHEN) for i in (1, 2, 3)]
        store.append_turns("conv-x", [*turns, Turn("conv-x", "s2", "s2:x7", "Ann", "mine", WHEN)])
        store.purge("conv-x", amu_ids=["conv-x:1:0"])  # the last segment
        assert store.next_seq("conv-x") == 2 and store.last_turn_number("conv-x", "s2") == 4  # 4 stored
        store.purge("conv-x", turn_ids=["s2:3", "s2:x7"])  # the session's last generated number
        assert store.last_turn_number("conv-x", "s2") == 3  # 2 stored, 3 purged
        assert store.last_turn_number("conv-x", "s9") == 3  # the user's mark: every session counts on
        bound = store.bind_turn_ids("conv-x", "s2", [TurnInput("Ann", "new", WHEN, None, None)])
        assert [turn.turn_id for turn in bound] == ["s2:4"]
        store.purge("conv-x", everything=True)
        assert store.next_seq("conv-x") == 2 and store.last_turn_number("conv-x", "s2") == 3
        assert store.ingestion_marks("conv-x") == (0, 0, 3)
        commit(store, 2, [make_amu(2, 0, "Caroline sings.")])  # after the forget, numbering goes on
        assert store.next_seq("conv-x") == 3 and store.purge("conv-x", turn_ids=["D1:2"]).amus
        assert store.next_seq("conv-x") == 3 and store.last_turn_number("conv-x", "s2") == 3


def test_a_purge_of_turn_ids_numbered_past_what_the_stores_columns_hold_still_happens(backend):
    """A caller may give ``<session>:<n>`` with any n: the marks count only numbers the columns hold
    one past, so a purge of a larger one is carried out, not refused as an integer overflow that
    would keep the user from ever being forgotten."""
    huge = ["s:99999999999999999999", f"s:{2**63 - 2}", f"s:{2**63 - 1}", "s:" + "9" * 120]
    with backend.open() as store:
        store.append_turns("u", [Turn("u", "s", turn_id, "Ann", f"text {i}", WHEN)
                                 for i, turn_id in enumerate(huge)])
        store.purge("u", turn_ids=huge[:2])
        assert store.last_turn_number("u", "s") == 2**63 - 2  # past the purged numbers it can hold
        store.purge("u", turn_ids=huge[2:])
        assert store.last_turn_number("u", "s") == 2**63 - 2 and not store.turns("u")
        store.append_turns("u", [Turn("u", "s", "s:1", "Ann", "again", WHEN)])
        store.purge("u", everything=True)
        assert not store.has_user("u") and store.integrity_problems() == []


def test_a_generated_id_another_writer_took_is_numbered_again_inside_the_append(backend):
    """Between an add's bind and its transaction another writer stored a turn under the id it
    generated: the append gives the turn a new number (a caller's id would be a conflict check)."""
    with backend.open() as store:
        mine = store.bind_turn_ids("u", "s", [TurnInput("Ann", "mine", WHEN, None, None)])
        store.append_turns("u", [Turn("u", "s", "s:1", "Bob", "theirs", WHEN)])  # the other writer
        assert [t.turn_id for t in mine] == ["s:1"]
        stored = store.append_turns("u", mine, "k", known=set(), generated=["s:1"])
        assert [(t.turn_id, t.text) for t in stored] == [("s:2", "mine")]
        assert store.idempotent_turn_ids("u", "k") == ["s:2"]
        assert {t.turn_id: t.text for t in store.turns("u")} == {"s:1": "theirs", "s:2": "mine"}


def test_writers_opening_a_new_store_at_once_share_the_first_secret(backend):
    """Each writer makes a secret when it finds none; the one that lost the race to write it takes
    the winner's (before, it failed to open, with both secrets in its error message)."""
    from retrieval.api.tokens import SECRET_KEY, store_secret

    with backend.open() as store:
        store.bind(SECRET_KEY, "ab" * 32)  # the writer that came first, after this one looked
        read, looked = store.meta, []

        def meta(key):
            if key == SECRET_KEY and not looked:
                looked.append(key)
                return None
            return read(key)

        store.meta = meta
        assert store_secret(store) == bytes.fromhex("ab" * 32)


def back_before_version_8(backend, store) -> None:
    """Mark the store as the version before the earlier purges' id marks (SQLite 7, PostgreSQL 5),
    without the segments' flushes, which came later."""
    if backend.name == "sqlite":
        for statement in [*SQLITE_BEFORE_VERSION_9.split("; "), "PRAGMA user_version=7"]:
            backend.raw(store, statement)
    else:
        backend.raw(store, "DROP TRIGGER segments_flush_moves_in_purge ON segments; "
                    "ALTER TABLE segments DROP COLUMN flushed_after; UPDATE schema_version SET version = 5")


def test_the_ids_purged_before_the_marks_are_never_given_again_after_the_upgrade(backend):
    """Purges before the id marks (SQLite version 7, PostgreSQL 5) left none, and that migration
    set them at 0: the next one counts every user it knows on from one bound past any id the
    earlier numbering can have given, the same for a user that purged and one that did not (its
    own counts would tell a user how much the others wrote); a new user counts from 0."""
    with backend.open() as store:
        commit(store, 0, [make_amu(0, 0)])
        commit(store, 1, [make_amu(1, 0)])
        store.purge("conv-x", amu_ids=["conv-x:1:0"])  # the last segment and its turn D1:1
        store.append_turns("quiet", [Turn("quiet", "s1", "s1:1", "Bob", "hello", WHEN)])
        store.purge("gone", everything=True)  # a purges row, no turn
        backend.raw(store, "UPDATE purges SET next_seq = 0, next_turn = 0")
        back_before_version_8(backend, store)
        assert store.next_seq("conv-x") == 1 and store.last_turn_number("conv-x", "s9") == 0
    with backend.open() as store:
        for user in ("conv-x", "quiet", "gone"):
            assert store.next_seq(user) == EARLIER_IDS_BOUND
            assert store.last_turn_number(user, "s1") == EARLIER_IDS_BOUND - 1
        assert store.next_seq("new") == 0 and store.last_turn_number("new", "s1") == 0
        assert store.integrity_problems() == []


def test_past_500_million_turns_ever_stored_the_ids_count_on_past_what_they_can_have_reached(backend):
    """Before the marks a segment number stayed below the turns ever stored and a generated turn
    number at most twice them: in a store whose turn counter passed the bound both count on from
    past those instead."""
    with backend.open() as store:
        commit(store, 0, [make_amu(0, 0)])
        backend.raw(store, "UPDATE sqlite_sequence SET seq = 1500000000 WHERE name = 'turns'"
                    if backend.name == "sqlite" else "SELECT setval('turns_position_seq', 1500000000)")
        back_before_version_8(backend, store)
    with backend.open() as store:
        assert store.next_seq("conv-x") == 1_500_000_000
        assert store.last_turn_number("conv-x", "s1") == 3_000_000_000


def test_a_purge_by_turn_id_reads_only_its_users_turn(backend):
    """Turn ids are the caller's, so two users may both have a "t1": purging Ann's reports Ann's
    words (from which the derived texts to forget are computed) and leaves Bob's."""
    with backend.open() as store:
        store.append_turns("ann", [Turn("ann", "s", "t1", "Ann", "Ann's words", WHEN),
                                   Turn("ann", "s", "t2", "Ann", "more", WHEN)])
        store.append_turns("bob", [Turn("bob", "s", "t1", "Bob", "Bob's private words", WHEN)])
        purged = store.purge("ann", turn_ids=["t1"])
        assert [(turn.user_id, turn.text) for turn in purged.turns] == [("ann", "Ann's words")]
        assert [turn.text for turn in store.turns("bob")] == ["Bob's private words"]


def test_a_partial_purge_drops_the_cached_vectors_and_codes_of_its_derived_texts(backend):
    with backend.open() as store:
        commit(store, 0, [make_amu(0, 0, text="Caroline paints.")])
        commit(store, 1, [make_amu(1, 0, text="Caroline runs.")])
        keys = [text_key("Caroline paints."), text_key("kept")]
        for table in ("vectors", "codes"):
            store.cache(table, "m", "conv-x", dict(zip(keys, (b"1", b"2"), strict=True)))
        store.purge("conv-x", turn_ids=["D1:0"], derived=lambda purged: [amu.text for amu in purged.amus])
        for table in ("vectors", "codes"):
            assert store.cached(table, "m", "conv-x", keys) == [None, b"2"], table
