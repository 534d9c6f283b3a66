"""What the user types for a store: a directory path, or a URL that is never taken as a path.
A PostgreSQL URL selects the PostgreSQL backend (one clear error where it cannot be used), any
other scheme is refused, and nothing is created on disk for a URL."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from retrieval import Memory
from retrieval.api.errors import StoreUnavailable
from retrieval.ingest import main as ingest_main
from retrieval.memory.backends import open_store
from retrieval.memory.errors import BackendUnavailable, StoreError
from retrieval.memory.store import AMUStore
from retrieval.memory.targets import local_directory, redacted, store_target
from retrieval.service.keys import KeyStore
from retrieval.service.launch import served_store
from retrieval.store import main as store_main
from tests.multi_route_fixtures import WordEmbedder

URL = "postgresql://u@127.0.0.1:1/memory"  # nothing listens on port 1


def test_a_postgresql_url_is_never_a_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreUnavailable):
        Memory.open(URL, embedder=WordEmbedder())
    assert list(tmp_path.iterdir()) == []  # no "postgresql:" directory


def test_without_postgresql_support_a_url_is_one_typed_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "retrieval.memory.postgres.store", None)  # not installed
    with pytest.raises(BackendUnavailable, match=r"^postgresql://u:\*\*\*@127\.0\.0\.1:1/memory: "
                                                 r"PostgreSQL support is not installed"):
        open_store("postgresql://u:secret@127.0.0.1:1/memory")
    with pytest.raises(StoreUnavailable, match="PostgreSQL support is not installed"):
        Memory.open("postgres://u@127.0.0.1:1/memory", embedder=WordEmbedder())
    assert list(tmp_path.iterdir()) == []


def test_another_scheme_is_refused_naming_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreError, match="a store is a directory or a postgresql:// URL, not a mysql:// URL"):
        open_store("mysql://u@h/memory")
    assert list(tmp_path.iterdir()) == []


def test_a_path_opens_the_sqlite_store(tmp_path):
    with open_store(tmp_path / "store") as store:
        assert isinstance(store, AMUStore) and store.local_files == tmp_path / "store"
        assert store.location == str(tmp_path / "store" / AMUStore.DB_NAME)
    with open_store(str(tmp_path / "store"), read_only=True) as store:
        assert store.read_only and store.users() == []


def test_a_store_opened_by_a_relative_path_is_read_there_after_a_chdir(tmp_path, monkeypatch):
    """A read-only memory's reader on a thread that had not read yet opened the relative path again
    from wherever the process had gone (a notebook's ``%cd``), and listed another store's items."""
    for name, text in (("a", "Maria adopted a cat named Luna."), ("b", "Eve keeps a pet python.")):
        with Memory.open(tmp_path / name / "store", embedder=WordEmbedder()) as memory:
            memory.add([{"speaker": "Ann", "text": text}], user_id="alice", session_id="s1")
            memory.flush(user_id="alice", session_id="s1")
    monkeypatch.chdir(tmp_path / "a")
    with Memory.open("store", read_only=True, embedder=WordEmbedder()) as memory:
        monkeypatch.chdir(tmp_path / "b")
        listed: list[str] = []
        reader = threading.Thread(target=lambda: listed.extend(
            item.text for item in memory.list(user_id="alice").items))
        reader.start()
        reader.join()
    assert listed and all("Maria" in text for text in listed), listed


def test_a_serving_command_names_the_store_it_opens_and_whether_it_makes_one(tmp_path, monkeypatch):
    """A relative ``--store`` started from another directory (an MCP client's) made a new, empty
    store there without a word: the start line gives the absolute path and says it is new."""
    monkeypatch.chdir(tmp_path)
    assert served_store(Path("store")) == f"{tmp_path / 'store'} (a new store: nothing was there)"
    with Memory.open("store", embedder=WordEmbedder()):
        pass
    assert served_store(Path("store")) == str(tmp_path / "store")
    assert served_store("postgresql://u:s3cret@db/memory") == "postgresql://u:***@db/memory"


def test_targets_keep_a_url_whole_and_hide_its_password():
    assert store_target(URL) == URL and store_target("runs/store") == Path("runs/store")
    assert local_directory(URL) is None and local_directory("runs/store") == Path.cwd() / "runs/store"
    assert local_directory(Path("postgresql:")) == Path.cwd() / "postgresql:"  # a Path is always a path
    assert redacted("postgresql://u:s3cret@db:5432/memory") == "postgresql://u:***@db:5432/memory"
    assert redacted(URL) == URL and redacted("runs/store") == "runs/store"
    assert redacted("postgresql://u@db/memory?sslmode=require&password=s3cret&sslpassword=k3y") == \
        "postgresql://u@db/memory?sslmode=require&password=***&sslpassword=***"  # libpq reads them there
    for url, shown in [  # never less than the password hidden, with @, /, ? or # in it
            ("postgresql://u:s3cret@[::1/memory", "postgresql://u:***@[::1/memory"),
            ("postgresql://ann:s3#c?re:t@127.0.0.1:1/memory", "postgresql://ann:***@127.0.0.1:1/memory"),
            ("postgresql://u@db/m?password=s3#cret&x=1", "postgresql://u@db/m?password=***&x=1"),
            ("postgresql://u@db/m?pass%77ord=s3cret", "postgresql://u@db/m?pass%77ord=***"),
            ("postgresql://db?PASSWORD=s3@cret", "postgresql://db?PASSWORD=***"),
            ("http://h/v1?q=a@b", "http://h/v1?q=a@b"),
            ("http://user:p@ssw0rd@127.0.0.1:8000/v1", "http://user:***@127.0.0.1:8000/v1"),
            ("postgresql://app:Zm9v/YmFy+s3cret@127.0.0.1:1/db", "postgresql://app:***@127.0.0.1:1/db"),
            ("postgresql://me@corp:s3cret@h/db", "postgresql://me@corp:***@h/db"),
            ("postgresql://[::1]:5432/db", "postgresql://[::1]:5432/db"),
            ("postgresql:///db?host=/sock&password=s3cret", "postgresql:///db?host=/sock&password=***"),
            ("postgresql://h:5432/db?user=me@corp&password=s3cret", "postgresql://h:***@corp&password=***")]:
        assert redacted(url) == shown


def test_command_lines_refuse_a_url_they_cannot_open(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "retrieval.memory.postgres.store", None)
    turns = tmp_path / "turns.jsonl"
    turns.write_text('{"conversation_id": "u", "session_id": "s", "turn_id": "t1", "speaker": "Ann", '
                     '"text": "hello there", "session_time": "2023-05-08T10:00:00"}\n')
    assert ingest_main(["--jsonl", str(turns), "--store", URL, "--no-progress"]) == 2
    assert "PostgreSQL support is not installed" in capsys.readouterr().err
    assert store_main(["check", "--store", URL]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    with pytest.raises(BackendUnavailable, match="PostgreSQL support is not installed"):
        KeyStore(URL)  # a PostgreSQL store's keys are its rows
    assert sorted(p.name for p in tmp_path.iterdir()) == ["turns.jsonl"]


@pytest.mark.parametrize("main", [ingest_main, store_main])
def test_an_empty_store_argument_is_refused_not_read_as_the_current_directory(main, tmp_path, monkeypatch,
                                                                                capsys):
    """An unset ``$STORE`` gives ``--store ""``: no store is made where the command runs."""
    monkeypatch.chdir(tmp_path)
    argv = (["--jsonl", "turns.jsonl", "--store", ""] if main is ingest_main else ["check", "--store", " "])
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2 and "--store: expected a store directory or URL" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
