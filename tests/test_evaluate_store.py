"""``retrieval.evaluate --store``: an existing store evaluated read-only, as it is. Each text is
embedded and fingerprinted once per run although the store can keep nothing, so its retrievals
time retrieval, not model forwards; a store whose build stopped half-way is refused."""

from __future__ import annotations

import sqlite3
from collections import Counter
from dataclasses import replace
from pathlib import Path

from isq.fingerprint import Fingerprinter
from retrieval.eval.locomo import load_locomo
from retrieval.eval.run import EvalModels, EvaluationSettings, evaluate
from tests.test_evaluate import HashEmbedder, fingerprinter_dirs, write_locomo  # noqa: F401 - a fixture

SETTINGS = EvaluationSettings(k_dense=2, k_code=2, progress=False)


class CountingEmbedder(HashEmbedder):
    def __init__(self) -> None:
        self.texts: Counter[str] = Counter()

    def encode(self, texts):
        self.texts.update(texts)
        return super().encode(texts)


def counting(fingerprinter: Fingerprinter) -> Counter[str]:
    """The texts ``fingerprinter`` fingerprints from now on, counted."""
    texts: Counter[str] = Counter()
    fingerprint = fingerprinter.fingerprint

    def counted(batch, *args, **kwargs):
        texts.update(batch)
        return fingerprint(batch, *args, **kwargs)

    fingerprinter.fingerprint = counted  # type: ignore[method-assign]
    return texts


def test_a_read_only_store_computes_each_text_once_per_run(tmp_path: Path,
                                                           fingerprinter_dirs) -> None:  # noqa: F811
    """A store that cached nothing (built by ``retrieval.ingest``, which does not embed the
    questions; here: its cache emptied) evaluated read-only: the route queries embedded and
    fingerprinted in one batch before the timed retrievals were computed again inside each
    configuration's retrievals and recall curves, one query at a time (21 times a rerun's time on
    the dev file, and multi-route latencies of model forwards)."""
    conversations = load_locomo(write_locomo(tmp_path / "locomo.json"))
    fingerprinters = {name: Fingerprinter.from_pretrained(path) for name, path in fingerprinter_dirs.items()}
    built = evaluate(conversations, EvalModels(fingerprinters, HashEmbedder()), tmp_path / "built", SETTINGS)
    db = sqlite3.connect(tmp_path / "built" / "store" / "amus.sqlite3")
    with db:
        db.execute("DELETE FROM vectors")
        db.execute("DELETE FROM codes")
    db.close()
    embedder = CountingEmbedder()
    prints = {name: counting(fingerprinter) for name, fingerprinter in fingerprinters.items()}
    stored = evaluate(conversations, EvalModels(fingerprinters, embedder), tmp_path / "stored",
                      replace(SETTINGS, store=tmp_path / "built" / "store"))
    assert embedder.texts and max(embedder.texts.values()) == 1, embedder.texts.most_common(3)
    for texts in prints.values():
        assert texts and max(texts.values()) == 1, texts.most_common(3)
    assert stored.construction.this_run["embeddings_computed"] == len(embedder.texts)
    assert {name: summary.overall.recall for name, summary in stored.configs.items()} == {
        name: summary.overall.recall for name, summary in built.configs.items()}
