"""What makes a bank's first build cheap: the collector paused while it runs, fresh arrays taken
without a copy, records read back in one parse per JSON column (same records)."""

from __future__ import annotations

import gc
import threading

import numpy as np

from retrieval.memory.reads import json_lists
from retrieval.multi_route.collector import collector_paused
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
