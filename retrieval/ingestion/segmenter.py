"""Online semantic segmentation (LycheeMemory section 3.2, Algorithm B.1, appendix C.1).

The dialogue stream is cut into segments; each finalized segment triggers one extraction call.
For a new exchange x_t against the active segment S (centroid c, last exchange h):

    surprise      s_t = 1 - max(cos(e_t, c), cos(e_t, h))                               (eq. 1)
    cohesion drop d_t = max(0, Coh(S) - Coh(S + x_t)),  Coh(V) = mean_v cos(v, c_V)   (eqs. 2-3)
    P_cut = sigmoid(-1.10 + w_s phi(s_t) + w_c d_t + w_l L(tokens(S)) + w_n N(|S|))   (eq. 4, C.1)

and S is finalized when P_cut >= 0.50. Constants from Table 10: surprise history of 64 values;
robust median/MAD z-score clipped to [-2, 4], used once the history holds 5 values; absolute
surprise a(s) = clip((s - 0.20) / 0.14, -1, 2.5); 300 / 600 / 900 min / target / max tokens;
10 exchanges at most; the length pressure L and count pressure N of C.1.

Choices where the paper is silent (all fields of :class:`SegmenterConfig`):

* Exchange: a turn plus the next turn when the next one is by another speaker (LycheeMemory's
  x_t is "a user message and the corresponding assistant response"; in two-party LoCoMo this
  pairs each turn with its reply). A turn followed by the same speaker is an exchange alone.
  ``pair_turns=False`` makes every turn an exchange. On LoCoMo dev (MiniLM) pairs give 3.8
  exchanges = 7.4 turns per segment, single turns 5.0 turns per segment (5.9 with w_c = 0);
  LycheeMemory reports 5.8 "turns" per segment without saying which unit it counts.
* phi(s): the mean of the robust z-score and a(s) once the history has 5 values, a(s) alone
  before (C.1 says the robust signal is disabled on a short history). w_s = 1.
* z-score scale: 1.4826 * MAD (the normal-consistent MAD), floored at 1e-6 so a constant
  history does not divide by zero.
* w_c = 4: the drop is small (a single orthogonal exchange against a one-exchange segment drops
  cohesion by 1 - 1/sqrt(2) = 0.29, adding 1.17); on LoCoMo dev its median is 0.04 and its
  90th percentile 0.12 (+0.47 logits, a quarter of phi's 10-90% spread), so cohesion
  sharpens, rather than overrides, the surprise signal.
* w_l = w_n = 1: C.1 gives L and N already on the logit scale of the bias.
* L and N are evaluated on the active segment S before x_t is appended (C.1: "over the current
  segment length"; N is -0.85 "for one exchange", which only S can have).
* The surprise history spans the whole conversation (one segmenter per conversation); session
  flushes do not reset it, so the 64-value window is meaningful for short sessions.
* Tokens: whitespace words x 1.3, rounded up (an approximation of the cl100k tokenizer of
  text-embedding-3-small for English; no tokenizer download needed).
* An exchange longer than the hard cap cannot be split; it forms a segment of its own.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from retrieval.memory.protocols import Embedder
from retrieval.memory.records import Exchange, Segment, Turn
from retrieval.memory.scripts import UNSPACED

# Why a segment was finalized (Algorithm B.1).
SEMANTIC_BOUNDARY = "semantic_boundary"
CAPACITY_LIMIT = "capacity_limit"
TARGET_LENGTH = "target_length"
EXCHANGE_LIMIT = "exchange_limit"
SESSION_FLUSH = "session_flush"
CUTS = (SEMANTIC_BOUNDARY, CAPACITY_LIMIT)
"""How a segment closes at its session's next exchange, whose push appends its surprise against it."""

_MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class SegmenterConfig:
    """Appendix C.1 constants (Table 10) and the weights the paper leaves unnamed (module doc)."""

    bias: float = -1.10
    threshold: float = 0.50
    history_size: int = 64
    min_history: int = 5
    z_clip: tuple[float, float] = (-2.0, 4.0)
    abs_center: float = 0.20
    abs_scale: float = 0.14
    abs_clip: tuple[float, float] = (-1.0, 2.5)
    min_tokens: int = 300
    target_tokens: int = 600
    max_tokens: int = 900
    max_exchanges: int = 10
    surprise_weight: float = 1.0
    cohesion_weight: float = 4.0
    length_weight: float = 1.0
    count_weight: float = 1.0
    words_to_tokens: float = 1.3
    pair_turns: bool = True




def count_tokens(text: str, ratio: float = SegmenterConfig.words_to_tokens) -> int:
    """Approximate token count: whitespace words x ``ratio``, rounded up, and one per character
    of a script written without spaces (a Chinese sentence is one "word", its tokenizer's tokens
    are about its characters), so that the token limits hold in any language."""
    unspaced = len(UNSPACED.findall(text))
    words = UNSPACED.sub(" ", text).split() if unspaced else text.split()
    return math.ceil(len(words) * ratio) + unspaced


def length_pressure(tokens: int, config: SegmenterConfig = SegmenterConfig()) -> float:
    """C.1 piecewise length signal: -1.30 below 0.7*min; -0.80 -> 0 up to min; 0.45 -> 1.90 from
    min to target; 1.90 -> 2.80 from target to max; 3.00 at or beyond max."""
    low, mid, high = config.min_tokens, config.target_tokens, config.max_tokens
    floor = 0.7 * low
    if tokens < floor:
        return -1.30
    if tokens < low:
        return -0.80 + 0.80 * (tokens - floor) / (low - floor)
    if tokens < mid:
        return 0.45 + (1.90 - 0.45) * (tokens - low) / (mid - low)
    if tokens < high:
        return 1.90 + (2.80 - 1.90) * (tokens - mid) / (high - mid)
    return 3.00


def count_pressure(exchanges: int) -> float:
    """C.1 exchange-count signal: -0.85, -0.15, 0.15 for 1, 2, 3 exchanges, then
    min(1.0, 0.30 + 0.15 (n - 4))."""
    if exchanges <= 1:
        return -0.85
    if exchanges == 2:
        return -0.15
    if exchanges == 3:
        return 0.15
    return min(1.0, 0.30 + 0.15 * (exchanges - 4))


def absolute_surprise(surprise: float, config: SegmenterConfig = SegmenterConfig()) -> float:
    """clip((s - 0.20) / 0.14, -1.0, 2.5)."""
    return float(np.clip((surprise - config.abs_center) / config.abs_scale, *config.abs_clip))


def robust_z(surprise: float, history: Sequence[float],
             config: SegmenterConfig = SegmenterConfig()) -> float | None:
    """Median/MAD z-score of ``surprise`` against ``history``, clipped to [-2, 4]; ``None`` while the
    history is shorter than ``min_history``."""
    if len(history) < config.min_history:
        return None
    values = np.asarray(history, dtype=np.float64)
    median = float(np.median(values))
    scale = max(_MAD_TO_SIGMA * float(np.median(np.abs(values - median))), 1e-6)
    return float(np.clip((surprise - median) / scale, *config.z_clip))


def cohesion(vectors: np.ndarray) -> float:
    """Coh(V): mean cosine similarity of the vectors to their centroid (eq. 2)."""
    centroid = vectors.mean(axis=0)
    norms = np.linalg.norm(vectors, axis=1) * np.linalg.norm(centroid)
    return float(np.mean(vectors @ centroid / np.maximum(norms, 1e-12)))


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / max(float(np.linalg.norm(a) * np.linalg.norm(b)), 1e-12))


def _surprise(embedding: np.ndarray, segment: np.ndarray) -> float:
    """Eq. 1: one minus the closer of the segment's centroid and its last exchange."""
    return 1.0 - max(_cosine(embedding, segment.mean(axis=0)), _cosine(embedding, segment[-1]))


def replayed_history(closed: Sequence[tuple[str, str, Sequence[float], Sequence[np.ndarray]]]
                     ) -> tuple[list[tuple[float, float]], dict[str, np.ndarray]]:
    """The surprise values the segmenter appended to its history while it cut these segments
    ((session id, the reason it closed, the keys of its exchanges' pushes,
    :mod:`retrieval.ingestion.push_order`, and their embeddings), in the order they closed), each
    with the key of the push that appended it, as :meth:`SemanticSegmenter.push` computed them:
    for each exchange after a segment's first, against the exchanges before it; for a segment's
    first, against the segment of its session it cut off, when that one closed at it (a semantic
    boundary or the capacity limit). And, per session whose last segment closed so, that
    segment: the exchange that cut it off opens the session's next segment and is still to be
    pushed again (:attr:`SemanticSegmenter.cut_off`). A stream that restarts takes both, so it
    cuts where the uninterrupted one would."""
    history: list[tuple[float, float]] = []
    before: dict[str, tuple[str, np.ndarray]] = {}  # per session: its last segment's reason, embeddings
    for session, reason, keys, embeddings in closed:
        vectors = np.asarray(embeddings, dtype=np.float64)
        cut = before.get(session)
        if cut is not None and cut[0] in CUTS:
            history.append((keys[0], _surprise(vectors[0], cut[1])))
        history += [(keys[at], _surprise(vectors[at], vectors[:at])) for at in range(1, len(vectors))]
        before[session] = (reason, vectors)
    return history, {session: vectors for session, (reason, vectors) in before.items()
                     if reason in CUTS}


def pair_exchanges(turns: Sequence[Turn], pair: bool = True) -> list[Exchange]:
    """Group a session's turns into exchanges: each turn with the following turn when the
    speaker changes, otherwise alone (every turn alone when ``pair`` is false)."""
    exchanges: list[Exchange] = []
    index = 0
    while index < len(turns):
        if pair and index + 1 < len(turns) and turns[index + 1].speaker != turns[index].speaker:
            exchanges.append(Exchange((turns[index], turns[index + 1])))
            index += 2
        else:
            exchanges.append(Exchange((turns[index],)))
            index += 1
    return exchanges


@dataclass(frozen=True)
class BoundarySignals:
    """Every term of eq. 4 for one exchange, for inspection and tests."""

    surprise: float
    z: float | None
    absolute: float
    cohesion_drop: float
    length: float
    count: float
    score: float
    p_cut: float


@dataclass
class _Active:
    exchanges: list[Exchange] = field(default_factory=list)
    embeddings: list[np.ndarray] = field(default_factory=list)
    tokens: int = 0


class SemanticSegmenter:
    """The online boundary policy for one conversation stream.

    :meth:`segment_session` embeds a session's exchanges in one batch, feeds them to
    :meth:`push` in order and flushes at the end. Segments are numbered from 0 across sessions.
    """

    def __init__(self, embedder: Embedder, user_id: str,
                 config: SegmenterConfig = SegmenterConfig()) -> None:
        self.embedder = embedder
        self.user_id = user_id
        self.config = config
        self.history: deque[float] = deque(maxlen=config.history_size)
        self.cut_off: np.ndarray | None = None
        """After a restart (:func:`replayed_history`), the segment that the next exchange cut off
        before it: its surprise against it joins the history, as it did before the restart."""
        self._active = _Active()
        self._session_id: str | None = None
        self._next_seq = 0

    def segment_session(self, turns: Sequence[Turn]) -> list[Segment]:
        """All segments of one session (the last one finalized by the session flush)."""
        return self.segment_sessions([turns])[0]

    def segment_sessions(self, sessions: Sequence[Sequence[Turn]]) -> list[list[Segment]]:
        """The segments of each session in turn, with one embedding call for all their exchanges.
        A ValueError names a session whose turns are of several users or sessions (they would be
        paired into one exchange) and an embedder that returns another number of vectors."""
        for index, turns in enumerate(sessions):
            owners = sorted({(turn.user_id, turn.session_id) for turn in turns})
            if len(owners) > 1:
                raise ValueError(f"sessions[{index}] holds turns of {owners[0]} and {owners[1]}: "
                                 "a session's turns share one user and one session")
        exchanges = [pair_exchanges(turns, self.config.pair_turns) for turns in sessions]
        texts = [exchange.text for group in exchanges for exchange in group]
        vectors = self.embedder.encode(texts)
        if len(vectors) != len(texts):
            raise ValueError(f"the embedder returned {len(vectors)} vectors for {len(texts)} exchanges")
        embeddings = iter(vectors)
        result = []
        for group in exchanges:
            segments = [segment for exchange in group for segment in self.push(exchange, next(embeddings))]
            flushed = self.flush()
            result.append(segments + ([flushed] if flushed else []))
        return result

    def signals(self, embedding: np.ndarray) -> BoundarySignals:
        """Eq. 4 for a new exchange against the (non-empty) active segment; no state changes."""
        cfg, active = self.config, self._active
        stack = np.stack(active.embeddings)
        surprise = _surprise(embedding, stack)
        z = robust_z(surprise, self.history, cfg)
        absolute = absolute_surprise(surprise, cfg)
        phi = absolute if z is None else 0.5 * (z + absolute)
        drop = max(0.0, cohesion(stack) - cohesion(np.vstack([stack, embedding[None, :]])))
        length = length_pressure(active.tokens, cfg)
        count = count_pressure(len(active.exchanges))
        score = (cfg.bias + cfg.surprise_weight * phi + cfg.cohesion_weight * drop
                 + cfg.length_weight * length + cfg.count_weight * count)
        return BoundarySignals(surprise, z, absolute, drop, length, count, score,
                               1.0 / (1.0 + math.exp(-score)))

    def push(self, exchange: Exchange, embedding: np.ndarray) -> list[Segment]:
        """Feed one exchange (Algorithm B.1, lines 10-15); returns the segments it finalized."""
        session_id = exchange.turns[0].session_id
        if self._session_id is not None and session_id != self._session_id and self._active.exchanges:
            raise ValueError(f"exchange of {session_id!r} pushed before session {self._session_id!r} was "
                             "flushed")
        self._session_id = session_id
        embedding = np.asarray(embedding, dtype=np.float64)
        tokens = count_tokens(exchange.text, self.config.words_to_tokens)
        if not self._active.exchanges:
            if self.cut_off is not None:
                self.history.append(_surprise(embedding, self.cut_off))
                self.cut_off = None
            return self._start(exchange, embedding, tokens)
        signals = self.signals(embedding)
        self.history.append(signals.surprise)
        if self._active.tokens + tokens > self.config.max_tokens:
            # The hard cap finalizes before appending (C.1).
            return [self._finalize(CAPACITY_LIMIT), *self._start(exchange, embedding, tokens)]
        if signals.p_cut >= self.config.threshold:
            return [self._finalize(SEMANTIC_BOUNDARY), *self._start(exchange, embedding, tokens)]
        self._append(exchange, embedding, tokens)
        return self._finalize_if_full()

    @property
    def holds_exchanges(self) -> bool:
        """Whether the active segment holds any exchange (a flush would close it)."""
        return bool(self._active.exchanges)

    def flush(self) -> Segment | None:
        """Finalize the active segment at the end of a session (``None`` if it is empty)."""
        return self._finalize(SESSION_FLUSH) if self.holds_exchanges else None

    def _start(self, exchange: Exchange, embedding: np.ndarray, tokens: int) -> list[Segment]:
        self._append(exchange, embedding, tokens)
        return self._finalize_if_full()

    def _append(self, exchange: Exchange, embedding: np.ndarray, tokens: int) -> None:
        self._active.exchanges.append(exchange)
        self._active.embeddings.append(embedding)
        self._active.tokens += tokens

    def _finalize_if_full(self) -> list[Segment]:
        if self._active.tokens >= self.config.target_tokens:
            return [self._finalize(TARGET_LENGTH)]
        if len(self._active.exchanges) >= self.config.max_exchanges:
            return [self._finalize(EXCHANGE_LIMIT)]
        return []

    def _finalize(self, reason: str) -> Segment:
        active = self._active
        segment = Segment(self.user_id, active.exchanges[0].turns[0].session_id, self._next_seq,
                          tuple(active.exchanges), reason, active.tokens)
        self._next_seq += 1
        self._active = _Active()
        return segment


__all__ = [
    "CAPACITY_LIMIT", "EXCHANGE_LIMIT", "SEMANTIC_BOUNDARY", "SESSION_FLUSH", "TARGET_LENGTH",
    "BoundarySignals",
    "Exchange", "Segment", "SegmenterConfig", "SemanticSegmenter", "absolute_surprise", "cohesion",
    "count_pressure", "count_tokens", "length_pressure", "pair_exchanges", "replayed_history", "robust_z",
]
