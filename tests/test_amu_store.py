"""AMU records and the append-only SQLite store."""

from __future__ import annotations

import os
import re
import sqlite3
import threading
from datetime import datetime
from pathlib import Path

import pytest

from retrieval.memory.in_chunks import IN_CHUNK, in_chunks
from retrieval.memory.records import (
    AMU,
    AMUValidationError,
    SegmentRecord,
    SourcePointer,
    Turn,
    amu_id,
)
from retrieval.memory.store import AMUStore
from retrieval.memory.times import iso_text, time_interval
from tests.conftest import run_together
from tests.store_backends import SQLITE_BEFORE_VERSION_10

WHEN = datetime(2023, 5, 8, 13, 56)


def by_session(store: AMUStore, user_id: str, session_id: str) -> list[AMU]:
    """The active units of one session, read through the store's own filters."""
    where, params = store._reads._filters(user_id=user_id)
    return list(store._reads._select(where + ["session_id = ?"], params + [session_id]))


def by_entity(store: AMUStore, entity: str) -> list[AMU]:
    """Active units listing this entity (case-insensitive): what the ``amu_entities`` index holds."""
    where, params = store._reads._filters()
    where.append("position IN (SELECT amu FROM amu_entities WHERE entity = ?)")
    return list(store._reads._select(where, params + [entity.casefold()]))


def in_time_range(store: AMUStore, start: str, end: str) -> list[AMU]:
    """Active units whose observation time or any timestamp overlaps [start, end] (ISO values of any
    precision): what the ``amu_times`` index holds."""
    low, high = time_interval(start)[0], time_interval(end)[1]
    where, params = store._reads._filters()
    where.append("position IN (SELECT amu FROM amu_times WHERE start <= ? AND end >= ?)")
    return list(store._reads._select(where, params + [iso_text(high), iso_text(low)]))


def make_turn(turn_id: str, speaker: str = "Caroline", session: str = "session_1",
              text: str = "hello") -> Turn:
    return Turn("conv-x", session, turn_id, speaker, text, WHEN)


def make_amu(seq: int, index: int, text: str = "Caroline paints.", session: str = "session_1",
             **overrides) -> AMU:
    values = dict(
        id=amu_id("conv-x", seq, index),
        text=text,
        memory_type="fact",
        source=SourcePointer("conv-x", session, (f"D1:{seq}",), ("Caroline",), seq),
        observed_at=WHEN.isoformat(),
    )
    values.update(overrides)
    return AMU(**values)


def commit(store: AMUStore, seq: int, amus: list[AMU], session: str = "session_1") -> None:
    turns = [make_turn(f"D1:{seq}", session=session, text=f"turn {seq}")]
    store.commit_segment(SegmentRecord("conv-x", seq, session, (f"D1:{seq}",), "semantic_boundary", "state"),
                         turns, amus)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"memory_type": "opinion"}, "memory_type"),
        ({"text": "   "}, "text"),
        ({"entities": "Caroline"}, "entities"),
        ({"tags": ["ok", 3]}, "tags.1"),
        ({"timestamps": ["8 May 2023"]}, "timestamps"),
        ({"observed_at": "yesterday"}, "observed_at"),
        ({"source": SourcePointer("conv-x", "session_1", ())}, "source.turn_ids"),
        ({"fingerprint": [1, -2]}, "fingerprint.1"),
    ],
)
def test_bad_records_name_the_field(overrides, field):
    with pytest.raises(AMUValidationError, match=f"field '{field}'"):
        make_amu(0, 0, **overrides)


def test_sequences_are_frozen_to_tuples():
    amu = make_amu(0, 0, entities=["Caroline"], tags=["art"], timestamps=["2023-05"], fingerprint=[3, 1, 3])
    assert amu.entities == ("Caroline",) and amu.timestamps == ("2023-05",) and amu.fingerprint == (3, 1, 3)
    assert amu.to_dict()["source"]["turn_ids"] == ["D1:0"]


@pytest.mark.parametrize(
    ("value", "start", "end"),
    [
        ("2022", "2022-01-01T00:00:00", "2022-12-31T23:59:59.999999"),
        ("2023-02", "2023-02-01T00:00:00", "2023-02-28T23:59:59.999999"),
        ("2023-W18", "2023-05-01T00:00:00", "2023-05-07T23:59:59.999999"),
        ("2023-05-07", "2023-05-07T00:00:00", "2023-05-07T23:59:59.999999"),
        ("2023-05-08T13:56:00", "2023-05-08T13:56:00", "2023-05-08T13:56:00"),
        ("2023-05-08T13:56:00+02:00", "2023-05-08T11:56:00", "2023-05-08T11:56:00"),
        ("2023-05-06/2023-05-07", "2023-05-06T00:00:00", "2023-05-07T23:59:59.999999"),
        ("2023W18", "2023-05-01T00:00:00", "2023-05-07T23:59:59.999999"),
        ("20230507", "2023-05-07T00:00:00", "2023-05-07T23:59:59.999999"),
        ("2023-W18-3", "2023-05-03T00:00:00", "2023-05-03T23:59:59.999999"),
        ("20230508T1356", "2023-05-08T13:56:00", "2023-05-08T13:56:00"),
    ],
)
def test_time_interval_forms(value, start, end):
    assert time_interval(value) == (datetime.fromisoformat(start), datetime.fromisoformat(end))


@pytest.mark.parametrize("value", ["2023-13", "2023-02-30", "May 2023", "2023-05-08/2023-05-01", "",
                                   "2022/2023/2024", "2023/" * 1200 + "2023"])
def test_time_interval_rejects(value):
    with pytest.raises(ValueError):
        time_interval(value)


@pytest.mark.parametrize("value", ["9999-W52", "9999W52", "2023-05-01/9999-W52"])
def test_a_week_ending_past_the_year_9999_is_refused_as_any_bad_value(value):
    """ISO week 52 of 9999 starts on 27 December and ends in the year 10000, past what a datetime
    holds (Python raises OverflowError there): an LLM may date a record so, and the value is
    refused like any other invalid one (ValueError; a record naming its field), not a crash."""
    refused = f"{value.split('/')[-1]!r} is not a valid ISO 8601 time value (date value out of range)"
    with pytest.raises(ValueError, match=f"^{re.escape(refused)}$"):
        time_interval(value)
    named = f"AMU 'conv-x:0:0': field 'timestamps': {refused}"
    with pytest.raises(AMUValidationError, match=f"^{re.escape(named)}$"):
        make_amu(0, 0, timestamps=[value])


def test_a_records_entity_rows_are_written_in_its_order(tmp_path):
    """Not in a set's order, which Python's hash seed changes from run to run: the same ingest
    gives the same rows in the same order (the files differ by each store's own secret)."""
    names = ["Zoe", "Ann", "Bob", "Mel", "Caroline", "LGBTQ", "Boston", "Kai"]
    with AMUStore(tmp_path) as store:
        commit(store, 0, [make_amu(0, 0, entities=names)])
        rows = store._db.execute("SELECT entity FROM amu_entities ORDER BY rowid").fetchall()
    assert [row[0] for row in rows] == [name.casefold() for name in names]


def test_store_round_trip_and_lookups(tmp_path):
    with AMUStore(tmp_path) as store:
        assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        commit(store, 0, [
            make_amu(0, 0, "Caroline went to a support group on 7 May 2023.", memory_type="event",
                     timestamps=["2023-05-07"], entities=["Caroline", "LGBTQ"]),
            make_amu(0, 1, "Melanie painted a sunrise in 2022.", timestamps=["2022"], entities=["Melanie"]),
        ])
        commit(store, 1, [make_amu(1, 0, "Caroline plans a trip the week after.", timestamps=["2023-W20"],
                                   entities=["Caroline"], fingerprint=[5, 9, 5], session="session_2")],
               session="session_2")
    with AMUStore(tmp_path) as store:  # reopened: everything persisted
        ids = [amu.id for amu in store.amus("conv-x")]
        assert ids == ["conv-x:0:0", "conv-x:0:1", "conv-x:1:0"]
        assert store.get("conv-x:1:0").fingerprint == (5, 9, 5)
        assert [a.id for a in by_session(store, "conv-x", "session_2")] == ["conv-x:1:0"]
        assert [a.id for a in store.by_segment("conv-x", 0)] == ["conv-x:0:0", "conv-x:0:1"]
        assert [a.id for a in by_entity(store, "caroline")] == ["conv-x:0:0", "conv-x:1:0"]
        # "2022" only overlaps the year 2022; the session time (2023-05-08) matches every unit in May.
        assert [a.id for a in in_time_range(store, "2022-06", "2022-07")] == ["conv-x:0:1"]
        assert [a.id for a in in_time_range(store, "2023-05-15", "2023-05-16")] == ["conv-x:1:0"]
        assert len(in_time_range(store, "2023-05", "2023-05")) == 3
        source = store.source_turns(store.get("conv-x:0:1"))
        assert [(t.turn_id, t.text, t.session_time) for t in source] == [("D1:0", "turn 0", WHEN)]
        record = store.segment("conv-x", 1)
        assert record.session_id == "session_2" and record.state == "state" and record.amu_count == 1
        assert store.users_with_segments() == ["conv-x"] and store.count() == 3
        with pytest.raises(KeyError):
            store.get("nope")


def test_archive_and_fingerprints_are_the_only_updates(tmp_path):
    with AMUStore(tmp_path) as store:
        commit(store, 0, [make_amu(0, 0), make_amu(0, 1, "Melanie runs.")])
        store.archive(["conv-x:0:0"])
        assert [a.id for a in store.amus()] == ["conv-x:0:1"]
        assert store.get("conv-x:0:0").archived
        assert len(list(store.amus(include_archived=True))) == 2
        with store._transaction() as db:  # the fingerprint column stays writable (a new fingerprinter)
            db.execute("UPDATE amus SET fingerprint = '[7, 8]' WHERE id = 'conv-x:0:1'")
        assert store.get("conv-x:0:1").fingerprint == (7, 8)
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            store._db.execute("UPDATE amus SET text = 'changed' WHERE id = 'conv-x:0:1'")
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            store._db.execute("DELETE FROM amus")
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            store._db.execute("UPDATE turns SET text = 'changed'")
        with pytest.raises(KeyError):
            store.archive(["missing"])


def test_segment_commit_is_atomic_and_unique(tmp_path):
    with AMUStore(tmp_path) as store:
        commit(store, 0, [make_amu(0, 0)])
        with pytest.raises(ValueError, match="already stored"):
            commit(store, 0, [make_amu(0, 5)])
        # The second AMU collides with a stored id after the turn and first AMU were inserted:
        # the whole segment must roll back.
        with pytest.raises(sqlite3.IntegrityError):
            store.commit_segment(
                SegmentRecord("conv-x", 1, "session_1", ("D1:1",), "semantic_boundary"),
                [make_turn("D1:1")], [make_amu(1, 0), make_amu(1, 1, id="conv-x:0:0")],
            )
        assert store.segment("conv-x", 1) is None
        assert store.count() == 1
        with pytest.raises(KeyError):
            store.turn("conv-x", "D1:1")
        for wrong in (SourcePointer("conv-y", "session_1", ("D1:2",), segment=2),
                      SourcePointer("conv-x", "session_9", ("D1:2",), segment=2),
                      SourcePointer("conv-x", "session_1", ("D1:2",), segment=3)):
            with pytest.raises(ValueError, match="belongs to"):
                commit(store, 2, [make_amu(2, 0, source=wrong)])


def test_segments_committed_together_all_land_or_none(tmp_path):
    def segment(seq: int, amus: list[AMU]) -> tuple[SegmentRecord, list[Turn], list[AMU]]:
        return (SegmentRecord("conv-x", seq, "session_1", (f"D1:{seq}",), "semantic_boundary"),
                [make_turn(f"D1:{seq}", text=f"turn {seq}")], amus)

    with AMUStore(tmp_path) as store:
        store.commit_segments([segment(0, [make_amu(0, 0)]), segment(1, [make_amu(1, 0), make_amu(1, 1)])])
        assert [store.segment("conv-x", seq).amu_count for seq in (0, 1)] == [1, 2]
        assert store.turn("conv-x", "D1:1").text == "turn 1"
        # The batch's second segment is stored already: its first one must roll back too.
        with pytest.raises(ValueError, match="segment 1 of 'conv-x' is already stored"):
            store.commit_segments([segment(2, [make_amu(2, 0)]), segment(1, [make_amu(1, 5)])])
        assert store.segment("conv-x", 2) is None and store.count() == 3
        with pytest.raises(KeyError):
            store.turn("conv-x", "D1:2")


def test_in_lists_are_bound_in_chunks_under_sqlite_s_parameter_limit():
    values = [f"v{i}" for i in range(2 * IN_CHUNK + 1)]
    chunks = list(in_chunks(values))
    assert [len(chunk) for _, chunk in chunks] == [IN_CHUNK, IN_CHUNK, 1]
    assert [marks.count("?") for marks, _ in chunks] == [IN_CHUNK, IN_CHUNK, 1] and chunks[2][0] == "?"
    assert [v for _, chunk in chunks for v in chunk] == values and list(in_chunks([])) == []


def open_files(path: Path) -> int:
    """This process's open file descriptors on ``path`` (Linux's /proc)."""
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if os.path.realpath(fd) == str(path.resolve()))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts descriptors through /proc")
def test_a_reading_thread_s_connection_closes_when_the_thread_ends(tmp_path):
    """Every thread reads on a connection of its own; a server's worker threads come and go, so one
    that ends must not leave its connection open (each holds a descriptor and a page cache). SQLite
    parks a closed connection's descriptor while others hold locks on the file, and the next one
    opened reuses it: the count stays where the first round of threads left it."""
    with AMUStore(tmp_path) as store:
        commit(store, 0, [make_amu(0, 0)])
        counts, together = [], threading.Barrier(8)

        def read() -> None:
            store.count()
            together.wait()  # all eight connections open at once, every round

        for _ in range(4):
            run_together(read, 8)
            counts.append(open_files(tmp_path / AMUStore.DB_NAME))
        assert counts == [counts[0]] * 4, counts
        assert store.count() == 1  # this thread's reader, and the store, still work


def test_a_reader_keeps_a_small_page_cache_and_the_writer_the_default(tmp_path):
    """Readers read most pages once (a search state's build, a listing); a server may hold one in
    each of its worker threads, so each keeps READER_CACHE_KIB of pages, not SQLite's 2,000 KiB."""
    from retrieval.memory.connection import READER_CACHE_KIB

    with AMUStore(tmp_path) as store:
        commit(store, 0, [make_amu(0, 0)])
        assert store._db.execute("PRAGMA cache_size").fetchone()[0] == -READER_CACHE_KIB == -256
        with store._transaction() as db:
            assert db.execute("PRAGMA cache_size").fetchone()[0] == -2000


def test_a_page_reads_its_records_from_the_users_index_in_store_order(tmp_path):
    """A page of ``list`` seeks the user's records after its cursor in store order: it read and
    sorted all of them (a walk of 50,000 records' pages took 11 s, quadratic in them). A store of
    version 9 gets the index when a writer opens it."""
    with AMUStore(tmp_path) as store:
        for seq in range(3):
            commit(store, seq, [make_amu(seq, 0), make_amu(seq, 1)])
        executed: list[str] = []
        store._db.set_trace_callback(executed.append)
        after = store.page("conv-x", limit=2)[-1][0]
        page = store.page("conv-x", after=after, limit=2)
        assert [amu.id for _, amu in page] == ["conv-x:1:0", "conv-x:1:1"]
        store._db.set_trace_callback(None)
        query = next(sql for sql in executed if "ORDER BY position LIMIT" in sql)
        plan = " ".join(row[3] for row in store._db.execute(f"EXPLAIN QUERY PLAN {query}"))
        assert "amus_by_position" in plan and "TEMP B-TREE" not in plan, plan
    db = sqlite3.connect(tmp_path / AMUStore.DB_NAME)
    db.executescript(SQLITE_BEFORE_VERSION_10 + "PRAGMA user_version=9;")
    db.close()
    with AMUStore(tmp_path) as store:
        indexes = {row[0] for row in store._db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert "amus_by_position" in indexes and store.integrity_problems() == []


@pytest.mark.parametrize("how", ["directory removed", "file replaced"])
def test_a_store_removed_or_replaced_under_its_writer_commits_nothing_more(tmp_path, how):
    """The directory deleted by hand (or a cleanup job) under a running server, or another file put
    in the store file's place: the writer's next commit is refused, naming the file, where it
    would have been answered and then lost with the unlinked file."""
    import shutil

    from retrieval.memory.errors import StoreFault

    directory = tmp_path / "store"
    with AMUStore(directory) as store:
        commit(store, 0, [make_amu(0, 0)])
        if how == "directory removed":
            shutil.rmtree(directory)
        else:
            AMUStore(tmp_path / "other").close()
            os.replace(tmp_path / "other" / AMUStore.DB_NAME, directory / AMUStore.DB_NAME)
        with pytest.raises(StoreFault, match=re.escape(f"{directory / AMUStore.DB_NAME} was removed or "
                                                       "replaced while this process wrote to it")):
            commit(store, 1, [make_amu(1, 0)])


@pytest.mark.parametrize("how", ["files removed", "file replaced"])
def test_a_thread_reading_first_after_the_store_was_removed_makes_no_new_one(tmp_path, how):
    """A thread whose first read comes after the store's files were removed (a cleanup emptying the
    directory as the ingestion worker wakes) is refused as the writer is, and leaves no empty
    database behind, which the next start would take for a new store; after a replacement it
    reads nothing of the other file."""
    from retrieval.memory.errors import StoreGone

    directory = tmp_path / "store"
    with AMUStore(directory) as store:
        commit(store, 0, [make_amu(0, 0)])
        for side in ("", "-wal", "-shm"):
            (directory / (AMUStore.DB_NAME + side)).unlink(missing_ok=True)
        if how == "file replaced":
            AMUStore(tmp_path / "other").close()
            os.replace(tmp_path / "other" / AMUStore.DB_NAME, directory / AMUStore.DB_NAME)
        failed: list[BaseException] = []

        def read() -> None:
            try:
                store.count("conv-x")
            except BaseException as err:  # noqa: BLE001 - handed to the test's thread
                failed.append(err)

        reader = threading.Thread(target=read)
        reader.start()
        reader.join()
        assert [type(err) for err in failed] == [StoreGone], failed
        assert (directory / AMUStore.DB_NAME).exists() == (how == "file replaced")


def test_a_store_in_a_directory_named_with_uri_characters_is_read_where_it_is(tmp_path):
    """SQLite reads a ``file:`` URI's path up to a ``?`` or ``#``: unescaped, a reader of
    ``a b#1/store`` opened (and made) a database at ``a b`` and found no store."""
    directory = tmp_path / "a b#1?x=%41" / "store"
    with AMUStore(directory) as store:
        commit(store, 0, [make_amu(0, 0)])
        counted: list[int] = []
        reader = threading.Thread(target=lambda: counted.append(store.count("conv-x")))
        reader.start()
        reader.join()
        assert counted == [1]
    with AMUStore(directory, read_only=True) as store:
        assert store.count("conv-x") == 1
    assert os.listdir(tmp_path) == ["a b#1?x=%41"]
    for read_only in (False, True):  # //tmp/...: no host named tmp
        with AMUStore(Path("/" + str(directory)), read_only=read_only) as store:
            assert store.count("conv-x") == 1


def test_a_store_opened_by_a_relative_path_still_commits_after_a_chdir(tmp_path, monkeypatch):
    """The check that the store is still in place looks at the file it opened, not at the relative
    path read again from wherever the process went since (a notebook's os.chdir)."""
    monkeypatch.chdir(tmp_path)
    with AMUStore(Path("rel")) as store:
        commit(store, 0, [make_amu(0, 0)])
        monkeypatch.chdir(tmp_path.parent)
        commit(store, 1, [make_amu(1, 0)])
        assert store.count("conv-x") == 2
