"""Codebook geometry: code-vector norms, pairwise and nearest-neighbour distances, 2-D PCA."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from isq.codebook import squared_distances

CodeVectors = Tensor | np.ndarray
"""N_c x D code vectors, e.g. ``Fingerprinter.codebook.vectors``."""


def _as_float64(vectors: CodeVectors) -> Tensor:
    # float64, so that distances of hand-built codebooks come out exact
    if isinstance(vectors, Tensor):
        return vectors.detach().cpu().double()
    return torch.as_tensor(np.asarray(vectors, dtype=np.float64))


def code_norms(vectors: CodeVectors) -> np.ndarray:
    """||e_j|| for every code."""
    norms: np.ndarray = _as_float64(vectors).norm(dim=1).numpy()
    return norms


def _distance_matrix(vectors: CodeVectors) -> np.ndarray:
    book = _as_float64(vectors)
    return squared_distances(book, book).sqrt_().numpy()


def pairwise_distances(vectors: CodeVectors) -> np.ndarray:
    """Euclidean distances of all code pairs i < j, in row-major order (N (N - 1) / 2 values)."""
    distances = _distance_matrix(vectors)
    upper = np.triu_indices(distances.shape[0], k=1)
    return distances[upper]


def nearest_neighbour_distances(vectors: CodeVectors) -> tuple[np.ndarray, np.ndarray]:
    """For every code, the distance to its nearest other code and that code's index."""
    distances = _distance_matrix(vectors)
    if distances.shape[0] < 2:
        raise ValueError("nearest neighbours need at least two codes")
    np.fill_diagonal(distances, np.inf)
    nearest = distances.argmin(axis=1)
    return distances[np.arange(distances.shape[0]), nearest], nearest


@dataclass(frozen=True)
class PCA2D:
    """The codebook projected on its two principal axes.

    ``coordinates`` (N, 2); ``explained_variance_ratio`` (2,) of the total variance;
    ``components`` (2, D), unit rows, each signed so its largest-magnitude loading is positive;
    ``mean`` (D,).
    """

    coordinates: np.ndarray
    explained_variance_ratio: np.ndarray
    components: np.ndarray
    mean: np.ndarray


def pca_2d(vectors: CodeVectors) -> PCA2D:
    """Principal component analysis of the code vectors (every code weighs the same)."""
    book = _as_float64(vectors).numpy()
    if min(book.shape) < 2:
        raise ValueError(f"a 2-D PCA needs at least 2 codes of dimension >= 2, got {book.shape}")
    mean = book.mean(axis=0)
    centred = book - mean
    _, singular, vt = np.linalg.svd(centred, full_matrices=False)
    components = vt[:2]
    # SVD signs are arbitrary; fix them so that reruns and tests see the same picture
    largest = np.abs(components).argmax(axis=1)
    components = components * np.sign(components[np.arange(2), largest])[:, None]
    variance = singular**2
    total = variance.sum()
    ratio = variance[:2] / total if total > 0 else np.zeros(2)
    return PCA2D(centred @ components.T, ratio, components, mean)
