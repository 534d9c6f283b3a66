"""Path A: dense k-NN over L2-normalised AMU embeddings with faiss (docs/design.md §4.1).

Vectors are L2-normalised, so inner product is cosine similarity. Ids are the insertion order
(0, 1, 2, ...), which is the AMU index shared with the topology and the retriever's metadata.
"""

from __future__ import annotations

import json
from pathlib import Path

import faiss
import numpy as np

KINDS = ("flat", "ivf", "hnsw")

_CONFIG_FILE = "dense.json"
_INDEX_FILE = "dense.faiss"


class DenseIndex:
    """Inner-product index over normalised embeddings.

    Args:
        dim: embedding dimension.
        kind: "flat" (exact ``IndexFlatIP``, the default and the reference), "ivf" (inverted
            file with ``nlist`` lists, ``nprobe`` probed per query; trained on the first batch
            added, which must hold at least ``nlist`` vectors) or "hnsw" (graph with ``hnsw_m``
            links per node, ``ef_search`` candidates per query). The approximate kinds are for
            banks large enough that a flat scan per query is too slow.
    """

    def __init__(
        self,
        dim: int,
        kind: str = "flat",
        nlist: int = 1024,
        nprobe: int = 32,
        hnsw_m: int = 32,
        ef_search: int = 128,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if dim < 1:
            raise ValueError(f"dim must be positive, got {dim}")
        self.dim = dim
        self.kind = kind
        self.nlist = nlist
        self.nprobe = nprobe
        self.hnsw_m = hnsw_m
        self.ef_search = ef_search
        factory = {"flat": "Flat", "ivf": f"IVF{nlist},Flat", "hnsw": f"HNSW{hnsw_m},Flat"}[kind]
        self._index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
        self._apply_search_params()

    def _apply_search_params(self) -> None:
        params = faiss.ParameterSpace()
        if self.kind == "ivf":
            params.set_index_parameter(self._index, "nprobe", self.nprobe)
        elif self.kind == "hnsw":
            params.set_index_parameter(self._index, "efSearch", self.ef_search)

    def __len__(self) -> int:
        return int(self._index.ntotal)

    def _as_matrix(self, vectors: np.ndarray) -> np.ndarray:
        matrix = np.ascontiguousarray(vectors, dtype=np.float32)
        if matrix.ndim == 1:
            matrix = matrix.reshape(1, -1)
        if matrix.ndim != 2 or matrix.shape[1] != self.dim:
            raise ValueError(f"expected vectors of dimension {self.dim}, got shape {np.shape(vectors)}")
        return matrix

    def add(self, vectors: np.ndarray) -> np.ndarray:
        """Append vectors (n x dim, L2-normalised); returns their ids."""
        matrix = self._as_matrix(vectors)
        start = len(self)
        if matrix.shape[0] == 0:
            return np.zeros(0, dtype=np.int64)
        if not self._index.is_trained:
            if matrix.shape[0] < self.nlist:
                raise ValueError(
                    f"an ivf index trains on its first batch, which needs >= nlist={self.nlist} "
                    f"vectors (got {matrix.shape[0]}); use kind='flat' for small banks"
                )
            self._index.train(matrix)
        self._index.add(matrix)
        return np.arange(start, start + matrix.shape[0], dtype=np.int64)

    def search(self, query_vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k by inner product for each query row: (scores float32, ids int64), both nq x k'.

        k' = min(k, len(self)), so an empty index gives nq x 0 arrays. Approximate kinds may find
        fewer than k' neighbours; those slots hold id -1 (and a meaningless score).
        """
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        queries = self._as_matrix(query_vectors)
        k = min(k, len(self))
        if k == 0 or queries.shape[0] == 0:
            shape = (queries.shape[0], k)
            return np.zeros(shape, dtype=np.float32), np.zeros(shape, dtype=np.int64)
        scores, ids = self._index.search(queries, k)
        return scores, ids.astype(np.int64)

    def save(self, directory: str | Path) -> None:
        """Write ``dense.json`` (parameters) and ``dense.faiss`` (the index)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        config = {
            "dim": self.dim,
            "kind": self.kind,
            "nlist": self.nlist,
            "nprobe": self.nprobe,
            "hnsw_m": self.hnsw_m,
            "ef_search": self.ef_search,
        }
        (directory / _CONFIG_FILE).write_text(json.dumps(config, indent=2))
        faiss.write_index(self._index, str(directory / _INDEX_FILE))

    @classmethod
    def load(cls, directory: str | Path) -> DenseIndex:
        """Read an index written by :meth:`save`."""
        directory = Path(directory)
        index = cls(**json.loads((directory / _CONFIG_FILE).read_text()))
        index._index = faiss.read_index(str(directory / _INDEX_FILE))
        index._apply_search_params()
        return index
