"""A store is bound to its embedder's weights and to what turns them into vectors: the same weights
pooled, truncated or run with another configuration give other vectors, so a store built with one
refuses the other instead of mixing the two models' vectors in one index."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from isq.encoder import MINILM_ALIAS, resolve_encoder_path
from retrieval import Memory
from retrieval.api.errors import StoreUnavailable
from retrieval.index.embed import SentenceEmbedder
from retrieval.memory.cache import model_key
from retrieval.memory.meta_keys import PIPELINE_KEY, bound_alike
from retrieval.memory.store import AMUStore

TURNS = [{"speaker": "Ann", "text": "I keep bees on the roof of the library."},
         {"speaker": "Ben", "text": "Do they mind the winter there?"}]


def edited(directory: Path, name: str, **changes: object) -> None:
    path = directory / name
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.fixture(scope="module")
def model_copy(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("models") / "minilm"
    shutil.copytree(resolve_encoder_path(MINILM_ALIAS), directory)
    return directory


@pytest.mark.parametrize(("name", "changes"), [
    ("1_Pooling/config.json", {"pooling_mode_mean_tokens": False, "pooling_mode_cls_token": True}),
    ("sentence_bert_config.json", {"max_seq_length": 8}),
    ("config.json", {"hidden_act": "relu"}),
])
def test_the_same_weights_run_otherwise_are_another_embedder(model_copy, tmp_path, name, changes):
    directory = tmp_path / "minilm"
    shutil.copytree(model_copy, directory)
    before = SentenceEmbedder(str(directory))
    edited(directory, name, **changes)
    after = SentenceEmbedder(str(directory))
    assert before.identity["sha256"] == after.identity["sha256"]  # the weights did not change
    assert before.identity[PIPELINE_KEY] != after.identity[PIPELINE_KEY]
    again = SentenceEmbedder(str(directory))
    again.encode(["a text longer than the model's inputs " * 60, "a short one"])  # sets truncation, padding
    assert again.identity == after.identity  # and the checksum is stable, encoded before or not


def test_an_embedder_edited_in_place_is_refused_and_an_older_record_keeps_its_vectors(model_copy, tmp_path):
    directory = tmp_path / "minilm"
    shutil.copytree(model_copy, directory)
    with Memory.open(tmp_path / "store", embedder=str(directory)) as memory:
        memory.add(TURNS, user_id="ann", session_id="s1")
        memory.flush(user_id="ann", session_id="s1")
        identity = memory.store.meta("embedder")
    assert identity[PIPELINE_KEY] and identity["name"] == str(directory)
    pooling = directory / "1_Pooling/config.json"
    original = pooling.read_text()
    edited(directory, "1_Pooling/config.json", pooling_mode_mean_tokens=False, pooling_mode_cls_token=True)
    refusal = rf"was built with embedder .* \(they differ in {PIPELINE_KEY}\)"  # the field named
    for read_only in (False, True):
        with pytest.raises(StoreUnavailable, match=refusal):
            Memory.open(tmp_path / "store", embedder=str(directory), read_only=read_only)
    pooling.write_text(original)

    older = {key: value for key, value in identity.items() if key != PIPELINE_KEY}
    assert bound_alike("embedder", older, identity) and not bound_alike("embedder", identity, older)
    database = tmp_path / "store" / AMUStore.DB_NAME
    with sqlite3.connect(database) as db:  # as older code recorded the embedder and cached its vectors
        db.execute("UPDATE meta SET value = ? WHERE key = 'embedder'", (json.dumps(older),))
        db.execute("UPDATE vectors SET model = ? WHERE model = ?", (model_key(older), model_key(identity)))
    db.close()
    cached = cached_vectors(database)
    assert list(cached) == [model_key(older)] and cached[model_key(older)] >= 2
    for read_only in (True, False):  # a reader and a writer both find the vectors it cached
        with Memory.open(tmp_path / "store", embedder=str(directory), read_only=read_only) as memory:
            assert "bees" in memory.search("bees", user_id="ann").hits[0].text
            assert memory.store.meta("embedder") == older  # left as older code reads it
    assert cached_vectors(database) == cached  # none computed again


def cached_vectors(database: Path) -> dict[str, int]:
    with sqlite3.connect(database) as db:
        counts = dict(db.execute("SELECT model, count(*) FROM vectors GROUP BY model").fetchall())
    db.close()
    return counts
