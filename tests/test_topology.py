"""Codebook co-occurrence topology (docs/design.md §3) and exact sublinear Path B search."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isq import walks
from isq.topk import top_k_of_scores
from isq.topology import CooccurrenceTopology, TopologyParams
from isq.walks import sum_walk

IDENTITY = {"codebook_size": 16, "codebook_sha256": "a" * 64}


def random_bank(seed: int, count: int = 60, num_codes: int = 16, max_size: int = 6) -> list[set[int]]:
    rng = np.random.default_rng(seed)
    return [
        set(rng.integers(0, num_codes, size=rng.integers(0, max_size + 1)).tolist()) for _ in range(count)
    ]


def reference_statistics(
    code_sets: list[set[int]], num_codes: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n(a), M_ab and P(b|a) by direct counting."""
    doc_freq = np.zeros(num_codes)
    cooc = np.zeros((num_codes, num_codes))
    for codes in code_sets:
        for a in codes:
            doc_freq[a] += 1
            for b in codes:
                if a != b:
                    cooc[a, b] += 1
    trans = np.zeros((num_codes, num_codes))
    for a in range(num_codes):
        if cooc[a].sum() > 0:
            trans[a] = cooc[a] / cooc[a].sum()
    return doc_freq, cooc, trans


def reference_code_scores(
    code_sets: list[set[int]], num_codes: int, max_hops: int, alpha: float, self_term: bool
) -> np.ndarray:
    """S_code(b|a) written out entry by entry from the formula of docs/design.md §3.2."""
    doc_freq, _, trans = reference_statistics(code_sets, num_codes)
    powers = [np.linalg.matrix_power(trans, h) for h in range(1, max_hops + 1)]
    scores = np.zeros((num_codes, num_codes))
    for a in range(num_codes):
        idf = math.log((len(code_sets) + 1) / (doc_freq[a] + 1))
        for b in range(num_codes):
            scores[a, b] = idf * max(powers[h - 1][a, b] * alpha**h for h in range(1, max_hops + 1))
            if self_term and a == b:
                scores[a, b] = max(scores[a, b], idf)
    return scores


def reference_unit_scores(
    code_sets: list[set[int]], scores: np.ndarray, query: set[int], aggregate: str
) -> np.ndarray:
    act = [max((scores[a, b] for a in query), default=0.0) for b in range(scores.shape[0])]
    combine = sum if aggregate == "sum" else max
    return np.array([combine(act[b] for b in codes) if codes else 0.0 for codes in code_sets])


PAPER_FORMULA = {"max_hops": 2, "alpha": 0.5, "self_term": False, "aggregate": "max"}


def build(code_sets: list[set[int]], num_codes: int = 16, identity=None, **kwargs) -> CooccurrenceTopology:
    """A topology with the paper's formula (docs/design.md §3.2) unless a test overrides a parameter."""
    topology = CooccurrenceTopology(num_codes, TopologyParams(**(PAPER_FORMULA | kwargs)), identity)
    topology.add(code_sets)
    return topology


def test_statistics_match_direct_counting() -> None:
    bank = random_bank(0)
    topology = build(bank)
    doc_freq, cooc, trans = reference_statistics(bank, 16)
    np.testing.assert_array_equal(topology.doc_freq, doc_freq)
    np.testing.assert_array_equal(topology.cooccurrence.toarray(), cooc)
    np.testing.assert_allclose(topology.transition().toarray(), trans)
    assert topology.num_units == len(bank)


def test_transition_rows_sum_to_one_or_are_empty() -> None:
    # code 15 never occurs, code 14 occurs only alone: both rows must stay zero
    bank = [{0, 1, 2}, {1, 3}, {2, 3, 4, 5}, {14}, {0, 5}]
    topology = build(bank)
    sums = topology.transition().toarray().sum(axis=1)
    np.testing.assert_allclose(sums[:6], 1.0)
    np.testing.assert_array_equal(sums[6:], 0.0)


@pytest.mark.parametrize("max_hops", [1, 2, 3])
@pytest.mark.parametrize("self_term", [False, True])
def test_code_scores_match_reference(max_hops: int, self_term: bool) -> None:
    bank = random_bank(max_hops, count=40, num_codes=12)
    topology = build(bank, num_codes=12, max_hops=max_hops, alpha=0.7, self_term=self_term)
    expected = reference_code_scores(bank, 12, max_hops, 0.7, self_term)
    np.testing.assert_allclose(topology.code_scores(), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("max_hops", [0, 1, 2])
def test_query_rows_equal_the_full_matrix_rows(max_hops: int) -> None:
    bank = random_bank(7, count=40, num_codes=12)
    topology = build(bank, num_codes=12, max_hops=max_hops, alpha=0.6, self_term=True)
    full = reference_code_scores(bank, 12, max_hops, 0.6, True) if max_hops else None
    sources = np.array([11, 0, 5])
    rows = topology.code_score_rows(sources)
    assert rows.shape == (3, 12)
    if full is not None:
        np.testing.assert_allclose(rows, full[sources], rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(topology.activation({0, 5, 11}), rows.max(axis=0))


def test_a_16384_code_bank_holds_no_dense_code_by_code_array() -> None:
    # a dense P or S_code at 16,384 codes would be 2 GB each; the bank must stay sparse
    rng = np.random.default_rng(0)
    bank = [set(rng.choice(16384, size=30, replace=False).tolist()) for _ in range(200)]
    topology = build(bank, num_codes=16384, max_hops=2, self_term=True)
    topology.prepare()
    indices, scores = topology.search(bank[3], k=5)
    assert indices[0] == 3 and scores[0] > 0
    assert topology.nbytes < 20 * 2**20


def test_reassigned_parameters_take_effect() -> None:
    bank = random_bank(3)
    topology = build(bank)
    topology.code_scores()
    topology.params = TopologyParams(3, 0.9, True, "max")
    np.testing.assert_allclose(
        topology.code_scores(), reference_code_scores(bank, 16, 3, 0.9, True), atol=1e-12
    )


@pytest.mark.parametrize("aggregate", ["max", "sum"])
def test_unit_scores_match_reference(aggregate: str) -> None:
    bank = random_bank(4)
    topology = build(bank, aggregate=aggregate, self_term=True)
    expected_codes = reference_code_scores(bank, 16, 2, 0.5, True)
    for query in ({0}, {1, 5, 9}, {15, 3}):
        expected = reference_unit_scores(bank, expected_codes, query, aggregate)
        np.testing.assert_allclose(topology.unit_scores(query), expected, atol=1e-12)


bank_strategy = st.lists(st.sets(st.integers(0, 9), max_size=5), max_size=40)


@settings(max_examples=150, deadline=None)
@given(
    bank=bank_strategy,
    query=st.sets(st.integers(0, 9), max_size=4),
    k=st.integers(0, 45),
    exclude=st.sets(st.integers(0, 45), max_size=12),
    max_hops=st.integers(1, 3),
    self_term=st.booleans(),
    aggregate=st.sampled_from(["max", "sum"]),
)
def test_search_equals_bruteforce(bank, query, k, exclude, max_hops, self_term, aggregate) -> None:
    # 10 codes and tiny sets: many AMUs share their best code, so ties are the common case
    topology = build(bank, num_codes=10, max_hops=max_hops, self_term=self_term, aggregate=aggregate)
    fast_ids, fast_scores = topology.search(query, k, exclude)
    ref_ids, ref_scores = topology.search_bruteforce(query, k, exclude)
    np.testing.assert_array_equal(fast_ids, ref_ids)
    np.testing.assert_array_equal(fast_scores, ref_scores)
    # and the reference itself is the definition: top k of the positive, non-excluded scores
    scores = reference_unit_scores(
        bank, reference_code_scores(bank, 10, max_hops, 0.5, self_term), query, aggregate
    )
    eligible = [i for i in range(len(bank)) if scores[i] > 1e-12 and i not in exclude]
    assert len(ref_ids) == min(k, len(eligible))
    assert set(ref_ids) <= set(eligible)
    np.testing.assert_allclose(ref_scores, sorted(scores[eligible], reverse=True)[: len(ref_ids)], atol=1e-12)


def test_ties_break_by_ascending_index_and_respect_exclude() -> None:
    bank = [{0, 1}] * 10 + [{2}, {0, 1}]
    topology = build(bank, num_codes=4)
    ids, scores = topology.search({0}, 5, exclude={1, 3})
    np.testing.assert_array_equal(ids, [0, 2, 4, 5, 6])
    assert len(set(scores.tolist())) == 1
    ids, _ = topology.search({0}, 50)
    np.testing.assert_array_equal(ids, [i for i in range(12) if i != 10])


def test_search_walks_a_large_bank_exactly() -> None:
    # posting lists much longer than k: the truncated walk must still agree with brute force
    rng = np.random.default_rng(7)
    bank = [
        set(rng.choice(64, size=rng.integers(1, 8), replace=False, p=np.arange(64, 0, -1) / 2080).tolist())
        for _ in range(3000)
    ]
    topology = build(bank, num_codes=64)
    for _ in range(30):
        query = set(rng.integers(0, 64, size=rng.integers(1, 6)).tolist())
        exclude = set(rng.integers(0, 3000, size=20).tolist())
        for k in (1, 20, 500):
            fast, ref = topology.search(query, k, exclude), topology.search_bruteforce(query, k, exclude)
            np.testing.assert_array_equal(fast[0], ref[0])
            np.testing.assert_array_equal(fast[1], ref[1])


def test_zero_scores_are_never_hits() -> None:
    # codes 0-1 and 2-3 live in separate components: a query on 0 cannot reach AMUs of {2, 3}
    bank = [{0, 1}, {2, 3}, {0, 1}, {2, 3}, set()]
    topology = build(bank, num_codes=4)
    ids, scores = topology.search({0}, 10)
    np.testing.assert_array_equal(ids, [0, 2])
    assert (scores > 0).all()
    np.testing.assert_array_equal(topology.search_bruteforce({0}, 10)[0], [0, 2])


def test_empty_cases_return_empty_results() -> None:
    empty = CooccurrenceTopology(num_codes=8)
    for topology in (empty, build([{0, 1}, {1, 2}], num_codes=8)):
        for query in (set(), {0, 1}):
            for search in (topology.search, topology.search_bruteforce):
                ids, scores = search(query, 5)
                assert ids.shape == scores.shape
                if not query or topology is empty:
                    assert ids.size == 0
    assert empty.code_scores().shape == (8, 8) and not empty.code_scores().any()
    assert build([{0, 1}], num_codes=8).search({0}, 0)[0].size == 0


def test_k_larger_than_bank_returns_every_positive_unit() -> None:
    bank = random_bank(5, count=25)
    topology = build(bank)
    scores = topology.unit_scores({2, 7})
    ids, _ = topology.search({2, 7}, 1000)
    assert sorted(ids.tolist()) == np.flatnonzero(scores > 0).tolist()


def test_invalid_inputs_are_refused() -> None:
    topology = build([{0, 1}], num_codes=4)
    with pytest.raises(ValueError):
        topology.add([{4}])
    with pytest.raises(ValueError):
        topology.add([{-1}])
    with pytest.raises(ValueError):
        topology.search({9}, 3)
    with pytest.raises(ValueError):
        topology.search({0}, -1)
    with pytest.raises(ValueError):
        TopologyParams(alpha=0.0)
    with pytest.raises(ValueError):
        TopologyParams(aggregate="mean")
    with pytest.raises(ValueError):
        TopologyParams(max_hops=0, self_term=False)
    with pytest.raises(ValueError, match="codebook_size"):
        CooccurrenceTopology(num_codes=4, identity=IDENTITY)
    assert topology.num_units == 1  # a refused add changes nothing


def test_incremental_add_equals_rebuild() -> None:
    bank = random_bank(6, count=50)
    whole = build(bank, self_term=True)
    parts = CooccurrenceTopology(num_codes=16, params=TopologyParams(**(PAPER_FORMULA | {"self_term": True})))
    parts.add(bank[:10])
    parts.search({1, 2}, 5)  # a query in between folds the first batch in
    parts.add([])
    parts.add(bank[10:30])
    indptr = np.cumsum([0] + [len(codes) for codes in bank[30:]])
    codes = np.array([c for codes in bank[30:] for c in sorted(codes)], dtype=np.int64)
    np.testing.assert_array_equal(parts.add_incidence(indptr, codes), np.arange(30, 50))
    np.testing.assert_array_equal(parts.doc_freq, whole.doc_freq)
    np.testing.assert_array_equal(parts.cooccurrence.toarray(), whole.cooccurrence.toarray())
    np.testing.assert_allclose(parts.code_scores(), whole.code_scores(), atol=1e-12)
    for query in ({0}, {3, 4, 11}):
        a, b = parts.search(query, 7, {2}), whole.search(query, 7, {2})
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_allclose(a[1], b[1], atol=1e-12)


def test_repeated_codes_count_once() -> None:
    with_repeats = build([[1, 1, 2, 2, 2], [3, 1, 3]])
    as_sets = build([{1, 2}, {1, 3}])
    np.testing.assert_array_equal(with_repeats.doc_freq, as_sets.doc_freq)
    np.testing.assert_array_equal(with_repeats.cooccurrence.toarray(), as_sets.cooccurrence.toarray())


def test_save_load_round_trip(tmp_path) -> None:
    bank = random_bank(8)
    topology = build(bank, max_hops=3, alpha=0.6, self_term=True, identity=IDENTITY)
    topology.add([{1, 2, 3}])  # pending AMUs must be saved too
    topology.save(tmp_path)
    loaded = CooccurrenceTopology.load(tmp_path, identity=IDENTITY)
    assert loaded.params == TopologyParams(3, 0.6, True, "max")
    assert loaded.num_units == topology.num_units == len(bank) + 1
    np.testing.assert_array_equal(loaded.code_scores(), topology.code_scores())
    for query in ({0, 5}, {9}):
        np.testing.assert_array_equal(loaded.search(query, 10)[0], topology.search(query, 10)[0])
    loaded.add([{4, 5}])  # a loaded bank keeps growing
    assert loaded.num_units == len(bank) + 2


def test_mismatched_identity_is_refused(tmp_path) -> None:
    build(random_bank(9), identity=IDENTITY).save(tmp_path)
    other = {"codebook_size": 16, "codebook_sha256": "b" * 64}
    with pytest.raises(ValueError, match="a{64}.*b{64}"):
        CooccurrenceTopology.load(tmp_path, identity=other)


# ---------------------------------------------------------------- Path B "sum": MaxScore walk

# Values whose sums round differently by order (0.1 + 0.2 != 0.3), equal values (ties) and a
# negative one (an activation the walk never visits but the exact score counts).
ACTIVATION_VALUES = [0.0, 0.1, 0.2, 0.3, 1 / 3, 0.7, 1.0, 2.5, 1e-9, -0.4]


def assert_same_result(fast: tuple[np.ndarray, np.ndarray], ref: tuple[np.ndarray, np.ndarray]) -> None:
    """Same AMUs in the same order and bitwise the same scores."""
    np.testing.assert_array_equal(fast[0], ref[0])
    assert fast[0].dtype == ref[0].dtype and fast[1].dtype == ref[1].dtype
    assert fast[1].tobytes() == ref[1].tobytes()


@settings(max_examples=300, deadline=None)
@given(
    bank=st.lists(st.sets(st.integers(0, 11), max_size=7), max_size=50),
    activation=st.lists(st.sampled_from(ACTIVATION_VALUES), min_size=12, max_size=12),
    k=st.integers(0, 55),
    exclude=st.sets(st.integers(0, 55), max_size=10),
    scan_share=st.sampled_from([0.25, math.inf]),
)
def test_sum_walk_equals_full_product(bank, activation, k, exclude, scan_share) -> None:
    # scan_below=0: the walk runs on tiny banks; scan_share=inf never gives way to the full product
    topology = CooccurrenceTopology(12)
    topology.add(bank)
    act = np.array(activation)
    fast = sum_walk(act, topology.incidence, topology.postings(), k, exclude, scan_share, scan_below=0)
    assert_same_result(fast, top_k_of_scores(topology.incidence @ act, k, exclude))


def skewed_bank(rng: np.random.Generator, count: int, num_codes: int) -> list[set[int]]:
    """Code sets with Zipf-like code frequencies and co-occurring groups of codes (topics)."""
    weights = 1.0 / np.arange(1, num_codes + 1)
    topics = [rng.choice(num_codes, size=6, replace=False) for _ in range(8)]
    bank = []
    for _ in range(count):
        codes = set(rng.choice(num_codes, size=rng.integers(0, 10), p=weights / weights.sum()).tolist())
        codes |= set(rng.choice(topics[rng.integers(len(topics))], size=rng.integers(0, 4)).tolist())
        bank.append(codes)
    return bank


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), k=st.sampled_from([1, 3, 20, 200]), excluded=st.integers(0, 40))
def test_default_search_equals_bruteforce_on_larger_banks(seed, k, excluded) -> None:
    # long posting lists, many rounds of the walk; the library default (self term + sum)
    rng = np.random.default_rng(seed)
    bank = skewed_bank(rng, 1500, 48)
    topology = CooccurrenceTopology(48, TopologyParams())
    topology.add(bank)
    for _ in range(5):
        query = set(rng.integers(0, 48, size=rng.integers(1, 8)).tolist())
        exclude = set(rng.integers(0, len(bank), size=excluded).tolist())
        ref = topology.search_bruteforce(query, k, exclude)
        assert_same_result(topology.search(query, k, exclude), ref)
        walk = sum_walk(topology.activation(query), topology.incidence, topology.postings(), k, exclude,
                        scan_share=math.inf, scan_below=0)
        assert_same_result(walk, ref)


def test_sum_walk_prunes_without_scanning(monkeypatch) -> None:
    # rare query codes dominate: the walk must stop early, never falling back to the full product
    rng = np.random.default_rng(11)
    bank = skewed_bank(rng, 4000, 64)
    topology = CooccurrenceTopology(64, TopologyParams())
    topology.add(bank)
    rare = np.argsort(topology.doc_freq)[:3]
    ref = topology.search_bruteforce(rare, 10)
    monkeypatch.setattr(walks, "top_k_of_scores", lambda *args: pytest.fail("the walk scanned the bank"))
    walk = sum_walk(topology.activation(rare), topology.incidence, topology.postings(), 10, scan_below=0)
    assert_same_result(walk, ref)


def test_sum_walk_bounds_unseen_amus_by_their_widest_row() -> None:
    # The last AMU holds none of the top code 0 but three codes worth 0.4 each: 1.2 beats AMU 0's
    # 1.0, so the walk may not stop after code 0 (a bound of two later codes, 0.8, would let it;
    # the long lists of codes 1-3 make walking on look dearer than scoring the one AMU met).
    bank = [{0}] + [{code} for code in (1, 2, 3) for _ in range(100)] + [{1, 2, 3}]
    act = np.array([1.0, 0.4, 0.4, 0.4])
    topology = CooccurrenceTopology(4)
    topology.add(bank)
    assert walks.window_bounds(act, 3, 1.0)[1] >= 1.2
    for k in (1, 2):
        fast = sum_walk(act, topology.incidence, topology.postings(), k, scan_share=math.inf, scan_below=0)
        assert_same_result(fast, top_k_of_scores(topology.incidence @ act, k))
        assert fast[0][0] == len(bank) - 1


def test_sum_walk_breaks_ties_by_index_across_the_walk() -> None:
    # AMUs 0 and 1 tie AMU 2 (0.5 + 0.5 = 1.0 exactly) but are reached after it: they still come first
    bank = [{1, 2}, {1, 2}, {0}, {3}]
    act = np.array([1.0, 0.5, 0.5, 0.25])
    topology = CooccurrenceTopology(4)
    topology.add(bank)
    walk = functools.partial(sum_walk, act, topology.incidence, topology.postings(), scan_share=math.inf,
                             scan_below=0)
    ids, scores = walk(2)
    assert ids.tolist() == [0, 1] and scores.tolist() == [1.0, 1.0]
    assert walk(3, exclude={1})[0].tolist() == [0, 2, 3]


@pytest.mark.parametrize(("call", "named"), [
    (lambda: TopologyParams(alpha="0.5"), "'alpha' is '0.5'"),
    (lambda: TopologyParams(alpha=None), "'alpha' is None"),
    (lambda: TopologyParams(length_norm="1"), "'length_norm' is '1'"),
    (lambda: TopologyParams(max_hops=True), "max_hops must be an integer"),
    (lambda: TopologyParams(self_term="no"), "self_term must be True or False"),
    (lambda: CooccurrenceTopology("8"), "num_codes must be a positive integer"),
    (lambda: CooccurrenceTopology(8, params={"alpha": 0.3}), "params must be a TopologyParams"),
    (lambda: CooccurrenceTopology(8).add([[1.7, 2]]), "codes must be integers"),
    (lambda: CooccurrenceTopology(8).activation([1.9]), "codes must be integers"),
    (lambda: CooccurrenceTopology(8).search([1], 2.5), "k must be an integer"),
    (lambda: CooccurrenceTopology(8).search_bruteforce([1], True), "k must be an integer"),
])
def test_bad_input_to_the_public_api_is_refused_naming_it(call, named):
    """Not a TypeError from deep inside numpy, and never a silently truncated code."""
    with pytest.raises((ValueError, TypeError), match=named):
        call()
