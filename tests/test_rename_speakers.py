"""``scripts/rename_speakers.py``: a renaming replaces whole words everywhere in a LoCoMo file, and
the alignment pairs only runs over the same questions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "rename_speakers.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_a_renaming_replaces_whole_words_in_every_string(tmp_path):
    source = [{"sample_id": "c", "conversation": {"speaker_a": "Mel", "speaker_b": "Melanie", "session_1": [
        {"speaker": "Mel", "dia_id": "D1:1", "text": "Melanie, Mel's Melody is here."}]},
        "qa": [{"question": "What did Mel say to Melanie?", "answer": "Mel.", "evidence": ["D1:1"]}]}]
    (tmp_path / "in.json").write_text(json.dumps(source))
    done = run("write", str(tmp_path / "in.json"), str(tmp_path / "out.json"), "Mel=Nat", "Melanie=Natalie")
    assert done.returncode == 0, done.stderr
    out = json.loads((tmp_path / "out.json").read_text())[0]
    assert (out["conversation"]["speaker_a"], out["conversation"]["speaker_b"]) == ("Nat", "Natalie")
    assert out["conversation"]["session_1"][0]["text"] == "Natalie, Nat's Melody is here."
    assert out["qa"][0]["question"] == "What did Nat say to Natalie?" and out["qa"][0]["evidence"] == ["D1:1"]
    assert run("write", str(tmp_path / "in.json"), str(tmp_path / "x.json"), "Mel=").returncode != 0


def test_alignment_keeps_the_base_texts_and_refuses_other_questions(tmp_path):
    def row(index: int, question: str) -> dict:
        return {"conversation": "c", "qa_index": index, "category": 1, "evidence": ["D1:1"],
                "question": question, "recall": {"dense20": 1.0}}

    (tmp_path / "base.jsonl").write_text("".join(json.dumps(row(i, f"Mel {i}?")) + "\n" for i in range(2)))
    (tmp_path / "renamed.jsonl").write_text("".join(json.dumps(row(i, f"Nat {i}?")) + "\n" for i in range(2)))
    base, renamed = str(tmp_path / "base.jsonl"), str(tmp_path / "renamed.jsonl")
    done = run("align", base, renamed, str(tmp_path / "out.jsonl"))
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["question"] for r in rows] == ["Mel 0?", "Mel 1?"]
    (tmp_path / "other.jsonl").write_text("".join(json.dumps(row(i, "Nat?")) + "\n" for i in (5, 1)))
    refused = run("align", base, str(tmp_path / "other.jsonl"), str(tmp_path / "o.jsonl"))
    assert refused.returncode != 0 and "does not hold the questions" in refused.stderr
