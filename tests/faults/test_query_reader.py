"""What a reader of a store meets: a query writes nothing into the store (the LLM planner's answers
are kept only in a cache directory the caller names, which a purge of the store cannot reach), so
a store on shared or read-only media stays as it was; the listing explains its score columns, its
size and its order, so it reads without the source; the store's fingerprinter is found without
naming it again; the rule extractor writes reflexives as reflexives ("themselves", not "Maria")."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

import retrieval.query as query_module
from retrieval.extract.pronouns import resolve_pronouns
from retrieval.memory.fingerprinter_source import (
    PATH_KEY,
    UnfoundFingerprinter,
    named_or_recorded,
    recorded_fingerprinter,
    remember_fingerprinter,
)
from retrieval.memory.store import AMUStore
from retrieval.multi_route.score_legend import SCORE_COLUMNS
from tests.fake_chat import FakeChatServer, completion_body
from tests.multi_route_fixtures import IDENTITY, WordEmbedder, WordFingerprinter, query_store
from tests.store_backends import SQLITE_BEFORE_VERSION_9


@pytest.fixture
def store_dir(tmp_path, monkeypatch):
    return query_store(tmp_path, monkeypatch)


def files(directory: Path) -> set[str]:
    return {str(path.relative_to(directory)) for path in directory.rglob("*")}


# ---------------------------------------------------------------------------- 4. read-only queries


def test_the_llm_planner_keeps_answers_only_where_told_and_never_in_the_store(store_dir, tmp_path, capsys,
                                                                              monkeypatch):
    answer = {"question_type": "single", "routes": [{"goal": "g", "queries": ["Ann pottery class"]}]}
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    before = files(store_dir)
    with FakeChatServer(lambda body: (200, completion_body(json.dumps(answer), 30, 9), 0.0)) as server:
        monkeypatch.setenv("ISQ_LLM_BASE_URL", server.base_url)
        monkeypatch.setenv("ISQ_LLM_MODEL", "fake")
        assert query_module.main(["--store", str(store_dir), "pottery?", "--planner", "llm"]) == 0
        assert query_module.main(["--store", str(store_dir), "pottery?", "--planner", "llm",
                                  "--llm-cache", str(tmp_path / "mine")]) == 0
    assert "Plan (llm:fake)" in capsys.readouterr().out
    assert files(store_dir) - before <= {"amus.sqlite3-wal", "amus.sqlite3-shm"}  # SQLite's own reader files
    assert not (tmp_path / "xdg").exists()  # a default left behind would outlive the user's forget
    assert len(list((tmp_path / "mine").rglob("*.json"))) == 1


# ------------------------------------------------ the listing explains itself to a first-time reader


def test_the_listing_has_a_legend_and_says_why_it_has_15_items(store_dir, capsys):
    assert (query_module.main(["--store", str(store_dir), "Where will Ann and Bob go camping?", "-k", "5"])
            == 0)
    out = capsys.readouterr().out
    for column in ("records", "lexical", "code", "s_best", "s_route", "s_final"):
        assert f"  {column} " in out
    assert "8 items: k = 5 is raised to plan_depth 15" in out and "--exact-k" in out
    assert "MMR" in out and "s_final is not sorted" in out


def test_exact_k_returns_k(store_dir, capsys):
    assert (query_module.main(["--store", str(store_dir), "pottery class", "-k", "3", "--exact-k", "--json"])
            == 0)
    out = json.loads(capsys.readouterr().out)
    assert (len(out["hits"]) == 3 and out["size"] == "3 items (k = 3)"
            and out["score_columns"] == SCORE_COLUMNS)


def test_the_store_names_its_fingerprinter(store_dir, tmp_path, capsys, monkeypatch):
    checkpoint = tmp_path / "fingerprinter"
    checkpoint.mkdir()
    loaded: list[Path] = []

    def from_pretrained(directory):
        loaded.append(Path(directory))
        return WordFingerprinter()

    monkeypatch.setattr(query_module.Fingerprinter, "from_pretrained", from_pretrained)
    with AMUStore(store_dir) as store:
        assert recorded_fingerprinter(store) is None  # a store without one
        store.bind("fingerprinter", IDENTITY)
        remember_fingerprinter(store, checkpoint, WordFingerprinter())
        assert recorded_fingerprinter(store) == checkpoint.resolve()
    assert query_module.main(["--store", str(store_dir), "pottery class", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert loaded == [checkpoint.resolve()] and any("code" in item["scores"] for item in out["hits"])


def test_serving_and_consolidating_a_built_store_take_its_recorded_fingerprinter(store_dir, tmp_path, capsys,
                                                                                  monkeypatch):
    """``retrieval.serve`` and ``retrieval.mcp`` (one launcher) and ``retrieval.consolidate`` open a
    store ingested with a fingerprinter without naming it again, as ``retrieval.query`` does."""
    import retrieval.consolidate as consolidate_module
    from retrieval.api.memory import Memory
    from retrieval.serve import _serve_parser
    from retrieval.service.launch import open_memory

    checkpoint = tmp_path / "fingerprinter"
    checkpoint.mkdir()
    with AMUStore(store_dir) as store:
        store.bind("fingerprinter", IDENTITY)
        remember_fingerprinter(store, checkpoint, WordFingerprinter())
    opened: list[dict] = []
    monkeypatch.setattr(Memory, "open", lambda path, **options: opened.append(options))
    open_memory(_serve_parser().parse_args(["--store", str(store_dir), "--extractor", "llm"]))
    open_memory(_serve_parser().parse_args(["--store", str(tmp_path / "new")]))
    db = sqlite3.connect(store_dir / AMUStore.DB_NAME)  # the store as an older version left it
    db.executescript(SQLITE_BEFORE_VERSION_9 + "ALTER TABLE purges DROP COLUMN next_seq; "
                     "ALTER TABLE purges DROP COLUMN next_turn;"
                     "PRAGMA user_version=6;")
    db.close()
    open_memory(_serve_parser().parse_args(["--store", str(store_dir)]))  # the first start after an upgrade
    assert [(o["fingerprinter"], o["extractor"], o["embedder"]) for o in opened] == [
        (checkpoint.resolve(), "llm", None), (None, "rule", None), (checkpoint.resolve(), "rule", None)]
    assert not (tmp_path / "new").exists()  # looking for a recorded one made no store
    loaded: list[Path] = []
    monkeypatch.setattr(consolidate_module.Fingerprinter, "from_pretrained",
                        lambda directory: loaded.append(Path(directory)) or WordFingerprinter())
    monkeypatch.setattr(consolidate_module, "SentenceEmbedder", lambda name: WordEmbedder())
    assert consolidate_module.main(["--store", str(store_dir)]) in (0, 1)
    assert loaded == [checkpoint.resolve()] and "error" not in capsys.readouterr().err
    import retrieval.ingest as ingest_module
    from retrieval.memory.errors import StoreError

    named: list[Path | None] = []

    def models(args):
        named.append(args.fingerprinter)
        raise StoreError("stop before loading")

    monkeypatch.setattr(ingest_module, "_models", models)
    more = tmp_path / "more.jsonl"
    more.write_text('{"session_id": "s9", "session_time": "2023-05-08T13:56:00", "speaker": "Ann", '
                    '"turn_id": "s9:1", "text": "One more turn."}\n', encoding="utf-8")
    assert ingest_module.main(["--jsonl", str(more), "--store", str(store_dir)]) == 2
    assert named == [checkpoint.resolve()]  # adding to the store takes its fingerprinter too


def test_serving_a_store_whose_fingerprinter_cannot_be_found_names_where_it_was(store_dir, tmp_path, capsys):
    """Built with a fingerprinter whose recorded directory is gone, or that recorded none (built
    through the server), a store is refused at start naming that, not as built "not 'none'"."""
    from retrieval.serve import _serve_parser
    from retrieval.service.launch import open_memory

    moved = tmp_path / "moved-away"
    with AMUStore(store_dir) as store:
        store.bind("fingerprinter", IDENTITY)
        store.put_meta(PATH_KEY, str(moved))
    with pytest.raises(UnfoundFingerprinter, match=f"loaded from {moved}, which is no longer a directory: "
                       "pass --fingerprinter DIR"):
        open_memory(_serve_parser().parse_args(["--store", str(store_dir)]))
    with AMUStore(store_dir) as store:
        store.put_meta(PATH_KEY, None)
    with pytest.raises(UnfoundFingerprinter, match="whose directory it does not record"):
        named_or_recorded(store_dir, None, writer=True)
    assert named_or_recorded(store_dir, None) is None  # a reader (retrieval.query) goes on without it
    import retrieval.consolidate as consolidate_module

    with AMUStore(store_dir) as store:
        store.put_meta(PATH_KEY, str(moved))
    assert consolidate_module.main(["--store", str(store_dir)]) == 2
    assert f"loaded from {moved}, which is no longer a directory: pass --fingerprinter DIR" in \
        capsys.readouterr().err


# ---------------------------------------------------- reflexives stay reflexive in extracted facts


@pytest.mark.parametrize(("text", "expected"), [
    ("I challenged myself to run a marathon.", "Maria challenged themselves to run a marathon."),
    ("Painting is about letting you express yourself.",
     "Painting is about letting Melanie express themselves."),
    ("You should be proud of yourself!", "Melanie should be proud of themselves!"),
    ("Myself, I prefer tea.", "Maria, Maria prefers tea."),
])
def test_reflexives_stay_reflexive(text, expected):
    assert resolve_pronouns(text, "Maria", "Melanie") == expected
