"""The process's model thread: a call handed to it runs there, one at a time, its result or error
back in the caller, which the call can name; a call made on it runs at once; a forked child gets
a thread of its own. The memory loads its models there and every forward of its models runs there,
whichever thread asks (a search's caller, the ingestion worker), so the process has one OpenMP
team (its effect on speed is a benchmark's: docs/performance.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from retrieval import Memory
from retrieval.api.loading import Deferred
from retrieval.index.model_thread import MODEL_THREAD, calling_thread, on_model_thread
from tests.test_ingest import HashEmbedder, conversation_turns

REPO = Path(__file__).resolve().parents[1]


def thread_name() -> str:
    return threading.current_thread().name


def test_a_call_runs_on_the_model_thread_and_its_error_reaches_the_caller():
    assert on_model_thread(thread_name) == "model-forwards" != thread_name()
    with pytest.raises(ZeroDivisionError):
        on_model_thread(lambda: 1 / 0)
    assert on_model_thread(lambda: on_model_thread(thread_name)) == "model-forwards"  # on itself: at once
    assert on_model_thread(calling_thread) is threading.current_thread() is calling_thread()


def test_calls_from_several_threads_run_one_at_a_time_in_arrival_order():
    held, started = threading.Event(), threading.Event()
    order: list[str] = []

    def first() -> None:
        started.set()
        assert held.wait(30)
        order.append("first")

    caller = threading.Thread(target=lambda: on_model_thread(first))
    caller.start()
    assert started.wait(30)
    second = threading.Thread(target=lambda: on_model_thread(lambda: order.append("second")))
    second.start()
    second.join(0.3)
    assert second.is_alive() and order == []  # queued behind the held call
    held.set()
    caller.join(30)
    second.join(30)
    assert order == ["first", "second"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_gets_a_model_thread_of_its_own():
    assert on_model_thread(thread_name) == "model-forwards"  # the parent's thread is running
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's exit status is the assertion
        os._exit(0 if on_model_thread(lambda: 41 + 1) == 42 else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert MODEL_THREAD.run(thread_name) == "model-forwards"


class ThreadRecordingEmbedder(HashEmbedder):
    """Records the thread of each ``encode``."""

    def __init__(self) -> None:
        self.threads: set[str] = set()

    def encode(self, texts):
        self.threads.add(thread_name())
        return super().encode(texts)


def test_the_memory_loads_and_runs_its_models_on_the_model_thread(tmp_path):
    loaded: list[str] = []
    embedder = ThreadRecordingEmbedder()

    def load() -> ThreadRecordingEmbedder:
        loaded.append(thread_name())
        return embedder

    with Memory.open(tmp_path / "memory", embedder=Deferred(load)) as memory:
        memory.add(conversation_turns("u")[:12], user_id="u", session_id="s1")
        memory.flush(user_id="u", session_id="s1")
        assert memory.search("garden tomatoes", user_id="u", k=3).hits
    assert loaded == ["model-forwards"]
    assert embedder.threads == {"model-forwards"}  # the ingestion worker's, the flush's, the search's


def test_an_interrupt_while_a_forward_runs_there_ends_the_process_as_an_interrupt(tmp_path):
    """Ctrl-C reaches the waiting caller; the forward on the model thread finishes first, so the
    interpreter does not exit under it (torch would abort the process). The forward sends the
    interrupt itself, once the caller waits, so that it lands while the forward runs however busy
    the machine is (a timer beside it could fire after the forward had ended). The script takes
    Ctrl-C as Python does by default: a process started in a shell's background inherits SIGINT
    ignored, and Python then leaves it so (the test exited 0 when the suite ran that way)."""
    script = tmp_path / "interrupted.py"
    script.write_text(
        "import os, signal, time, torch\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from retrieval.index.model_thread import on_model_thread\n"
        "a = torch.randn(384, 384)\n"
        "def forward():\n"
        "    time.sleep(0.3)  # the caller is waiting by now\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    for _ in range(4000):\n"
        "        torch.relu(a @ a)\n"
        "on_model_thread(forward)\n")
    done = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == -signal.SIGINT, done.stderr[-500:]
    assert "KeyboardInterrupt" in done.stderr
