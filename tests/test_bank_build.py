"""What makes a bank's first build cheap: the collector paused while it runs, fresh arrays taken
without a copy, records read back in one parse per JSON column (same records); and what keeps
the states out of a serving process's later full collections (the freezer)."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import weakref

import numpy as np
import pytest

from retrieval.memory.reads import json_lists
from retrieval.multi_route.collector import LongLivedFreezer, collector_paused, installed_freezer
from retrieval.multi_route.growing import GrowingRows


def test_the_collector_is_off_inside_and_as_it_was_after():
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still holds
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()


def test_overlapping_pauses_of_two_threads_end_with_the_last():
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        with collector_paused():
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    inside.wait(10)
    with collector_paused():
        pass
    assert not gc.isenabled()  # the other thread's build is still running
    release.set()
    thread.join(10)
    assert gc.isenabled()


def test_a_fresh_first_fill_is_taken_and_later_rows_are_copied():
    rows = GrowingRows(4)
    first = np.ones((3, 4), dtype=np.float32)
    rows.extend(first, fresh=True)
    assert np.shares_memory(rows.view, first) and rows.view.shape == (3, 4)
    rows.extend(np.full((2, 4), 2.0, dtype=np.float32), fresh=True)  # not empty: grows by copying
    assert not np.shares_memory(rows.view, first)
    assert rows.view.tolist() == [[1.0] * 4] * 3 + [[2.0] * 4] * 2
    held = np.zeros((2, 4), dtype=np.float32)
    other = GrowingRows(4)
    other.extend(held)
    assert not np.shares_memory(other.view, held)


def test_json_columns_parse_as_one_array():
    texts = ['["a", "b"]', "[]", '[1, 2, 3]', '["\\u00e9", "x,y"]']
    assert json_lists(texts) == [["a", "b"], [], [1, 2, 3], ["é", "x,y"]]
    assert json_lists([]) == []


class _Node:
    """A tracked object that a weak reference can watch."""


def _cycle() -> _Node:
    """A node that refers to itself: only the cyclic collector frees it."""
    node = _Node()
    node.__dict__["itself"] = node
    return node


def _remove_freezers() -> None:
    while (freezer := installed_freezer()) is not None:
        freezer.remove()


def test_the_freezer_freezes_survivors_collects_new_cycles_and_thaws_after_its_interval():
    now = [0.0]
    freezer = LongLivedFreezer(objects=1, thaw_s=60.0, clock=lambda: now[0]).install()
    try:
        alive = _Node()
        gc.collect()
        assert gc.get_freeze_count() > 0
        assert not any(entry is alive for entry in gc.get_objects())  # frozen: out of the walks

        acyclic = weakref.ref(alive)
        del alive
        assert acyclic() is None  # a frozen object still goes with its last reference

        later = _cycle()
        made_after = weakref.ref(later)
        del later
        gc.collect()
        assert made_after() is None  # a cycle made after the freeze is collected as before

        frozen = _cycle()
        gc.collect()  # frozen while alive
        kept = weakref.ref(frozen)
        del frozen
        gc.collect()
        assert kept() is not None  # a frozen cycle waits for the thaw ...
        now[0] = 60.0
        gc.collect()
        assert gc.get_freeze_count() == 0
        gc.collect()
        assert kept() is None  # ... and the walk after it frees it
    finally:
        freezer.remove()
    assert gc.get_freeze_count() == 0
    assert freezer not in gc.callbacks


def test_the_freezer_waits_for_a_full_collection_with_enough_survivors():
    freezer = LongLivedFreezer(objects=1)
    try:
        freezer.install()
        gc.collect(0)
        gc.collect(1)
        assert gc.get_freeze_count() == 0  # young collections: nothing frozen, nothing counted
        assert (freezer.full_collections, freezer.full_seconds) == (0, 0.0)
        gc.collect()
        assert freezer.full_collections == 1 and freezer.full_seconds > 0
        assert installed_freezer() is freezer
        freezer.remove()
        LongLivedFreezer(objects=10**9).install().install()  # once, whatever the calls
        assert [type(entry) for entry in gc.callbacks].count(LongLivedFreezer) == 1
        gc.collect()
        assert gc.get_freeze_count() == 0  # too few survivors
    finally:
        _remove_freezers()


POLICY_AT_TORCH_IMPORT = """
import os, sys

seen = []
sys.addaudithook(lambda event, args: event == "import" and args[0] == "torch" and not seen
                 and seen.append(os.environ.get("OMP_WAIT_POLICY")))
command = __import__(sys.argv[1], fromlist=["main"])


def opened(args):
    import torch  # noqa: F401 - the memory would load it here at the latest
    sys.__stdout__.write(f"policy when torch loaded: {seen[0]}\\n")  # the MCP command redirects stdout
    sys.exit(0)


command.open_memory = opened
command.main(sys.argv[2:])
"""


@pytest.mark.parametrize("command", [["retrieval.serve", "--port", "8765"],
                                     ["retrieval.mcp", "--user", "alice"]])
def test_a_server_command_sleeps_idle_openmp_threads_unless_told_otherwise(tmp_path, command):
    """OpenMP reads its wait policy as torch loads: each command sets it before anything it imports
    loads torch. Spinning threads of several servers on the same cores made a forward 7 times as
    slow."""
    from benchmarks.service_process import ROOT, child_env

    def policy(**env: str) -> str:
        environment = {key: value for key, value in child_env().items() if key != "OMP_WAIT_POLICY"}
        done = subprocess.run([sys.executable, "-c", POLICY_AT_TORCH_IMPORT, command[0], "--store",
                               str(tmp_path / "store"), *command[1:]], cwd=ROOT, env={**environment, **env},
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout.split("policy when torch loaded: ")[1].strip()

    assert policy() == "PASSIVE"
    assert policy(OMP_WAIT_POLICY="ACTIVE") == "ACTIVE"


def test_a_serving_process_installs_the_freezer(monkeypatch, tmp_path):
    import argparse

    from retrieval.api.memory import Memory
    from retrieval.service import launch

    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setattr(Memory, "open", staticmethod(lambda store, **options: ("opened", store)))
    try:
        arguments = argparse.Namespace(store=tmp_path, fingerprinter=None, extractor="rule", embedder=None,
                                       threads=None, read_only=False)
        opened = launch.open_memory(arguments)
        assert opened == ("opened", tmp_path)
        assert any(isinstance(entry, LongLivedFreezer) for entry in gc.callbacks)
    finally:
        _remove_freezers()
