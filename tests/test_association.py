"""Path B's association options (docs/design.md §3.5) against hand-computed values: the paper's
conditional walk, the lift (pointwise mutual information) of the walk, IDF on the target, the self term alone
(H_r = 0) and length normalisation of the summed score."""

from __future__ import annotations

import math

import numpy as np
import pytest

from isq.topology import CooccurrenceTopology, TopologyParams

# Three codes over four units: code 0 is everywhere (a "common target"), 1 and 2 are rarer.
BANK = [{0, 1}, {0, 1}, {0, 2}, {0, 1, 2}]
N = len(BANK)
# M (a != b): M01 = 3, M02 = 2, M12 = 1; row sums r = (5, 4, 3); total 12.
M = np.array([[0, 3, 2], [3, 0, 1], [2, 1, 0]], dtype=float)
P = M / M.sum(axis=1, keepdims=True)
IDF = np.log((N + 1) / (np.array([4, 3, 2]) + 1.0))
SHARE = M.sum(axis=0) / M.sum()


def topology(**params) -> CooccurrenceTopology:
    built = CooccurrenceTopology(3, TopologyParams(**params))
    built.add(BANK)
    return built


def with_self_term(scores: np.ndarray) -> np.ndarray:
    scores = scores.copy()
    np.fill_diagonal(scores, np.maximum(np.diag(scores), IDF))
    return scores


def test_conditional_is_the_spec_formula() -> None:
    expected = with_self_term(IDF[:, None] * P * 0.5)
    np.testing.assert_allclose(topology(alpha=0.5).code_scores(), expected, rtol=1e-12)


def test_lift_is_the_positive_pointwise_mutual_information_of_the_walk() -> None:
    expected = with_self_term(0.5 * np.log(np.maximum(P / SHARE[None, :], 1.0)))
    np.testing.assert_allclose(topology(alpha=0.5, association="lift").code_scores(), expected, rtol=1e-12)
    # code 0 is reached from 1 with P = 3/4 but holds 5/12 of all co-occurrences: lift 1.8
    assert (topology(alpha=1.0, association="lift").code_scores()[1, 0]
            == pytest.approx(math.log(0.75 / (5 / 12))))


def test_idf_on_the_target_discounts_common_targets() -> None:
    scores = topology(alpha=1.0, association="target_idf").code_scores()
    np.testing.assert_allclose(scores, with_self_term(P * IDF[None, :]), rtol=1e-12)
    conditional = topology(alpha=1.0).code_scores()
    assert scores[1, 0] == 0.0 < conditional[1, 0]  # the code in every unit (IDF 0) is never a target


def test_two_hops_take_the_best_walk() -> None:
    two = topology(max_hops=2, alpha=0.9, association="lift").code_scores()
    walk = np.maximum(0.9 * np.log(np.maximum(P / SHARE, 1.0)), 0.81 * np.log(np.maximum(P @ P / SHARE, 1.0)))
    np.testing.assert_allclose(two, with_self_term(walk), rtol=1e-12)


def test_no_hops_keeps_the_self_term_alone() -> None:
    built = topology(max_hops=0)
    np.testing.assert_allclose(built.code_scores(), np.diag(IDF), rtol=1e-12)
    np.testing.assert_allclose(built.unit_scores({1, 2}), [IDF[1], IDF[1], IDF[2], IDF[1] + IDF[2]],
                               rtol=1e-12)
    with pytest.raises(ValueError, match="self_term"):
        TopologyParams(max_hops=0, self_term=False)


def test_length_normalisation_divides_the_sum() -> None:
    plain, normed = topology(max_hops=0), topology(max_hops=0, length_norm=0.5)
    lengths = np.array([len(codes) for codes in BANK], dtype=float)
    np.testing.assert_allclose(normed.unit_scores({1}), plain.unit_scores({1}) / np.sqrt(lengths), rtol=1e-12)
    indices, scores = normed.search({1, 2}, 2)
    expected = normed.unit_scores({1, 2})
    assert list(indices) == sorted(range(4), key=lambda i: (-expected[i], i))[:2]
    np.testing.assert_allclose(scores, expected[indices])
    for value in (0.5, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="length_norm"):
            TopologyParams(aggregate="max" if value == 0.5 else "sum", length_norm=value)


def test_saved_parameters_round_trip(tmp_path) -> None:
    identity = {"codebook_size": 3, "codebook_sha256": "c" * 64}
    params = TopologyParams(2, 0.4, True, "sum", "lift", 0.5)
    built = CooccurrenceTopology(3, params, identity)
    built.add(BANK)
    built.save(tmp_path)
    assert CooccurrenceTopology.load(tmp_path, identity).params == params
