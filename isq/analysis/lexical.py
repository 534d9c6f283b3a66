"""Token <-> code: how word-like the codes are, what maps to each code, which codes a word gets."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from isq.analysis.sample import SampleCodes


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


def lexical_consistency(sample: SampleCodes,
                        special: Sequence[str] = ("[CLS]", "[SEP]", "</s>", "<pad>")) -> LexicalConsistency:
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


WORD_START = ("▁", "Ġ")
"""How SentencePiece (T5) and byte-level BPE (GPT-2, RoBERTa) mark a token that starts a word;
WordPiece (BERT, MiniLM) marks the others instead (``##``)."""


def frequent_words(sample: SampleCodes, count: int, min_length: int = 4) -> list[str]:
    """The ``count`` most frequent whole-word alphabetic tokens of at least ``min_length`` letters:
    where the tokenizer marks word starts (:data:`WORD_START`), the marked tokens without the mark
    (an unmarked one is the inside of a word), else the tokens as they are."""
    tokens = [token for text in sample.tokens for token in text]
    marked = any(token[:1] in WORD_START for token in tokens)
    if marked:
        tokens = [token[1:] for token in tokens if token[:1] in WORD_START]
    words = Counter(token for token in tokens if token.isalpha() and len(token) >= min_length)
    return [word for word, _ in words.most_common(count)]
