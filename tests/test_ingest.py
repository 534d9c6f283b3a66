"""Ingestion end to end: segmentation + extraction + store, crash/resume, LoCoMo and JSONL input,
malformed files, the command line."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import zlib
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from retrieval import Memory
from retrieval.api.batch import IngestError, ingest_turns
from retrieval.api.bulk import add_conversation
from retrieval.eval.locomo import load_locomo
from retrieval.extract.rules import RuleExtractor
from retrieval.ingest import main, warn_unservable
from retrieval.ingestion.segmenter import SegmenterConfig
from retrieval.ingestion.turns_jsonl import read_turns_jsonl
from retrieval.memory.records import InputFormatError, Turn
from retrieval.memory.store import AMUStore

REPO = Path(__file__).resolve().parents[1]
WHEN = datetime(2023, 5, 8, 13, 56)


class HashEmbedder:
    """Deterministic bag-of-words embedder (crc32 buckets, stable across processes)."""

    dim = 64

    def encode(self, texts):
        vectors = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().split():
                vectors[row, zlib.crc32(word.strip(".,!?:").encode()) % self.dim] += 1.0
        return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


TOPICS = {
    "garden": "I planted tomatoes and basil in my garden, the soil and compost matter",
    "race": "I ran a charity race for mental health, the race was long and rewarding",
    "guitar": "I practice acoustic guitar chords every evening and learn new songs",
}


def conversation_turns(user_id: str = "conv-a") -> list[Turn]:
    """Two sessions of alternating speakers with topic changes inside."""
    plan = [("s1", ["garden"] * 6 + ["race"] * 6), ("s2", ["guitar"] * 6 + ["garden"] * 4)]
    turns = []
    for number, (session, topics) in enumerate(plan, start=1):
        for index, topic in enumerate(topics):
            speaker = ("Ann", "Bob")[index % 2]
            text = f"{TOPICS[topic]} yesterday, number {index}."
            turns.append(Turn(user_id, session, f"D{number}:{index + 1}", speaker, text, WHEN))
    return turns


def snapshot(store: AMUStore) -> list[tuple]:
    return [(a.id, a.text, a.source.turn_ids, a.source.session_id, a.fingerprint) for a in store.amus()]


class FailingExtractor(RuleExtractor):
    """Raises on the n-th extraction call (a crash in the middle of an ingest)."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.calls = 0
        self.fail_at = fail_at

    def extract(self, segment, context):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("extractor crashed")
        return super().extract(segment, context)


def ingest_and_die(store_dir: str, where: str, segment: int) -> None:
    """Run in a subprocess: SIGKILL itself while extracting, or inside the commit transaction of,
    the given segment (after one of its AMUs was inserted)."""
    from retrieval.memory import record_writes
    from retrieval.memory.store import AMUStore as Store

    class KillingExtractor(RuleExtractor):
        def extract(self, seg, context):
            if where == "extract" and seg.seq == segment:
                os.kill(os.getpid(), signal.SIGKILL)
            return super().extract(seg, context)

    insert = record_writes.insert_amu

    def insert_then_die(db, amu):
        insert(db, amu)
        if where == "commit" and amu.source.segment == segment:
            os.kill(os.getpid(), signal.SIGKILL)

    record_writes.insert_amu = insert_then_die
    with Store(store_dir) as store:
        ingest_turns(conversation_turns(), store, HashEmbedder(), KillingExtractor(), progress=False)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[tuple]:
    """The AMUs of an uninterrupted ingest."""
    with AMUStore(tmp_path_factory.mktemp("clean")) as store:
        stats = ingest_turns(conversation_turns(), store, HashEmbedder(), RuleExtractor(), progress=False)
        assert stats.segments >= 4 and stats.resumed_segments == 0
        return snapshot(store)


def test_ingest_turns_stores_every_segment(tmp_path, reference):
    turns = conversation_turns()
    with AMUStore(tmp_path) as store:
        stats = ingest_turns(turns, store, HashEmbedder(), RuleExtractor(), progress=False)
        assert snapshot(store) == reference
        segments = store.segments("conv-a")
        assert [t for s in segments for t in s.turn_ids] == [t.turn_id for t in turns]
        assert {s.session_id for s in segments} == {"s1", "s2"}
        assert (stats.turns, stats.sessions, stats.conversations, stats.amus) == (22, 2, 1, len(reference))
        assert stats.exchanges == 11 and stats.mean_exchanges_per_segment == pytest.approx(11
                                                                                           / stats.segments)
        amu = next(store.amus())
        assert "on 7 May 2023" in amu.text and amu.timestamps == ("2023-05-07",)
        assert store.source_turns(amu)[0].text.endswith("yesterday, number 0.")
        summary = stats.summary()
        assert "mean exchanges/segment" in summary and "LLM calls 0" in summary


class FallingBackExtractor(RuleExtractor):
    """The rule extractor with every odd segment kept as raw turns (as an LLM endpoint that is
    down leaves it)."""

    name = "rule-falling-back"

    def extract(self, segment, context):
        extraction = super().extract(segment, context)
        return dataclasses.replace(extraction, fallback=True) if segment.seq % 2 else extraction


def test_the_memory_path_counts_fallbacks_and_unresolved_dates_as_the_batch_path_does(tmp_path):
    """``retrieval.ingest`` and the evaluation add through :func:`add_conversation`: its summary
    counts the segments that fell back to raw turns and the date phrases kept unresolved."""
    turns = conversation_turns()
    turns[3] = dataclasses.replace(turns[3], text="I visited the pyramids 1000000 days ago, number 3.")
    with AMUStore(tmp_path / "batch") as store:
        batch = ingest_turns(turns, store, HashEmbedder(), FallingBackExtractor(), progress=False)
    with Memory.open(tmp_path / "memory", embedder=HashEmbedder(), extractor=FallingBackExtractor()) as mem:
        added = add_conversation(mem, turns)
    assert batch.segments == added.segments and batch.segments >= 3
    assert added.fallback_segments == batch.fallback_segments == batch.segments // 2
    assert added.unresolved_dates == batch.unresolved_dates == 1
    assert f"raw-turn fallback segments {batch.segments // 2} |" in added.summary()


class CrossingExtractor(FallingBackExtractor):
    """User b's segments (all fallbacks) are extracted while user a's first segment is: b's wait
    until a's begins, and a's ends only after b's first has."""

    name = "rule-crossing"

    def __init__(self) -> None:
        super().__init__()
        self.b_may_go, self.b_done = threading.Event(), threading.Event()

    def extract(self, segment, context):
        if segment.user_id == "b":
            assert self.b_may_go.wait(60)
            extraction = dataclasses.replace(super().extract(segment, context), fallback=True)
            self.b_done.set()
            return extraction
        self.b_may_go.set()
        assert self.b_done.wait(60)
        return super().extract(segment, context)


def test_a_runs_counts_are_its_own_users_while_another_user_is_extracted_beside_it(tmp_path):
    """``add_conversation`` reports the fallbacks of the users it adds, not those another thread's
    flush (or the ingestion worker) extracted for another user meanwhile."""
    with Memory.open(tmp_path, embedder=HashEmbedder(), extractor=CrossingExtractor()) as mem:
        mem.add([dataclasses.replace(t, user_id="b") for t in conversation_turns()[:12]], user_id="b",
                session_id="s1")
        flushing = threading.Thread(target=mem.flush, kwargs={"user_id": "b", "session_id": "s1"})
        flushing.start()
        stats = add_conversation(mem, conversation_turns("a"))
        flushing.join(60)
        own = sum(segment.fallback for segment in mem.store.segments("a"))
        assert any(segment.fallback for segment in mem.store.segments("b"))
        assert stats.fallback_segments == own


def test_an_empty_caption_is_stored_as_none_as_add_stores_it(tmp_path):
    turns = conversation_turns()
    turns[0] = dataclasses.replace(turns[0], image_caption="")
    with AMUStore(tmp_path) as store:
        ingest_turns(turns, store, HashEmbedder(), RuleExtractor(), progress=False)
        assert store.turns("conv-a")[0].image_caption is None


def test_crash_mid_ingest_then_resume_without_duplicates(tmp_path, reference):
    turns = conversation_turns()
    with AMUStore(tmp_path) as store:
        with pytest.raises(RuntimeError, match="extractor crashed"):
            ingest_turns(turns, store, HashEmbedder(), FailingExtractor(fail_at=3), progress=False)
        assert len(store.segments("conv-a")) == 2
        stats = ingest_turns(turns, store, HashEmbedder(), RuleExtractor(), progress=False)
        assert stats.resumed_segments == 2 and stats.amus == len(reference) - len(
            [u for u in reference if u[0].split(":")[1] in ("0", "1")])
        assert snapshot(store) == reference
        again = ingest_turns(turns, store, HashEmbedder(), RuleExtractor(), progress=False)
        assert again.amus == 0 and again.resumed_segments == again.segments
        assert snapshot(store) == reference


@pytest.mark.parametrize("where", ["extract", "commit"])
def test_killed_process_resumes_without_loss(tmp_path, reference, where):
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import test_ingest; "
            f"test_ingest.ingest_and_die({str(tmp_path)!r}, {where!r}, 2)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, timeout=300)
    assert result.returncode == -signal.SIGKILL, result.stderr.decode()[-2000:]
    with AMUStore(tmp_path) as store:
        assert [s.seq for s in store.segments("conv-a")] == [0, 1]  # segment 2 lost entirely
        assert {a.source.segment for a in store.amus()} == {0, 1}
        ingest_turns(conversation_turns(), store, HashEmbedder(), RuleExtractor(), progress=False)
        assert snapshot(store) == reference


def test_other_segmenter_settings_keep_the_stored_segments(tmp_path, reference):
    with AMUStore(tmp_path) as store:
        ingest_turns(conversation_turns(), store, HashEmbedder(), RuleExtractor(), progress=False)
        segments = store.segments("conv-a")
        again = ingest_turns(conversation_turns(), store, HashEmbedder(), RuleExtractor(),
                             config=SegmenterConfig(max_exchanges=2), progress=False)
        assert again.amus == 0 and again.resumed_segments == again.segments == len(segments)
        assert store.segments("conv-a") == segments and snapshot(store) == reference


def test_a_stored_turn_given_with_another_text_is_refused(tmp_path):
    turns = conversation_turns()
    edited = [*turns[:5], dataclasses.replace(turns[5], text="I planted roses."), *turns[6:]]
    with AMUStore(tmp_path) as store:
        ingest_turns(turns[:8], store, HashEmbedder(), RuleExtractor(), progress=False)
        before = snapshot(store), store.turns("conv-a")
        with pytest.raises(IngestError, match="'conv-a' turn 'D1:6': the input's text differs"):
            ingest_turns(edited, store, HashEmbedder(), RuleExtractor(), progress=False)
        assert (snapshot(store), store.turns("conv-a")) == before


def test_fingerprints_are_stored(tmp_path):
    class FakeFingerprinter:
        def fingerprint(self, texts):
            return [SimpleNamespace(sequence=(len(t) % 7, 3), codes=frozenset({len(t) % 7, 3}))
                    for t in texts]

    with AMUStore(tmp_path) as store:
        ingest_turns(conversation_turns(), store, HashEmbedder(), RuleExtractor(),
                     fingerprinter=FakeFingerprinter(), progress=False)
        assert all(a.fingerprint == (len(a.text) % 7, 3) for a in store.amus())


def test_sessions_must_be_contiguous(tmp_path):
    turns = conversation_turns()
    shuffled = turns[:2] + turns[-2:] + turns[2:4]
    with AMUStore(tmp_path) as store, pytest.raises(IngestError, match="continues"):
        ingest_turns(shuffled, store, HashEmbedder(), RuleExtractor(), progress=False)


@pytest.mark.parametrize(("change", "message"), [
    ({"user_id": "u" * 200}, "conversation_id has 200 characters; the limit is 128"),
    ({"session_id": "s1\x00"}, "session_id 's1\\x00' holds a control character"),
    ({"speaker": "A\x01"}, "field 'speaker' 'A\\x01' holds a control character or line break"),
    ({"text": "x" * 20_001},
     "field 'text' has 20001 characters; the limit is 20000 (split it into several turns)"),
])
def test_the_batch_path_refuses_what_the_memory_refuses_before_storing_anything(tmp_path, change, message):
    """A turn the memory could never read, search or forget by id is refused at ingestion, naming
    where it is; nothing is stored."""
    turns = conversation_turns()
    turns[5] = dataclasses.replace(turns[5], **change)
    with AMUStore(tmp_path) as store:
        with pytest.raises(IngestError) as refused:
            ingest_turns(turns, store, HashEmbedder(), RuleExtractor(), progress=False)
        assert str(refused.value).endswith(f"turn 'D1:6': {message}")
        assert store.users_with_segments() == [] and list(store.amus()) == []


# -- LoCoMo -----------------------------------------------------------------------------------


def locomo_fixture() -> list[dict]:
    def session(number, texts):
        return [{"speaker": ("Caroline", "Melanie")[i % 2], "dia_id": f"D{number}:{i + 1}", "text": text}
                for i, text in enumerate(texts)]

    first = session(1, ["I went to a support group yesterday, it was powerful.",
                        "That is great! I painted a lake sunrise last year.",
                        "I love your painting colours so much."])
    first[1].update(img_url=["http://x/y.jpg"], blip_caption="a photo of a sunset over a lake",
                    query="sunrise")
    conversation = {
        "speaker_a": "Caroline", "speaker_b": "Melanie",
        "session_1_date_time": "1:56 pm on 8 May, 2023", "session_1": first,
        "session_10_date_time": "10:37 am on 27 June, 2023",
        "session_10": session(10, ["I took my kids camping in the mountains last week.",
                                   "Camping sounds wonderful, I want to join next month."]),
        "session_2_date_time": "1:14 pm on 25 May, 2023",
        "session_2": session(2, ["I ran a charity race for mental health last Saturday."]),
        "session_11_date_time": "8:00 pm on 1 July, 2023",  # a date without turns: skipped
    }
    qa = [{"question": "When did Caroline go to the support group?", "answer": "7 May 2023",
           "evidence": ["D1:1"], "category": 2},
          {"question": "When did Melanie paint a sunrise?", "answer": 2022, "evidence": ["D1:2"],
           "category": 2},
          {"question": "What did Caroline paint?", "adversarial_answer": "nothing", "evidence": [],
           "category": 5}]
    return [{"sample_id": "conv-t", "conversation": conversation, "qa": qa, "event_summary": {}}]


def write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data, indent=1))
    return path


def test_load_locomo_orders_sessions_and_parses_fields(tmp_path):
    (conversation,) = load_locomo(write_json(tmp_path / "locomo.json", locomo_fixture()))
    assert conversation.conversation_id == "conv-t" and conversation.participants == ("Caroline", "Melanie")
    assert [s.session_id for s in conversation.sessions] == ["session_1", "session_2", "session_10"]
    assert conversation.sessions[2].time == datetime(2023, 6, 27, 10, 37)
    assert [t.turn_id for t in conversation.turns] == ["D1:1", "D1:2", "D1:3", "D2:1", "D10:1", "D10:2"]
    assert conversation.turns[1].image_caption == "a photo of a sunset over a lake"
    assert conversation.turns[3].session_time == datetime(2023, 5, 25, 13, 14)
    blank = locomo_fixture()
    blank[0]["conversation"]["session_1"][0]["blip_caption"] = "  "  # says nothing: no caption
    (read,) = load_locomo(write_json(tmp_path / "blank.json", blank))
    assert read.turns[0].image_caption is None and read.turns[1].image_caption is not None
    questions = conversation.questions
    assert questions[1].answer == "2022" and questions[1].evidence == ("D1:2",)
    assert questions[2].answer is None and questions[2].adversarial_answer == "nothing"
    assert questions[2].category == 5


def test_ingest_locomo_conversation(tmp_path):
    (conversation,) = load_locomo(write_json(tmp_path / "locomo.json", locomo_fixture()))
    with AMUStore(tmp_path / "store") as store:
        stats = ingest_turns(conversation.turns, store, HashEmbedder(), RuleExtractor(), progress=False)
        assert store.speakers("conv-t") == conversation.participants  # the extractor's participants
        amus = list(store.amus("conv-t"))
        assert stats.turns == 6 and stats.amus == len(amus) == 6
        assert [(a.source.session_id, a.source.turn_ids) for a in amus][:2] == [
            ("session_1", ("D1:1",)), ("session_1", ("D1:2",))]
        texts = {a.source.turn_ids[0]: a.text for a in amus}
        assert texts["D1:1"] == "Caroline went to a support group on 7 May 2023, it was powerful."
        assert texts["D1:2"] == ("That is great! Melanie painted a lake sunrise in 2022. "
                                 "[Melanie shares an image: a photo of a sunset over a lake]")
        assert texts["D1:3"] == "Caroline loves Melanie's painting colours so much."
        assert texts["D2:1"] == "Caroline ran a charity race for mental health on Saturday, 20 May 2023."
        assert texts["D10:1"] == ("Caroline took Caroline's kids camping in the mountains "
                                  "in the week before 27 June 2023.")
        assert store.get(amus[-1].id).timestamps == ("2023-07",)


# -- malformed input --------------------------------------------------------------------------


def test_malformed_locomo_names_file_and_place(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('[\n {"sample_id": "c",\n  "conversation": {,}\n }\n]')
    with pytest.raises(InputFormatError, match=r"broken\.json:3:\d+: invalid JSON"):
        load_locomo(broken)
    given = '"dia_id": "D1:1",'
    text = json.dumps(locomo_fixture()).replace(given, given + ' "text": "Unseen.",', 1)
    twice = tmp_path / "twice.json"
    twice.write_text(text)
    assert '"Unseen."' in text  # else the replacement found no turn to give a second text
    with pytest.raises(InputFormatError, match=r"twice\.json: key 'text' is given twice in one object"):
        load_locomo(twice)

    def mutated(change) -> Path:
        data = locomo_fixture()
        change(data[0])
        return write_json(tmp_path / "bad.json", [locomo_fixture()[0], data[0]])

    cases = [
        (lambda c: c["conversation"].pop("speaker_b"),
         r"\(conv-t\): conversation: missing field 'speaker_b'"),
        (lambda c: c["conversation"].update(session_2_date_time="someday"), r".*session_2_date_time"),
        (lambda c: c["conversation"]["session_1"][1].pop("text"),
         r".*session_1 turn 1: missing field 'text'"),
        (lambda c: c["conversation"]["session_2"][0].update(dia_id="D1:1"),
         r"\(conv-t\): duplicate dia_id 'D1:1'"),
        (lambda c: c.pop("qa"), r".*missing field 'qa'"),
        (lambda c: c["conversation"].update(speaker_b=c["conversation"]["speaker_a"] + " "),
         r".*field 'conversation.speaker_b': .* is speaker_a's name too"),
        (lambda c: c["conversation"].update(session_01=c["conversation"]["session_1"]),
         r".*fields 'conversation.session_1' and 'conversation.session_01' are the same session 1"),
        (lambda c: c["qa"][0].update(category="two"), r".*qa 0: field 'category' must be int"),
    ]
    for change, message in cases:
        with pytest.raises(InputFormatError, match=r"bad\.json: conversation 1 " + message):
            load_locomo(mutated(change))
    padded = locomo_fixture()  # a session key written with a leading zero is that session, as written
    body = padded[0]["conversation"]
    body["session_01"], body["session_01_date_time"] = body.pop("session_1"), body.pop("session_1_date_time")
    (conversation,) = load_locomo(write_json(tmp_path / "padded.json", padded))
    assert [session.session_id for session in conversation.sessions][:2] == ["session_01", "session_2"]


def jsonl_line(**overrides) -> str:
    row = {"session_id": "s1", "session_time": "2023-05-08T13:56:00", "speaker": "Ann", "turn_id": "t1",
           "text": "I planted basil yesterday."}
    row.update(overrides)
    return json.dumps({k: v for k, v in row.items() if v is not None})


def test_read_turns_jsonl(tmp_path):
    path = tmp_path / "talk.jsonl"
    path.write_text("\n".join([jsonl_line(), "",
                               jsonl_line(turn_id="t2", speaker="Bob", image_caption="a dog"),
                               jsonl_line(turn_id="t3", session_id="s2", session_time="2023-05-09T10:00:00",
                                          conversation_id="other")]) + "\n")
    turns = read_turns_jsonl(path)
    assert [(t.user_id, t.session_id, t.turn_id) for t in turns] == [
        ("talk", "s1", "t1"), ("talk", "s1", "t2"), ("other", "s2", "t3")]
    assert turns[1].image_caption == "a dog" and turns[0].session_time == WHEN


def test_a_jsonl_session_s_turns_keep_their_own_times(tmp_path):
    """As the memory's add takes them: a session that runs past midnight is one session."""
    path = tmp_path / "talk.jsonl"
    path.write_text("\n".join([jsonl_line(session_time="2023-05-08T23:50:00"),
                               jsonl_line(turn_id="t2", session_time="2023-05-09T00:10:00+02:00")]) + "\n")
    turns = read_turns_jsonl(path)
    assert [turn.session_id for turn in turns] == ["s1", "s1"]
    assert [turn.session_time.isoformat() for turn in turns] == ["2023-05-08T23:50:00", "2023-05-08T22:10:00"]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([jsonl_line(), "{oops", jsonl_line(turn_id="t3")], r"talk\.jsonl:2:2: invalid JSON"),
        ([jsonl_line(), jsonl_line(turn_id="t2", text=None)],
         r"talk\.jsonl:2: 'text' is a required property"),
        ([jsonl_line(speaker=7)], r"talk\.jsonl:1: field 'speaker': 7 is not of type 'string'"),
        ([jsonl_line(session_time="8 May")], r"talk\.jsonl:1: field 'session_time': '8 May' is not an ISO"),
        ([jsonl_line(), jsonl_line()], r"talk\.jsonl:2: duplicate turn_id 't1'"),
        ([jsonl_line(), jsonl_line(turn_id="t2", session_id="s2"), jsonl_line(turn_id="t3")],
         r"talk\.jsonl:3: session 's1' continues"),
        (["[1, 2]"], r"talk\.jsonl:1: \[1, 2\] is not of type 'object'"),
        ([jsonl_line(text="w" * 30_000)],
         r"talk\.jsonl:1: field 'text': 'w{60}'… \(30000 characters\) is too long$"),
        ([jsonl_line(image_captoin="a red kayak")],
         r"talk\.jsonl:1: field 'image_captoin': not a field of a turn line; its fields are conversation_id"),
        ([jsonl_line(time="2023-05-08T10:00:00")],
         r"talk\.jsonl:1: field 'time': not a field of a turn line \(the stream calls it session_time\)"),
        ([jsonl_line()[:-1] + ', "text": "I planted mint."}'],
         r"talk\.jsonl:1: key 'text' is given twice in one object; give each key once$"),
        (["[" * 100_000 + "]" * 100_000], r"talk\.jsonl:1: JSON nested too deep to read$"),
        ([jsonl_line()[:-1] + ', "n": ' + "7" * 5000 + "}"],
         r"talk\.jsonl:1: a number of more than 4300 digits$"),
    ],
)
def test_malformed_jsonl_names_file_and_line(tmp_path, lines, message):
    path = tmp_path / "talk.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputFormatError, match=message):
        read_turns_jsonl(path)


def test_cli_reports_malformed_input_in_one_line(tmp_path, capsys):
    path = tmp_path / "talk.jsonl"
    path.write_text(jsonl_line() + "\n{oops\n")
    assert main(["--jsonl", str(path), "--store", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}:2:2: invalid JSON" in err
    assert main(["--locomo", str(tmp_path / "missing.json"), "--store", str(tmp_path / "store")]) == 2
    assert "missing.json: cannot read" in capsys.readouterr().err
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    assert main(["--locomo", str(deep), "--store", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {deep}: JSON nested too deep to read\n"


def test_cli_refuses_a_bad_turn_naming_where_it_is_before_making_a_store(tmp_path, capsys):
    path = tmp_path / "talk.jsonl"
    path.write_text(jsonl_line() + "\n" + jsonl_line(turn_id="t2", text="   ") + "\n")
    assert main(["--jsonl", str(path), "--store", str(tmp_path / "store")]) == 2
    assert capsys.readouterr().err == (f"error: {path}: conversation 'talk', session 's1', turn 't2': "
                                       "field 'text' must be a non-empty string, got '   '\n")
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize(("fields", "where", "message"), [
    ({"conversation_id": "u" * 129}, "conversation 'uuu",
     "conversation_id has 129 characters; the limit is 128"),
    ({"session_id": "s\x01"}, "session 's\\x01'", "session_id 's\\x01' holds a control character"),
])
def test_cli_refuses_a_bad_user_or_session_id_before_making_a_store(tmp_path, capsys, fields, where, message):
    """The ids the memory will refuse are refused first, so no store is left bound to the run's models."""
    path = tmp_path / "talk.jsonl"
    path.write_text(jsonl_line(**fields) + "\n")
    assert main(["--jsonl", str(path), "--store", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and where in err and err.endswith(f"turn 't1': {message}\n")
    assert not (tmp_path / "store").exists()


def test_a_conversation_given_twice_is_refused_naming_its_sample_id(tmp_path):
    """One conversation is one user: given twice, its questions would count twice in an evaluation
    and its turns would be one add with every turn id twice."""
    twice = write_json(tmp_path / "twice.json", locomo_fixture() + locomo_fixture())
    with pytest.raises(InputFormatError, match=r"twice\.json: conversation 1: field 'sample_id': 'conv-t' is "
                                               r"also conversation 0's"):
        load_locomo(twice)


def test_a_time_finer_than_microseconds_is_refused_not_cut(tmp_path, capsys):
    path = tmp_path / "talk.jsonl"
    path.write_text(jsonl_line(session_time="2023-05-08T13:56:00.1234567") + "\n")
    assert main(["--jsonl", str(path), "--store", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err
    assert "field 'session_time'" in err and "at most 6 decimals" in err and err.count("\n") == 1
    assert not (tmp_path / "store").exists()


def test_ctrl_c_keeps_the_sessions_added_and_a_rerun_adds_the_rest(tmp_path, capsys, monkeypatch):
    """Interrupted after its first session, ingest says so in one line (status 130); the same
    command again stores every turn once."""
    import retrieval.ingest as ingest_module

    path = tmp_path / "talk.jsonl"
    turns = conversation_turns()
    path.write_text("\n".join(jsonl_line(session_id=t.session_id, turn_id=t.turn_id, speaker=t.speaker,
                                          text=t.text) for t in turns) + "\n")
    add = ingest_module.add_conversation

    def first_session_then_ctrl_c(memory, given, **options):
        add(memory, [t for t in given if t.session_id == given[0].session_id], **options)
        raise KeyboardInterrupt

    monkeypatch.setattr(ingest_module, "add_conversation", first_session_then_ctrl_c)
    command = ["--jsonl", str(path), "--store", str(tmp_path / "store"), "--no-progress"]
    assert main(command) == 130
    err = capsys.readouterr().err
    assert err.startswith("interrupted: the turns added so far are stored") and err.count("\n") == 1, err
    with AMUStore(tmp_path / "store", read_only=True) as store:
        assert 0 < len(store.turns("talk")) < len(turns)  # the file's name is its conversation
        kept = len(store.segments("talk"))
    monkeypatch.setattr(ingest_module, "add_conversation", add)
    assert main(command) == 0
    with AMUStore(tmp_path / "store", read_only=True) as store:
        assert [t.turn_id for t in store.turns("talk")] == [t.turn_id for t in turns]
        segments = len(store.segments("talk"))
    assert 0 < kept < segments and f"segments {segments} ({kept} already stored)" in capsys.readouterr().out


def test_cli_names_an_embedder_directory_that_is_not_there(tmp_path, capsys):
    path = tmp_path / "talk.jsonl"
    path.write_text(jsonl_line() + "\n")
    missing = tmp_path / "no-model"
    assert main(["--jsonl", str(path), "--store", str(tmp_path / "store"), "--embedder", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"embedder '{missing}': no such directory" in err
    assert not (tmp_path / "store").exists()


def test_cli_subprocess_exit_code_without_traceback(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('[{"sample_id": "c", "conversation": {}, "qa": []}]')
    result = subprocess.run([sys.executable, "-m", "retrieval.ingest", "--locomo", str(broken), "--store",
                             str(tmp_path / "store")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and result.stderr.strip().count("\n") == 0
    assert "broken.json: conversation 0 (c): conversation: missing field 'speaker_a'" in result.stderr


@pytest.mark.slow
def test_cli_ingests_jsonl_with_the_real_embedder(tmp_path, capsys):
    path = tmp_path / "talk.jsonl"
    rows = [jsonl_line(turn_id=t.turn_id, session_id=t.session_id, speaker=t.speaker, text=t.text)
            for t in conversation_turns()]
    path.write_text("\n".join(rows) + "\n")
    store_dir = tmp_path / "store"
    assert main(["--jsonl", str(path), "--store", str(store_dir), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "turns 22 | exchanges 11" in out and "AMUs written 22" in out and "wall time" in out
    with AMUStore(store_dir) as store:
        assert store.count("talk") == 22


def test_cli_names_an_embedder_the_hub_would_have_to_give_in_one_line_at_once(tmp_path, capsys, monkeypatch):
    """A name neither on disk nor in the Hugging Face cache, with no hub: refused in one line that
    says it is the embedder, not after the hub client's minute of retries."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr("isq.encoder._hub_reachable", lambda: False)
    path = tmp_path / "talk.jsonl"
    path.write_text(jsonl_line() + "\n")
    assert main(["--jsonl", str(path), "--store", str(tmp_path / "store"),
                 "--embedder", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "embedder: cannot load 'no-such-model'" in err
    assert "the Hugging Face hub cannot be reached" in err
    assert not (tmp_path / "store").exists()


def test_cli_names_an_embedder_directory_that_holds_no_model_in_one_line(tmp_path, capsys):
    path = tmp_path / "talk.jsonl"
    path.write_text(jsonl_line() + "\n")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("not a model")
    assert main(["--jsonl", str(path), "--store", str(tmp_path / "store"),
                 "--embedder", str(tmp_path / "notes")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"embedder '{tmp_path / 'notes'}': " in err and "Traceback" not in err
    assert not (tmp_path / "store").exists()


def test_an_embedder_from_the_hugging_face_cache_asks_the_hub_for_nothing(monkeypatch):
    """The cache attempt tells the transformer's adapter lookup too that it is local (transformers
    asks the hub for an adapter config otherwise: 24 s of retries with the hub unreachable)."""
    import sentence_transformers

    from retrieval.index.embed import SentenceEmbedder

    calls: list[dict] = []

    class Cached:
        def __init__(self, path, **kwargs):
            calls.append({"path": path, **kwargs})

        def get_sentence_embedding_dimension(self):
            return 8

    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", Cached)
    assert SentenceEmbedder("org/cached-model").dim == 8
    assert calls == [{"path": "org/cached-model", "local_files_only": True, "device": "cpu",
                      "model_kwargs": {"adapter_kwargs": {"local_files_only": True}}}]


def test_ids_no_url_can_name_are_stored_with_one_warning(tmp_path, capsys):
    """A conversation id with a space (a JSONL file's name), a turn id with a slash: the store keeps
    them for Python and retrieval.query, and the run says in one line that a server cannot reach
    them; ids a server can name say nothing."""
    source = tmp_path / "my talk.jsonl"
    warn_unservable(source, [Turn("my talk", "s 1", "D1/1", "Ann", "hi", None),
                             Turn("my talk", "s1", "D1:2", "Ann", "hi", None)])
    warning = capsys.readouterr().err
    assert warning.count("\n") == 1 and warning.startswith(
        f"warning: {source}: 1 conversation id(s) such as 'my talk', 1 session id(s) such as 's 1', "
        "1 turn id(s) such as 'D1/1' cannot be served over HTTP or MCP")
    warn_unservable(source, [Turn("conv-26", "session_1", "D1:3", "Ann", "hi", None)])
    assert capsys.readouterr().err == ""
