"""Codebook co-occurrence topology and Path B search (docs/design.md §3, MemCode "key design 3").

Every AMU u is reduced to its fingerprint code set U_fp(u) (distinct codes of a codebook
of N_c codes). Over the bank of N_u AMUs the topology keeps

- n(a): the number of AMUs whose code set contains a (document frequency),
- M_ab: the number of AMUs containing both a and b, a != b (sparse, N_c x N_c),
- P(b|a) = M_ab / sum_b' M_ab' (rows of codes that never co-occur stay zero),
- S_code(b|a) = log((N_u + 1) / (n(a) + 1)) * max_{1<=h<=H_r} [P^h]_ab * alpha^h.

A query fingerprint Q_fp activates every code b with A(b) = max_{a in Q_fp} S_code(b|a) and
an AMU scores S_amu(u) = max_{b in U_fp(u)} A(b). Path B returns the K best AMUs.

The bank itself is an AMU x code incidence matrix X (CSR, never dense); M grows by X_new^T X_new
as AMUs arrive, so adding never rebuilds the co-occurrence counts. P is held sparse (recomputed
lazily when the bank changed) and a query expands only its own codes' rows of S_code, so no
search holds an N_c x N_c array: 16,384 codes would need 2 GB for each dense one. The analysis
does (:meth:`CooccurrenceTopology.code_scores`, read by ``python -m isq.report``: at 16,384 codes
it holds S_code and its temporaries, several GB).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from isq.identity import check_identity, normalise_identity
from isq.ranges import NON_NEGATIVE, Range, check_ranges
from isq.topk import check_k, code_array, top_k_of_scores
from isq.walks import max_walk, sum_walk

AGGREGATES = ("max", "sum")
ASSOCIATIONS = ("conditional", "lift", "target_idf")

_CONFIG_FILE = "topology.json"
_ARRAYS_FILE = "topology.npz"


@dataclass(frozen=True)
class TopologyParams:
    """Path B's parameters, defined once for the topology, the retrievers and every CLI.

    Args:
        max_hops: H_r, the longest walk on P that counts; 0 keeps the self term alone (the
            standing ablation: an IDF-weighted overlap of code sets).
        alpha: per-hop decay α in (0, 1].
        self_term: add an h = 0 term, so a query code also activates itself with its IDF:
            S_code(a|a) = max(S_code(a|a), IDF(a)) (the paper's formula starts at h = 1).
        aggregate: "max" (the paper's S_amu) or "sum" (sum of A(b) over the AMU's codes).
        association: how a walk of h hops from a to b is weighted. "conditional" is the paper's
            IDF(a) · α^h · [P^h]_ab, which favours common targets (a code found in most units is
            reached from anywhere). "lift" divides by the target's share of all co-occurrences,
            π(b) = Σ_a M_ab / Σ M: α^h · max(0, log([P^h]_ab / π(b))), the pointwise mutual
            information of the walk, which is 0 for a target no likelier after a than anywhere
            and at most the self-information of b (the scale of the self term's IDF).
        length_norm: with ``aggregate="sum"``, divide S_amu(u) by |U_fp(u)|^length_norm, so a
            long unit does not win by having many weakly activated codes (0 = off).

    The paper gives no H_r or α. The defaults (H_r = 1, α = 0.3, self term, sum, conditional)
    were chosen by the 36-setting sweep on the LoCoMo development conversations
    (``docs/results.md``), where the self term and sum aggregation mattered and the walk did
    not. The paper's setting (docs/design.md §3.5) is ``TopologyParams(2, 0.5, False, "max")`` (or
    any H_r, α), the setting whose search walks an inverted index without scanning the bank.
    """

    max_hops: int = 1
    alpha: float = 0.3
    self_term: bool = True
    aggregate: str = "sum"
    association: str = "conditional"
    length_norm: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.max_hops, bool) or not isinstance(self.max_hops, int) or self.max_hops < 0:
            raise ValueError(f"max_hops must be an integer >= 0, got {self.max_hops!r}")
        if not isinstance(self.self_term, bool) or (self.max_hops == 0 and not self.self_term):
            raise ValueError(f"self_term must be True or False (True with max_hops 0): {self.self_term!r}")
        check_ranges("TopologyParams", asdict(self), {"alpha": Range(0, 1, low_open=True),
                                                      "length_norm": NON_NEGATIVE}, required=True)
        if self.aggregate not in AGGREGATES:
            raise ValueError(f"aggregate must be one of {AGGREGATES}, got {self.aggregate!r}")
        if self.association not in ASSOCIATIONS:
            raise ValueError(f"association must be one of {ASSOCIATIONS}, got {self.association!r}")
        if self.length_norm and self.aggregate != "sum":
            raise ValueError(f"length_norm applies to aggregate 'sum', not {self.aggregate!r}")

    def label(self) -> str:
        extra = "" if self.association == "conditional" else f" {self.association}"
        extra += f" len^{self.length_norm}" if self.length_norm else ""
        return (f"H_r={self.max_hops} α={self.alpha} self={'on' if self.self_term else 'off'} "
                f"{self.aggregate}{extra}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class CooccurrenceTopology:
    """Co-occurrence topology over AMU code sets, with exact top-K Path B search.

    Args:
        num_codes: codebook size N_c.
        params: Path B parameters (:class:`TopologyParams`); may be reassigned between queries
            (e.g. in a sweep), S_code is then recomputed on the next query.
        identity: the fingerprinter identity (``codebook_size``, ``codebook_sha256``) recorded
            when the bank is saved and checked when it is loaded.
    """

    def __init__(self, num_codes: int = 1024, params: TopologyParams = TopologyParams(),
                 identity: Mapping[str, Any] | None = None) -> None:
        if isinstance(num_codes, bool) or not isinstance(num_codes, int) or num_codes < 1:
            raise ValueError(f"num_codes must be a positive integer, got {num_codes!r}")
        if not isinstance(params, TopologyParams):
            raise TypeError(f"params must be a TopologyParams, got {type(params).__name__}")
        self.identity = normalise_identity(identity)
        if self.identity is not None and self.identity["codebook_size"] != num_codes:
            raise ValueError(f"num_codes={num_codes} disagrees with the fingerprinter codebook_size "
                             f"{self.identity['codebook_size']}")
        self.num_codes, self.params = num_codes, params
        self._incidence = sp.csr_matrix((0, num_codes), dtype=np.int8)
        self._pending: list[sp.csr_matrix] = []
        self._doc_freq: np.ndarray = np.zeros(num_codes, dtype=np.int64)
        self._cooc = sp.csr_matrix((num_codes, num_codes), dtype=np.int64)
        self._postings: sp.csc_matrix | None = None
        self._version = 0
        self._transition: tuple[int, sp.csr_matrix] | None = None

    # ------------------------------------------------------------------ building

    def add(self, code_sets: Iterable[Iterable[int]]) -> np.ndarray:
        """Append AMUs given as code sets (e.g. ``Fingerprint.codes``); returns their indices."""
        arrays = [code_array(list(codes)) for codes in code_sets]
        lengths = np.fromiter((a.size for a in arrays), dtype=np.int64, count=len(arrays))
        indptr = np.concatenate(([0], np.cumsum(lengths)))
        codes = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
        return self.add_incidence(indptr, codes)

    def add_incidence(self, indptr: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """Append AMUs given in CSR form: the codes of AMU i are ``codes[indptr[i]:indptr[i+1]]``.

        This is the vectorised path for large banks; repeated codes within an AMU count once.
        Returns the indices of the new AMUs.
        """
        indptr = np.asarray(indptr, dtype=np.int64)
        codes = code_array(codes)
        if indptr.ndim != 1 or indptr.size < 1 or indptr[0] != 0 or indptr[-1] != codes.size:
            raise ValueError("indptr must start at 0 and end at len(codes)")
        if np.any(np.diff(indptr) < 0):
            raise ValueError("indptr must be non-decreasing")
        if codes.size and (codes.min() < 0 or codes.max() >= self.num_codes):
            raise ValueError(f"codes must lie in [0, {self.num_codes})")
        start = self.num_units
        count = indptr.size - 1
        if count:
            new = sp.csr_matrix((np.ones(codes.size, dtype=np.int32), codes, indptr),
                                shape=(count, self.num_codes))
            new.sum_duplicates()  # a code set is a set: repeated codes merge into one entry
            # 0/1 entries stored as int8 to keep the bank small; upcast where counts are summed
            self._pending.append(sp.csr_matrix((np.ones(new.nnz, dtype=np.int8), new.indices, new.indptr),
                                               shape=new.shape))
        return np.arange(start, start + count, dtype=np.int64)

    def _fold_pending(self) -> None:
        """Fold AMUs added since the last read into n, M (M += X_new^T X_new) and the bank."""
        if not self._pending:
            return
        new = self._pending[0] if len(self._pending) == 1 else sp.vstack(self._pending, format="csr")
        self._pending = []
        self._doc_freq += np.bincount(new.indices, minlength=self.num_codes)
        new_counts = new.astype(np.int32)
        gram = (new_counts.T @ new_counts).tocsr().astype(np.int64)
        # docs/design.md §3.1: M_ab counts a != b only
        gram = gram - sp.diags(gram.diagonal(), format="csr", dtype=np.int64)
        gram.eliminate_zeros()
        self._cooc = (self._cooc + gram).tocsr()
        self._incidence = sp.vstack([self._incidence, new], format="csr")
        self._postings = None
        self._version += 1

    def with_params(self, params: TopologyParams) -> CooccurrenceTopology:
        """The same counts scored under other parameters (a topology sweep): a copy that shares
        the count matrices, for reading; AMUs added afterwards reach neither consistently."""
        self._fold_pending()
        view = copy.copy(self)
        view.params = params
        return view

    def prepare(self) -> None:
        """Do the lazy work now (fold new AMUs, P, inverted index), e.g. before serving queries."""
        self.transition()
        self.postings()

    # ------------------------------------------------------------------ statistics

    @property
    def num_units(self) -> int:
        """N_u, the number of AMUs in the bank (including ones not folded in yet)."""
        return int(self._incidence.shape[0]) + sum(int(chunk.shape[0]) for chunk in self._pending)

    @property
    def doc_freq(self) -> np.ndarray:
        """n(a) for every code a (int64, length N_c)."""
        self._fold_pending()
        freq: np.ndarray = self._doc_freq.copy()
        return freq

    @property
    def cooccurrence(self) -> sp.csr_matrix:
        """M as a sparse N_c x N_c matrix with a zero diagonal."""
        self._fold_pending()
        return self._cooc.copy()

    @property
    def incidence(self) -> sp.csr_matrix:
        """The AMU x code incidence matrix X (0/1 entries)."""
        self._fold_pending()
        return self._incidence

    @property
    def nbytes(self) -> int:
        """Bytes held by the bank's sparse structures (X, its inverted index, M and the cached P)."""
        self._fold_pending()
        total = self._doc_freq.nbytes
        cached_transition = None if self._transition is None else self._transition[1]
        for matrix in (self._incidence, self._postings, self._cooc, cached_transition):
            if matrix is not None:
                total += matrix.data.nbytes + matrix.indices.nbytes + matrix.indptr.nbytes
        return total

    def transition(self) -> sp.csr_matrix:
        """P(b|a) as a sparse N_c x N_c CSR matrix; rows of codes without co-occurrences are empty."""
        self._fold_pending()
        if self._transition is None or self._transition[0] != self._version:
            probs = self._cooc.astype(np.float64)
            probs.eliminate_zeros()
            totals = np.asarray(probs.sum(axis=1), dtype=np.float64).ravel()
            probs.data /= np.repeat(totals, np.diff(probs.indptr))  # division, as M_ab / sum_b' M_ab'
            self._transition = (self._version, probs)
        return self._transition[1]

    def idf(self) -> np.ndarray:
        """log((N_u + 1) / (n(a) + 1)) for every code a (docs/design.md §3.2)."""
        self._fold_pending()
        units = int(self._incidence.shape[0])
        idf: np.ndarray = np.log((units + 1) / (self._doc_freq + 1.0))
        return idf

    def code_score_rows(self, sources: np.ndarray) -> np.ndarray:
        """Rows ``sources`` of S_code (docs/design.md §3.2), shape (len(sources), N_c), column b =
        target code: P^h is walked from these rows only, so a query holds |Q_fp| x N_c floats at any N_c."""
        params = self.params
        sources = np.asarray(sources, dtype=np.int64)
        idf = self.idf()
        best = np.zeros((sources.size, self.num_codes))
        if params.max_hops:
            probs = self.transition()
            target_share = self._target_share() if params.association == "lift" else None
            power = probs[sources].toarray()
            for hop in range(1, params.max_hops + 1):
                if hop > 1:
                    power = np.asarray(power @ probs)
                np.maximum(best, self._weigh(power, target_share) * params.alpha**hop, out=best)
            if params.association == "conditional":
                best *= idf[sources][:, None]
            elif params.association == "target_idf":
                best *= idf[None, :]
        if params.self_term:
            rows = np.arange(sources.size)
            best[rows, sources] = np.maximum(best[rows, sources], idf[sources])
        return best

    def code_scores(self) -> np.ndarray:
        """All of S_code as a dense N_c x N_c float64 array (analysis and tests; queries use rows)."""
        return self.code_score_rows(np.arange(self.num_codes))

    def _target_share(self) -> np.ndarray:
        """π(b): code b's share of all co-occurrence counts (0 for a code that never co-occurs)."""
        totals = np.asarray(self._cooc.sum(axis=0), dtype=np.float64).ravel()
        share: np.ndarray = totals / max(float(totals.sum()), 1.0)
        return share

    @staticmethod
    def _weigh(walk: np.ndarray, target_share: np.ndarray | None) -> np.ndarray:
        """[P^h]_ab as is ("conditional"), or its positive log-lift over π(b) ("lift")."""
        if target_share is None:
            return walk
        lift = np.divide(walk, target_share[None, :], out=np.zeros_like(walk),
                         where=target_share[None, :] > 0)
        weighted: np.ndarray = np.log(np.maximum(lift, 1.0))
        return weighted

    # ------------------------------------------------------------------ scoring

    def activation(self, query_codes: Iterable[int]) -> np.ndarray:
        """A(b) = max_{a in Q_fp} S_code(b|a) for every code b; all zero for an empty query."""
        query = np.unique(code_array(list(query_codes)))
        if query.size and (query[0] < 0 or query[-1] >= self.num_codes):
            raise ValueError(f"query codes must lie in [0, {self.num_codes})")
        if query.size == 0:
            return np.zeros(self.num_codes, dtype=np.float64)
        best: np.ndarray = self.code_score_rows(query).max(axis=0)
        return best

    def unit_scores(self, query_codes: Iterable[int]) -> np.ndarray:
        """S_amu(u) of every AMU for the query (length N_u); linear in the bank size."""
        act = self.activation(query_codes)
        bank = self.incidence
        scores: np.ndarray
        if self.params.aggregate == "sum":
            scores = np.asarray(bank @ act)
            if self.params.length_norm:
                scores = scores / np.maximum(np.diff(bank.indptr), 1) ** self.params.length_norm
            return scores
        scores = np.zeros(bank.shape[0], dtype=np.float64)
        lengths = np.diff(bank.indptr)
        nonempty = lengths > 0
        if nonempty.any():
            # reduceat over the start of each non-empty row spans exactly that row's codes
            scores[nonempty] = np.maximum.reduceat(act[bank.indices], bank.indptr[:-1][nonempty])
        return scores

    def search_bruteforce(self, query_codes: Iterable[int], k: int,
                          exclude: Iterable[int] = ()) -> tuple[np.ndarray, np.ndarray]:
        """Reference Path B: score every AMU, return the top k (indices, scores).

        Order: score descending, then AMU index ascending; excluded and zero-score AMUs never
        appear. This is the definition that :meth:`search` must reproduce exactly.
        """
        return top_k_of_scores(self.unit_scores(query_codes), k, exclude)

    def search(self, query_codes: Iterable[int], k: int,
               exclude: Iterable[int] = ()) -> tuple[np.ndarray, np.ndarray]:
        """Path B top-k (indices, scores), identical to :meth:`search_bruteforce`.

        With ``aggregate="max"`` the bank is not scanned (:func:`isq.walks.max_walk`). With
        ``aggregate="sum"`` the inverted index is walked with MaxScore pruning, AMUs reached
        being scored exactly from their rows of X (:func:`isq.walks.sum_walk`).
        """
        check_k(k)
        if self.params.length_norm:  # per-unit normalisation breaks the walk's bounds: score every unit
            return self.search_bruteforce(query_codes, k, exclude)
        if self.params.aggregate == "sum":
            return sum_walk(self.activation(query_codes), self.incidence, self.postings(), k, exclude)
        return max_walk(self.activation(query_codes), self.postings(), k, exclude)

    def postings(self) -> sp.csc_matrix:
        """The bank in CSC form: column b lists the AMUs containing code b, ascending."""
        bank = self.incidence
        if self._postings is None:
            postings = bank.tocsc()
            postings.sort_indices()
            self._postings = postings
        return self._postings

    # ------------------------------------------------------------------ persistence

    def save(self, directory: str | Path) -> None:
        """Write ``topology.json`` (parameters, identity) and ``topology.npz`` (X, M, n)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._fold_pending()
        config = {"num_codes": self.num_codes, **self.params.to_dict(), "identity": self.identity,
                  "num_units": self._incidence.shape[0]}
        (directory / _CONFIG_FILE).write_text(json.dumps(config, indent=2))
        np.savez(
            directory / _ARRAYS_FILE,
            incidence_indptr=self._incidence.indptr,
            incidence_indices=self._incidence.indices,
            cooc_data=self._cooc.data,
            cooc_indices=self._cooc.indices,
            cooc_indptr=self._cooc.indptr,
            doc_freq=self._doc_freq,
        )

    @classmethod
    def load(cls, directory: str | Path, identity: Mapping[str, Any]) -> CooccurrenceTopology:
        """Read a saved topology, refusing one built by another fingerprinter than ``identity``."""
        directory = Path(directory)
        config = json.loads((directory / _CONFIG_FILE).read_text())
        check_identity(config["identity"], identity, f"topology in {directory}")
        params = TopologyParams(**{key: config[key] for key in TopologyParams.__dataclass_fields__
                                   if key in config})
        topology = cls(num_codes=config["num_codes"], params=params, identity=config["identity"])
        n_codes = topology.num_codes
        with np.load(directory / _ARRAYS_FILE) as arrays:
            indices = arrays["incidence_indices"]
            topology._incidence = sp.csr_matrix(
                (np.ones(indices.size, dtype=np.int8), indices, arrays["incidence_indptr"]),
                shape=(config["num_units"], n_codes))
            topology._cooc = sp.csr_matrix((arrays["cooc_data"], arrays["cooc_indices"],
                                            arrays["cooc_indptr"]),
                                           shape=(n_codes, n_codes))
            topology._doc_freq = arrays["doc_freq"].astype(np.int64)
        return topology
