"""``kill -9`` of a process using the memory API: during a burst of adds every acknowledged turn
is stored exactly once after a reopen; during a consolidation job the job resumes and ends as an
uninterrupted one would."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from retrieval import Memory
from retrieval.consolidation.audit import audit
from retrieval.memory.store import AMUStore
from tests.multi_route_fixtures import WordEmbedder

REPO = Path(__file__).resolve().parents[2]

ADDER = """
import sys
sys.path.insert(0, {repo!r})
from retrieval import Memory
from tests.multi_route_fixtures import WordEmbedder
with Memory.open({path!r}, embedder=WordEmbedder()) as mem:
    for i in range(10_000):
        mem.add([{{"speaker": "AB"[i % 2], "text": f"turn {{i}} talks about gardens number {{i % 7}}",
                   "turn_id": f"t{{i}}"}}], user_id="u", session_id=f"s{{i // 40}}")
        print("ack", i, flush=True)
"""

CONSOLIDATOR = """
import sys, time
sys.path.insert(0, {repo!r})
from retrieval import Memory
from retrieval.consolidation.operations import OfflineOperator
from tests.multi_route_fixtures import WordEmbedder

class Slow(OfflineOperator):
    def decide(self, cluster):
        time.sleep(1.0)
        return super().decide(cluster)

STATEMENTS = ["I love hiking in the Alps.", "My sister bakes bread on Sundays.", \
"We adopted a puppy named Rex.",
              "Tom plays the violin beautifully."]

mem = Memory.open({path!r}, embedder=WordEmbedder(), operator=Slow())
for i in range(24):
    mem.add([{{"speaker": "Ann", "text": STATEMENTS[i % 4]}}], user_id="u", session_id="s")
mem.flush(user_id="u", session_id="s")
print("job", mem.consolidate(user_id="u").id, flush=True)
time.sleep(600)
"""


def spawn(script: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})


def test_every_acknowledged_add_survives_a_kill_exactly_once(tmp_path):
    process = spawn(ADDER.format(repo=str(REPO), path=str(tmp_path)))
    acked = []
    assert process.stdout is not None
    for line in process.stdout:
        acked.append(int(line.split()[1]))
        if len(acked) == 97:  # mid-session, segments closed and open
            break
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    with Memory.open(tmp_path, embedder=WordEmbedder()) as mem:
        with AMUStore(tmp_path, read_only=True) as reader:
            turns = reader.turns("u")
        stored = [turn.turn_id for turn in turns]
        assert len(stored) == len(set(stored)) and {f"t{i}" for i in acked} <= set(stored)
        assert mem.search("turn 96 talks about gardens", user_id="u", k=3).hits
        again = mem.add([{"speaker": "B", "text": "turn 5 talks about gardens number 5", "turn_id": "t5"}],
                        user_id="u", session_id="s0")
        assert again.turn_ids == () and again.duplicates == ("t5",)
        for session in {turn.session_id for turn in turns}:  # a turn stored after the last one read
            mem.flush(user_id="u", session_id=session)      # as acknowledged may open another session
    with AMUStore(tmp_path, read_only=True) as reader:
        covered = [turn_id for segment in reader.segments("u") for turn_id in segment.turn_ids]
        assert sorted(covered) == sorted(stored)  # each stored turn in exactly one committed segment


def job_state(path: Path, user: str) -> str | None:
    """The state of the user's one job (job ids are opaque tokens: the row is found by its user)."""
    db = sqlite3.connect(f"file:{path / AMUStore.DB_NAME}?mode=ro", uri=True, timeout=30)
    try:
        row = db.execute("SELECT state FROM jobs WHERE conversation_id = ?", (user,)).fetchone()
    finally:
        db.close()
    return None if row is None else row[0]


def test_a_consolidation_job_killed_while_running_resumes_after_reopen(tmp_path):
    process = spawn(CONSOLIDATOR.format(repo=str(REPO), path=str(tmp_path)))
    assert process.stdout is not None
    job_id = process.stdout.readline().split()[1]
    deadline = time.monotonic() + 120
    while job_state(tmp_path, "u") != "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # into the first cluster's decision
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert job_state(tmp_path, "u") == "running"
    with Memory.open(tmp_path, embedder=WordEmbedder()) as mem:
        deadline = time.monotonic() + 120
        while mem.job(job_id, user_id="u").state != "done" and time.monotonic() < deadline:
            time.sleep(0.05)
        job = mem.job(job_id, user_id="u")
        assert job.state == "done", job
        records = mem.list(user_id="u", limit=100).items
        assert len(records) == 4  # the four distinct statements, each merged once
        assert all(mem.history(record.id, user_id="u") for record in records)
    with AMUStore(tmp_path, read_only=True) as reader:
        assert audit(reader).ok
