"""``retrieval.evaluate --store``: an existing store evaluated read-only, as it is. Each text is
embedded and fingerprinted once per run although the store can keep nothing, so its retrievals
time retrieval, not model forwards; a store whose build stopped half-way is refused."""

from __future__ import annotations

import sqlite3
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from isq.fingerprint import Fingerprinter
from retrieval.eval.configs import EvaluationError
from retrieval.eval.locomo import load_locomo
from retrieval.eval.run import EvalModels, EvaluationSettings, evaluate
from tests.test_evaluate import (  # noqa: F401 - fingerprinter_dirs is a fixture
    HashEmbedder,
    fingerprinter_dirs,
    interrupted_flush,
    write_locomo,
)

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
    """A store built outside the evaluation (by ``retrieval.ingest``, which neither embeds the
    questions nor records its cost; here: its cache and cost emptied) evaluated read-only: the route
    queries embedded and fingerprinted in one batch before the timed retrievals were computed again
    inside each configuration's retrievals and recall curves, one query at a time (21 times a rerun's
    time on the dev file, and multi-route latencies of model forwards), and its construction was
    reported as "ingestion 0.0 s"."""
    conversations = load_locomo(write_locomo(tmp_path / "locomo.json"))
    fingerprinters = {name: Fingerprinter.from_pretrained(path) for name, path in fingerprinter_dirs.items()}
    built = evaluate(conversations, EvalModels(fingerprinters, HashEmbedder()), tmp_path / "built", SETTINGS)
    db = sqlite3.connect(tmp_path / "built" / "store" / "amus.sqlite3")
    with db:
        db.execute("DELETE FROM vectors")
        db.execute("DELETE FROM codes")
        db.execute("DELETE FROM meta WHERE key = 'construction:conv-t'")
    db.close()
    embedder = CountingEmbedder()
    prints = {name: counting(fingerprinter) for name, fingerprinter in fingerprinters.items()}
    stored = evaluate(conversations, EvalModels(fingerprinters, embedder), tmp_path / "stored",
                      replace(SETTINGS, store=tmp_path / "built" / "store"))
    assert embedder.texts and max(embedder.texts.values()) == 1, embedder.texts.most_common(3)
    for texts in prints.values():
        assert texts and max(texts.values()) == 1, texts.most_common(3)
    assert stored.construction.this_run["embeddings_computed"] == len(embedder.texts)
    assert (built.construction.unrecorded, stored.construction.unrecorded) == ([], ["conv-t"])
    report = (tmp_path / "stored" / "results.md").read_text()
    assert "not recorded for conv-t, built outside the evaluation" in report
    assert {name: summary.overall.recall for name, summary in stored.configs.items()} == {
        name: summary.overall.recall for name, summary in built.configs.items()}


def test_a_store_whose_build_stopped_after_its_turns_were_stored_is_refused(tmp_path: Path,
                                                                           fingerprinter_dirs) -> None:  # noqa: F811
    """Killed after the second session's turns were stored but before they were taken into records:
    the turns match the file, so the store was evaluated, exit 0, with those turns' evidence
    missing from every configuration (77.5% recall against 100% on a review's cut). Refused now;
    the run that resumes the build makes it evaluable."""
    from retrieval.api.memory import Memory

    conversations = load_locomo(write_locomo(tmp_path / "locomo.json"))
    fingerprinters = {name: Fingerprinter.from_pretrained(path) for name, path in fingerprinter_dirs.items()}
    models = EvalModels(fingerprinters, HashEmbedder())
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(Memory, "flush", interrupted_flush(2))
        with pytest.raises(KeyboardInterrupt):
            evaluate(conversations, models, tmp_path / "built", SETTINGS)
    store = replace(SETTINGS, store=tmp_path / "built" / "store")
    refused = r"turns of conv-t are stored but not yet taken into its records \(from 'D2:\d+'; its ingestion"
    with pytest.raises(EvaluationError, match=refused):
        evaluate(conversations, models, tmp_path / "stored", store)
    evaluate(conversations, models, tmp_path / "built", SETTINGS)  # resumes the build
    assert evaluate(conversations, models, tmp_path / "stored", store).configs
