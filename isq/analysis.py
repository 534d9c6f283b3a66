"""Codebook health: utilisation, geometry, fingerprints, stability and co-occurrence topology.

One fingerprinter pass, :func:`collect`, turns a text sample into :class:`SampleCodes` (tokens,
token codes, ||z_t|| and the quantisation error ||z_t - e_k||^2 of every non-padding token).
Everything else is a plain function over arrays (counts, a codebook, code sequences, the
co-occurrence matrix M and the S_code matrix of SPEC section 3), so each statistic can be
checked on hand-built inputs. ``isq.report`` and ``notebooks/codebook_analysis.ipynb`` draw them.

The topology functions take arrays rather than a ``retrieval`` object: ``retrieval`` depends on
``isq``, not the other way round.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp
import torch
from torch import Tensor

from isq.fingerprint import Fingerprinter, collapse_repeats
from isq.quantizer import fp32_island, squared_distances

Codebook = Tensor | np.ndarray
"""N_c x D code vectors, e.g. ``Fingerprinter.codebook``."""

# ---------------------------------------------------------------------------- the sample


@dataclass
class SampleCodes:
    """Per-text results of one fingerprinter pass (padding removed, one entry per text).

    ``tokens``: the tokenizer's token strings; ``token_codes``: the nearest code per token;
    ``z_norms``: ||z_t||; ``errors``: ||z_t - e_{kappa_t}||^2. ``num_codes``: N_c.
    """

    texts: list[str]
    tokens: list[list[str]]
    token_codes: list[np.ndarray]
    z_norms: list[np.ndarray]
    errors: list[np.ndarray]
    num_codes: int

    @property
    def all_codes(self) -> np.ndarray:
        """Every token code of the sample, texts concatenated in order."""
        return _concatenate(self.token_codes, np.int64)

    @property
    def all_z_norms(self) -> np.ndarray:
        return _concatenate(self.z_norms, np.float64)

    @property
    def all_errors(self) -> np.ndarray:
        return _concatenate(self.errors, np.float64)

    def select(self, indices: Sequence[int]) -> SampleCodes:
        """The texts at ``indices``, in that order."""
        return SampleCodes(
            texts=[self.texts[i] for i in indices],
            tokens=[self.tokens[i] for i in indices],
            token_codes=[self.token_codes[i] for i in indices],
            z_norms=[self.z_norms[i] for i in indices],
            errors=[self.errors[i] for i in indices],
            num_codes=self.num_codes,
        )


def _concatenate(arrays: Sequence[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(arrays).astype(dtype) if arrays else np.zeros(0, dtype=dtype)


def nearest_codes(z: Tensor, codebook: Tensor) -> tuple[Tensor, Tensor]:
    """Nearest code index and its squared distance ||z_t - e_k||^2 for z (n, D), codebook (N, D).

    The same argmin as the fingerprinter's, so the codes agree with ``Fingerprinter.token_codes``.
    """
    with fp32_island():
        distances = squared_distances(z.float(), codebook.float())
    errors, codes = distances.min(dim=1)
    return codes, errors


@torch.inference_mode()
def collect(fingerprinter: Fingerprinter, texts: Sequence[str], batch_size: int = 64) -> SampleCodes:
    """Run the fingerprinter over ``texts`` (truncated to ``config.max_length`` tokens)."""
    if isinstance(texts, str):
        raise TypeError("collect() takes a sequence of texts, not a single string")
    if not texts:
        raise ValueError("collect() needs at least one text")
    tokenizer = fingerprinter.tokenizer
    count = len(texts)
    tokens: list[list[str]] = [[] for _ in range(count)]
    codes: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * count
    norms: list[np.ndarray] = [np.zeros(0)] * count
    errors: list[np.ndarray] = [np.zeros(0)] * count
    order = sorted(range(count), key=lambda i: len(texts[i]))  # length-sorted batches pad less
    for start in range(0, count, batch_size):
        chunk = order[start : start + batch_size]
        batch = tokenizer(
            [texts[i] for i in chunk], padding=True, truncation=True,
            max_length=fingerprinter.config.max_length, return_tensors="pt",
        ).to(fingerprinter.device)
        z = fingerprinter.semantic_encoder(batch["input_ids"], batch["attention_mask"]).float()
        flat_codes, flat_errors = nearest_codes(z.reshape(-1, z.shape[-1]), fingerprinter.codebook)
        batch_codes = flat_codes.reshape(z.shape[:-1]).cpu().numpy()
        batch_errors = flat_errors.reshape(z.shape[:-1]).double().cpu().numpy()
        batch_norms = z.norm(dim=-1).double().cpu().numpy()
        mask = batch["attention_mask"].bool().cpu().numpy()
        ids = batch["input_ids"].cpu().numpy()
        for row, i in enumerate(chunk):
            keep = mask[row]
            tokens[i] = tokenizer.convert_ids_to_tokens(ids[row][keep].tolist())
            codes[i] = batch_codes[row][keep].astype(np.int64)
            norms[i] = batch_norms[row][keep]
            errors[i] = batch_errors[row][keep]
    return SampleCodes(list(texts), tokens, codes, norms, errors, fingerprinter.codebook_size)


def sample_texts(texts: Sequence[str], size: int, seed: int = 0) -> list[str]:
    """A reproducible random subset of ``size`` texts, kept in their original order."""
    if size >= len(texts):
        return list(texts)
    chosen = sorted(random.Random(seed).sample(range(len(texts)), size))
    return [texts[i] for i in chosen]


# ---------------------------------------------------------------------------- utilisation


@dataclass(frozen=True)
class UsageStats:
    """How evenly a sample uses the codebook.

    A code is dead here when no token of the sample maps to it (training's revival rule uses a
    windowed mean count instead). ``entropy`` is in nats; ``normalised_entropy`` divides it by
    log N_c (1 = uniform use); ``perplexity`` = exp(entropy), between 1 and N_c; ``gini`` is the
    Gini coefficient of the per-code counts over all N_c codes (0 = uniform, 1 - 1/N_c = a single code).
    """

    num_codes: int
    tokens: int
    used: int
    dead: int
    dead_share: float
    entropy: float
    normalised_entropy: float
    perplexity: float
    gini: float


def code_counts(codes: npt.ArrayLike, num_codes: int) -> np.ndarray:
    """Per-code token counts (length ``num_codes``); negative entries (padding) are ignored."""
    codes = np.asarray(codes, dtype=np.int64).ravel()
    codes = codes[codes >= 0]
    if codes.size and codes.max() >= num_codes:
        raise ValueError(f"code {codes.max()} is outside a codebook of {num_codes} codes")
    return np.bincount(codes, minlength=num_codes)


def gini(values: npt.ArrayLike) -> float:
    """Gini coefficient of non-negative values: 0 when all are equal, (n - 1) / n for one non-zero."""
    x = np.sort(np.asarray(values, dtype=np.float64).ravel())
    total = x.sum()
    if x.size == 0 or total == 0:
        raise ValueError("the Gini coefficient needs at least one positive value")
    ranks = np.arange(1, x.size + 1)
    return float(2.0 * (ranks * x).sum() / (x.size * total) - (x.size + 1) / x.size)


def usage_stats(counts: npt.ArrayLike) -> UsageStats:
    """Utilisation statistics from per-code counts (see :func:`code_counts`)."""
    counts = np.asarray(counts, dtype=np.float64)
    total = counts.sum()
    if total == 0:
        raise ValueError("no token was counted")
    p = counts[counts > 0] / total
    entropy = float(-(p * np.log(p)).sum())
    num_codes = counts.size
    dead = int((counts == 0).sum())
    return UsageStats(
        num_codes=num_codes,
        tokens=int(total),
        used=num_codes - dead,
        dead=dead,
        dead_share=dead / num_codes,
        entropy=entropy,
        normalised_entropy=float(entropy / np.log(num_codes)) if num_codes > 1 else 1.0,
        perplexity=float(np.exp(entropy)),
        gini=gini(counts),
    )


# ---------------------------------------------------------------------------- geometry


def _as_float64(codebook: Codebook) -> Tensor:
    # float64, so that distances of hand-built codebooks come out exact
    if isinstance(codebook, Tensor):
        return codebook.detach().cpu().double()
    return torch.as_tensor(np.asarray(codebook, dtype=np.float64))


def code_norms(codebook: Codebook) -> np.ndarray:
    """||e_j|| for every code."""
    return _as_float64(codebook).norm(dim=1).numpy()


def _distance_matrix(codebook: Codebook) -> np.ndarray:
    book = _as_float64(codebook)
    return squared_distances(book, book).sqrt_().numpy()


def pairwise_distances(codebook: Codebook) -> np.ndarray:
    """Euclidean distances of all code pairs i < j, in row-major order (N (N - 1) / 2 values)."""
    distances = _distance_matrix(codebook)
    upper = np.triu_indices(distances.shape[0], k=1)
    return distances[upper]


def nearest_neighbour_distances(codebook: Codebook) -> tuple[np.ndarray, np.ndarray]:
    """For every code, the distance to its nearest other code and that code's index."""
    distances = _distance_matrix(codebook)
    if distances.shape[0] < 2:
        raise ValueError("nearest neighbours need at least two codes")
    np.fill_diagonal(distances, np.inf)
    nearest = distances.argmin(axis=1)
    return distances[np.arange(distances.shape[0]), nearest], nearest


@dataclass(frozen=True)
class LexicalConsistency:
    """How word-like the codes are, over (token, code) pairs of a sample (special tokens left out).

    ``code_given_token``: H(code | token) in bits — 0 when every occurrence of a token gets the
    same code; ``token_given_code``: H(token | code) — 0 when every code stands for one token.
    Exact-match retrieval over code sets needs both to be low.
    """

    code_given_token: float
    token_given_code: float
    pairs: int


def _conditional_entropy(pairs: Sequence[tuple[object, object]]) -> float:
    """H(second | first) in bits from observed pairs."""
    joint, first = Counter(pairs), Counter(a for a, _ in pairs)
    n = len(pairs)
    return float(-sum(c / n * np.log2(c / first[a]) for (a, _), c in joint.items())) if n else 0.0


def lexical_consistency(sample: SampleCodes, special: Sequence[str] = ("[CLS]", "[SEP]", "</s>", "<pad>")) -> LexicalConsistency:
    """H(code | token) and H(token | code) of ``sample`` (see :class:`LexicalConsistency`)."""
    skip = set(special)
    pairs = [(t, int(c)) for tokens, codes in zip(sample.tokens, sample.token_codes, strict=True)
             for t, c in zip(tokens, codes, strict=True) if t not in skip]
    return LexicalConsistency(
        code_given_token=_conditional_entropy(pairs),
        token_given_code=_conditional_entropy([(c, t) for t, c in pairs]),
        pairs=len(pairs),
    )


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


def pca_2d(codebook: Codebook) -> PCA2D:
    """Principal component analysis of the code vectors (every code weighs the same)."""
    book = _as_float64(codebook).numpy()
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


# ---------------------------------------------------------------------------- token <-> code


@dataclass(frozen=True)
class CodeConcordance:
    """What maps to one code: its token count, most frequent tokens and contexts (with counts).

    A context is the token with ``width`` neighbours each side, the token itself in brackets.
    """

    code: int
    count: int
    tokens: list[tuple[str, int]]
    contexts: list[tuple[str, int]]


def concordance(sample: SampleCodes, top: int = 5, width: int = 1) -> dict[int, CodeConcordance]:
    """For every used code, its ``top`` tokens and ``top`` contexts; ordered by code count."""
    token_counts: dict[int, Counter[str]] = {}
    context_counts: dict[int, Counter[str]] = {}
    for tokens, codes in zip(sample.tokens, sample.token_codes, strict=True):
        for position, code in enumerate(codes.tolist()):
            token_counts.setdefault(code, Counter())[tokens[position]] += 1
            left = tokens[max(0, position - width) : position]
            right = tokens[position + 1 : position + 1 + width]
            context = " ".join([*left, f"[{tokens[position]}]", *right])
            context_counts.setdefault(code, Counter())[context] += 1
    order = sorted(token_counts, key=lambda c: (-sum(token_counts[c].values()), c))
    return {
        code: CodeConcordance(
            code=code,
            count=sum(token_counts[code].values()),
            tokens=token_counts[code].most_common(top),
            contexts=context_counts[code].most_common(top),
        )
        for code in order
    }


def word_codes(sample: SampleCodes, pieces: Sequence[str]) -> Counter[tuple[int, ...]]:
    """The code sequences a word gets across the sample, with counts.

    ``pieces`` is the word as the tokenizer splits it (``tokenizer.tokenize(word)``); every
    occurrence of that token sequence in a text counts once.
    """
    pieces = list(pieces)
    if not pieces:
        raise ValueError("a word needs at least one token")
    found: Counter[tuple[int, ...]] = Counter()
    for tokens, codes in zip(sample.tokens, sample.token_codes, strict=True):
        for start in range(len(tokens) - len(pieces) + 1):
            if tokens[start : start + len(pieces)] == pieces:
                found[tuple(codes[start : start + len(pieces)].tolist())] += 1
    return found


def frequent_words(sample: SampleCodes, count: int, min_length: int = 4) -> list[str]:
    """The ``count`` most frequent whole-word alphabetic tokens of at least ``min_length`` letters."""
    words: Counter[str] = Counter(
        token for tokens in sample.tokens for token in tokens
        if token.isalpha() and len(token) >= min_length
    )
    return [word for word, _ in words.most_common(count)]


# ---------------------------------------------------------------------------- fingerprints


@dataclass(frozen=True)
class FingerprintLengths:
    """Per text: L (tokens), |S_fp| (repeats collapsed) and |U_fp| (distinct codes)."""

    tokens: np.ndarray
    sequence: np.ndarray
    distinct: np.ndarray

    def summary(self) -> dict[str, float]:
        """Means and medians, and the mean |S_fp| / L and |U_fp| / L ratios."""
        lengths = np.maximum(self.tokens, 1)  # an empty text has nothing to compress
        return {
            "mean_L": float(self.tokens.mean()),
            "median_L": float(np.median(self.tokens)),
            "mean_S_fp": float(self.sequence.mean()),
            "median_S_fp": float(np.median(self.sequence)),
            "mean_U_fp": float(self.distinct.mean()),
            "median_U_fp": float(np.median(self.distinct)),
            "mean_S_fp_over_L": float((self.sequence / lengths).mean()),
            "mean_U_fp_over_L": float((self.distinct / lengths).mean()),
        }


def fingerprint_lengths(token_codes: Sequence[Sequence[int]]) -> FingerprintLengths:
    """Lengths of L, S_fp and U_fp for every text's token codes."""
    if not token_codes:
        raise ValueError("no fingerprints")
    codes = [list(np.asarray(c).tolist()) for c in token_codes]
    return FingerprintLengths(
        tokens=np.array([len(c) for c in codes]),
        sequence=np.array([len(collapse_repeats(c)) for c in codes]),
        distinct=np.array([len(set(c)) for c in codes]),
    )


# ---------------------------------------------------------------------------- stability

# Capitalised names that are not also common words ("Will", "May", "Bill" are left out).
NAMES = (
    "John", "Mary", "Tom", "Jane", "Jack", "Susan", "David", "Linda", "Peter", "Anna", "Ben",
    "Lisa", "Paul", "Kate", "Sarah", "James", "Emily", "Bob", "Alice", "Steve", "Nancy", "Jim",
    "Sam", "Tony", "Helen", "Mike", "Laura", "Carla", "Luis", "Grace",
)
_NAME_PATTERN = re.compile(r"\b(" + "|".join(NAMES) + r")\b")
_NUMBER_PATTERN = re.compile(r"\d+")


def substitute_name(text: str) -> str | None:
    """Replace the first known first name with the next one in :data:`NAMES`; None if there is none."""
    match = _NAME_PATTERN.search(text)
    if match is None:
        return None
    other = NAMES[(NAMES.index(match.group(1)) + 1) % len(NAMES)]
    return text[: match.start()] + other + text[match.end() :]


def change_digit(text: str) -> str | None:
    """Change the last digit of the first number (a day, hour, year, price); None without digits."""
    match = _NUMBER_PATTERN.search(text)
    if match is None:
        return None
    last = match.end() - 1
    return text[:last] + str((int(text[last]) + 1) % 10) + text[last + 1 :]


EDITS: dict[str, Callable[[str], str | None]] = {"name": substitute_name, "digit": change_digit}
"""The small edits of the stability check, by name."""


def edited_texts(texts: Sequence[str], edit: Callable[[str], str | None]) -> tuple[list[int], list[str]]:
    """Indices of the texts that ``edit`` applies to, and their edited versions."""
    indices, edited = [], []
    for i, text in enumerate(texts):
        changed = edit(text)
        if changed is not None:
            indices.append(i)
            edited.append(changed)
    return indices, edited


@dataclass(frozen=True)
class Stability:
    """Share of identical token codes between texts and their edited versions.

    Only pairs with equal token counts are compared, position by position (``compared``;
    the others are ``skipped``). ``share`` is over every aligned position; ``share_unedited``
    only over positions whose token did not change, i.e. how far an edit's effect spreads.
    Either is NaN when there is nothing to compare.
    """

    share: float
    share_unedited: float
    compared: int
    skipped: int


def stability(original: SampleCodes, edited: SampleCodes) -> Stability:
    """Compare text i of ``original`` with text i of ``edited``."""
    if len(original.texts) != len(edited.texts):
        raise ValueError(f"{len(original.texts)} original texts but {len(edited.texts)} edited ones")
    same = positions = same_unedited = unedited = compared = 0
    for tokens_a, codes_a, tokens_b, codes_b in zip(
        original.tokens, original.token_codes, edited.tokens, edited.token_codes, strict=True
    ):
        if len(codes_a) != len(codes_b):
            continue
        compared += 1
        equal_codes = codes_a == codes_b
        equal_tokens = np.array([a == b for a, b in zip(tokens_a, tokens_b, strict=True)], dtype=bool)
        same += int(equal_codes.sum())
        positions += len(codes_a)
        same_unedited += int((equal_codes & equal_tokens).sum())
        unedited += int(equal_tokens.sum())
    return Stability(
        share=same / positions if positions else float("nan"),
        share_unedited=same_unedited / unedited if unedited else float("nan"),
        compared=compared,
        skipped=len(original.texts) - compared,
    )


# ---------------------------------------------------------------------------- topology


def degrees(cooccurrence: sp.spmatrix | np.ndarray) -> np.ndarray:
    """Topology degree of every code: the number of other codes it co-occurs with (M_ab > 0, b != a)."""
    entries = sp.csr_matrix(cooccurrence).tocoo()  # via CSR: duplicate entries summed
    partners = (entries.row != entries.col) & (entries.data != 0)
    return np.bincount(entries.row[partners], minlength=entries.shape[0])


@dataclass(frozen=True)
class Association:
    """S_code(target | source) and how often the two codes co-occur directly (M_ab)."""

    source: int
    target: int
    score: float
    cooccurrences: int


def top_associations(
    code_scores: np.ndarray,
    cooccurrence: sp.spmatrix | np.ndarray,
    k: int = 20,
    indirect_only: bool = False,
    sources: np.ndarray | None = None,
) -> list[Association]:
    """The ``k`` strongest off-diagonal S_code entries (row = source, column = target).

    With ``indirect_only``, only pairs that never co-occur directly (M_ab = 0), i.e. links
    that exist through multi-hop walks alone. ``sources``, a boolean mask over codes, limits
    the source codes (e.g. to codes seen in enough units: a code seen once has a high IDF and
    trivially certain co-occurrences). Zero scores are never listed; ties go to the smaller
    (source, target).
    """
    scores = np.array(code_scores, dtype=np.float64)
    np.fill_diagonal(scores, 0.0)
    if sources is not None:
        scores[~np.asarray(sources, dtype=bool)] = 0.0
    counts = sp.csr_matrix(cooccurrence)
    if indirect_only:
        direct = counts.tocoo()
        scores[direct.row[direct.data > 0], direct.col[direct.data > 0]] = 0.0
    flat = np.flatnonzero(scores > 0)
    order = flat[np.lexsort((flat, -scores.ravel()[flat]))][:k]
    sources, targets = np.unravel_index(order, scores.shape)
    return [
        Association(int(a), int(b), float(scores[a, b]), int(counts[a, b]))
        for a, b in zip(sources, targets, strict=True)
    ]
