"""The exact inner products a memory bank's channels score with: every row of a matrix (or the
rows given) against one query vector, computed the same way on every machine and without BLAS
threads (:func:`inner_products`)."""

from __future__ import annotations

import itertools

import numpy as np

PRODUCT_ROWS = 1024
"""Rows per BLAS call of :func:`inner_products`: fewer than OpenBLAS splits across threads, and a
multiple of the row groups its matrix-vector kernels work in."""


def inner_products(matrix: np.ndarray, vector: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """``matrix @ vector`` (``matrix[rows] @ vector`` with ``rows``), bit for bit what one call
    computes on one BLAS thread, made of calls of :data:`PRODUCT_ROWS` rows (a single row left
    at the end joins the call before it, which keeps every row in the kernel's row group it
    would have had). No call starts BLAS threads: a search runs beside other searches and the
    ingestion worker, and on a loaded machine a product split across threads waits for every
    thread to be scheduled (a 10,000-row product took 28 ms split and 2.6 ms in blocks at load
    9 on two cores). One call over more rows than that splits across the machine's threads, so
    its last float bits depend on the machine; these do not."""
    count = len(matrix) if rows is None else len(rows)
    out = np.empty(count, dtype=np.result_type(matrix.dtype, vector.dtype))
    bounds = [*range(0, count, PRODUCT_ROWS), count]
    if len(bounds) > 2 and count - bounds[-2] == 1:
        del bounds[-2]
    for start, stop in itertools.pairwise(bounds):
        block = matrix[start:stop] if rows is None else matrix[rows[start:stop]]
        np.matmul(block, vector, out=out[start:stop])
    return out
