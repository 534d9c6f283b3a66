"""Faults of small and unusual stores: a kill between a segment's embeddings and its commit is
repaired on resume; a WAL store on read-only media without its ``-shm`` opens; a JSONL file that
is not UTF-8 names file and line; an empty input binds no models; a failed start leaves no store."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import retrieval.api.online as stream_module
from retrieval.api.batch import ingest_turns
from retrieval.extract.rules import RuleExtractor
from retrieval.ingest import main as ingest_main
from retrieval.ingestion.turns_jsonl import read_turns_jsonl
from retrieval.memory.records import InputFormatError
from retrieval.memory.store import AMUStore
from tests.test_consolidation import NamedHashEmbedder
from tests.test_ingest import HashEmbedder, conversation_turns


def vector_rows(directory: Path) -> int:
    with AMUStore(directory, read_only=True) as store:
        return store._db.execute("SELECT COUNT(*) FROM vectors").fetchone()[0]


def test_a_kill_between_the_embeddings_and_the_commit_is_repaired_on_resume(tmp_path: Path, monkeypatch):
    with AMUStore(tmp_path / "reference") as store:
        ingest_turns(conversation_turns(), store, HashEmbedder(), RuleExtractor(), progress=False)
    embed, calls = stream_module.embed_segment, []

    def killed_in_second_segment(*args):
        calls.append(1)
        embed(*args)
        if len(calls) == 2:
            raise SystemExit("killed")  # the segment's vectors are cached, the segment is not committed

    monkeypatch.setattr(stream_module, "embed_segment", killed_in_second_segment)
    with AMUStore(tmp_path / "store") as store, pytest.raises(SystemExit):
        ingest_turns(conversation_turns(), store, HashEmbedder(), RuleExtractor(), progress=False)
    monkeypatch.setattr(stream_module, "embed_segment", embed)
    with AMUStore(tmp_path / "store") as store:
        stats = ingest_turns(conversation_turns(), store, HashEmbedder(), RuleExtractor(), progress=False)
        segments = [(s.seq, s.turn_ids, s.amu_count) for s in store.segments("conv-a")]
    with AMUStore(tmp_path / "reference", read_only=True) as reference:
        assert segments == [(s.seq, s.turn_ids, s.amu_count) for s in reference.segments("conv-a")]
    assert stats.resumed_segments == 1 and vector_rows(tmp_path
                                                       / "store") == vector_rows(tmp_path / "reference")


@contextmanager
def immutable(directory: Path) -> Iterator[None]:
    """The directory as on read-only media: nothing can be created in it, even by root."""
    if subprocess.run(["chattr", "+i", str(directory)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(directory)], check=True)


def test_a_wal_store_opens_read_only_without_its_shm(tmp_path: Path):
    with AMUStore(tmp_path / "store") as store:
        ingest_turns(conversation_turns()[:6], store, HashEmbedder(), RuleExtractor(), progress=False)
        count = store.count()
    assert not (tmp_path / "store" / "amus.sqlite3-shm").exists()  # closed cleanly: no index file left
    with immutable(tmp_path / "store"), AMUStore(tmp_path / "store", read_only=True) as store:
        assert store.count() == count


def test_a_jsonl_file_that_is_not_utf8_names_file_and_line(tmp_path: Path):
    path = tmp_path / "talk.jsonl"
    good = json.dumps({"session_id": "s1", "session_time": "2023-05-08T13:56:00", "speaker": "Ann",
                       "turn_id": "D1", "text": "hello there"})
    path.write_bytes(good.encode() + b"\n" + good.replace("hello", "caf\xe9").encode("latin-1") + b"\n")
    with pytest.raises(InputFormatError, match=r"talk\.jsonl:2: not UTF-8 text"):
        read_turns_jsonl(path)


def test_an_empty_input_binds_nothing_and_creates_no_store(tmp_path: Path, capsys, monkeypatch):
    with AMUStore(tmp_path / "library") as store:
        assert ingest_turns([], store, HashEmbedder(), RuleExtractor(), progress=False).turns == 0
        assert store.meta("embedder") is None and store.meta("fingerprinter") is None
    monkeypatch.setattr("retrieval.ingest.SentenceEmbedder", NamedHashEmbedder)
    (tmp_path / "empty.jsonl").write_text("\n")
    assert ingest_main(["--jsonl", str(tmp_path / "empty.jsonl"), "--store", str(tmp_path / "cli")]) == 2
    assert "no turns; nothing to ingest" in capsys.readouterr().err and not (tmp_path / "cli").exists()


def test_a_failed_start_leaves_no_store_behind(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setattr("retrieval.ingest.SentenceEmbedder", NamedHashEmbedder)
    path = tmp_path / "talk.jsonl"
    path.write_text("\n".join(json.dumps({"session_id": t.session_id,
                                          "session_time": t.session_time.isoformat(),
                                          "speaker": t.speaker, "turn_id": t.turn_id, "text": t.text})
                              for t in conversation_turns()))
    bad = ["--fingerprinter", str(tmp_path / "no-such-fingerprinter"), "--no-progress"]
    assert ingest_main(["--jsonl", str(path), "--store", str(tmp_path / "new"), *bad]) == 2
    assert capsys.readouterr().err.startswith("error: ") and not (tmp_path / "new").exists()
    assert ingest_main(["--jsonl", str(path), "--store", str(tmp_path / "kept"), "--no-progress"]) == 0
    assert ingest_main(["--jsonl", str(path), "--store", str(tmp_path / "kept"), *bad]) == 2
    assert vector_rows(tmp_path / "kept") > 0  # a store that existed is never removed
