"""Ordinary date phrases never block ingestion, and a conversation with and without time-zone
offsets works through every command: real transcripts carry both."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

import retrieval.query as query_module
from retrieval.api.batch import IngestError, ingest_turns
from retrieval.consolidate import main as consolidate_main
from retrieval.extract.base import Extraction
from retrieval.extract.dates import resolve_dates, resolve_relative_dates
from retrieval.extract.rules import RuleExtractor
from retrieval.ingest import main as ingest_main
from retrieval.ingestion.turns_jsonl import read_turns_jsonl
from retrieval.memory.records import AMU, SourcePointer, Turn
from retrieval.memory.store import AMUStore
from retrieval.multi_route.bank import MemoryBank
from retrieval.multi_route.planner_rules import query_time
from tests.test_consolidation import NamedHashEmbedder
from tests.test_ingest import WHEN, HashEmbedder

# ---------------------------------------------------------------------------- 1. dates out of range

OUT_OF_RANGE = ["1000000 days ago", "200000 weeks ago", "30000 months ago", "9000 years ago"]


def test_a_distant_year_resolves_to_a_four_digit_iso_year():
    assert (resolve_relative_dates("a castle built 1500 years ago", WHEN)
            == ("a castle built in 523", ["0523"]))
    assert (resolve_relative_dates("That was 20000 months ago", WHEN)
            == ("That was in September 356", ["0356-09"]))
    assert query_time("What castle was built 1500 years ago?", WHEN).start == "0523"


@pytest.mark.parametrize("phrase", OUT_OF_RANGE)
def test_a_phrase_past_year_1_stays_text_without_a_date(phrase):
    text = f"It happened {phrase}, they say."
    assert resolve_relative_dates(text, WHEN) == (text, [])
    assert [found.value for found in resolve_dates(text, WHEN)[1]] == [None]


@pytest.mark.parametrize(("when", "phrase"), [
    (datetime(9999, 12, 31, 12), "tomorrow"), (datetime(9999, 12, 31, 12), "next year"),
    (datetime(9999, 12, 30, 12), "next weekend"), (datetime(1, 1, 1, 12), "yesterday"),
    (datetime(1, 1, 1, 12), "last week"), (datetime(1, 1, 1, 12), "last month"),
    (datetime(9999, 12, 31, 12), "this week"), (datetime(9999, 12, 31, 12), "next week"),
])
def test_the_edges_of_the_calendar_stay_text(when, phrase):
    """Past the calendar, or a week whose ISO value is written but not readable (9999's last week
    ends on 2 January 10000): the phrase stays as written, in a turn and in a question."""
    assert resolve_relative_dates(f"See you {phrase}.", when) == (f"See you {phrase}.", [])
    assert query_time(f"Who did I see {phrase}?", when) is None


def castle_turns() -> list[Turn]:
    texts = ["We toured a castle built 1500 years ago, amazing stone walls.",
             "My grandma painted landscapes 1000000 days ago in the old village house.",
             "Ancient people walked here 200000 weeks ago through the mountain pass.",
             "The library archives started 30000 months ago with handwritten books.",
             "The garden festival opens tomorrow with tulips and music."]
    return [Turn("conv-d", "s1", f"D1:{i + 1}", ("Ann", "Bob")[i % 2], text, WHEN)
            for i, text in enumerate(texts)]


def test_ingestion_stores_every_turn_and_counts_the_unresolved(tmp_path: Path):
    with AMUStore(tmp_path) as store:
        stats = ingest_turns(castle_turns(), store, HashEmbedder(), RuleExtractor(), progress=False)
        assert stats.turns == 5 and store.count() == 5 and stats.unresolved_dates == 3
        assert "date phrases kept unresolved (outside years 1-9999) 3" in stats.summary()
        castle = next(amu for amu in store.amus() if "castle" in amu.text)
        assert castle.timestamps == ("0523",) and castle.t_ref == "0523"
        late = [amu for amu in store.amus() if amu.source.turn_ids == ("D1:2",)][0]
        assert "1000000 days ago" in late.text and late.timestamps == ()


def test_an_edge_session_time_ingests(tmp_path: Path):
    turns = [Turn("conv-e", "s1", "D1:1", "Ann", "The rocket museum opens tomorrow with new exhibits.",
                  datetime(9999, 12, 31, 12)),
             Turn("conv-e", "s2", "D2:1", "Bob", "I visited the pottery studio yesterday, lovely glazes.",
                  datetime(1, 1, 1, 12)),
             Turn("conv-e", "s3", "D3:1", "Ann", "This week I renovated the kitchen with Bob.",
                  datetime(9999, 12, 31, 10))]
    with AMUStore(tmp_path) as store:
        stats = ingest_turns(turns, store, HashEmbedder(), RuleExtractor(), progress=False)
        assert store.count() == 3 and stats.unresolved_dates == 3


def test_an_invalid_record_names_the_conversation_and_turns(tmp_path: Path):
    class BadExtractor(RuleExtractor):
        def extract(self, segment, context):
            return Extraction([AMU("x", "text", "fact", SourcePointer(segment.user_id,
                                                                      segment.session_id,
                                                                      ("D1:1",)), timestamps=("523",))])

    with AMUStore(tmp_path) as store, \
            pytest.raises(IngestError, match=r"'conv-d' segment 0 \(turns D1:1\.\.D1:"):
        ingest_turns(castle_turns(), store, HashEmbedder(), BadExtractor(), progress=False)


# ---------------------------------------------------------------------------- 2. mixed time zones


def test_a_time_with_an_offset_is_stored_as_naive_utc():
    aware = datetime(2023, 5, 8, 13, 56, tzinfo=timezone(timedelta(hours=2)))
    assert Turn("c", "s", "t", "Ann", "hi", aware).session_time == datetime(2023, 5, 8, 11, 56)
    assert Turn("c", "s", "t", "Ann", "hi", WHEN).session_time == WHEN  # naive: taken as written


def mixed_jsonl(path: Path) -> Path:
    rows = [("s1", "2023-05-08T13:56:00+02:00", "Ann",
             "I planted tomatoes and basil in my garden yesterday."),
            ("s1", "2023-05-08T13:56:00+02:00", "Bob", "I ran a charity race for mental health last week."),
            ("s2", "2023-05-20T09:00:00", "Ann", "My tomatoes and basil in the garden are growing well."),
            ("s2", "2023-05-20T09:00:00", "Bob", "I signed up for another charity race next month."),
            ("s3", "2023-06-01T08:00:00-05:00", "Ann", "I started pottery classes with clay and glaze.")]
    path.write_text("\n".join(json.dumps({"conversation_id": "conv-z", "session_id": s, "session_time": t,
                                          "speaker": who, "turn_id": f"D{i}", "text": text})
                              for i, (s, t, who, text) in enumerate(rows)) + "\n")
    return path


def test_mixed_offsets_work_through_ingest_consolidate_and_query(tmp_path: Path, capsys, monkeypatch):
    turns = read_turns_jsonl(mixed_jsonl(tmp_path / "talk.jsonl"))
    assert [t.session_time for t in turns][::2] == [datetime(2023, 5, 8, 11, 56), datetime(2023, 5, 20, 9),
                                                     datetime(2023, 6, 1, 13)]
    for module in ("retrieval.ingest", "retrieval.consolidate"):
        monkeypatch.setattr(f"{module}.SentenceEmbedder", NamedHashEmbedder)
    monkeypatch.setattr(query_module, "SentenceEmbedder", NamedHashEmbedder)
    store = str(tmp_path / "store")
    assert ingest_main(["--jsonl", str(tmp_path / "talk.jsonl"), "--store", store, "--no-progress"]) == 0
    assert consolidate_main(["--store", store, "--threshold", "0.9"]) == 0
    capsys.readouterr()
    assert query_module.main(["--store", store, "What did Ann plant in the garden?", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)["hits"]
    assert hits and {turn["time"] for hit in hits for turn in hit["source_turns"]} <= {
        "2023-05-08T11:56:00", "2023-05-20T09:00:00", "2023-06-01T13:00:00"}


def test_a_question_reads_its_relative_dates_on_the_latest_sessions_own_day(tmp_path: Path):
    """"Yesterday" in a question is the day before the latest session's date on its speaker's
    clock, as in the records: at 08:00 in Tokyo on 8 May (23:00 UTC on 7 May) it is 7 May. The
    latest session is the latest in UTC, whatever the order the turns came in."""
    tokyo, new_york = timezone(timedelta(hours=9)), timezone(timedelta(hours=-5))
    turns = [Turn("conv-t", "s2", "D2:1", "Ann", "Yesterday I went hiking in the hills.",
                  datetime(2023, 5, 8, 8, tzinfo=tokyo)),
             Turn("conv-t", "s1", "D1:1", "Ann", "I repaired my bicycle today.",
                  datetime(2023, 5, 7, 20, tzinfo=new_york))]  # 01:00 UTC on 8 May: later still
    with AMUStore(tmp_path) as store:
        ingest_turns(turns[:1], store, HashEmbedder(), RuleExtractor(), progress=False)
        bank = MemoryBank.build(store, "conv-t", HashEmbedder())
        hiking = next(amu for amu in store.amus("conv-t") if "hiking" in amu.text)
    assert hiking.t_ref == "2023-05-07" and bank.context.now == datetime(2023, 5, 8, 8)
    assert query_time("What did Ann do yesterday?", bank.context.now).start == "2023-05-07"
    bank.add_turns(turns[1:])
    assert bank.context.now == datetime(2023, 5, 7, 20)  # New York's clock, the latest in UTC
    bank.add_turns([dataclasses.replace(turns[0], turn_id="D2:2")])  # an earlier one changes nothing
    assert bank.context.now == datetime(2023, 5, 7, 20)
