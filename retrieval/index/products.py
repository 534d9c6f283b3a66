"""The exact inner products a memory bank's channels score with: every row of a matrix (or the
rows given) against one query vector, computed the same way on every machine and without BLAS
threads (:func:`inner_products`), a large product's blocks shared with helper threads."""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

PRODUCT_ROWS = 1024
"""Rows per BLAS call of :func:`inner_products`: fewer than OpenBLAS splits across threads, and a
multiple of the row groups its matrix-vector kernels work in."""
SHARED_BLOCKS = 4
"""A product of at least this many blocks is offered to the helper threads (a smaller one costs
less than the hand-off)."""
PRODUCT_THREADS = max(1, min(os.cpu_count() or 1, 4))
"""Threads that compute one product's blocks at most: the caller and the helpers."""


def inner_products(matrix: np.ndarray, vector: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """``matrix @ vector`` (``matrix[rows] @ vector`` with ``rows``), bit for bit what one call
    computes on one BLAS thread, made of calls of :data:`PRODUCT_ROWS` rows (a single row left
    at the end joins the call before it, which keeps every row in the kernel's row group it
    would have had). No call starts BLAS threads: a search runs beside other searches and the
    ingestion worker, and on a loaded machine a product split across BLAS threads waits for every
    thread to be scheduled (a 10,000-row product took 28 ms split and 2.6 ms in blocks at load
    9 on two cores). One call over more rows than that splits across the machine's threads, so
    its last float bits depend on the machine; these do not. A product of
    :data:`SHARED_BLOCKS` blocks or more is shared (:class:`_Blocks`): a block is the same call
    whichever thread runs it, so the floats do not change."""
    count = len(matrix) if rows is None else len(rows)
    out = np.empty(count, dtype=np.result_type(matrix.dtype, vector.dtype))
    bounds = [*range(0, count, PRODUCT_ROWS), count]
    if len(bounds) > 2 and count - bounds[-2] == 1:
        del bounds[-2]
    blocks = list(itertools.pairwise(bounds))

    def compute(start: int, stop: int) -> None:
        block = matrix[start:stop] if rows is None else matrix[rows[start:stop]]
        np.matmul(block, vector, out=out[start:stop])

    if len(blocks) < SHARED_BLOCKS or PRODUCT_THREADS == 1:
        for start, stop in blocks:
            compute(start, stop)
    else:
        _Blocks(compute, blocks).run()
    return out


class _Blocks:
    """One product's blocks, each taken by the first thread free to run it: the caller and up to
    :data:`PRODUCT_THREADS` - 1 helpers (numpy leaves the GIL during a block). The caller takes
    blocks until none is left, then waits only for the blocks a helper has begun; a helper that
    starts after that finds nothing to do, so a product never waits for a helper busy elsewhere
    (another search's product) or not yet scheduled."""

    def __init__(self, compute: Callable[[int, int], None], blocks: list[tuple[int, int]]) -> None:
        self._compute, self._blocks = compute, blocks
        self._next, self._running = 0, 0
        self._error: BaseException | None = None
        self._changed = threading.Condition()

    def run(self) -> None:
        executor = _helpers()
        for _ in range(PRODUCT_THREADS - 1):
            executor.submit(self._take)
        self._take()
        with self._changed:
            self._changed.wait_for(lambda: self._running == 0)
        if self._error is not None:
            raise self._error

    def _take(self) -> None:
        while True:
            with self._changed:
                if self._next == len(self._blocks) or self._error is not None:
                    return
                start, stop = self._blocks[self._next]
                self._next += 1
                self._running += 1
            failed: BaseException | None = None
            try:
                self._compute(start, stop)
            except BaseException as error:  # re-raised in the caller
                failed = error
            with self._changed:
                self._error = self._error or failed
                self._running -= 1
                self._changed.notify_all()


_EXECUTOR: tuple[int, ThreadPoolExecutor] | None = None
_EXECUTOR_LOCK = threading.Lock()


def _helpers() -> ThreadPoolExecutor:
    """The process's helper threads (made again in a forked child, whose parent's threads are gone)."""
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None or _EXECUTOR[0] != os.getpid():
            _EXECUTOR = (os.getpid(), ThreadPoolExecutor(PRODUCT_THREADS - 1, thread_name_prefix="products"))
        return _EXECUTOR[1]
