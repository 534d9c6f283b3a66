"""What the README's commands print: their own lines, no third-party chatter (issue 23, the
fresh-clone walk-through). Each check runs the command's logging set-up in a fresh interpreter,
as a user's shell does, and captures what reaches the terminal."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _stderr_of(script: str) -> str:
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO,
                            check=True)
    return result.stderr


def test_evaluate_progress_keeps_its_lines_and_drops_library_info():
    stderr = _stderr_of(
        "import logging\n"
        "from retrieval.evaluate import show_progress\n"
        "from retrieval.index.embed import SentenceEmbedder\n"
        "show_progress(True)\n"
        "SentenceEmbedder()\n"
        "logging.getLogger('retrieval.eval.run').info('conv-1: 3 AMUs')\n")
    assert "conv-1: 3 AMUs" in stderr
    assert "Loading SentenceTransformer" not in stderr
    assert stderr.strip() == "conv-1: 3 AMUs"
