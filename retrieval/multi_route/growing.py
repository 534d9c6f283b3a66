"""Arrays that grow at the end in amortised O(rows added): spare rows are kept (capacity
doubles) and the filled part is read as a view, so a memory bank's matrices grow as turns and
segments are stored without copying everything on each append."""

from __future__ import annotations

import numpy as np

MIN_ROWS = 64
"""The capacity of a growing array's first allocation."""


class _Growing:
    """The filled part of a preallocated array (rows along axis 0)."""

    def __init__(self, shape: tuple[int, ...], dtype: type) -> None:
        self._data: np.ndarray = np.zeros((0, *shape), dtype=dtype)
        self.size = 0

    @property
    def nbytes(self) -> int:
        """Bytes held, spare rows included."""
        return int(self._data.nbytes)

    @property
    def view(self) -> np.ndarray:
        """The filled part (a view: writing to it writes the array)."""
        return self._data[: self.size]

    def extend(self, rows: np.ndarray, *, fresh: bool = False) -> None:
        """Append ``rows`` (converted to the array's dtype). ``fresh``: nothing else holds or
        writes ``rows``, so an empty array takes them as they are instead of copying them (the
        first fill of a bank built from a large store; the next append copies into a larger one)."""
        rows = np.asarray(rows, dtype=self._data.dtype)
        if fresh and self.size == 0 and rows.flags.c_contiguous and rows.flags.writeable:
            self._data, self.size = rows, len(rows)
            return
        if self.size + len(rows) > len(self._data):
            rows_held = max(2 * len(self._data), self.size + len(rows), MIN_ROWS)
            grown = np.zeros((rows_held, *self._data.shape[1:]), dtype=self._data.dtype)
            grown[: self.size] = self._data[: self.size]
            self._data = grown
        self._data[self.size : self.size + len(rows)] = rows
        self.size += len(rows)


class GrowingRows(_Growing):
    """A float32 matrix of ``dim`` columns."""

    def __init__(self, dim: int) -> None:
        super().__init__((dim,), np.float32)


class GrowingInts(_Growing):
    """An int64 vector."""

    def __init__(self) -> None:
        super().__init__((), np.int64)


class GrowingFlags(_Growing):
    """A boolean vector."""

    def __init__(self) -> None:
        super().__init__((), np.bool_)
