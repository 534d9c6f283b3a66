"""What the README's commands print: their own lines, no third-party chatter, so a reader
following the README on a fresh clone sees only what concerns them. Each check runs the
command's logging set-up in a fresh interpreter, as a user's shell does, and captures what
reaches the terminal."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

from training.quiet import quiet_third_party_noise

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


def test_a_resumed_or_validated_checkpoint_does_not_warn_about_its_old_directory():
    # what `--validate_only true --ckpt_path runs/smoke/version_0/checkpoints/last.ckpt` printed
    message = ("The dirpath has changed from 'runs/smoke/version_0/checkpoints' to '/repo/checkpoints', "
               "therefore `best_model_score`, `kth_best_model_path`, `kth_value`, `last_model_path` and "
               "`best_k_models` won't be reloaded. Only `best_model_path` will be reloaded.")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_third_party_noise()
        warnings.warn(message, stacklevel=1)
        warnings.warn("a warning that is the user's business", stacklevel=1)
    assert [str(w.message) for w in caught] == ["a warning that is the user's business"]


def test_the_server_drops_the_mcp_session_manager_chatter_and_keeps_its_warnings():
    stderr = _stderr_of(
        "import logging\n"
        "from retrieval.serve import MCP_SESSION_LOGGERS, quiet_mcp_session_logs\n"
        "logging.basicConfig(level=logging.INFO, format='%(message)s')\n"
        "quiet_mcp_session_logs()\n"
        "for name in MCP_SESSION_LOGGERS:\n"
        "    logging.getLogger(name).info('StreamableHTTP session manager started')\n"
        "    logging.getLogger(name).info('Terminating session: None')\n"
        "    logging.getLogger(name).warning('a session failed')\n")
    assert stderr.split() == ["a", "session", "failed"] * 2
