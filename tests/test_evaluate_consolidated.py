"""The evaluation on consolidated memory: a consolidation block with equal recall ceilings, a
store bound to being consolidated or not, and paired comparison across the two runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retrieval.consolidation.operations import OfflineOperator
from retrieval.eval.locomo import load_locomo
from retrieval.eval.paired_differences import compare
from retrieval.eval.run import EvalModels, EvaluationSettings, evaluate
from retrieval.memory.errors import StoreMismatch
from tests.test_evaluate import HashEmbedder, fingerprinter_dirs, fingerprinters, write_locomo  # noqa: F401

CONFIGS = ["dense2", "dense1+code1"]


def duplicated_locomo(path: Path) -> list:
    """The test conversation with one turn said twice (a near-duplicate to merge)."""
    data = json.loads(Path(write_locomo(path)).read_text())
    session = data[0]["conversation"]["session_1"]
    session.append(dict(session[0], dia_id=f"D1:{len(session) + 1}"))
    path.write_text(json.dumps(data))
    return load_locomo(path)


def test_consolidated_evaluation_reports_what_changed(tmp_path: Path, fingerprinters) -> None:  # noqa: F811
    conversations = duplicated_locomo(tmp_path / "locomo.json")
    settings = EvaluationSettings(configs=CONFIGS, progress=False)
    plain = evaluate(conversations, EvalModels(fingerprinters, HashEmbedder()), tmp_path / "plain", settings)
    merged = evaluate(conversations, EvalModels(fingerprinters, HashEmbedder(), operator=OfflineOperator()),
                      tmp_path / "merged", settings)
    block = merged.consolidation
    assert plain.consolidation is None and block is not None
    assert block.archived >= 2 and block.created >= 1 and block.lost_turns == 0
    assert block.amus_active_after == block.amus_before - block.archived + block.created
    assert block.recall_ceiling_after == block.recall_ceiling_before
    written = json.loads((tmp_path / "merged" / "results.json").read_text())["consolidation"]
    assert written["refused"] == block.refused >= 0  # every count the reports sum is written
    assert "## Consolidation" in (tmp_path / "merged" / "results.md").read_text()
    with pytest.raises(StoreMismatch, match="consolidation"):
        evaluate(conversations, EvalModels(fingerprinters, HashEmbedder()), tmp_path / "merged", settings)
    table = compare(tmp_path / "plain" / "questions.jsonl", "dense2", ["dense2@merged"],
                    tagged={"merged": tmp_path / "merged" / "questions.jsonl"})
    assert table["dense2@merged"]["overall"].n == plain.configs["dense2"].overall.n
