"""Structured evidence indexes of the store (schema 3; docs/design.md §7): key normalisation, the nodes
of a record, FTS5 and evidence nodes kept in step with inserts and archiving inside the store's
transactions, the migration of a version-2 store, and the temporal scope both extractors fill."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from datetime import datetime

import pytest

from retrieval.extract.base import ReferenceContext
from retrieval.extract.dates import absolute_dates
from retrieval.extract.rules import RuleExtractor, temporal_scope
from retrieval.index.evidence_nodes import segment_search_texts
from retrieval.memory.evidence_keys import normalise_key, record_nodes, temporal_keys
from retrieval.memory.records import AMU, Exchange, Segment, SegmentRecord, SourcePointer, Turn, amu_id
from retrieval.memory.schema import SCHEMA_VERSION
from retrieval.memory.store import AMUStore
from tests.store_backends import SQLITE_BEFORE_VERSION_9
from tests.store_lexical import lexical_search

WHEN = datetime(2023, 5, 8, 13, 56)


def record(seq: int, index: int, text: str, entities=(), tags=(), t_ref=None, turns=None, **extra) -> AMU:
    return AMU(amu_id("conv-x", seq, index), text, "fact",
               SourcePointer("conv-x", f"session_{seq // 10 + 1}",
                             tuple(turns or (f"D1:{seq * 10 + index}",)), ("Ann",), seq),
               observed_at=WHEN.isoformat(), entities=tuple(entities), tags=tuple(tags), t_ref=t_ref, **extra)


def commit(store: AMUStore, seq: int, amus: list[AMU]) -> None:
    turn_ids = [turn for amu in amus for turn in amu.source.turn_ids] or [f"D1:{seq * 10}"]
    session = f"session_{seq // 10 + 1}"
    turns = [Turn("conv-x", session, turn_id, "Ann", f"raw {turn_id}", WHEN)
             for turn_id in dict.fromkeys(turn_ids)]
    store.commit_segment(SegmentRecord("conv-x", seq, session, tuple(t.turn_id for t in turns),
                                       "semantic_boundary"),
                         turns, amus)


def node_map(store: AMUStore) -> dict[str, tuple[str, ...]]:
    return {node.name: node.amu_ids for node in store.evidence_nodes("conv-x")}


@pytest.mark.parametrize(("raw", "key"), [
    ("LGBTQ", "lgbtq"), ("  Support-Group ", "support group"), ("Caroline's", "caroline"),
    ("Dr. Seuss", "dr seuss"),
    ("rock_climbing / hiking", "rock climbing hiking"), ("Café  Nero!", "café nero"), ("?!", ""),
    # combining marks belong to their letters: "heart" and "party", "book" and "scribe" stay apart
    ("दिल", "दिल"), ("दल", "दल"), ("किताब", "किताब"), ("कातिब", "कातिब"), ("สวัสดี", "สวัสดี"),
    ("Cafe\u0301", "café"),
])
def test_keys_are_normalised_as_table_13_says(raw, key):
    assert normalise_key(raw) == key


def test_the_nodes_of_a_record():
    amu = record(3, 0, "Ann met Bob at the LGBTQ center.", entities=["Ann", "LGBTQ", "lgbtq"],
                 tags=["Support", "center"], t_ref="2023-05-07", valid_from="2023-W18")
    names = [node.name for node in record_nodes(amu)]
    assert names[:4] == ["entity:ann", "entity:lgbtq", "topic:support", "topic:center"]  # LGBTQ / lgbtq merge
    assert {"entity_topic:ann|support", "entity_topic:lgbtq|center"} <= set(names)
    assert "temporal:2023-05-07" in names and "temporal:2023-05" in names and "temporal:2023-05-01" in names
    assert names[-1] == "event_frame:3" and len(names) == len(set(names))
    assert temporal_keys(["2023"]) == [f"2023-{m:02d}" for m in range(1, 13)]  # a year: months, not 365 days
    assert temporal_keys(["2023-12-31/2024-01-01"]) == ["2023-12-31", "2024-01-01", "2023-12", "2024-01"]
    # a record of schema 2 (no scope) falls back to its first timestamp, else the day it was stated
    assert [n.key for n in record_nodes(record(1, 0, "x", timestamps=["2022"]))
            if n.node_type == "temporal"][0] \
        == "2022-01"
    assert ([n.key for n in record_nodes(record(1, 0, "x")) if n.node_type == "temporal"]
            == ["2023-05-08", "2023-05"])
    assert segment_search_texts([amu])[-1] == amu.text  # the event frame's searchable text


def test_inserts_and_archiving_keep_fts_and_nodes_in_step(tmp_path):
    with AMUStore(tmp_path) as store:
        commit(store, 0, [record(0, 0, "Ann signed up for a pottery class.", ["Ann"], ["pottery"],
                                 "2023-05-07"),
                          record(0, 1, "Bob ran a charity race for LGBTQ youth.", ["Bob", "LGBTQ"],
                                 ["race"])])
        commit(store, 1, [record(1, 0, "Ann loves pottery and painting.", ["ann"], ["Pottery", "painting"])])
        nodes = node_map(store)
        assert nodes["entity:ann"] == ("conv-x:0:0", "conv-x:1:0")  # "Ann" and "ann" merged into one node
        assert nodes["topic:pottery"] == ("conv-x:0:0", "conv-x:1:0")
        assert nodes["entity_topic:ann|pottery"] == ("conv-x:0:0", "conv-x:1:0")
        assert nodes["temporal:2023-05-07"] == ("conv-x:0:0",)
        assert nodes["temporal:2023-05-08"] == ("conv-x:0:1", "conv-x:1:0")  # t_ref: the session day
        frame = next(n for n in store.evidence_nodes("conv-x", "event_frame") if n.key == "0")
        assert (frame.session_id, frame.turn_ids, frame.amu_ids) == ("session_1", ("D1:0", "D1:1"),
                                                                      ("conv-x:0:0", "conv-x:0:1"))
        # Porter stems match "potteries"; 1:0 says pottery in its text and twice in its topics
        assert ([amu for amu, _ in lexical_search(store, "potteries", "conv-x", 5)]
                == ["conv-x:1:0", "conv-x:0:0"])
        # entities column
        assert [amu for amu, _ in lexical_search(store, "lgbtq", "conv-x", 5)] == ["conv-x:0:1"]
        assert lexical_search(store, "pottery", "conv-other", 5) == []

        store.archive(["conv-x:0:0"])  # consolidation's path: gone from every index in that transaction
        assert [amu for amu, _ in lexical_search(store, "pottery", "conv-x", 5)] == ["conv-x:1:0"]
        nodes = node_map(store)
        assert nodes["entity:ann"] == ("conv-x:1:0",) and "temporal:2023-05-07" not in nodes
        merged = record(1, 7, "Ann took a pottery class on 7 May 2023 and loves it.", ["Ann"], ["pottery"],
                        "2023-05-07", turns=("D1:0", "D1:10"))
        store.replace_extraction(SegmentRecord("conv-x", 1, "session_1", ("D1:10",), "semantic_boundary",
                                               revision=1), [merged])  # an insert outside commit_segment
        nodes = node_map(store)
        assert nodes["temporal:2023-05-07"] == ("conv-x:1:7",) and nodes["entity:ann"] == ("conv-x:1:7",)
        assert [amu for amu, _ in lexical_search(store, "pottery", "conv-x", 5)] == ["conv-x:1:7"]
        with pytest.raises(sqlite3.DatabaseError, match="one-way"):
            store._db.execute("UPDATE amus SET archived = 0 WHERE id = 'conv-x:0:0'")
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            store._db.execute("UPDATE amus SET t_ref = '2020' WHERE id = 'conv-x:1:7'")


def test_a_failed_commit_leaves_no_index_rows(tmp_path):
    with AMUStore(tmp_path) as store:
        commit(store, 0, [record(0, 0, "Ann paints.", ["Ann"], ["paint"])])
        with pytest.raises(sqlite3.IntegrityError):
            commit(store, 1, [record(1, 0, "Bob sings.", ["Bob"], ["sing"]),
                              dataclasses.replace(record(1, 1, "Ann paints again."), id="conv-x:0:0")])
        assert "entity:bob" not in node_map(store) and lexical_search(store, "sings", "conv-x", 5) == []


def _downgrade_to_version_2(path) -> None:
    """Turn a version-3 store into what version 2 wrote: no scope columns, no index tables."""
    db = sqlite3.connect(path)
    for trigger in ("amus_fts_insert", "amus_index_archive", "amus_archive_one_way", "amus_append_only"):
        db.execute(f"DROP TRIGGER {trigger}")
    for table in ("amu_fts", "evidence_links", "evidence_nodes"):
        db.execute(f"DROP TABLE {table}")
    for column in ("t_ref", "valid_from", "valid_to"):
        db.execute(f"ALTER TABLE amus DROP COLUMN {column}")
    db.executescript(SQLITE_BEFORE_VERSION_9 + "PRAGMA user_version=2;")
    db.commit()
    db.close()


def test_a_version_2_store_migrates_and_gets_its_indexes(tmp_path):
    with AMUStore(tmp_path) as store:
        commit(store, 0, [record(0, 0, "Ann signed up for a pottery class.", ["Ann"], ["pottery"],
                                 "2023-05-07"),
                          record(0, 1, "Bob ran a race.", ["Bob"], ["race"])])
        store.archive(["conv-x:0:1"])
    _downgrade_to_version_2(tmp_path / AMUStore.DB_NAME)
    with pytest.raises(Exception, match=f"needs a migration to {SCHEMA_VERSION}"):
        AMUStore(tmp_path, read_only=True)
    with AMUStore(tmp_path) as store:
        assert store._db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert store.get("conv-x:0:0").t_ref is None  # old records keep what they had
        nodes = node_map(store)
        assert nodes["entity:ann"] == ("conv-x:0:0",) and "entity:bob" not in nodes  # archived: not indexed
        assert nodes["temporal:2023-05-08"] == ("conv-x:0:0",)  # falls back to the day it was stated
        assert ("event_frame:0" in nodes
                and lexical_search(store, "pottery", "conv-x", 3)[0][0] == "conv-x:0:0")
        assert lexical_search(store, "race", "conv-x", 3) == []
        commit(store, 1, [record(1, 0, "Ann bought clay.", ["Ann"], ["clay"], "2023-05-09")])
        assert node_map(store)["entity:ann"] == ("conv-x:0:0", "conv-x:1:0")


def test_the_rule_extractor_fills_scope_tags_and_entities():
    text = ("Since last week I take pottery classes with Mel until tomorrow, "
            "and we met on 3 May 2023 in Boston.")
    turn = Turn("conv-x", "s1", "D1:1", "Ann", text, WHEN)
    segment = Segment("conv-x", "s1", 0, (Exchange((turn,)),), "session_flush", 0)
    (amu,) = RuleExtractor().extract(segment, ReferenceContext(["Ann", "Mel"])).amus
    assert (amu.valid_from, amu.valid_to, amu.t_ref) == ("2023-W18", "2023-05-09", "2023-05-03")
    assert amu.timestamps == ("2023-W18", "2023-05-09", "2023-05-03")
    assert "Mel" in amu.entities and "Boston" in amu.entities and "Ann" in amu.entities
    assert amu.tags[:2] == ("pottery", "classes") and "boston" not in amu.tags and len(amu.tags) <= 5
    plain = Turn("conv-x", "s1", "D1:2", "Ann", "I adore painting landscapes by the lake.", WHEN)
    (other,) = RuleExtractor().extract(Segment("conv-x", "s1", 1, (Exchange((plain,)),), "session_flush", 0),
                                       ReferenceContext(["Ann", "Mel"])).amus
    assert (other.t_ref, other.valid_from, other.valid_to) == ("2023-05-08", None, None)  # the session day
    assert temporal_scope([("2023", "by"), ("2022", None), ("2021", None)]) == {
        "t_ref": "2022", "valid_from": None, "valid_to": "2023"}
    assert absolute_dates("on 7 May 2023, May 8, 2023, in June 2022, 2023-02-30 and in 2021") == [
        "2023-05-07", "2023-05-08", "2022-06", "2021"]
    # an ISO date after a preposition is that date, not its year
    assert absolute_dates("We moved in 2021-06, from 2023-05-07 to 2023-05-08.") == [
        "2021-06", "2023-05-07", "2023-05-08"]
    assert absolute_dates("in Sept. 2022, on 3 Sept 2021 and Sep 4, 2020") == ["2022-09", "2021-09-03",
                                                                              "2020-09-04"]


def test_absolute_dates_after_since_or_until_bound_the_record_as_relative_ones_do():
    from datetime import datetime

    said = datetime(2023, 5, 10, 9)
    turns = [Turn("u", "s1", "s1:1", "Maria", "I have lived in Denver since 7 May 2022 and will stay until "
                  "June 2024.", said),
             Turn("u", "s1", "s1:2", "Maria", "I have lived in Boston since last year and will stay until "
                  "next month.", said)]
    segment = Segment("u", "s1", 0, tuple(Exchange((turn,)) for turn in turns), "session_flush", 10)
    amus = RuleExtractor().extract(segment, ReferenceContext(("Maria", "Jon"))).amus
    assert [(a.t_ref, a.valid_from, a.valid_to) for a in amus] == [
        ("2023-05-10", "2022-05-07", "2024-06"), ("2023-05-10", "2022", "2023-06")]


def test_the_llm_extractor_fills_the_temporal_scope(tmp_path):
    from tests.test_extract import LLM_TURNS, FakeOpenAI, completion, llm, make_segment

    record_ = {"text": "Caroline has gone to the support group since May 2023.", "memory_type": "event",
               "entities": ["Caroline"], "tags": ["support group"], "timestamps": ["2023-05"],
               "t_ref": "2023-05-07", "valid_from": "2023-05", "valid_to": None, "turn_ids": ["D1:1"]}
    bad = {**record_, "t_ref": "last May"}
    script = [completion(json.dumps({"records": [bad]})), completion(json.dumps({"records": [record_]}))]
    context = ReferenceContext(("Caroline", "Melanie"))
    with FakeOpenAI(script) as server:
        extraction = llm(server, tmp_path, max_retries=1).extract(make_segment(LLM_TURNS), context)
    assert len(server.requests) == 2 and "t_ref" in server.requests[0]["messages"][0]["content"]
    (amu,) = extraction.amus
    assert (amu.t_ref, amu.valid_from, amu.valid_to) == ("2023-05-07", "2023-05", None)
    assert amu.entities == ("Caroline",) and amu.tags == ("support group",) and amu.memory_type == "event"


def test_a_name_too_long_for_a_key_keys_no_node_but_an_old_nodes_text_is_still_found() -> None:
    """A new record's entity or tag of more than MAX_NAME_CHARS (after normalisation) keys no node;
    a store written before the bound may hold such a node, and a purge re-texting it must still
    find the spelling a remaining record gives it (``node_text`` looks every key up)."""
    from retrieval.memory.evidence_keys import node_text
    from retrieval.memory.records import MAX_NAME_CHARS

    long_name = "Q" * (MAX_NAME_CHARS + 1)
    amu = record(1, 0, "Ann met someone.", entities=("Ann", long_name), tags=("x" * 150,))
    names = {node.name for node in record_nodes(amu)}
    assert "entity:ann" in names and not any(len(node.key) > MAX_NAME_CHARS for node in record_nodes(amu))
    assert f"entity:{long_name.casefold()}" not in names
    assert node_text(amu, "entity", long_name.casefold()) == long_name
    ligatures = record(1, 1, "A blessing.", tags=("\ufdfa" * 20,))  # 20 characters, 360 once normalised
    assert not {node.node_type for node in record_nodes(ligatures)} & {"topic", "entity_topic"}
    assert {node.node_type for node in record_nodes(ligatures, longest=None)} >= {"topic"}
