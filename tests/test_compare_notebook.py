"""notebooks/compare_codebooks.ipynb: committed without outputs, and runs headless on two tiny
fingerprinters (B the start of A, as a warm start would be) and a tiny questions.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
import torch
from nbclient import NotebookClient

from isq.model import ISQModel
from tests.conftest import tiny_config

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "compare_codebooks.ipynb"


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict[str, Path]:
    """B: a tiny random fingerprinter; A: the same one with codes 0-7 moved by one unit each."""
    root = tmp_path_factory.mktemp("pair")
    torch.manual_seed(0)
    model = ISQModel(tiny_config())
    dirs = {"B": model.export_fingerprinter(root / "b")}
    with torch.no_grad():
        vectors = model.quantizer.codebook.vectors
        vectors[:8] += torch.nn.functional.normalize(torch.randn_like(vectors[:8]), dim=1)
    dirs["A"] = model.export_fingerprinter(root / "a")
    return dirs


def _questions(path: Path) -> Path:
    """Three questions: A wins one (multi-hop), B one (single-hop, lexical gap), one tie."""
    rows = [("multi-hop", ["D1:1", "D1:2"], ["D1:1", "D1:2"], ["D1:1"], False),
            ("single-hop", ["D1:3"], [], ["D1:3"], True),
            ("temporal", ["D1:4"], ["D1:4"], ["D1:4"], False)]
    path.write_text("".join(json.dumps({
        "conversation": "c", "qa_index": i, "category": category, "question": f"question {i}?",
        "evidence": evidence,
        "found": {"multi": [], "multi+code": a, "multi+kmeans": b}, "lexical_gap": gap}) + "\n"
        for i, (category, evidence, a, b, gap) in enumerate(rows)))
    return path


def test_committed_notebook_has_no_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code and all(cell.outputs == [] and cell.execution_count is None for cell in code)


def test_notebook_puts_two_codebooks_side_by_side(pair, tmp_path, monkeypatch):
    monkeypatch.setenv("ISQ_FINGERPRINTER_A", str(pair["A"]))
    monkeypatch.setenv("ISQ_FINGERPRINTER_B", str(pair["B"]))
    monkeypatch.setenv("ISQ_SAMPLE_SIZE", "40")
    monkeypatch.setenv("ISQ_QUESTIONS",
                       f"{_questions(tmp_path / 'q.jsonl')}:{_questions(tmp_path / 'q2.jsonl')}")
    monkeypatch.setenv("ISQ_DAILYDIALOG", "synthetic")
    monkeypatch.delenv("ISQ_CONFIG_A", raising=False)
    monkeypatch.delenv("ISQ_CONFIG_B", raising=False)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    (tmp_path / "kernel").mkdir()  # a kernel outside the repository: paths still the repository's
    NotebookClient(notebook, kernel_name="python3", timeout=180,
                   resources={"metadata": {"path": str(tmp_path / "kernel")}}).execute()
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 5  # usage, geometry, moved, purity, wins
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    markdown = "".join(o.get("data", {}).get("text/markdown", "") for o in outputs)
    assert "40 texts from the project's synthetic corpus" in printed
    # 8 of 64 codes moved one unit; the other 56 did not move at all
    moved = printed.split("median move ")[1]
    assert moved.startswith("0 (") and "still nearest to their start" in moved
    assert "| multi+code | -16.7 [" in markdown  # (+50 - 100 + 0) / 3 points, pooled over two equal runs
    assert "| multi-hop | 1 | 0 | 0 |" in markdown and "| single-hop | 0 | 1 | 0 |" in markdown
    assert "| lexical gap | 0 | 1 | 0 |" in markdown
    assert "question 0?" in markdown and "question 1?" in markdown
