"""The segmenter at its bounds (docs/design.md §5.2): a cut probability of exactly the threshold
cuts, a segment may reach exactly the cap and closes at exactly the target, surprise takes the
closer of centroid and last exchange, and a replayed history matches the live one."""

from __future__ import annotations

import numpy as np
import pytest

from retrieval.ingestion.segmenter import (
    SEMANTIC_BOUNDARY,
    SESSION_FLUSH,
    TARGET_LENGTH,
    SegmenterConfig,
    SemanticSegmenter,
    count_tokens,
)
from retrieval.memory.records import Exchange, Turn
from tests.test_segmenter import WHEN

E1, E2 = np.array([1.0, 0.0, 0.0]), np.array([0.0, 1.0, 0.0])


class Same:
    dim = 3

    def encode(self, texts):
        return np.tile(E1, (len(texts), 1))


def exchange(text: str, i: int = 0) -> Exchange:
    return Exchange((Turn("c", "s1", f"t{i}", "Ann", text, WHEN),))


def test_a_cut_probability_of_exactly_the_threshold_cuts():
    """A segment is finalized when P_cut >= 0.50 (eq. 4). With every weight and the bias at 0
    the score is 0 and P_cut exactly 0.5: each exchange must cut. ``>`` never cuts."""
    config = SegmenterConfig(
        bias=0.0, surprise_weight=0.0, cohesion_weight=0.0, length_weight=0.0, count_weight=0.0
    )
    segmenter = SemanticSegmenter(Same(), "c", config)
    turns = [Turn("c", "s1", f"t{i}", "Ann", f"cooking pasta {i}", WHEN) for i in range(3)]
    segments = segmenter.segment_session(turns)
    assert [s.reason for s in segments] == [SEMANTIC_BOUNDARY, SEMANTIC_BOUNDARY, SESSION_FLUSH]


def test_a_segment_may_reach_exactly_max_tokens():
    """The hard cap refuses an exchange only when the segment would pass max_tokens; one that
    brings it to exactly 900 joins it (which then closes at the target length). ``>=`` splits it
    off as a capacity cut."""
    config = SegmenterConfig(words_to_tokens=1.0)
    first, second = exchange(" ".join(["w"] * 499), 0), exchange(" ".join(["w"] * 399), 1)
    assert count_tokens(first.text, 1.0) + count_tokens(second.text, 1.0) == config.max_tokens
    segmenter = SemanticSegmenter(Same(), "c", config)
    assert segmenter.push(first, E1) == []
    [segment] = segmenter.push(second, E1)
    assert (segment.reason, len(segment.exchanges), segment.tokens) == (TARGET_LENGTH, 2, 900)


def test_surprise_takes_the_closer_of_centroid_and_last_exchange():
    """Eq. 1, s = 1 - max(cos(e, c), cos(e, h)). An exchange equal to the segment's last one
    is no surprise, however far the centroid; surprise against the centroid alone gives 0.29."""
    segmenter = SemanticSegmenter(Same(), "c", SegmenterConfig(bias=-50.0))
    segmenter.push(exchange("cooking pasta", 0), E1)
    segmenter.push(exchange("football match", 1), E2)
    assert segmenter.signals(E2).surprise == pytest.approx(0.0, abs=1e-9)


def test_a_segment_of_exactly_the_target_length_closes():
    """A segment is finalized at the target length when it holds >= 600 tokens; one exchange
    of exactly 600 closes it at once (``>`` leaves it open)."""
    config = SegmenterConfig(words_to_tokens=1.0)
    one = exchange(" ".join(["w"] * 599))
    assert count_tokens(one.text, 1.0) == config.target_tokens
    [segment] = SemanticSegmenter(Same(), "c", config).push(one, E1)
    assert (segment.reason, segment.tokens) == (TARGET_LENGTH, 600)


def test_replayed_history_counts_the_exchange_that_made_a_capacity_cut():
    """After a restart the surprise history is replayed from the closed segments; the first
    exchange of a segment that a capacity cut opened was scored against the segment it cut off,
    so its surprise is in the live history and must be in the replayed one (else a restarted
    stream scores later exchanges against another history and cuts elsewhere)."""
    from retrieval.ingestion.segmenter import CAPACITY_LIMIT, replayed_history

    config = SegmenterConfig(words_to_tokens=1.0)
    live = SemanticSegmenter(Same(), "c", config)
    pushed = [
        (exchange(" ".join(["w"] * 499), 0), E1),
        (exchange(" ".join(["w"] * 499), 1), E2),
        (exchange("short one", 2), E2),
    ]
    closed = [s for ex, e in pushed for s in live.push(ex, e)] + [live.flush()]
    assert [s.reason for s in closed] == [CAPACITY_LIMIT, SESSION_FLUSH]
    vectors = {ex.turns[0].turn_id: e for ex, e in pushed}
    keys = {ex.turns[0].turn_id: float(at) for at, (ex, _) in enumerate(pushed)}
    replay = [(s.session_id, s.reason, [keys[ex.turns[0].turn_id] for ex in s.exchanges],
               [vectors[ex.turns[0].turn_id] for ex in s.exchanges]) for s in closed]
    history, _ = replayed_history(replay)
    assert [key for key, _ in history] == [1.0, 2.0]  # each value keyed by the push that appended it
    assert [value for _, value in history] == pytest.approx(list(live.history))
