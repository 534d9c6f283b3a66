"""LoCoMo evaluation: evidence parsing, recall/hit arithmetic, categories, configurations, the
results schema, a tiny end-to-end run (and its rerun on the stored memory), CLI errors and the
answer stage against a local fake OpenAI-style endpoint."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import retrieval.evaluate as evaluate_module
from isq.fingerprint import Fingerprinter
from isq.model import ISQModel
from isq.topology import TopologyParams
from retrieval.api.errors import MemoryAPIError
from retrieval.contract import Hit
from retrieval.eval.answers import JUDGE_PROMPT, _parse_verdict, locomo_f1, normalize_answer
from retrieval.eval.configs import EvaluationError, RetrievalConfig, default_configs, parse_config, sweep_grid
from retrieval.eval.dual_path import Channel, DualPathMode
from retrieval.eval.locomo import load_locomo
from retrieval.eval.metrics import covered_turns, score_evidence, summarise, tied_at_cut
from retrieval.eval.questions import EvidenceReport, parse_evidence, select_questions
from retrieval.eval.render import render_markdown
from retrieval.eval.results import SweepRow, TopologySetting, read_results
from retrieval.eval.run import EvalModels, EvaluationSettings, evaluate
from retrieval.evaluate import DEFAULT_FINGERPRINTER, main, trained_fingerprinter
from retrieval.memory.backends import open_store
from retrieval.memory.cache import model_identity
from retrieval.memory.fingerprinter_source import remember_fingerprinter
from tests.conftest import tiny_config
from tests.fake_chat import FakeChatServer, completion_body

# -- a small LoCoMo-format conversation with known evidence -----------------------------------

SESSION_1 = [
    "Anna", "I just got back from a trip to Lisbon with my sister.",
    "Ben", "Lisbon sounds amazing, what did you see there?",
    "Anna", "We walked around Alfama and I bought a blue scarf at the market.",
    "Ben", "I adopted a dog last week, a little beagle.",
    "Anna", "What is the beagle called?",
    "Ben", "His name is Biscuit and he loves chasing pigeons.",
    "Anna", "Biscuit is a great name for a beagle.",
    "Ben", "I am training him to sit before dinner every evening.",
]
SESSION_2 = [
    "Ben", "Biscuit learned to sit and to roll over this month.",
    "Anna", "I started hiking in the mountains on weekends.",
    "Ben", "Which trail did you hike first?",
    "Anna", "The ridge trail near the lake, it took five hours.",
    "Ben", "I want to take Biscuit hiking with you some time.",
    "Anna", "Sure, I also cooked a big pot of lentil soup after the hike.",
    "Ben", "Lentil soup is my favourite winter dinner.",
    "Anna", "I will bring the recipe to the book club on Friday.",
]


def _turns(session: int, script: list[str]) -> list[dict]:
    return [{"speaker": script[i], "dia_id": f"D{session}:{i // 2 + 1}", "text": script[i + 1]}
            for i in range(0, len(script), 2)]


QA = [
    {"question": "Where did Anna travel and what did she buy there?", "answer": "Lisbon, a blue scarf",
     "evidence": ["D1:1", "D1:3"], "category": 1},
    {"question": "When did Ben adopt his dog?", "answer": "the week before 8 May 2023", "evidence": ["D1:4"],
     "category": 2},
    {"question": "Would Anna enjoy a long walk outdoors?", "answer": "yes; she hikes",
     "evidence": ["D2:2;D2:4"], "category": 3},
    {"question": "What is the name of Ben's dog?", "answer": "Biscuit", "evidence": ["D 1:6"], "category": 4},
    {"question": "What did Anna cook after the hike?", "answer": "lentil soup", "evidence": ["D2: 6", "D9:1"],
     "category": 4},
    {"question": "What does Ben train the dog to do?", "answer": "sit", "evidence": ["D1"], "category": 4},
    {"question": "When is the book club?", "answer": "Friday", "evidence": [], "category": 2},
    {"question": "What did Ben buy in Lisbon?", "adversarial_answer": "a scarf", "evidence": ["D1:3"],
     "category": 5},
]
SCORED = {"multi-hop": 1, "temporal": 1, "open-domain": 1, "single-hop": 2}


def write_locomo(path) -> str:
    conversation = {
        "speaker_a": "Anna", "speaker_b": "Ben",
        "session_1_date_time": "1:56 pm on 8 May, 2023", "session_1": _turns(1, SESSION_1),
        "session_2_date_time": "10:00 am on 20 May, 2023", "session_2": _turns(2, SESSION_2),
    }
    path.write_text(json.dumps([{"sample_id": "conv-t", "conversation": conversation, "qa": QA}]))
    return str(path)


class HashEmbedder:
    """Deterministic bag-of-words vectors (signed feature hashing), L2-normalised."""

    name = "hash-bow"
    dim = 64

    def encode(self, texts):
        vectors = np.zeros((len(texts), self.dim), dtype=np.float32)
        vectors[:, 0] = 0.1  # never a zero vector
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                digest = int(hashlib.md5(word.encode()).hexdigest(), 16)
                vectors[row, 1 + digest % (self.dim - 1)] += 1.0 if digest >> 64 & 1 else -1.0
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def fingerprinter_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fingerprinters")
    dirs = {}
    for name, seed in (("trained", 0), ("kmeans", 1)):
        torch.manual_seed(seed)
        dirs[name] = ISQModel(tiny_config()).export_fingerprinter(root / name)
    return dirs


@pytest.fixture(scope="module")
def fingerprinters(fingerprinter_dirs):
    return {name: Fingerprinter.from_pretrained(path) for name, path in fingerprinter_dirs.items()}


# -- evidence, metrics, categories ------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "ids", "repaired", "unparsed"),
    [
        (["D1:3"], ("D1:3",), 0, 0),
        (["D1:3;D1:4"], ("D1:3", "D1:4"), 1, 0),
        (["D8:6; D9:17"], ("D8:6", "D9:17"), 1, 0),
        (["D 1:3"], ("D1:3",), 1, 0),
        (["D1: 3"], ("D1:3",), 1, 0),
        (["D30:05"], ("D30:5",), 1, 0),
        (["D:11:26"], ("D11:26",), 1, 0),
        (["D1"], (), 0, 1),
        ([""], (), 0, 1),
        (["D1:3", "D1:3", "D2:1"], ("D1:3", "D2:1"), 0, 0),
        ([], (), 0, 0),
    ],
)
def test_parse_evidence(raw, ids, repaired, unparsed):
    evidence = parse_evidence(raw)
    assert evidence.ids == ids
    assert (len(evidence.repaired), len(evidence.unparsed)) == (repaired, unparsed)


def test_recall_hit_and_complete_arithmetic():
    evidence = ("D1:1", "D1:2", "D2:5")
    partial = score_evidence(evidence, {"D1:2", "D3:1"})
    assert partial.recall == pytest.approx(1 / 3) and partial.hit and not partial.complete
    assert partial.found == ("D1:2",)
    assert score_evidence(evidence, {"D1:1", "D1:2", "D2:5", "D9:9"}).recall == 1.0
    miss = score_evidence(evidence, set())
    assert (miss.recall, miss.hit, miss.complete) == (0.0, False, False)
    with pytest.raises(ValueError):
        score_evidence((), {"D1:1"})


def test_summary_is_a_micro_average_over_questions():
    rows = [("multi-hop", {"recall": 1 / 3, "hit": 1.0}), ("multi-hop", {"recall": 1.0, "hit": 1.0}),
            ("temporal", {"recall": 0.0, "hit": 0.0})]
    summary = summarise(rows)
    assert summary["overall"] == {"recall": pytest.approx(4 / 9), "hit": pytest.approx(2 / 3), "n": 3}
    assert summary["by_category"]["multi-hop"] == {"recall": pytest.approx(2 / 3), "hit": 1.0, "n": 2}
    assert list(summary["by_category"]) == ["multi-hop", "temporal"]  # absent categories are left out


def test_covered_turns_come_from_source_pointers():
    hits = [Hit(id="a", text="a", score=0.9, kind="record", session_id="session_1", turns=("D1:1", "D1:2"),
                index=0, channel="dense", rank=1),
            Hit(id="b", text="b", score=0.5, kind="record", session_id="session_2", turns=("D2:4",),
                index=3, channel="code", rank=1)]
    assert covered_turns(hits) == {"D1:1", "D1:2", "D2:4"}


def test_ties_at_the_cut_of_the_complementary_path():
    def hit(path, score):
        return Hit(id="x", text="x", score=score, kind="record", session_id="s", turns=(), index=0,
                   channel=path, rank=1)

    hits = [hit("dense", 0.9), hit("code", 0.5), hit("code", 0.5), hit("code", 0.3), hit("code", 0.3),
            hit("code", 0.3)]
    assert tied_at_cut(hits) == pytest.approx(3 / 5)
    assert tied_at_cut(hits[:1]) is None


def test_question_selection_maps_categories_and_counts_evidence_problems(tmp_path):
    (conversation,) = load_locomo(write_locomo(tmp_path / "locomo.json"))
    report = EvidenceReport()
    questions = select_questions(conversation, report)
    assert [q.category_name for q in questions] == ["multi-hop", "temporal", "open-domain", "single-hop",
                                                    "single-hop"]
    assert [q.evidence for q in questions] == [("D1:1", "D1:3"), ("D1:4",), ("D2:2", "D2:4"), ("D1:6",),
                                               ("D2:6",)]
    assert report.skipped_categories == {5: 1}
    assert report.unscored == ["conv-t qa 5 (single-hop)", "conv-t qa 6 (temporal)"]  # "D1", the empty list
    assert (report.questions, report.evidence_ids) == (5, 7)
    assert report.repaired == ["conv-t qa 2: 'D2:2;D2:4'", "conv-t qa 3: 'D 1:6'", "conv-t qa 4: 'D2: 6'"]
    assert report.unparsed == ["conv-t qa 5: 'D1'"] and report.unknown_ids == ["conv-t qa 4: D9:1"]


def test_evidence_names_turns_as_the_conversation_spells_their_ids(tmp_path):
    """A release whose dia_ids carry leading zeros (``D1:03``) keeps its questions: evidence is
    matched in canonical form and kept in the conversation's spelling, which the hits carry."""
    write_locomo(tmp_path / "locomo.json")
    data = json.loads((tmp_path / "locomo.json").read_text())
    for key, turns in data[0]["conversation"].items():
        if key.startswith("session_") and isinstance(turns, list):
            for turn in turns:
                session, number = turn["dia_id"][1:].split(":")
                turn["dia_id"] = f"D{session}:{int(number):02d}"
    (tmp_path / "padded.json").write_text(json.dumps(data))
    (conversation,) = load_locomo(tmp_path / "padded.json")
    report = EvidenceReport()
    questions = select_questions(conversation, report)
    assert [q.evidence for q in questions] == [("D1:01", "D1:03"), ("D1:04",), ("D2:02", "D2:04"), ("D1:06",),
                                               ("D2:06",)]
    assert report.unknown_ids == ["conv-t qa 4: D9:1"]


# -- configurations ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("dense20", RetrievalConfig("dense20", 20, None, DualPathMode(None, 0))),
        ("code40", RetrievalConfig("code40", 40, "trained", DualPathMode(Channel.CODE, 0))),
        ("kmeans40", RetrievalConfig("kmeans40", 40, "kmeans", DualPathMode(Channel.CODE, 0))),
        ("bm25_40", RetrievalConfig("bm25_40", 40, None, DualPathMode(Channel.BM25, 0))),
        ("dense20+code20", RetrievalConfig("dense20+code20", 40, "trained", DualPathMode(Channel.CODE, 20))),
        ("dense20+kmeans20",
         RetrievalConfig("dense20+kmeans20", 40, "kmeans", DualPathMode(Channel.CODE, 20))),
        ("dense20+bm25_20", RetrievalConfig("dense20+bm25_20", 40, None, DualPathMode(Channel.BM25, 20))),
        ("multi", RetrievalConfig("multi", 40)),
        ("multi+code", RetrievalConfig("multi+code", 40, "trained")),
    ],
)
def test_parse_config(name, expected):
    assert parse_config(name) == expected


@pytest.mark.parametrize("name",
                         ["dense", "code20+dense20", "dense20+dense20", "bm2520", "dense20+code20+bm25_5"])
def test_bad_config_names_are_rejected(name):
    with pytest.raises(ValueError, match="unknown configuration"):
        parse_config(name)


@pytest.mark.parametrize("name", ["dense0", "code0", "dense20+bm25_0", "dense0+code20"])
def test_a_part_of_no_items_is_rejected(name):
    with pytest.raises(ValueError, match=f"configuration '{re.escape(name)}': each K must be at least 1"):
        parse_config(name)


def test_default_configs_share_one_budget():
    names = default_configs(20, 20, with_kmeans=True)
    assert names == ["dense20", "dense40", "dense20+code20", "dense20+bm25_20", "code40", "dense20+kmeans20",
                     "multi", "multi+code", "multi+kmeans"]
    assert {parse_config(n).k for n in names} == {20, 40} and "dense20+kmeans20" not in default_configs()
    assert "multi+kmeans" not in default_configs()
    assert parse_config("multi+kmeans") == RetrievalConfig("multi+kmeans", 40, "kmeans")
    assert parse_config("multi+code", 12).k == 12 and parse_config("multi+code").uses_codes
    grid = sweep_grid()
    assert len(grid) == 36 and len({(p.max_hops, p.alpha, p.self_term, p.aggregate) for p in grid}) == 36


# -- answer scoring ---------------------------------------------------------------------------


def test_locomo_f1():
    assert normalize_answer("The cat, and a Dog!") == "cat dog"
    assert locomo_f1("a blue scarf", "Blue scarf", 4) == 1.0
    assert locomo_f1("blue hat", "blue scarf", 4) == pytest.approx(0.5)
    assert locomo_f1("Lisbon", "Lisbon, a blue scarf", 1) == pytest.approx(0.5)  # per sub-answer
    assert locomo_f1("yes", "yes; she hikes", 3) == 1.0  # open-domain: gold before ';'
    assert locomo_f1("", "Biscuit", 4) == 0.0


# -- end to end -------------------------------------------------------------------------------


def _check_block(block):
    assert {"recall", "hit", "n"} <= set(block)
    assert (isinstance(block["recall"], float) and isinstance(block["hit"], float)
            and isinstance(block["n"], int))
    assert 0.0 <= block["recall"] <= 1.0 and 0.0 <= block["hit"] <= 1.0


def check_schema(results, configs):
    assert set(results["configs"]) == set(configs)
    for summary in results["configs"].values():
        _check_block(summary["overall"])
        assert summary["overall"]["n"] == sum(SCORED.values())
        assert {name: block["n"] for name, block in summary["by_category"].items()} == SCORED
        for block in summary["by_category"].values():
            _check_block(block)
    construction = results["construction"]
    assert isinstance(construction["seconds"], float)
    for key in ("amus", "segments", "llm_calls", "tokens"):
        assert isinstance(construction[key], int)


def _timeless(configs) -> dict:
    dumped = {name: summary.model_dump() for name, summary in configs.items()}
    for summary in dumped.values():
        summary["overall"].pop("latency_ms")
    return dumped


def test_end_to_end_and_rerun_on_the_stored_memory(tmp_path, fingerprinters):
    conversations = load_locomo(write_locomo(tmp_path / "locomo.json"))
    out = tmp_path / "eval"
    models = EvalModels(fingerprinters, HashEmbedder())
    model = evaluate(conversations, models, out,
                     EvaluationSettings(k_dense=2, k_code=2, sweep=True, progress=False))
    names = ["dense2", "dense4", "dense2+code2", "dense2+bm25_2", "code4", "dense2+kmeans2", "multi",
             "multi+code", "multi+kmeans"]
    results = json.loads((out / "results.json").read_text())  # the keys that downstream scripts read
    check_schema(results, names)
    for name in ("multi", "multi+code", "multi+kmeans"):  # exactly the budget, like dense4, with cost figures
        overall = results["configs"][name]["overall"]
        assert overall["mean_retrieved"] == 4.0 and overall["mean_tokens"] > 0 and overall["latency_ms"] > 0
    assert results["multi"]["planner"] == "rule" and results["multi"]["reranker"].startswith("off")
    assert results["multi"]["plans_by"] == {"rule": sum(results["multi"]["question_types"].values())}
    fell_back = model.multi.model_copy(update={"planner": "llm:m", "plans_by": {"llm:m": 3, "rule": 1}})
    assert "- planner: llm:m (plans made by: llm:m 3, rule 1); reranker: off" in render_markdown(
        model.model_copy(update={"multi": fell_back}), [])
    assert set(results["construction"]["per_conversation"]) == {"conv-t"}
    assert results == model.model_dump() and read_results(out / "results.json") == model
    configs = results["configs"]
    recall = {name: configs[name]["overall"]["recall"] for name in names}
    # a larger dense budget and a complementary path only add AMUs
    assert recall["dense4"] >= recall["dense2"] and recall["dense2+code2"] >= recall["dense2"]
    assert configs["dense4"]["overall"]["mean_retrieved"] == 4.0
    assert ("tied_at_cut" in configs["dense2+code2"]["overall"]
            and "tied_at_cut" not in configs["dense4"]["overall"])
    construction = results["construction"]
    assert construction["amus"] > 4 and construction["segments"] >= 1
    assert (construction["llm_calls"], construction["tokens"]) == (0, 0)
    assert results["answers"]["status"] == "skipped" and "ISQ_LLM_BASE_URL" in results["answers"]["note"]
    assert results["codebooks"]["trained"]["codebook_size"] == 64
    assert results["evidence"]["unknown_ids"] == ["conv-t qa 4: D9:1"]
    unscored = ["conv-t qa 5 (single-hop)", "conv-t qa 6 (temporal)"]  # the reader sees which and why
    assert (results["evidence"]["questions_without_evidence"], results["evidence"]["unscored_questions"]) == (
        2, unscored)
    sweep = json.loads((out / "sweep.json").read_text())
    assert len(sweep) == 36 and set(sweep[0]["configs"]) == {"dense2+code2", "code4", "dense2+kmeans2"}
    assert results["sweep"]["recommended"]["config"] == "dense2+code2"
    markdown = (out / "results.md").read_text()
    assert "| dense2+code2 |" in markdown and "Topology sweep" in markdown and "Skipped:" in markdown
    assert f"2 questions without usable evidence ({', '.join(unscored)}); " in markdown
    assert (out / "recall.png").read_bytes()[:4] == b"\x89PNG"
    lines = (out / "questions.jsonl").read_text().splitlines()
    assert len(lines) == 5 and set(json.loads(lines[0])["found"]) == set(names)

    again = evaluate(conversations, models, out, EvaluationSettings(k_dense=2, k_code=2, progress=False))
    assert _timeless(again.configs) == _timeless(model.configs)  # the same retrieval; only latencies differ
    assert again.construction.this_run["replayed_turns"] == sum(len(c.turns) for c in conversations)
    assert again.construction.this_run["embeddings_computed"] == 0  # everything came from the store's cache
    assert again.construction.this_run["fingerprints_computed"] == 0
    assert again.construction.ingest_seconds == construction["ingest_seconds"]  # not counted twice
    assert again.construction.amus == construction["amus"]

    # --store: the memory built there, evaluated read-only as it is (nothing added, same retrieval)
    stored = evaluate(conversations, models, tmp_path / "elsewhere",
                      EvaluationSettings(k_dense=2, k_code=2, progress=False, store=out / "store"))
    assert (_timeless(stored.configs) == _timeless(model.configs)
            and stored.construction.this_run["replayed_turns"] == 0)
    with pytest.raises(MemoryAPIError, match="no store at"):
        evaluate(conversations, models, tmp_path / "x",
                 EvaluationSettings(k_dense=2, k_code=2, progress=False,
                                    store=tmp_path / "elsewhere" / "store"))
    # --store with a file the store was not built from: refused, naming the first turn that differs
    first, *rest = conversations[0].sessions
    edited = replace(first.turns[1], text="Something else entirely.")
    changes = {"stored with another text": (replace(first, turns=(first.turns[0], edited, *first.turns[2:])),
                                            *rest),
               "'D2:1' stored, nothing in the file": (first,)}
    for message, sessions in changes.items():
        with pytest.raises(EvaluationError, match=f"holds another memory of 'conv-t'.*{message}"):
            evaluate([replace(conversations[0], sessions=sessions)], models, tmp_path / "y",
                     EvaluationSettings(k_dense=2, k_code=2, progress=False, store=out / "store"))


def test_out_holds_one_runs_reports_whatever_stops_a_rerun(tmp_path, fingerprinters, monkeypatch):
    """A rerun into the same OUT that fails half-way (here while drawing its pictures), that is
    refused (a sweep with no codebook path; a shorter cut of the file, whose memory the store's
    longer one would pad with distractors) leaves the earlier run's reports as they were; a
    rerun that ends replaces them all."""
    import retrieval.eval.run as run_module

    conversations = load_locomo(write_locomo(tmp_path / "locomo.json"))
    out, models = tmp_path / "eval", EvalModels(fingerprinters, HashEmbedder())

    def settings(*configs: str, **more) -> EvaluationSettings:
        return EvaluationSettings(configs=configs, k_dense=2, k_code=2, progress=False, **more)

    evaluate(conversations, models, out, settings("dense2", "dense2+code2", sweep=True))
    reports = {name: (out / name).read_bytes()
               for name in ("questions.jsonl", "results.json", "results.md", "sweep.json")}

    def unchanged() -> bool:
        return all((out / name).read_bytes() == data for name, data in reports.items())

    def no_pictures(*_args) -> None:
        raise OSError("no space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(run_module, "write_pictures", no_pictures)
        with pytest.raises(OSError, match="no space"):
            evaluate(conversations, models, out, settings("dense4"))
    assert unchanged()
    with pytest.raises(EvaluationError, match="--sweep needs a configuration with a codebook path"):
        evaluate(conversations, models, out, settings("dense4", sweep=True))
    assert unchanged()
    shorter = [replace(conversations[0], sessions=conversations[0].sessions[:1])]
    with pytest.raises(EvaluationError, match="'D2:1' stored, nothing in the file.*its own --out"):
        evaluate(shorter, models, out, settings("dense4"))
    assert unchanged()
    again = evaluate(conversations, models, out, settings("dense4"))
    assert set(json.loads((out / "results.json").read_text())["configs"]) == set(again.configs) == {"dense4"}
    assert not (out / "sweep.json").exists()  # the earlier run's sweep, which this one did not make
    assert set(json.loads((out / "questions.jsonl").read_text().splitlines()[0])["found"]) == {"dense4"}
    assert not (out / ".incomplete").exists()


def test_the_memory_in_a_database_retrieves_as_in_a_directory(tmp_path, fingerprinters, postgres_url):
    conversations = load_locomo(write_locomo(tmp_path / "locomo.json"))
    models = EvalModels(fingerprinters, HashEmbedder())
    settings = EvaluationSettings(k_dense=2, k_code=2, progress=False)
    local = evaluate(conversations, models, tmp_path / "local", settings)
    remote = evaluate(conversations, models, tmp_path / "remote", replace(settings, database=postgres_url))
    assert _timeless(remote.configs) == _timeless(local.configs)  # every configuration, every figure
    assert ((tmp_path / "remote" / "questions.jsonl").read_text()
            == (tmp_path / "local" / "questions.jsonl").read_text())
    assert (remote.construction.amus, remote.construction.segments) == (local.construction.amus,
                                                                        local.construction.segments)
    assert (tmp_path / "remote" / "results.json").is_file() and not (tmp_path / "remote" / "store").exists()
    # a rerun finds the memory in the database: nothing added or computed again, the same retrieval
    again = evaluate(conversations, models, tmp_path / "again", replace(settings, database=postgres_url))
    assert _timeless(again.configs) == _timeless(local.configs)
    assert again.construction.this_run["embeddings_computed"] == 0
    assert again.construction.amus == local.construction.amus
    with pytest.raises(EvaluationError, match="not both"):
        evaluate(conversations, models, tmp_path / "x",
                 replace(settings, database=postgres_url, store=tmp_path / "local" / "store"))
    shorter = [replace(conversations[0], sessions=conversations[0].sessions[:1])]
    with pytest.raises(EvaluationError, match="'D2:1' stored, nothing in the file.*its own --database$"):
        evaluate(shorter, models, tmp_path / "cut", replace(settings, database=postgres_url))


def test_a_kmeans_configuration_needs_the_control(tmp_path, fingerprinters):
    conversations = load_locomo(write_locomo(tmp_path / "locomo.json"))
    with pytest.raises(ValueError, match="k-means control"):
        evaluate(conversations, EvalModels({"trained": fingerprinters["trained"]}, HashEmbedder()),
                 tmp_path / "o", EvaluationSettings(configs=["dense2+kmeans2"], progress=False))


# -- command line -----------------------------------------------------------------------------


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err
    return err


def test_cli_errors_are_one_line_with_exit_code_2(tmp_path, capsys, fingerprinter_dirs):
    trained = str(fingerprinter_dirs["trained"])
    missing = tmp_path / "missing.json"
    assert main(["--locomo", str(missing), "--fingerprinter", trained, "--out", str(tmp_path / "o")]) == 2
    assert str(missing) in _error(capsys)
    broken = tmp_path / "broken.json"
    broken.write_text('[{"sample_id": ')
    assert main(["--locomo", str(broken), "--fingerprinter", trained, "--out", str(tmp_path / "o")]) == 2
    err = _error(capsys)
    assert str(broken) in err and "invalid JSON" in err
    locomo = write_locomo(tmp_path / "locomo.json")
    assert (main(["--locomo", locomo, "--fingerprinter", str(tmp_path / "nope"), "--out",
                  str(tmp_path / "o")]) == 2)
    assert "nope" in _error(capsys)
    assert main(["--locomo", locomo, "--fingerprinter", trained, "--configs", "dense20+kmeans20",
                 "--out", str(tmp_path / "o")]) == 2
    assert "k-means control" in _error(capsys)
    assert (main(["--locomo", locomo, "--fingerprinter", trained, "--alpha", "1.5", "--out",
                  str(tmp_path / "o")]) == 2)
    assert "alpha" in _error(capsys)
    assert main(["--locomo", locomo, "--fingerprinter", trained, "--configs", "dense20", "--sweep",
                 "--out", str(tmp_path / "o")]) == 2
    assert "--sweep needs a configuration with a codebook path" in _error(capsys)
    assert not (tmp_path / "o").exists()  # refused before the memory (and OUT) is made


def test_cli_database_is_a_postgresql_url_and_excludes_store(tmp_path, capsys, fingerprinter_dirs):
    command = ["--locomo", write_locomo(tmp_path / "locomo.json"), "--fingerprinter",
               str(fingerprinter_dirs["trained"]), "--out", str(tmp_path / "o")]
    with pytest.raises(SystemExit) as refused:
        main([*command, "--database", str(tmp_path / "db")])
    assert refused.value.code == 2 and "--database: not a PostgreSQL URL" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        main([*command, "--database", "postgresql://u@127.0.0.1:1/db", "--store", str(tmp_path / "s")])
    assert refused.value.code == 2 and "not allowed with argument --database" in capsys.readouterr().err
    assert not (tmp_path / "db").exists() and not (tmp_path / "o").exists()


class FakeChat(FakeChatServer):
    """The judge prompt gets CORRECT when the generated answer equals the gold answer; an answer
    request gets the canned answer of its question, else "no idea"."""

    def __init__(self, answers: dict[str, str]):
        super().__init__(lambda body: self.reply(body, answers))

    @staticmethod
    def reply(body: dict, answers: dict[str, str]) -> tuple[int, dict, float]:
        system, user = (m["content"] for m in body["messages"])
        if system == JUDGE_PROMPT:
            gold = re.search(r"Gold answer: (.*)", user)[1]
            generated = re.search(r"Generated answer: (.*)", user)[1]
            return 200, completion_body("CORRECT" if gold == generated else "WRONG", 50, 1), 0.0
        question = re.search(r"Question: (.*?)(?: Use the dates|$)", user, re.M)[1]
        return 200, completion_body(answers.get(question, "no idea"), 100, 5), 0.0


def test_ctrl_c_ends_the_run_in_one_line_with_the_interrupt_status(tmp_path, monkeypatch, capsys,
                                                                   fingerprinter_dirs):
    monkeypatch.setattr(evaluate_module, "SentenceEmbedder", lambda name: HashEmbedder())

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate_module, "evaluate", interrupted)
    code = main(["--locomo", write_locomo(tmp_path / "locomo.json"), "--fingerprinter",
                 str(fingerprinter_dirs["trained"]), "--out", str(tmp_path / "eval"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 130 and err.startswith("interrupted: ") and err.count("\n") == 1, err
    assert "the same command again goes on from it" in err


def test_a_run_refused_while_building_leaves_no_staged_reports_or_empty_out(tmp_path, monkeypatch, capsys,
                                                                           fingerprinter_dirs):
    """A run refused half-way (``--store`` holding another memory of the file's conversation)
    leaves OUT as it found it: no ``.incomplete``, and no OUT where there was none."""
    monkeypatch.setattr(evaluate_module, "SentenceEmbedder", lambda name: HashEmbedder())
    locomo = write_locomo(tmp_path / "locomo.json")
    command = ["--fingerprinter", str(fingerprinter_dirs["trained"]), "--k-dense", "2", "--k-code", "2",
               "--no-progress"]
    assert main(["--locomo", locomo, "--out", str(tmp_path / "built"), *command]) == 0
    edited = tmp_path / "edited.json"
    edited.write_text(Path(locomo).read_text().replace(SESSION_1[3], "Something else entirely."))
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "notes.txt").write_text("mine")
    for out in ("fresh", "kept"):
        assert main(["--locomo", str(edited), "--out", str(tmp_path / out), "--store",
                     str(tmp_path / "built" / "store"), *command]) == 2
        assert "holds another memory of 'conv-t'" in capsys.readouterr().err
    assert not (tmp_path / "fresh").exists()
    assert sorted(path.name for path in (tmp_path / "kept").iterdir()) == ["notes.txt"]


def test_a_store_is_evaluated_with_the_fingerprinter_it_recorded(tmp_path, monkeypatch, capsys,
                                                                   fingerprinter_dirs):
    """As the other readers of a built store: ``--store`` without ``--fingerprinter`` takes the one
    ingestion recorded there, not the committed one; a named one still wins; one recorded and
    since moved is refused."""
    monkeypatch.setattr(evaluate_module, "SentenceEmbedder", lambda name: HashEmbedder())
    locomo = write_locomo(tmp_path / "locomo.json")
    command = ["--locomo", locomo, "--k-dense", "2", "--k-code", "2", "--no-progress"]
    ours = fingerprinter_dirs["kmeans"]
    assert main([*command, "--out", str(tmp_path / "built"), "--fingerprinter", str(ours)]) == 0
    store = tmp_path / "built" / "store"
    with open_store(store) as opened:  # what ingestion with --fingerprinter records
        opened.put_meta("fingerprinter", model_identity(Fingerprinter.from_pretrained(ours)))
        remember_fingerprinter(opened, ours, Fingerprinter.from_pretrained(ours))
    for named, used in ((None, ours), (fingerprinter_dirs["trained"], fingerprinter_dirs["trained"])):
        out = tmp_path / f"eval-{used.name}"
        extra = [] if named is None else ["--fingerprinter", str(named)]
        assert main([*command, "--out", str(out), "--store", str(store), *extra]) == 0
        settings = json.loads((out / "results.json").read_text())["settings"]
        assert Path(settings["fingerprinter"]).resolve() == Path(used).resolve()
        assert settings["identities"] == {  # what the directory held, which a re-export in place changes
            "embedder": model_identity(HashEmbedder()),
            "trained_fingerprinter": model_identity(Fingerprinter.from_pretrained(used))}
    with open_store(store) as opened:  # the recorded directory since moved: refused, not replaced unsaid
        opened.put_meta("fingerprinter_path", str(tmp_path / "moved"))
    assert main([*command, "--out", str(tmp_path / "eval-moved"), "--store", str(store)]) == 2
    err = capsys.readouterr().err
    assert f"loaded from {tmp_path / 'moved'}, which is no longer a directory" in err and err.count("\n") == 1
    with open_store(store) as opened:  # built with the committed one (through a server: no directory)
        opened.put_meta("fingerprinter", model_identity(Fingerprinter.from_pretrained(DEFAULT_FINGERPRINTER)))
        opened.put_meta("fingerprinter_path", None)
    assert trained_fingerprinter(None, store) == DEFAULT_FINGERPRINTER


def test_a_second_run_refused_into_the_same_out_leaves_the_running_runs_reports(tmp_path, monkeypatch,
                                                                                  fingerprinter_dirs):
    """Run A holds OUT's store and has staged its reports; run B into the same OUT is refused (the
    store is busy) and drops nothing of A's: A ends with its reports published."""
    import threading

    import retrieval.eval.run as run_module

    monkeypatch.setattr(evaluate_module, "SentenceEmbedder", lambda name: HashEmbedder())
    out = tmp_path / "out"
    command = ["--locomo", write_locomo(tmp_path / "locomo.json"), "--out", str(out), "--fingerprinter",
               str(fingerprinter_dirs["trained"]), "--k-dense", "2", "--k-code", "2", "--no-progress"]
    staged, go_on, write = threading.Event(), threading.Event(), run_module.write_questions

    def held(path, *args, **kwargs):
        staged.set()
        go_on.wait(120)
        return write(path, *args, **kwargs)

    monkeypatch.setattr(run_module, "write_questions", held)
    codes: list[int] = []
    first = threading.Thread(target=lambda: codes.append(main(command)))
    first.start()
    try:
        assert staged.wait(120) and (out / ".incomplete").is_dir()
        assert main(command) == 2
        assert (out / ".incomplete").is_dir()
    finally:
        go_on.set()
        first.join(120)
    assert codes == [0] and (out / "results.json").is_file()


def interrupted_flush(at: int):
    """``Memory.flush`` as a run sees it when Ctrl-C (or a kill) comes at its ``at``-th call."""
    from retrieval.api.memory import Memory

    flush, calls = Memory.flush, []

    def stopped(memory, **kwargs):
        calls.append(kwargs["session_id"])
        if len(calls) == at:
            raise KeyboardInterrupt
        return flush(memory, **kwargs)

    return stopped


def test_a_run_stopped_half_way_counts_what_it_built_in_the_construction_cost(tmp_path, fingerprinters,
                                                                             monkeypatch):
    """Ctrl-C in the second session: the first session's segments stay built, and what building
    them cost is in the store's ledger, so the run that goes on reports both runs' cost."""
    from retrieval.api.memory import Memory
    from retrieval.memory.backends import open_store
    from retrieval.memory.meta_keys import CONSTRUCTION_KEY

    conversations = load_locomo(write_locomo(tmp_path / "locomo.json"))
    models, settings = EvalModels(fingerprinters, HashEmbedder()), EvaluationSettings(progress=False)
    with monkeypatch.context() as patched:
        patched.setattr(Memory, "flush", interrupted_flush(2))
        with pytest.raises(KeyboardInterrupt):
            evaluate(conversations, models, tmp_path / "eval", settings)
    with open_store(tmp_path / "eval" / "store") as store:
        spent = store.meta(CONSTRUCTION_KEY.format("conv-t"))
        assert len(store.segments("conv-t")) > 0
    assert spent is not None and spent["seconds"] > 0
    done = evaluate(conversations, models, tmp_path / "eval", settings)
    assert done.construction.ingest_seconds > spent["seconds"]
    assert done.construction.per_conversation["conv-t"] > spent["seconds"]


def test_cli_run_with_the_answer_stage(tmp_path, monkeypatch, fingerprinter_dirs):
    monkeypatch.setattr(evaluate_module, "SentenceEmbedder", lambda name: HashEmbedder())
    canned = {QA[0]["question"]: "Lisbon, a blue scarf", QA[1]["question"]: QA[1]["answer"],
              QA[3]["question"]: "Biscuit"}
    out = tmp_path / "eval"
    with FakeChat(canned) as server:
        monkeypatch.setenv("ISQ_LLM_BASE_URL", server.base_url)
        monkeypatch.setenv("ISQ_LLM_MODEL", "fake-model")
        code = main(["--locomo", write_locomo(tmp_path / "locomo.json"), "--fingerprinter",
                     str(fingerprinter_dirs["trained"]), "--out", str(out), "--k-dense", "2", "--k-code", "2",
                     "--answer-configs", "dense2+code2", "--no-progress"])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    check_schema(results,
                 ["dense2", "dense4", "dense2+code2", "dense2+bm25_2", "code4", "multi", "multi+code"])
    answers = results["answers"]
    assert answers["status"] == "done" and answers["model"] == "fake-model" and set(answers["configs"]) == {
        "dense2+code2"}
    overall = answers["configs"]["dense2+code2"]["overall"]
    assert overall == {"f1": pytest.approx(3 / 5), "judge": pytest.approx(3 / 5), "n": 5}
    assert answers["configs"]["dense2+code2"]["by_category"]["single-hop"]["f1"] == pytest.approx(0.5)
    assert answers["query_tokens"] == 5 * (100 + 5) and answers["usage"]["judge"]["prompt_tokens"] == 5 * 50
    assert len(server.requests) == 10
    first_prompt = server.requests[0]["messages"][1]["content"]
    assert "Memories:" in first_prompt and "Original turns:" in first_prompt and "[D1:" in first_prompt
    temporal = next(r for r in server.requests if QA[1]["question"] in r["messages"][1]["content"])
    assert "Use the dates of the conversation" in temporal["messages"][1]["content"]
    assert len((out / "answers.jsonl").read_text().splitlines()) == 5
    assert "LoCoMo F1" in (out / "results.md").read_text()
    assert read_results(out / "results.json").answers.configs["dense2+code2"].overall.n == 5


@pytest.mark.parametrize("down", ["some", "all", "refused"])
def test_failed_llm_requests_are_counted_not_scored(tmp_path, monkeypatch, fingerprinter_dirs, down):
    """An answer or a verdict the endpoint never gave is no wrong answer: it is counted under
    ``failed`` and left out of F1, judge and n; with nothing graded the stage says why. An endpoint
    refusing the key stops the stage at its first request, the rest of the run kept."""
    monkeypatch.setattr(evaluate_module, "SentenceEmbedder", lambda name: HashEmbedder())
    monkeypatch.setattr("retrieval.llm_client.time.sleep", lambda seconds: None)  # instant retries
    canned = {qa["question"]: qa["answer"] for qa in QA if "answer" in qa}

    def reply(body: dict) -> tuple[int, dict, float]:
        system, user = (m["content"] for m in body["messages"])
        if down == "refused":
            return 401, {"error": "bad key"}, 0.0
        if down == "all" or (system != JUDGE_PROMPT and QA[0]["question"] in user) \
                or (system == JUDGE_PROMPT and f"Question: {QA[3]['question']}" in user):
            return 500, {"error": "down"}, 0.0
        return FakeChat.reply(body, canned)

    out = tmp_path / "eval"
    with FakeChatServer(reply) as server:
        monkeypatch.setenv("ISQ_LLM_BASE_URL", server.base_url)
        monkeypatch.setenv("ISQ_LLM_MODEL", "fake-model")
        assert main(["--locomo", write_locomo(tmp_path / "locomo.json"), "--fingerprinter",
                     str(fingerprinter_dirs["trained"]), "--out", str(out), "--k-dense", "2", "--k-code", "2",
                     "--answer-configs", "dense2+code2", "--no-progress"]) == 0
    answers = json.loads((out / "results.json").read_text())["answers"]
    if down == "refused":
        assert answers["status"] == "skipped" and "stopped" in answers["note"]
        assert "(HTTP 401)" in answers["note"]
        assert len(server.requests) == 1 and server.base_url not in answers["note"]
    elif down == "all":
        assert answers["status"] == "skipped" and "answer 5" in answers["note"], answers
    else:
        assert answers["failed"] == {"answer": 1, "judge": 1}, answers["failed"]
        overall = answers["configs"]["dense2+code2"]["overall"]
        assert (overall["judge"], overall["n"]) == (1.0, 3), overall


def test_the_committed_fingerprinter_is_the_default_and_loads():
    from isq import Fingerprinter
    from retrieval.evaluate import _parser

    args = _parser().parse_args(["--locomo", "x.json", "--out", "o"])
    assert trained_fingerprinter(args.fingerprinter, args.store) == DEFAULT_FINGERPRINTER
    assert DEFAULT_FINGERPRINTER.name == "isq_minilm_dailydialog_cpu"
    fingerprinter = Fingerprinter.from_pretrained(DEFAULT_FINGERPRINTER)
    assert fingerprinter.codebook.vectors.shape == (1024, 384)


def test_without_the_committed_fingerprinter_the_default_says_to_pass_one(tmp_path, capsys, monkeypatch):
    """An installed package has no checkpoints/: the default then names what to pass."""
    absent = tmp_path / "site-packages" / "checkpoints"
    monkeypatch.setattr("retrieval.evaluate.DEFAULT_FINGERPRINTER", absent)
    locomo = write_locomo(tmp_path / "locomo.json")
    assert main(["--locomo", locomo, "--out", str(tmp_path / "o")]) == 2
    err = _error(capsys)
    assert "pass --fingerprinter DIR" in err and not (tmp_path / "o").exists()


@pytest.mark.parametrize(("reply", "correct"), [
    ("CORRECT", True), ("Correct.", True), ("WRONG", False), ("Not correct.", False),
    ("NOT CORRECT - the gold answer is 2022", False), ("This is not correct", False), ("Incorrect", False),
    ("The answer is not wrong.", True), ("Wrong, it is not correct", False)])
def test_the_judges_verdict_reads_a_negation(reply: str, correct: bool) -> None:
    assert _parse_verdict(reply) is correct


def test_the_topology_setting_keeps_every_parameter_of_the_run() -> None:
    params = TopologyParams(2, 0.4, True, "sum", "lift", 0.5)
    assert TopologyParams(**TopologySetting(**params.to_dict()).model_dump()) == params
    assert SweepRow(**params.to_dict(), configs={}).model_dump()["association"] == "lift"
