"""Online semantic segmentation: LycheeMemory eq. 1-4 with the appendix C.1 constants."""

from __future__ import annotations

import math
from datetime import datetime

import numpy as np
import pytest

from retrieval.ingestion.segmenter import (
    CAPACITY_LIMIT,
    EXCHANGE_LIMIT,
    SEMANTIC_BOUNDARY,
    SESSION_FLUSH,
    TARGET_LENGTH,
    SegmenterConfig,
    SemanticSegmenter,
    absolute_surprise,
    cohesion,
    count_pressure,
    count_tokens,
    length_pressure,
    pair_exchanges,
    robust_z,
)
from retrieval.memory.records import Exchange, Turn
from tests.multi_route_fixtures import WordEmbedder, WordFingerprinter

WHEN = datetime(2023, 5, 8, 13, 56)


class TopicEmbedder:
    """Texts start with a topic word; same topic -> nearly the same direction (a small
    text-specific wobble), different topics -> orthogonal directions. Counts encode() calls."""

    dim = 64

    def __init__(self) -> None:
        self.calls = 0

    def encode(self, texts):
        self.calls += 1
        vectors = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            topic = text.split(": ", 1)[1].split()[0]
            vectors[row, sum(map(ord, topic)) % 32] = 1.0
            vectors[row, 32 + len(text) % 32] = 0.2
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def turns_of(texts, session="s1", speakers=("Ann", "Bob")):
    return [Turn("c", session, f"{session}:{i}", speakers[i % len(speakers)], text, WHEN)
            for i, text in enumerate(texts)]


def words(count: int, topic: str = "cooking") -> str:
    return " ".join([topic] + ["w"] * (count - 1))


def exchange(text: str, session: str = "s1") -> Exchange:
    return Exchange((Turn("c", session, "t", "Ann", text, WHEN),))


# -- C.1 signal functions -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [(0, -1.30), (209, -1.30), (210, -0.80), (255, -0.40), (299, -0.0088889), (300, 0.45), (450, 1.175),
     (600, 1.90), (750, 2.35), (899, 2.797), (900, 3.00), (5000, 3.00)],
)
def test_length_pressure_piecewise(tokens, expected):
    assert length_pressure(tokens) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize(("n", "expected"), [(1, -0.85), (2, -0.15), (3, 0.15), (4, 0.30), (5, 0.45),
                                             (8, 0.90), (9, 1.0), (10, 1.0)])
def test_count_pressure(n, expected):
    assert count_pressure(n) == pytest.approx(expected)


@pytest.mark.parametrize(("s", "expected"), [(0.20, 0.0), (0.34, 1.0), (0.06, -1.0), (0.0, -1.0), (0.9, 2.5)])
def test_absolute_surprise(s, expected):
    assert absolute_surprise(s) == pytest.approx(expected)


def test_robust_z_median_mad_and_clipping():
    history = [0.1, 0.2, 0.3, 0.4, 0.5]  # median 0.3, MAD 0.1 -> scale 0.14826
    assert robust_z(0.6, history[:4]) is None  # fewer than 5 values: disabled
    assert robust_z(0.6, history) == pytest.approx(0.3 / 0.14826)
    assert robust_z(1.0, history) == 4.0
    assert robust_z(0.0, history) == -2.0
    assert robust_z(0.3, [0.3] * 5) == 0.0  # constant history: no division by zero


def test_cohesion_is_mean_cosine_to_centroid():
    assert cohesion(np.array([[1.0, 0.0], [1.0, 0.0]])) == pytest.approx(1.0)
    assert cohesion(np.array([[1.0, 0.0], [0.0, 1.0]])) == pytest.approx(math.sqrt(0.5))


def test_count_tokens_is_words_times_1_3_rounded_up():
    assert count_tokens("one two three") == 4
    assert count_tokens(words(10)) == 13


def test_text_written_without_spaces_counts_a_token_a_character():
    """A Chinese or Thai sentence is one whitespace "word": its characters count, so the token
    limits cut its segments as they cut English ones."""
    assert count_tokens("我昨天去北京看了长城") == 10
    assert count_tokens("我们 went to 北京 yesterday") == 4 + 4  # 3 words x 1.3 rounded up, 4 characters
    assert count_tokens("สวัสดีครับ") == 10


def test_a_chinese_segment_is_cut_by_the_token_limits(tmp_path):
    from retrieval import Memory

    text = "我昨天和我的朋友去北京看了长城，天气很好。" * 30  # 630 characters, one whitespace word
    with Memory.open(tmp_path, embedder=WordEmbedder(), fingerprinter=WordFingerprinter()) as memory:
        memory.add([{"speaker": "AB"[i % 2], "text": text} for i in range(8)], user_id="u", session_id="s")
        memory.flush(user_id="u", session_id="s")
        assert max(len(segment.turn_ids) for segment in memory.store.segments("u")) <= 2


# -- eq. 4 on crafted embeddings --------------------------------------------------------------


def crafted_segmenter() -> SemanticSegmenter:
    """Active segment {(1,0,0), (0.8,0.6,0)}, two 10-word exchanges (13 tokens each)."""
    segmenter = SemanticSegmenter(TopicEmbedder(), "c")
    assert segmenter.push(exchange(words(10)), np.array([1.0, 0.0, 0.0])) == []
    assert segmenter.push(exchange(words(10)), np.array([0.8, 0.6, 0.0])) == []
    return segmenter


def test_boundary_score_matches_hand_computation():
    segmenter = crafted_segmenter()
    segmenter.history.clear()  # the second push recorded one surprise; score against an empty history
    signals = segmenter.signals(np.array([0.0, 0.0, 1.0]))
    # s = 1 - max(cos(e, c), cos(e, h)) = 1 - 0 (e is orthogonal to both).
    assert signals.surprise == pytest.approx(1.0)
    assert signals.z is None and signals.absolute == 2.5  # clip((1 - 0.2) / 0.14) = 2.5
    # For unit vectors Coh(V) = |centroid|: |(0.9, 0.3, 0)| = 0.948683 -> |(0.6, 0.2, 1/3)| = 0.714920.
    assert signals.cohesion_drop == pytest.approx(0.948683 - 0.714920, abs=1e-6)
    assert signals.length == -1.30 and signals.count == -0.15  # 26 tokens, 2 exchanges
    expected = -1.10 + 1.0 * 2.5 + 4.0 * 0.233763 + 1.0 * -1.30 + 1.0 * -0.15
    assert signals.score == pytest.approx(expected, abs=1e-5)
    assert signals.p_cut == pytest.approx(1 / (1 + math.exp(-0.885052)), abs=1e-5)  # 0.7079


def test_boundary_score_uses_robust_z_after_five_values():
    segmenter = crafted_segmenter()
    segmenter.history.clear()
    segmenter.history.extend([0.1, 0.2, 0.3, 0.4, 0.5])
    signals = segmenter.signals(np.array([0.0, 0.0, 1.0]))
    assert signals.z == 4.0  # (1 - 0.3) / 0.14826 = 4.72, clipped
    # phi = mean(z, a) = (4.0 + 2.5) / 2 = 3.25
    assert signals.score == pytest.approx(-1.10 + 3.25 + 0.935052 - 1.30 - 0.15, abs=1e-5)


def test_same_direction_scores_low():
    segmenter = crafted_segmenter()
    signals = segmenter.signals(np.array([0.9, 0.3, 0.0]) / np.linalg.norm([0.9, 0.3, 0.0]))
    assert signals.surprise == pytest.approx(0.0, abs=1e-9)
    assert signals.cohesion_drop == pytest.approx(0.0, abs=1e-9)
    assert signals.p_cut < 0.05


def test_signals_are_read_only_and_push_records_history():
    segmenter = crafted_segmenter()
    assert len(segmenter.history) == 1  # the first push starts the segment without a score
    segmenter.signals(np.array([0.0, 1.0, 0.0]))
    assert len(segmenter.history) == 1


# -- the online loop --------------------------------------------------------------------------


def test_topic_change_cuts_and_homogeneous_stream_waits_for_pressure():
    texts = [words(12, "cooking")] * 6 + [words(12, "football")] * 6
    segmenter = SemanticSegmenter(TopicEmbedder(), "c")
    segments = segmenter.segment_session(turns_of(texts))
    assert [s.reason for s in segments] == [SEMANTIC_BOUNDARY, SESSION_FLUSH]
    assert [t.text.split()[0] for t in segments[0].turns] == ["cooking"] * 6
    assert [t.text.split()[0] for t in segments[1].turns] == ["football"] * 6

    # One topic throughout: cuts come only from length/count pressure, i.e. never before the
    # segment holds min_tokens (length pressure >= 0.45).
    homogeneous = SemanticSegmenter(TopicEmbedder(), "c").segment_session(turns_of([words(40)] * 40))
    assert len(homogeneous) > 1
    for segment in homogeneous[:-1]:
        assert segment.reason in (SEMANTIC_BOUNDARY, TARGET_LENGTH)
        assert segment.tokens >= 300
    first_cut = homogeneous[0]
    signals_at_cut = length_pressure(first_cut.tokens) + count_pressure(len(first_cut.exchanges))
    assert signals_at_cut > 1.10  # pressures alone overcome the bias


def test_caps_hold():
    # Two 500-token exchanges cannot share a segment: the hard cap finalizes before appending.
    big = SemanticSegmenter(TopicEmbedder(),
                            "c").segment_session(turns_of([words(384)] * 4, speakers=("Ann",)))
    assert [s.reason for s in big[:-1]] == [CAPACITY_LIMIT] * 3
    assert all(s.tokens <= 900 for s in big)
    # One exchange longer than the cap cannot be split: it is a segment of its own.
    huge = SemanticSegmenter(TopicEmbedder(), "c").segment_session(turns_of([words(800)]))
    assert [(len(s.exchanges), s.reason) for s in huge] == [(1, TARGET_LENGTH)]
    # Tiny identical exchanges never cross the threshold: the 10-exchange cap ends each segment.
    tiny = SemanticSegmenter(TopicEmbedder(),
                             "c").segment_session(turns_of(["cooking"] * 50, speakers=("Ann",)))
    assert [len(s.exchanges) for s in tiny] == [10] * 5
    assert [s.reason for s in tiny] == [EXCHANGE_LIMIT] * 5


def test_random_stream_never_exceeds_caps():
    rng = np.random.default_rng(0)
    segmenter = SemanticSegmenter(TopicEmbedder(), "c")
    for _ in range(50):
        length = int(rng.integers(1, 500))
        topic = ["cooking", "football", "music"][int(rng.integers(0, 3))]
        segment_list = segmenter.push(exchange(words(length, topic)), rng.normal(size=8))
        for segment in segment_list:
            assert len(segment.exchanges) <= 10
            assert segment.tokens <= 900 or len(segment.exchanges) == 1


def test_sessions_flush_number_segments_and_embed_in_one_batch():
    embedder = TopicEmbedder()
    segmenter = SemanticSegmenter(embedder, "c")
    first = segmenter.segment_session(turns_of([words(12)] * 5, session="s1"))
    history = len(segmenter.history)
    second = segmenter.segment_session(turns_of([words(12)] * 4, session="s2"))
    assert embedder.calls == 2  # one encode() per session
    assert first[-1].reason == SESSION_FLUSH and second[-1].reason == SESSION_FLUSH
    assert [s.seq for s in first + second] == list(range(len(first) + len(second)))
    assert {t.session_id
            for t in first[-1].turns} == {"s1"} and {t.session_id for t in second[0].turns} == {"s2"}
    assert len(segmenter.history) > history  # the surprise history spans sessions


def test_pushing_another_session_before_flush_is_an_error():
    segmenter = SemanticSegmenter(TopicEmbedder(), "c")
    segmenter.push(exchange("Ann: cooking", session="s1"), np.ones(4))
    with pytest.raises(ValueError, match="flushed"):
        segmenter.push(exchange("Ann: cooking", session="s2"), np.ones(4))


def test_exchanges_pair_a_turn_with_the_reply():
    turns = turns_of(["a", "b", "c", "d", "e"], speakers=("Ann", "Ann", "Bob", "Ann", "Bob"))
    assert [[t.text for t in x.turns] for x in pair_exchanges(turns)] == [["a"], ["b", "c"], ["d", "e"]]
    assert len(pair_exchanges(turns, pair=False)) == 5
    assert pair_exchanges(turns)[1].text == "Ann: b\nBob: c"
    config = SegmenterConfig(pair_turns=False)
    segments = SemanticSegmenter(TopicEmbedder(), "c", config).segment_session(turns_of([words(5)] * 4))
    assert sum(len(s.exchanges) for s in segments) == 4


def test_a_restarted_stream_cuts_where_the_uninterrupted_one_does(tmp_path):
    """The surprise history and the cut its open segment started with are replayed from the
    stored segments, so closing and opening the memory between adds changes no segment."""
    import random

    from retrieval import Memory

    rng = random.Random(3)
    topics = ["garden tomatoes soil water", "marathon running shoes race", "python code bugs tests",
              "trip to Paris museum art", "cooking pasta sauce garlic"]
    turns = [{"speaker": "AB"[i % 2], "time": "2023-05-08T10:00:00",
              "text": f"We talked about {rng.choice(topics)} and {rng.choice(topics)} item {i}."}
             for i in range(120)]

    def segments(path, restarts: bool) -> list[tuple]:
        memory = Memory.open(path, embedder=WordEmbedder(), fingerprinter=WordFingerprinter())
        for start in range(0, len(turns), 30):
            memory.add(turns[start:start + 30], user_id="u", session_id="s")
            memory.drain(user_id="u")
            if restarts:
                memory.close()
                memory = Memory.open(path, embedder=WordEmbedder(), fingerprinter=WordFingerprinter())
        memory.flush(user_id="u", session_id="s")
        cut = [(record.turn_ids, record.reason) for record in memory.store.segments("u")]
        memory.close()
        return cut

    uninterrupted = segments(tmp_path / "once", restarts=False)
    assert len({reason for _, reason in uninterrupted}) > 1  # boundaries of more than one kind
    assert segments(tmp_path / "restarted", restarts=True) == uninterrupted


def test_a_restart_with_several_sessions_open_cuts_where_the_uninterrupted_stream_does(tmp_path):
    """Three sessions of one user added interleaved and never flushed: a restart feeds their open
    exchanges again, and each is judged against the history as it stood when it was first pushed
    (the closed segments' values merged in by the turn log's order), so no cut moves."""
    import random

    from retrieval import Memory

    rng = random.Random(4)
    topics = [["garden", "tomatoes", "soil", "water"], ["marathon", "running", "shoes", "race"],
              ["guitar", "song", "chords", "band"], ["paris", "trip", "museum", "train"],
              ["puppy", "walk", "park", "leash"], ["cake", "oven", "flour", "sugar"]]
    everyword = [word for topic in topics for word in topic]
    adds: dict[str, list[list[dict]]] = {}
    for session in ("s0", "s1", "s2"):
        topic, said = rng.choice(topics), []
        for i in range(24):
            topic = rng.choice(topics) if rng.random() < 0.2 else topic
            said.append({"speaker": ("Ann", "Bob")[i % 2], "turn_id": f"{session}-{i}",
                         "text": " ".join(rng.sample(topic, 3) + rng.sample(everyword, 1))})
        adds[session] = [said[i:i + 3] for i in range(0, 24, 3)]
    order = rng.sample(list(adds) * 8, k=24)
    ops = [(session, adds[session][order[:at].count(session)]) for at, session in enumerate(order)]

    def segments(path, restart_at: int | None, flush: bool) -> list[tuple]:
        memory = Memory.open(path, embedder=WordEmbedder(), fingerprinter=WordFingerprinter())
        for at, (session, turns) in enumerate([*ops, (None, [])]):
            if at == restart_at:
                memory.close()
                memory = Memory.open(path, embedder=WordEmbedder(), fingerprinter=WordFingerprinter())
            if session is not None:
                memory.add(turns, user_id="u", session_id=session)
                memory.drain(user_id="u")
        for session in adds if flush else ():
            memory.flush(user_id="u", session_id=session)
        cut = [(record.session_id, record.turn_ids, record.reason) for record in memory.store.segments("u")]
        memory.close()
        return cut

    for flush in (False, True):
        uninterrupted = segments(tmp_path / f"once{flush}", None, flush)
        assert len(uninterrupted) >= 3 and len({session for session, _, _ in uninterrupted}) == 3
        for restart_at in range(6, 25, 3):  # 24: a restart after the last add, before the flushes
            restarted = segments(tmp_path / f"restarted{restart_at}{flush}", restart_at, flush)
            assert restarted == uninterrupted, (restart_at, flush)


def interleaved_ops(seed: int, rounds: int, flush_any: bool) -> list[tuple[str, str, list[dict]]]:
    """Adds of one to three turns to three sessions of one user, a speaker now and then saying two
    turns in a row, and flushes: of the session last added to when another's add follows it, or
    (``flush_any``) now and then of any session begun, other sessions' turns often added since."""
    import random

    rng = random.Random(seed)
    topics = [["garden", "tomatoes", "soil", "water"], ["marathon", "running", "shoes", "race"],
              ["guitar", "song", "chords", "band"], ["paris", "trip", "museum", "train"],
              ["puppy", "walk", "park", "leash"], ["cake", "oven", "flour", "sugar"]]
    everyword = [word for topic in topics for word in topic]
    topic = {f"s{i}": rng.choice(topics) for i in range(3)}
    speaker, count, ops, last = dict.fromkeys(topic, "Ann"), dict.fromkeys(topic, 0), [], None
    for _ in range(rounds):
        session = rng.choice(list(topic))
        begun = [name for name in topic if count[name]]
        if flush_any and begun and rng.random() < 0.3:
            ops.append(("flush", rng.choice(begun), []))
        elif not flush_any and last and last != session and rng.random() < 0.3:
            ops.append(("flush", last, []))
        turns = []
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.2:
                topic[session] = rng.choice(topics)
            if rng.random() > 0.3:
                speaker[session] = "Bob" if speaker[session] == "Ann" else "Ann"
            words = rng.choices(topic[session], k=rng.randint(3, 6) - 1) + rng.sample(everyword, 1)
            turns.append({"speaker": speaker[session], "turn_id": f"{session}-{count[session]}",
                          "text": " ".join(words)})
            count[session] += 1
        ops.append(("add", session, turns))
        last = session
    return ops


def run_ops(path, ops, restart_at: int | None,
            config: SegmenterConfig | None = None) -> tuple[list, list[list[float]]]:
    """The user's stored segments after ``ops`` (closing and opening the memory before operation
    ``restart_at``), and its stream's surprise history after each operation."""
    from retrieval import Memory

    def opened():
        return Memory.open(path, embedder=WordEmbedder(), fingerprinter=WordFingerprinter(), segmenter=config)

    memory = opened()
    histories = []
    for at, (kind, session, turns) in enumerate(ops):
        if at == restart_at:
            memory.close()
            memory = opened()
        if kind == "add":
            memory.add(turns, user_id="u", session_id=session)
            memory.drain(user_id="u")
        else:
            memory.flush(user_id="u", session_id=session)
        stream = memory._backlog._users["u"].stream
        histories.append(list(stream.history) if stream is not None else [])
    segments = memory.store.segments("u")
    memory.close()
    return segments, histories


def test_a_restart_cuts_as_the_uninterrupted_stream_with_flushes_and_a_speaker_saying_two_turns(tmp_path):
    """Adds of one to three turns to three sessions, a speaker now and then saying two turns in a
    row, a session flushed when another's add follows it: a restart before any operation leaves
    every cut where it was. (A turn waiting at the restart whose speaker speaks again after it is
    pushed alone by that later turn, after every value the log held.)"""
    ops = interleaved_ops(10, 20, flush_any=False)

    def segments(path, restart_at: int | None) -> list[tuple]:
        return [(record.session_id, record.turn_ids, record.reason)
                for record in run_ops(path, ops, restart_at)[0]]

    uninterrupted = segments(tmp_path / "once", None)
    assert {reason for _, _, reason in uninterrupted} >= {SESSION_FLUSH}
    for restart_at in range(1, len(ops)):
        assert segments(tmp_path / f"restarted{restart_at}", restart_at) == uninterrupted, restart_at


@pytest.mark.parametrize("seed", [4, 5])
def test_a_restart_replays_the_surprise_history_exactly_when_a_session_is_flushed_after_others_were_added(
        tmp_path, seed):
    """Flushes of any session begun, turns of other sessions often added since its last: the
    segments a flush closes keep the last turn fed then (``flushed_after``), so after a restart
    before any operation the stream's surprise history equals, value for value and in order, the
    one of the stream that never stopped, after every later operation, and every cut is where it
    was. (Placed just after the flushed session's own last turn instead, a flush's values moved in
    6 of 8 seeds.)"""
    ops = interleaved_ops(seed, 24, flush_any=True)
    uninterrupted, histories = run_ops(tmp_path / "once", ops, None)
    flushes = [(record.session_id, record.flushed_after) for record in uninterrupted
               if record.reason == SESSION_FLUSH]
    assert flushes and all(after is not None for _, after in flushes)
    assert any(not after.startswith(f"{session}-") for session, after in flushes)  # others' turns came last
    for restart_at in range(1, len(ops)):
        segments, restarted = run_ops(tmp_path / f"restarted{restart_at}", ops, restart_at)
        assert segments == uninterrupted, restart_at
        assert restarted[restart_at:] == histories[restart_at:], restart_at


@pytest.mark.parametrize("seed", [4, 5, 6])
def test_a_restart_replays_the_surprise_history_exactly_with_every_turn_an_exchange(tmp_path, seed):
    """With ``pair_turns`` off each turn is pushed as it is fed, keyed by its own place in the log,
    so a restart before any operation replays the history and the cuts of the stream that never
    stopped, flushes of any session included."""
    config = SegmenterConfig(pair_turns=False)
    ops = interleaved_ops(seed, 24, flush_any=True)
    uninterrupted, histories = run_ops(tmp_path / "once", ops, None, config)
    assert any(record.reason != SESSION_FLUSH for record in uninterrupted)  # cuts, not only flushes
    for restart_at in range(1, len(ops)):
        segments, restarted = run_ops(tmp_path / f"restarted{restart_at}", ops, restart_at, config)
        assert segments == uninterrupted, restart_at
        assert restarted[restart_at:] == histories[restart_at:], restart_at


def test_a_push_is_keyed_by_the_log_index_of_the_turn_that_completed_its_exchange():
    """A paired exchange at its reply, a lone turn at its session's next turn, a turn a flush
    pushed just after itself, a turn the log does not hold after every key."""
    from retrieval.ingestion.push_order import PushOrder
    from retrieval.memory.records import SegmentRecord

    said = [("s1", "Ann"), ("s1", "Bob"), ("s2", "Ann"), ("s1", "Ann"), ("s2", "Cy"), ("s1", "Ann")]
    log = [Turn("c", session, f"t{at}", speaker, f"turn {at}") for at, (session, speaker) in enumerate(said)]
    flushed = SegmentRecord("c", 0, "s1", ("t0", "t1", "t3"), SESSION_FLUSH)
    order = PushOrder(log, [flushed], pair_turns=True)
    assert order.first_open == 2  # t2, of s2, is in no segment
    assert order.key(Exchange((log[0], log[1]))) == 1  # at its reply
    assert order.key(Exchange((log[3],))) == 5  # Ann again: pushed alone when t5 came
    assert order.key(Exchange((log[3],)), flush=3.5) == 3.5
    assert order.keyed(flushed)[2] == [1, 3.5]  # the segment's last turn went alone at its flush
    assert order.key(Exchange((Turn("c", "s1", "t9", "Ann", "later"),))) == math.inf


def test_a_session_of_several_sessions_or_a_short_embedding_is_refused():
    mixed = turns_of([words(5)] * 2, session="s1") + turns_of([words(5)] * 2, session="s2")
    with pytest.raises(ValueError, match=r"sessions\[0\] holds turns of \('c', 's1'\) and \('c', 's2'\)"):
        SemanticSegmenter(TopicEmbedder(), "c").segment_session(mixed)

    class ShortEmbedder(TopicEmbedder):
        def encode(self, texts):
            return super().encode(texts)[:-1]

    with pytest.raises(ValueError, match="returned 1 vectors for 2 exchanges"):
        SemanticSegmenter(ShortEmbedder(), "c").segment_session(turns_of([words(5)] * 4))
