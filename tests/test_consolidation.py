"""Asynchronous consolidation (docs/design.md §8): gates, HAC plan, the offline and LLM operators,
pointer forwarding with its audit, idempotence, the indexes, the command lines."""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

from retrieval.api.batch import ingest_turns
from retrieval.consolidate import main as consolidate_main
from retrieval.consolidation.audit import audit
from retrieval.consolidation.config import ConsolidationConfig
from retrieval.consolidation.engine import consolidate_user
from retrieval.consolidation.gates import is_count_sensitive, split_by_window
from retrieval.consolidation.llm_operator import LLMOperator
from retrieval.consolidation.members import Member, members
from retrieval.consolidation.merge_plan import make_plan
from retrieval.consolidation.operations import OfflineOperator, Operation
from retrieval.consolidation.report import ConsolidationReport, combined
from retrieval.extract.rules import RuleExtractor
from retrieval.ingest import main as ingest_main
from retrieval.llm_client import InvalidResponse
from retrieval.memory.meta_keys import PLAN_KEY
from retrieval.memory.records import AMU, MAX_TURN_CHARS, MAX_WRITTEN_KEYS, SourcePointer, Turn
from retrieval.memory.store import AMUStore
from tests.fake_chat import FakeChatServer, completion_body
from tests.store_lexical import lexical_search
from tests.test_ingest import HashEmbedder

CID = "conv-d"
SESSIONS = [("s1", datetime(2023, 5, 8, 13, 56)), ("s2", datetime(2023, 5, 20, 10, 0)),
            ("s3", datetime(2023, 8, 1, 9, 0))]
LINES = {
    "hike": ("Ann", "I love hiking in the mountains with my dog Max."),
    "hike_bob": ("Bob", "I love hiking in the mountains with my dog Max."),
    "cats": ("Ann", "I have two cats at home and they are lovely."),
    "guitar": ("Bob", "I am learning to play the acoustic guitar this summer."),
    "guitar2": ("Bob", "I am learning to play acoustic guitar this summer!"),
    "group": ("Ann", "I went to the support group yesterday, it was powerful."),
    "paint": ("Bob", "My favourite painting shows a sunrise over the lake."),
    "book": ("Ann", "Reading fantasy novels before bed relaxes me a lot."),
    "bread_a": ("Bob", "I bake sourdough bread with rye flour and sea salt at home."),
    "bread_b": ("Bob", "I bake sourdough bread with rye flour and sea salt at home lately."),
    "bread_c": ("Bob", "I bake sourdough bread with spelt flour and sea salt at home lately."),
}
PLAN = {"s1": ["hike", "hike_bob", "cats", "guitar", "group", "paint", "book", "bread_a"],
        "s2": ["hike", "cats", "guitar2", "group", "paint", "book", "bread_b", "bread_c"],
        "s3": ["hike", "guitar", "paint"]}
"""Known duplicates: exact ones (hike, paint, book, s1+s2; s3 is 2.5 months later: the window
splits it off), a near one (guitar), a count-sensitive pair (cats), two events with different
dates (group), the same words by another speaker (hike_bob), and a chain that merges in two
passes (bread: a~b, b~c, but a and c too far apart for one complete-linkage cluster)."""


def duplicate_turns(user_id: str = CID) -> list[Turn]:
    turns = []
    for number, (session, when) in enumerate(SESSIONS, start=1):
        for index, key in enumerate(PLAN[session]):
            speaker, text = LINES[key]
            turns.append(Turn(user_id, session, f"D{number}:{index + 1}", speaker, text, when))
    return turns


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The synthetic conversation, ingested (rule extractor, hash embedder), not consolidated."""
    directory = tmp_path_factory.mktemp("built")
    with AMUStore(directory) as store:
        ingest_turns(duplicate_turns(), store, HashEmbedder(), RuleExtractor(), progress=False)
    return directory


@pytest.fixture
def store_dir(built, tmp_path) -> Path:
    target = tmp_path / "store"
    shutil.copytree(built, target)
    return target


def snapshot(store: AMUStore) -> list[tuple]:
    """Every AMU (archived too) with its forward pointer and operation, and the pending plans."""
    successors = store.successors()
    return [(a.id, a.text, a.archived, successors.get(a.id), a.source, a.observed_at, a.timestamps,
             store.meta(f"consolidation:{a.id}")) for a in store.amus(include_archived=True)] + [
        store.meta(PLAN_KEY.format(cid)) for cid in store.users_with_segments()]


def member(unit_id: str, text: str, speaker: str = "Ann", when: datetime | None = SESSIONS[0][1],
           timestamps: tuple[str, ...] = ()) -> Member:
    amu = AMU(unit_id, text, "fact", SourcePointer(CID, "s1", (f"T{unit_id}",), (speaker,), 0),
              observed_at=when.isoformat() if when else None, timestamps=timestamps)
    return Member(amu, when, when)


# -- gates and the plan --------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "sensitive"), [
    ("Ann has two cats.", True),
    ("Jon ran 3 races in June.", True),
    ("Gina goes dancing twice a week.", True),
    ("Gina practises every day before work.", True),
    ("Jon visits the studio weekly.", True),
    ("How many kids does Melanie have? Melanie has a couple.", True),
    ("It was the first time Caroline went camping.", True),
    ("Caroline went to a support group on 7 May 2023.", False),
    ("On Saturday, 20 May 2023 at 1:56 pm Caroline ran a charity race.", False),
    ("Melanie painted a lake sunrise in 2022.", False),
    ("Caroline loves painting sunsets.", False),
    ("Jon has saved 2000 dollars for the trip.", True),  # a number that could be a year, and is not
    ("Jon has 1999 followers.", True),
    ("Jon's team won 21:15.", True),
    ("Jon moved to Paris in mid-2021, early 2019 or in the 2020s.", False),
    ("Jon has saved about 2000 dollars.", True),
    ("Jon's channel grew to 2000 subscribers, a budget of 2000 dollars.", True),
    ("Jon won by 2010 votes.", True),
    ("[2023-05-08 to 2023-05-20] Jon left at 17:30.", False),
])
def test_count_sensitive_lexicon(text: str, sensitive: bool) -> None:
    assert is_count_sensitive(text) is sensitive


@pytest.mark.parametrize(("field", "value", "message"), [
    ("threshold", "0.1", "threshold must be a number, got '0.1'"),
    ("threshold", True, "threshold must be a number, got True"),
    ("window_days", None, "window_days must be a number, got None"),
    ("prefix_min_span_minutes", float("nan"), "prefix_min_span_minutes must be a number, got nan"),
    ("max_passes", 2.5, "max_passes must be a whole number, got 2.5"),
    ("max_passes", True, "max_passes must be a whole number, got True"),
])
def test_a_setting_of_the_wrong_type_is_refused_naming_it(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        ConsolidationConfig(**{field: value})
    assert str(refused.value) == message


def test_a_merge_chain_of_any_length_is_followed_to_its_first_statement() -> None:
    """Each run can merge a new undated duplicate into the last merged AMU, so a chain grows a link
    a run without bound: its members' spans and forwarded AMUs are found without recursion."""
    start = datetime(2023, 5, 1)
    chain = [AMU(f"{CID}:m{i}", "Ann loves tea.", "fact", SourcePointer(CID, "s1", (f"T{i}",), ("Ann",), 0),
                 observed_at=(start + timedelta(hours=i)).isoformat(), archived=i < 2999)
             for i in range(3000)]
    (only,) = members(chain, {f"{CID}:m{i}": f"{CID}:m{i + 1}" for i in range(2999)})
    assert (only.id, only.first, only.last) == (f"{CID}:m2999", start, start + timedelta(hours=2999))
    assert [amu.id for amu in only.forwarded] == [f"{CID}:m{i}" for i in range(2998, -1, -1)]


def test_gates_on_hand_built_clusters() -> None:
    may, june, sept = datetime(2023, 5, 1), datetime(2023, 5, 25), datetime(2023, 9, 1)
    members = [member("a1", "Ann loves tea.", when=may),
               member("b1", "Bob loves tea.", speaker="Bob", when=may),
               member("a2", "Ann loves tea!", when=june), member("a3", "Ann has two teapots.", when=june),
               member("a4", "Ann loves tea.", when=sept),
               member("b2", "Bob loves tea.", speaker="Bob", when=june),
               member("a5", "Ann loves tea.", when=None), member("a6", "Ann loves tea.", when=None)]
    same = lambda texts: np.ones((len(texts), 4), dtype=np.float32)  # noqa: E731 - every pair at distance 0
    plan = make_plan(members, same, ConsolidationConfig(threshold=0.1))
    # one cluster per speaker; the count-sensitive a3 is held back; Ann's Sept and undated AMUs split off
    assert plan.clusters == [("a1", "a2"), ("b1", "b2"), ("a5", "a6")]
    assert (plan.count_sensitive, plan.window_splits) == (1, 2)
    fallback = make_plan(members, same, ConsolidationConfig(threshold=0.1), fallback_segments={0})
    assert fallback.clusters == [] and fallback.pending_reextraction == len(members)
    apart = lambda texts: np.eye(len(texts), 8, dtype=np.float32)  # noqa: E731 - orthogonal: distance 1
    assert make_plan(members, apart, ConsolidationConfig(threshold=0.1)).clusters == []
    parts = split_by_window([members[0], members[2], members[4]], ConsolidationConfig(window_days=30).window)
    assert [[m.id for m in part] for part in parts] == [["a1", "a2"], ["a4"]]


def test_offline_operator_merges_duplicates_of_one_event_keeping_the_newest() -> None:
    cluster = [member("a1", "Ann went to the group on 7 May 2023.", timestamps=("2023-05-07",)),
               member("a2", "[2023-05-01 to 2023-05-08] Ann went to the group on 7 May 2023!",
                      when=datetime(2023, 5, 9), timestamps=("2023-05-07",)),
               member("a3", "Ann went to the group on 19 May 2023.", when=datetime(2023, 5, 20),
                      timestamps=("2023-05-19",))]
    (draft,) = OfflineOperator().decide(cluster)
    assert draft.operation == Operation.MERGE and draft.member_ids == ("a1", "a2")
    assert draft.text == "Ann went to the group on 7 May 2023!" and draft.exact  # old prefix stripped
    assert OfflineOperator().decide(cluster[:1] + cluster[2:]) == []


# -- the offline path end to end -----------------------------------------------------------------


def test_offline_consolidation_of_a_conversation_with_known_duplicates(store_dir: Path) -> None:
    with AMUStore(store_dir, role="consolidate") as store:
        before = {a.id: a for a in store.amus()}
        report = consolidate_user(store, CID, HashEmbedder())
        assert ((report.amus_before, report.amus_active_after, report.archived, report.created)
                == (19, 13, 12, 6))
        assert report.operations == {"MERGE": 6, "KEEP": 1} and report.exact_duplicates == 3
        assert (report.count_sensitive, report.passes, report.llm_calls, report.tokens) == (2, 3, 0, 0)
        assert report.turns_before == report.turns_after and not report.lost_turns
        active = list(store.amus())
        texts = sorted(a.text for a in active)
        assert texts.count("Ann has two cats at home and they are lovely.") == 2  # count-sensitive: kept
        assert sum("support group" in t for t in texts) == 2  # two events, two dates
        assert "Bob loves hiking in the mountains with Bob's dog Max." in texts  # another speaker
        assert "Ann loves hiking in the mountains with Ann's dog Max." in texts  # s3: outside the window
        hike = next(a for a in active if a.text.startswith("[2023-05-08 to 2023-05-20] Ann loves hiking"))
        assert hike.source == SourcePointer(CID, "s2", ("D1:1", "D2:1"), ("Ann",), None)
        assert hike.observed_at == SESSIONS[1][1].isoformat() and hike.id.startswith(f"{CID}:c:")
        guitar = next(a for a in active if "guitar" in a.text and a.source.session_id == "s2")
        assert (guitar.text
                == "[2023-05-08 to 2023-05-20] Bob is learning to play acoustic guitar this summer!")
        (bread,) = [a for a in active if "sourdough" in a.text]  # merged in two passes
        assert bread.source.turn_ids == ("D1:8", "D2:7", "D2:8")
        archived = [a for a in store.amus(include_archived=True) if a.archived]
        assert all(a.text == before[a.id].text for a in archived if a.id in before)  # never rewritten
        assert store.meta(f"consolidation:{hike.id}") == {"operation": "MERGE"}
        assert store.meta(PLAN_KEY.format(CID)) is None
        block = combined([report])
        assert (block["amus_before"], block["amus_active_after"], block["archived"], block["lost_turns"]) == (
            19, 13, 12, 0)
        assert block["operations"] == {"KEEP": 1, "MERGE": 6} and block["operator"] == ["offline"]


def test_a_rerun_over_a_consolidated_store_changes_nothing(store_dir: Path) -> None:
    with AMUStore(store_dir, role="consolidate") as store:
        consolidate_user(store, CID, HashEmbedder())
        first = snapshot(store)
        again = consolidate_user(store, CID, HashEmbedder())
        assert (again.archived, again.created, again.amus_before, again.amus_active_after) == (0, 0, 13, 13)
        assert snapshot(store) == first


def test_a_saved_plan_of_other_settings_is_not_resumed(store_dir: Path) -> None:
    with AMUStore(store_dir, role="consolidate") as store:
        stale = [f"{CID}:0:1", f"{CID}:0:2"]  # Bob's hike and Ann's cats: never one cluster
        store.put_meta(PLAN_KEY.format(CID), {"config": {"threshold": 0.5}, "clusters": [stale]})
        assert consolidate_user(store, CID, HashEmbedder()).archived == 12
        assert not any(store.get(unit_id).archived for unit_id in stale)
        assert store.meta(PLAN_KEY.format(CID)) is None


def test_forwarding_keeps_every_source_turn_reachable(store_dir: Path) -> None:
    with AMUStore(store_dir, role="consolidate") as store:
        consolidate_user(store, CID, HashEmbedder())
        wider = consolidate_user(store, CID, HashEmbedder(),
                                         config=ConsolidationConfig(window_days=100))
        assert wider.created == 3  # the s3 statements join their merged May AMUs
        result = audit(store)
        assert result.ok and result.longest_chain == 2 and result.forwarded == 18 and result.active == 10
        successors = store.successors()
        all_turns = {t.turn_id for t in store.turns(CID)}
        for amu in store.amus(include_archived=True):
            current = amu
            while current.archived:
                current = store.get(successors[current.id])
            assert {t.turn_id for t in store.source_turns(current)} >= set(amu.source.turn_ids)
        covered = {turn for a in store.amus() for turn in a.source.turn_ids}
        assert covered == {turn for a in store.amus(include_archived=True) for turn in a.source.turn_ids}
        assert covered <= all_turns
        hike = next(a for a in store.amus() if "Ann loves hiking" in a.text)
        assert hike.text == "[2023-05-08 to 2023-08-01] Ann loves hiking in the mountains with Ann's dog Max."
        assert hike.source.turn_ids == ("D1:1", "D2:1", "D3:1")


def test_loose_settings_refuse_each_lossy_draft_once(store_dir: Path) -> None:
    """A refused cluster is planned and asked again in each later pass: its refusal counts once."""
    with AMUStore(store_dir, role="consolidate") as store:
        loose = ConsolidationConfig(threshold=2, linkage="single", window_days=100_000)
        report = consolidate_user(store, CID, HashEmbedder(), config=loose)
        assert (report.amus_active_after, report.refused, report.passes) == (15, 1, 2)
        assert audit(store).ok


def test_the_audit_names_a_lost_turn(store_dir: Path) -> None:
    with AMUStore(store_dir, role="consolidate") as store:
        store.archive([f"{CID}:0:0"])  # archived outside consolidation: no successor, nothing covers D1:1
        result = audit(store)
        assert not result.ok and result.lost_turns[CID] == {"D1:1"}
        assert result.problems == [f"{CID}:0:0: archived without a successor"]


def test_forward_refuses_members_that_are_no_longer_active(store_dir: Path) -> None:
    with AMUStore(store_dir, role="consolidate") as store:
        first, second = list(store.amus())[:2]
        merged = AMU(f"{CID}:c:test", "Merged.", "fact", SourcePointer(CID, "s1", ("D1:1", "D1:2"), ("Ann",)))
        store.archive([second.id])
        count = store.count()
        assert store.forward([first.id, second.id], merged, "MERGE") is False
        assert store.count() == count and not store.get(first.id).archived and store.successors() == {}
        with pytest.raises(ValueError, match="need active AMUs"):
            store.forward([merged.id], merged, "MERGE")


def test_the_indexes_see_archived_amus_disappear_and_merged_ones_appear(store_dir: Path) -> None:
    with AMUStore(store_dir, role="consolidate") as store:
        consolidate_user(store, CID, HashEmbedder())
        archived = {a.id for a in store.amus(include_archived=True) if a.archived}
        active = {a.id for a in store.amus()}
        found = {unit_id for unit_id, _ in lexical_search(store, "sourdough bread", CID, 10)}
        (bread,) = [a.id for a in store.amus() if "sourdough" in a.text]
        assert found == {bread}
        linked = {unit_id for node in store.evidence_nodes(CID) for unit_id in node.amu_ids}
        assert not linked & archived and bread in linked and linked <= active


# -- the LLM operator through a local endpoint ---------------------------------------------------

MARATHON = [Turn("conv-m", "s1", "D1:1", "Ann", "I am training for the city marathon in the spring.",
                 SESSIONS[0][1]),
            Turn("conv-m", "s1", "D1:2", "Bob", "Good luck with that, the course looks hard!",
                 SESSIONS[0][1]),
            Turn("conv-m", "s2", "D2:1", "Ann", "I am training hard for the city marathon this spring.",
                 SESSIONS[1][1])]
ANSWERS = {
    "MERGE": {"operation": "MERGE", "text": "Ann is training for the city marathon in spring 2023.",
              "memory_type": "event", "entities": ["Ann"], "tags": ["marathon"], "timestamps": ["2023"]},
    "UPDATE": {"operation": "UPDATE", "text": "Ann now trains hard for the city marathon.",
               "memory_type": "fact"},
    "AGGREGATE": {"operation": "AGGREGATE",
                  "text": "Ann trains for the city marathon, harder since May 2023.",
                  "memory_type": "event", "timestamps": ["2023-05"]},
}


@pytest.fixture
def marathon(tmp_path) -> Path:
    with AMUStore(tmp_path / "store") as store:
        ingest_turns(MARATHON, store, HashEmbedder(), RuleExtractor(), progress=False)
    return tmp_path / "store"


def answering(*contents: str):
    replies = list(contents)

    def respond(body):
        content = replies.pop(0) if len(replies) > 1 else replies[0]
        return 200, completion_body(content, 100, 20), 0.0
    return respond


@pytest.mark.parametrize("operation", ["MERGE", "UPDATE", "AGGREGATE"])
def test_each_llm_operation_through_a_local_endpoint(marathon: Path, tmp_path: Path, operation: str) -> None:
    answer = ANSWERS[operation]
    with FakeChatServer(answering(json.dumps(answer))) as server, \
            AMUStore(marathon, role="consolidate") as store:
        operator = LLMOperator(server.base_url, "m", cache_dir=tmp_path / "cache", max_retries=1,
                               backoff_s=0.0)
        report = consolidate_user(store, "conv-m", HashEmbedder(), operator)
        assert report.operations == {operation: 1} and (report.archived, report.created) == (2, 1)
        assert (report.llm_calls, report.tokens) == (1, 120)
        (merged,) = [a for a in store.amus() if a.source.speakers == ("Ann",)]
        assert merged.text == "[2023-05-08 to 2023-05-20] " + answer["text"]
        assert merged.memory_type == answer["memory_type"] and merged.source.turn_ids == ("D1:1", "D2:1")
        assert merged.t_ref == (None if operation == "AGGREGATE" else "2023-05-20")
        assert store.meta(f"consolidation:{merged.id}") == {"operation": operation}
        (request,) = server.requests
        prompt = request["messages"][1]["content"]
        assert request["response_format"] == {"type": "json_object"} and request["temperature"] == 0.0
        assert prompt.index("in the spring") < prompt.index("this spring")  # oldest first
        assert "stated 2023-05-08 13:56 by Ann" in prompt


def test_a_bad_llm_answer_is_retried_and_a_rerun_is_served_from_the_cache(marathon: Path,
                                                                          tmp_path: Path) -> None:
    second_store = tmp_path / "second"
    shutil.copytree(marathon, second_store)
    missing_text = json.dumps({"operation": "MERGE", "memory_type": "fact"})
    bad_time = json.dumps(dict(ANSWERS["MERGE"], timestamps=["spring"]))
    only_prefix = json.dumps(dict(ANSWERS["MERGE"], text="[2023-05-08 to 2023-05-20] "))
    spaced_prefix = json.dumps(dict(ANSWERS["MERGE"], text=" [2023-05-08 to 2023-05-20] "))
    # texts no store keeps, which JSON can spell: a NUL, a lone surrogate, more than a turn may hold
    unstorable = [json.dumps(dict(ANSWERS["MERGE"], text=text))
                  for text in ("Ann ran\x00 twice.", "Ann ran \ud800 twice.", "Ann ran. " * 2300)]
    replies = answering("not json", missing_text, bad_time, only_prefix, spaced_prefix, *unstorable,
                        json.dumps(ANSWERS["MERGE"]))
    with FakeChatServer(replies) as server:
        with AMUStore(marathon, role="consolidate") as store:
            operator = LLMOperator(server.base_url, "m", cache_dir=tmp_path / "cache", max_retries=8,
                                   backoff_s=0.0)
            report = consolidate_user(store, "conv-m", HashEmbedder(), operator)
            assert report.created == 1 and operator.usage.retries == 8 and operator.usage.http_calls == 9
            first = [(a.text, a.source) for a in store.amus()]
        assert len(list((tmp_path / "cache").rglob("*.json"))) == 1  # only the valid answer was cached
        with AMUStore(second_store, role="consolidate") as store:
            operator = LLMOperator(server.base_url, "m", cache_dir=tmp_path / "cache", max_retries=0)
            report = consolidate_user(store, "conv-m", HashEmbedder(), operator)
            assert operator.usage.http_calls == 0 and operator.usage.cache_hits == 1
            assert (report.llm_calls, report.tokens) == (1, 120)
            assert [(a.text, a.source) for a in store.amus()] == first
        assert len(server.requests) == 9


def test_an_answer_may_restate_long_members_at_their_length_and_no_longer() -> None:
    """A record may be longer than a turn may be where it restates members that long together (an
    aggregate keeps every name and number), not beyond."""
    from retrieval.consolidation.llm_operator import _parse

    long = [member(str(n), f"Ann listed item {n}: " + "a pine cone, " * 900) for n in range(2)]
    together = sum(len(m.amu.text) for m in long)
    assert together > MAX_TURN_CHARS
    fits = json.dumps(dict(ANSWERS["AGGREGATE"], text="x" * together))
    assert len(_parse(fits, long).text) == together
    with pytest.raises(InvalidResponse, match="more than the"):
        _parse(json.dumps(dict(ANSWERS["AGGREGATE"], text="x" * (together + 1))), long)
    with pytest.raises(InvalidResponse, match=f"more than the {MAX_TURN_CHARS}"):
        _parse(json.dumps(dict(ANSWERS["AGGREGATE"], text="x" * (MAX_TURN_CHARS + 1))),
               [member("s", "Ann runs.")])


def test_rounds_folded_together_count_a_turn_deleted_between_them_as_deleted_not_lost() -> None:
    def run(before: set[str], after: set[str], stored: set[str]) -> ConsolidationReport:
        return ConsolidationReport(CID, "offline", 0.25, turns_before=frozenset(before),
                                   turns_after=frozenset(after), turns_stored=frozenset(stored))

    deleted = run({"a", "b"}, {"a", "b"}, {"a", "b"})
    deleted.absorb(run({"a"}, {"a"}, {"a"}))  # the user deleted b between the rounds
    assert not deleted.lost_turns
    lost = run({"a", "b"}, {"a", "b"}, {"a", "b"})
    lost.absorb(run({"a", "b"}, {"a"}, {"a", "b"}))  # b still stored, no record points to it
    assert lost.lost_turns == {"b"}


def test_a_users_report_counts_only_the_requests_made_for_that_user(marathon: Path, tmp_path: Path) -> None:
    """Jobs of several users share one operator: another user's request made while this user's
    consolidation runs is not in this user's report (it showed the size of the other's records),
    though the operator's total counts it; forgetting a user drops its count."""
    class Shared(LLMOperator):
        def decide(self, cluster):
            drafts = super().decide(cluster)
            self.client.complete([{"role": "user", "content": "another user's records " * 50}],
                                 lambda content: content, user="bob")
            return drafts

    with FakeChatServer(answering(json.dumps(ANSWERS["MERGE"]))) as server, \
            AMUStore(marathon, role="consolidate") as store:
        operator = Shared(server.base_url, "m", max_retries=0)
        report = consolidate_user(store, "conv-m", HashEmbedder(), operator)
        assert (report.llm_calls, report.tokens) == (1, 120)
        assert operator.usage_of("bob").tokens == 120 and operator.usage.tokens == 240
        operator.forget("bob")
        assert operator.usage_of("bob").tokens == 0 and operator.usage_of("conv-m").tokens == 120


def test_an_answer_landing_after_a_purge_of_its_records_is_not_kept(marathon: Path, tmp_path: Path) -> None:
    """The user deletes the cluster's turns while the endpoint works on it: the answer restates
    them, so it must not stay in the user's cache (the purge dropped what was there before)."""
    def purge_then_answer(body: dict) -> tuple[int, dict, float]:
        with AMUStore(marathon) as writer:
            writer.purge("conv-m", turn_ids=["D1:1", "D2:1"])
        return 200, completion_body(json.dumps(ANSWERS["MERGE"]), 100, 20), 0.0

    with FakeChatServer(purge_then_answer) as server, AMUStore(marathon, role="consolidate") as store:
        operator = LLMOperator(server.base_url, "m", cache_dir=tmp_path / "cache", max_retries=0)
        report = consolidate_user(store, "conv-m", HashEmbedder(), operator)
        assert len(server.requests) == 1 and report.created == 0 and report.conflicts == 0
        assert not report.lost_turns  # the turns the user deleted were not lost by consolidating
        (left,) = store.amus("conv-m")
        assert left.source.turn_ids == ("D1:2",)
    assert not list((tmp_path / "cache").rglob("*.json"))


def test_no_operator_sees_a_record_after_a_purge_of_it_committed(store_dir: Path) -> None:
    """A forget commits while the operator decides the pass's first cluster: the pass's other
    clusters, planned from records read before it, are not sent, and the next pass reads the
    store again (nothing left: nothing planned, no plan left behind)."""
    seen: list[list[str]] = []

    class Forgetting(OfflineOperator):
        def decide(self, cluster):
            seen.append([member.amu.text for member in cluster])
            if len(seen) == 1:
                with AMUStore(store_dir) as writer:
                    writer.purge(CID, everything=True)
            return super().decide(cluster)

    with AMUStore(store_dir, role="consolidate") as store:
        report = consolidate_user(store, CID, HashEmbedder(), Forgetting())
        assert len(seen) == 1 and (report.created, report.archived) == (0, 0) and not report.lost_turns
        assert not list(store.amus(CID, include_archived=True))
        again = consolidate_user(store, CID, HashEmbedder(), Forgetting())  # nothing left: nothing to do
        assert again.to_dict() == {**ConsolidationReport(CID, again.operator, again.threshold).to_dict(),
                                   "seconds": 0.0}
        with store._transaction() as db:  # the plan's row is gone, not kept as null
            assert not db.execute("SELECT key FROM meta WHERE key = ?", (PLAN_KEY.format(CID),)).fetchall()


def test_keep_and_no_answer_leave_the_cluster_alone(marathon: Path, tmp_path: Path) -> None:
    with FakeChatServer(answering(json.dumps({"operation": "KEEP"}))) as server, \
            AMUStore(marathon, role="consolidate") as store:
        before = snapshot(store)
        operator = LLMOperator(server.base_url, "m", cache_dir=tmp_path / "cache", max_retries=0)
        report = consolidate_user(store, "conv-m", HashEmbedder(), operator)
        assert report.operations == {"KEEP": 1} and report.archived == 0 and snapshot(store) == before
    with FakeChatServer(lambda body: (500, {"error": "down"}, 0.0)) as server, \
            AMUStore(marathon, role="consolidate") as store:
        operator = LLMOperator(server.base_url, "m", max_retries=0)
        report = consolidate_user(store, "conv-m", HashEmbedder(), operator)
        assert report.unanswered == 1 and report.archived == 0 and snapshot(store) == before


# -- command lines -------------------------------------------------------------------------------


class NamedHashEmbedder(HashEmbedder):
    """The hash embedder behind the command lines' ``SentenceEmbedder(name)``."""

    def __init__(self, name: str | None = None) -> None:
        self.name = "HashEmbedder"


def test_consolidate_cli(store_dir: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr("retrieval.consolidate.SentenceEmbedder", NamedHashEmbedder)
    assert consolidate_main(["--store", str(store_dir)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{CID}: active AMUs 19 -> 13 | clusters 7 | archived 12 | created 6")
    assert out[1].startswith("audit ok: active 13 | forwarded 12")
    assert consolidate_main(["--store", str(store_dir), "--window-days", "100"]) == 0
    assert "archived 6 | created 3" in capsys.readouterr().out
    store, llm = ["--store", str(store_dir)], ["--store", str(store_dir), "--operator", "llm"]
    for argv, message, endpoint in [
        (["--store", str(tmp_path / "missing")], "no store at", None),
        ([*store, "--user", "nope"], "holds no user 'nope'", None),
        ([*store, "--threshold", "0"], "threshold 0.0 is not a cosine distance", None),
        ([*store, "--window-days", "inf"], "window_days inf must be positive and at most", None),
        (llm, "needs base_url", None),
        (llm, "'http://[::1/v1' is not a URL", "http://[::1/v1"),
        (llm, "is not an http(s) URL with a host", "localhost:8000/v1"),
        (llm, "'http://admin:***@127.0.0.1:99999/v1' is not a URL", "http://admin:pw42@127.0.0.1:99999/v1"),
        (llm, "'http://admin:***@[::1/v1' is not a URL", "http://admin:pw42@[::1/v1"),
        (llm, "'http://admin:***@127.0.0.1:8000/v1' is not a URL", "http://admin:pw42#x@127.0.0.1:8000/v1"),
    ]:
        monkeypatch.delenv("ISQ_LLM_BASE_URL", raising=False)
        monkeypatch.setenv("ISQ_LLM_MODEL", "m")
        if endpoint is not None:
            monkeypatch.setenv("ISQ_LLM_BASE_URL", endpoint)
        assert consolidate_main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: ") and message in err and "pw42" not in err
    assert not (tmp_path / "missing").exists()


def duplicates_jsonl(path: Path) -> Path:
    """:func:`duplicate_turns` as the JSONL file ``retrieval.ingest --jsonl`` reads."""
    rows = [{"conversation_id": t.user_id, "session_id": t.session_id,
             "session_time": t.session_time.isoformat(), "speaker": t.speaker, "turn_id": t.turn_id,
             "text": t.text} for t in duplicate_turns()]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_ingest_cli_consolidates_in_the_background(tmp_path: Path, capsys, monkeypatch) -> None:
    """Each user's job runs once and its report is printed, however soon a job ends (here every
    job has ended when consolidate returns: asked again then, consolidate starts another)."""
    from retrieval.api.memory import Memory

    queue = Memory.consolidate

    def ended_at_once(memory: Memory, *, user_id: str, **options: object):
        job = queue(memory, user_id=user_id, **options)
        while job.state not in ("done", "failed"):
            time.sleep(0.02)
            job = memory.job(job.id, user_id=user_id)
        return job

    monkeypatch.setattr(Memory, "consolidate", ended_at_once)
    monkeypatch.setattr("retrieval.ingest.SentenceEmbedder", NamedHashEmbedder)
    path = duplicates_jsonl(tmp_path / "talk.jsonl")
    store = tmp_path / "store"
    assert ingest_main(["--jsonl", str(path), "--store", str(store), "--no-progress",
                        "--consolidate-in-background"]) == 0
    out = capsys.readouterr().out
    assert "AMUs written 19" in out and f"consolidation {CID}: active AMUs 19 -> 13 | archived" in out
    with AMUStore(store, read_only=True) as reader:
        assert reader.count(CID, include_archived=False) == 13 and audit(reader).ok
        # one job: the report printed is the consolidation's, not a second run's over its result
        assert [row.id for row in map(reader.job_row, (1, 2)) if row is not None] == [1]


def test_ingest_cli_says_a_job_ran_while_its_users_data_was_deleted(tmp_path: Path, capsys,
                                                                     monkeypatch) -> None:
    """Where another process deleted the user's data under the job (a forget through a server
    beside it), the job's counts are never shown: the line says why, not counts of None."""
    import retrieval.api.jobs as jobs

    consolidate = jobs.consolidate_user

    def forgotten_meanwhile(store, user, *args, **kwargs):
        report = consolidate(store, user, *args, **kwargs)
        store.purge(user)
        return report

    monkeypatch.setattr(jobs, "consolidate_user", forgotten_meanwhile)
    monkeypatch.setattr("retrieval.ingest.SentenceEmbedder", NamedHashEmbedder)
    assert ingest_main(["--jsonl", str(duplicates_jsonl(tmp_path / "talk.jsonl")), "--store",
                        str(tmp_path / "store"), "--no-progress", "--consolidate-in-background"]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("consolidation")]
    assert re.fullmatch(rf"consolidation {CID}: job [0-9a-f]+ done: the user's data was deleted meanwhile "
                        r"\(another process's delete or forget\)", line), line


def test_ingest_cli_names_a_refused_endpoint_as_its_jobs_failure(tmp_path: Path, capsys, monkeypatch) -> None:
    """A consolidation job the LLM endpoint refuses (a wrong key) ends failed with what to fix, and
    the command exits 1 (its turns are stored, a consolidation is not done), not 0 with counts of
    None."""
    monkeypatch.setattr("retrieval.ingest.SentenceEmbedder", NamedHashEmbedder)
    path = duplicates_jsonl(tmp_path / "talk.jsonl")
    with FakeChatServer(lambda body: (401, {"error": {"message": "bad key"}}, 0.0)) as server:
        monkeypatch.setenv("ISQ_LLM_BASE_URL", server.base_url)
        monkeypatch.setenv("ISQ_LLM_MODEL", "m")
        code = ingest_main(["--jsonl", str(path), "--store", str(tmp_path / "store"), "--no-progress",
                            "--consolidate-in-background", "llm"])
    out = capsys.readouterr().out.splitlines()
    assert code == 1 and any("AMUs written 19" in line for line in out)
    (line,) = [line for line in out if line.startswith("consolidation")]
    assert re.fullmatch(rf"consolidation {CID}: job [0-9a-f]+ failed: the LLM endpoint refused the memory's "
                        r"requests \(HTTP 401\): check ISQ_LLM_API_KEY \(the key\)", line), line
    with AMUStore(tmp_path / "store", read_only=True) as reader:
        assert reader.count(CID, include_archived=False) == 19


def test_a_merge_keeps_what_was_forwarded_into_its_members(tmp_path: Path, caplog) -> None:
    """A first merge names Max in its text but not in its entities; a later merge of it that drops
    Max is refused (the audit checks every forwarded AMU against the end of its chain), and the
    refusal's log line counts what it would lose without naming it."""
    user, first, later = "conv-x", datetime(2023, 5, 8, 10), datetime(2023, 5, 20, 10)
    walks = [Turn(user, "s1", "D1:1", "Ann", "I walk my dog Max in the park in the mornings.", first),
             Turn(user, "s1", "D1:2", "Bob", "That sounds like a lovely routine for you.", first),
             Turn(user, "s1", "D1:3", "Ann", "I walk my dog Max in the park in the mornings, really.", first)]
    answers = [{"operation": "MERGE", "text": "Ann walks Ann's dog Max in the park in the mornings.",
                "memory_type": "fact", "entities": ["Ann"]},
               {"operation": "MERGE", "text": "Ann walks the dog in the park in the mornings.",
                "memory_type": "fact", "entities": ["Ann"]}]
    with FakeChatServer(answering(*map(json.dumps, answers))) as server, \
            AMUStore(tmp_path / "store", role="consolidate") as store:
        operator = LLMOperator(server.base_url, "m", max_retries=0)
        ingest_turns(walks, store, HashEmbedder(), RuleExtractor(), progress=False)
        assert consolidate_user(store, user, HashEmbedder(), operator).created == 1
        again = Turn(user, "s2", "D2:1", "Ann", "I walk the dog in the park in the mornings, really.", later)
        ingest_turns([again], store, HashEmbedder(), RuleExtractor(), progress=False)
        with caplog.at_level(logging.INFO, logger="retrieval"):
            report = consolidate_user(store, user, HashEmbedder(), operator)
        assert (report.created, report.refused) == (0, 1) and audit(store).ok
        assert any("Max" in amu.text for amu in store.amus(user))
        refusals = [record.getMessage() for record in caplog.records if "refused" in record.getMessage()]
        assert refusals == ["conv-x: MERGE of 2 records refused (2 problems)"]
        assert not [record for record in caplog.records if "Max" in record.getMessage()]


def test_turns_stored_during_a_run_are_on_their_speakers_clock(tmp_path: Path) -> None:
    """A merge of a record from turns stored while the run is under way gets its prefix in the
    speaker's time zone, as a run after them would write it."""
    user, zone = "conv-z", timezone(timedelta(hours=9))
    first, late = datetime(2023, 5, 8, 10, tzinfo=zone), datetime(2023, 5, 21, 2, tzinfo=zone)  # 20 May UTC
    books = [Turn(user, "s1", "D1:1", "Ann", "I love hiking in the mountains with my dog Max.", first),
             Turn(user, "s1", "D1:2", "Bob", "Reading fantasy novels before bed relaxes me a lot.", first),
             Turn(user, "s1", "D1:3", "Ann", "What a nice way to end the day, I agree.", first),
             Turn(user, "s1", "D1:4", "Bob", "Reading fantasy novels before bed relaxes me a lot!", first)]
    hike = [Turn(user, "s2", "D2:1", "Ann", "I love hiking in the mountains with my dog Max.", late)]
    directory = tmp_path / "store"
    with AMUStore(directory) as writer:
        ingest_turns(books, writer, HashEmbedder(), RuleExtractor(), progress=False)

    class StoringMeanwhile(OfflineOperator):
        def decide(self, cluster):
            if hike:  # the first call: another writer stores a session meanwhile
                with AMUStore(directory) as other:
                    ingest_turns([hike.pop()], other, HashEmbedder(), RuleExtractor(), progress=False)
            return super().decide(cluster)

    with AMUStore(directory, role="consolidate") as store:
        consolidate_user(store, user, HashEmbedder(), StoringMeanwhile())
        merged = {amu.text for amu in store.amus(user) if ":c:" in amu.id and amu.source.speakers == ("Ann",)}
    assert merged == {"[2023-05-08 to 2023-05-21] Ann loves hiking in the mountains with Ann's dog Max."}


def test_an_llm_answer_may_add_a_bounded_number_of_keys() -> None:
    """Evidence nodes pair every entity with every tag: a merged record may have at most
    MAX_WRITTEN_KEYS tags (or entities, timestamps) more than its members have together."""
    cluster = [member("a1", "Ann loves tea."), member("a2", "Ann loves tea!")]
    answers = [dict(ANSWERS["MERGE"], text="Ann loves tea.", tags=[f"t{i}" for i in range(count)])
               for count in (MAX_WRITTEN_KEYS + 1, MAX_WRITTEN_KEYS)]
    with FakeChatServer(answering(*map(json.dumps, answers))) as server:
        operator = LLMOperator(server.base_url, "m", max_retries=0)
        assert operator.decide(cluster) is None  # one tag too many: unusable
        (draft,) = operator.decide(cluster)
    assert len(draft.tags) == MAX_WRITTEN_KEYS and len(server.requests) == 2


def test_an_answer_with_an_unusable_time_is_logged_without_what_it_says(caplog) -> None:
    """An event time the endpoint wrote in words restates what the user said; the warning for the
    unusable answer says which field is wrong, never the value (the log is kept and read apart
    from the store, and no delete reaches it)."""
    cluster = [member("a1", "Ann got her test results."), member("a2", "Ann got her test results!")]
    answer = dict(ANSWERS["MERGE"], text="Ann got her test results.",
                  timestamps=["when Ann told Bob about her HIV test"])
    with FakeChatServer(answering(json.dumps(answer))) as server, \
            caplog.at_level(logging.INFO, logger="retrieval"):
        operator = LLMOperator(server.base_url, "m", max_retries=0)
        assert operator.decide(cluster) is None
    said = [record.getMessage() for record in caplog.records]
    assert said == ["cluster a1 (+1) attempt 1: unusable answer: timestamps: a value is not an ISO 8601 "
                    "time value"], said
    assert not [line for line in said if "HIV" in line or "told" in line]


def test_the_summary_line_counts_clusters_no_answer_came_for() -> None:
    """An endpoint that answered none of the clusters reads otherwise than KEEP answers."""
    report = ConsolidationReport(CID, "llm:m", 0.25, clusters=2, unanswered=2)
    assert "clusters 2 |" in report.summary() and "merges refused 0, unanswered 2 |" in report.summary()
