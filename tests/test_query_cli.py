"""``python -m retrieval.query``: the listing and ``--json`` over a small store, and one-line errors
with exit status 2 for bad input."""

from __future__ import annotations

import json

import pytest

import retrieval.query as query_module
from retrieval.query import main
from tests.multi_route_fixtures import ARCHIVED, CID, WordEmbedder, query_store


@pytest.fixture
def store_dir(tmp_path, monkeypatch):
    return query_store(tmp_path, monkeypatch)


def test_json_lists_hits_with_route_scores_type_time_provenance_and_turns(store_dir, capsys):
    assert (main(["--store", str(store_dir), "When did Ann sign up for the pottery class?", "-k", "5",
                  "--json"]) == 0)
    out = json.loads(capsys.readouterr().out)
    assert out["plan"]["question_type"] == "temporal" and out["plan"]["routes"][0]["entities"] == ["ann"]
    assert out["reranker"].startswith("off")
    assert out["query"] == "When did Ann sign up for the pottery class?"
    items = out["hits"]
    # max(5, 15) capped by the bank's 8 items
    assert len(items) == 8 and len({item["id"] for item in items}) == 8
    assert ARCHIVED not in {item["id"] for item in items}
    first = items[0]
    assert first["id"] == f"{CID}:0:0" and first["kind"] == "record" and first["memory_type"] == "fact"
    assert first["time"] == "2023-05-07" and first["routes"] == [1] and "lexical" in first["scores"]
    # the HTTP hit's score: the fused score, where a route's fusion scored the hit
    fused = [item for item in items if "s_final" in item["scores"]]
    assert fused
    assert [item["score"] for item in fused] == pytest.approx([item["scores"]["s_final"] for item in fused])
    assert (first["session_id"], first["turns"]) == ("session_1", ["D1:1"])  # as an HTTP hit says it
    # the original turn, verbatim
    assert first["source_turns"][0]["text"] == "I signed up for a pottery class yesterday."
    source = first["source_turns"][0]
    assert source["turn_id"] == "D1:1" and source["time"].startswith("2023-")
    assert {item["kind"] for item in items} == {"record", "turn"}


def test_the_listing(store_dir, capsys):
    assert main(["--store", str(store_dir), "Where will Ann and Bob go camping?"]) == 0
    out = capsys.readouterr().out
    assert "Plan (rule):" in out and "Reranker: off" in out and "route 1" in out
    assert "> [D2:4] (2023-06-20) Ann: Yes, Yosemite would be perfect." in out


@pytest.mark.parametrize(("args", "message"), [
    (["--store", "{missing}", "a question"], "no store at"),
    (["--store", "{store}", "   "], "no letter or digit"),
    (["--store", "{store}", "a question", "--user", "conv-9"], "no user 'conv-9'"),
    (["--store", "{store}", "a question", "-k", "0"], "-k must be from 1 to 100, got 0"),
    (["--store", "{store}", "a question", "-k", "101"], "-k must be from 1 to 100, got 101"),
    (["--store", "{store}", "a question", "--reranker", "{missing}"], "no such model directory"),
])
def test_bad_input_is_one_line_and_exit_2(store_dir, tmp_path, capsys, args, message):
    args = [a.format(missing=tmp_path / "absent", store=store_dir) for a in args]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err and message in err


def test_another_embedder_is_refused(store_dir, capsys, monkeypatch):
    class Other(WordEmbedder):
        name = "other"

    monkeypatch.setattr(query_module, "SentenceEmbedder", lambda name: Other())
    assert main(["--store", str(store_dir), "pottery"]) == 2
    assert "built with embedder 'word-hash'" in capsys.readouterr().err
