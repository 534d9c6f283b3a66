"""Codebook analysis functions (isq.analysis) on hand-built inputs with known answers."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from isq import analysis
from isq.analysis import SampleCodes
from isq.codebook import Codebook, perplexity
from isq.fingerprint import Fingerprinter
from isq.model import ISQModel
from tests.conftest import tiny_config

TEXTS = [
    "Hi John, are you free on Monday at 7?",
    "It's 120 dollars.",
    "ok",
    "Shall we meet at the library on the 14th?",
]


@pytest.fixture(scope="module")
def fingerprinter(tmp_path_factory) -> Fingerprinter:
    torch.manual_seed(0)
    directory = ISQModel(tiny_config()).export_fingerprinter(tmp_path_factory.mktemp("fp"))
    return Fingerprinter.from_pretrained(directory)


def hand_sample(tokens: list[list[str]], codes: list[list[int]], num_codes: int = 8) -> SampleCodes:
    return SampleCodes(
        texts=[" ".join(t) for t in tokens],
        tokens=tokens,
        token_codes=[np.array(c, dtype=np.int64) for c in codes],
        z_norms=[np.ones(len(c)) for c in codes],
        errors=[np.zeros(len(c)) for c in codes],
        num_codes=num_codes,
    )


# ---------------------------------------------------------------------------- utilisation


def test_code_counts_ignore_padding_and_refuse_foreign_codes():
    counts = analysis.code_counts(np.array([[0, 2, 2, -1], [3, -1, -1, -1]]), 5)
    np.testing.assert_array_equal(counts, [1, 0, 2, 1, 0])
    with pytest.raises(ValueError, match="outside"):
        analysis.code_counts([0, 5], 5)


def test_uniform_use_has_perplexity_n_and_gini_zero():
    usage = analysis.usage_stats(np.full(8, 5))
    assert usage.perplexity == pytest.approx(8.0)
    assert usage.normalised_entropy == pytest.approx(1.0)
    assert usage.gini == pytest.approx(0.0, abs=1e-12)
    assert (usage.dead, usage.used, usage.tokens) == (0, 8, 40)


def test_one_dead_code_is_counted():
    usage = analysis.usage_stats([3, 3, 0, 3])
    assert (usage.dead, usage.used, usage.dead_share) == (1, 3, 0.25)
    assert usage.perplexity == pytest.approx(3.0)


def test_all_mass_on_one_code_has_perplexity_one():
    usage = analysis.usage_stats([0, 0, 7, 0])
    assert usage.perplexity == pytest.approx(1.0)
    assert usage.entropy == pytest.approx(0.0)
    assert usage.gini == pytest.approx(1 - 1 / 4)


def test_gini_matches_the_mean_absolute_difference_definition():
    values = np.array([0, 0, 0, 1, 3])
    by_definition = np.abs(values[:, None] - values[None, :]).sum() / (2 * values.size**2 * values.mean())
    assert analysis.gini(values) == pytest.approx(by_definition) == pytest.approx(0.7)


def test_usage_perplexity_is_the_training_perplexity_and_exp_entropy():
    counts = np.array([5, 0, 3, 1, 1])
    usage = analysis.usage_stats(counts)
    assert usage.perplexity == pytest.approx(float(perplexity(torch.tensor(counts, dtype=torch.float64))))
    assert usage.perplexity == pytest.approx(math.exp(usage.entropy), rel=1e-12)


def test_usage_of_nothing_is_refused():
    with pytest.raises(ValueError, match="no token"):
        analysis.usage_stats(np.zeros(4))


# ---------------------------------------------------------------------------- geometry

RIGHT_TRIANGLE = np.array([[0.0, 0.0], [3.0, 0.0], [0.0, 4.0]])


@pytest.mark.parametrize("as_tensor", [False, True])
def test_norms_and_pairwise_distances_of_a_3_4_5_triangle(as_tensor):
    book = torch.tensor(RIGHT_TRIANGLE, dtype=torch.float32) if as_tensor else RIGHT_TRIANGLE
    np.testing.assert_allclose(analysis.code_norms(book), [0, 3, 4])
    np.testing.assert_allclose(analysis.pairwise_distances(book), [3, 4, 5])


def test_nearest_neighbour_distances_skip_the_code_itself():
    distances, nearest = analysis.nearest_neighbour_distances(RIGHT_TRIANGLE)
    np.testing.assert_allclose(distances, [3, 3, 4])
    np.testing.assert_array_equal(nearest, [1, 0, 0])


def test_codebook_lookup_used_by_collect_returns_index_and_squared_error():
    z = torch.tensor([[0.5, 0.0], [2.0, 0.0], [0.0, 5.0]])
    codes, errors, _ = Codebook.from_vectors(torch.tensor(RIGHT_TRIANGLE)).nearest(z)
    assert codes.tolist() == [0, 1, 2]
    torch.testing.assert_close(errors, torch.tensor([0.25, 1.0, 1.0]))


def test_pca_of_a_codebook_on_a_line():
    direction = np.array([1.0, 2.0, 2.0]) / 3.0
    t = np.array([-2.0, -1.0, 0.0, 1.0, 2.0])
    pca = analysis.pca_2d(t[:, None] * direction + np.array([5.0, -1.0, 2.0]))
    np.testing.assert_allclose(pca.explained_variance_ratio, [1.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(pca.components[0], direction, atol=1e-12)
    np.testing.assert_allclose(pca.coordinates[:, 0], t, atol=1e-12)
    np.testing.assert_allclose(pca.coordinates[:, 1], 0.0, atol=1e-12)
    np.testing.assert_allclose(pca.mean, [5.0, -1.0, 2.0])


def test_pca_of_a_codebook_in_a_plane():
    book = np.array([[2.0, 0, 0], [-2.0, 0, 0], [0, 1.0, 0], [0, -1.0, 0]]) + 7.0
    pca = analysis.pca_2d(book)
    np.testing.assert_allclose(pca.explained_variance_ratio, [0.8, 0.2])
    np.testing.assert_allclose(np.abs(pca.components), [[1, 0, 0], [0, 1, 0]], atol=1e-12)
    np.testing.assert_allclose(pca.coordinates, [[2, 0], [-2, 0], [0, 1], [0, -1]], atol=1e-12)


def test_pca_needs_two_codes():
    with pytest.raises(ValueError, match="at least 2"):
        analysis.pca_2d(np.ones((1, 4)))


# ---------------------------------------------------------------------------- fingerprints


def test_fingerprint_lengths():
    lengths = analysis.fingerprint_lengths([[5, 5, 7, 7, 5], [3], [2, 2, 2]])
    np.testing.assert_array_equal(lengths.tokens, [5, 1, 3])
    np.testing.assert_array_equal(lengths.sequence, [3, 1, 1])
    np.testing.assert_array_equal(lengths.distinct, [2, 1, 1])
    summary = lengths.summary()
    assert summary["mean_L"] == 3.0 and summary["median_S_fp"] == 1.0
    assert summary["mean_U_fp_over_L"] == pytest.approx((2 / 5 + 1 + 1 / 3) / 3)


# ---------------------------------------------------------------------------- concordance


def test_concordance_lists_tokens_and_contexts_by_frequency():
    sample = hand_sample([["a", "b", "a"], ["b", "a"]], [[1, 2, 1], [2, 2]])
    entries = analysis.concordance(sample)
    assert list(entries) == [2, 1]  # code 2 has three tokens, code 1 two
    assert entries[2].count == 3 and entries[2].tokens == [("b", 2), ("a", 1)]
    assert entries[1].tokens == [("a", 2)]
    assert dict(entries[1].contexts) == {"[a] b": 1, "b [a]": 1}


def test_word_codes_match_whole_token_sequences():
    sample = hand_sample([["a", "b", "a"], ["b", "a"]], [[1, 2, 1], [2, 2]])
    assert analysis.word_codes(sample, ["a"]) == Counter({(1,): 2, (2,): 1})
    assert analysis.word_codes(sample, ["b", "a"]) == Counter({(2, 1): 1, (2, 2): 1})
    assert analysis.word_codes(sample, ["c"]) == Counter()


def test_frequent_words_skip_subwords_short_and_special_tokens():
    sample = hand_sample([["[CLS]", "monday", "##s", "at", "monday", "dollars", "[SEP]"]], [[0] * 7])
    assert analysis.frequent_words(sample, 5) == ["monday", "dollars"]


def test_frequent_words_of_a_tokenizer_that_marks_word_starts():
    """SentencePiece (T5) marks a word's first piece with "▁"; the unmarked pieces are insides."""
    sample = hand_sample([["▁they", "▁have", "▁ticket", "▁stub", "s", ".", "</s>"],
                          ["▁have", "▁ticket", "tion", "</s>"]], [[0] * 7, [0] * 4])
    assert analysis.frequent_words(sample, 5) == ["have", "ticket", "they", "stub"]


# ---------------------------------------------------------------------------- stability


def test_edits():
    assert analysis.substitute_name("Hi John, meet Mary") == "Hi Mary, meet Mary"
    assert analysis.substitute_name("Johnson is here") is None
    assert analysis.change_digit("at 19 o'clock on the 3rd") == "at 10 o'clock on the 3rd"
    assert analysis.change_digit("no digits") is None
    indices, edited = analysis.edited_texts(["a 1", "b", "c 5"], analysis.change_digit)
    assert indices == [0, 2] and edited == ["a 2", "c 6"]


def test_stability_of_identical_codes_is_one():
    sample = hand_sample([["a", "b"], ["c"]], [[1, 2], [3]])
    result = analysis.stability(sample, sample)
    assert (result.share, result.share_unedited, result.compared, result.skipped) == (1.0, 1.0, 2, 0)


def test_stability_counts_aligned_positions_and_skips_length_changes():
    original = hand_sample([["hi", "john", "!"], ["at", "7"]], [[1, 2, 3], [4, 5]])
    edited = hand_sample([["hi", "mary", "!"], ["at", "1", "##7"]], [[1, 6, 7], [4, 5, 5]])
    result = analysis.stability(original, edited)
    assert (result.compared, result.skipped) == (1, 1)
    assert result.share == pytest.approx(1 / 3)
    assert result.share_unedited == pytest.approx(1 / 2)  # "hi" kept its code, "!" did not


# ---------------------------------------------------------------------------- topology


def test_degrees_count_distinct_partners_and_ignore_the_diagonal():
    cooc = sp.csr_matrix(np.array([[9, 2, 0], [2, 0, 1], [0, 1, 0]]))
    np.testing.assert_array_equal(analysis.degrees(cooc), [1, 2, 1])
    assert cooc[0, 0] == 9  # the caller's matrix is untouched


def test_top_associations_exclude_the_diagonal_and_order_by_score():
    scores = np.array([[9.0, 0.5, 0.2], [0.1, 9.0, 0.7], [0.0, 0.5, 9.0]])
    cooc = sp.csr_matrix(np.array([[0, 3, 0], [3, 0, 1], [0, 1, 0]]))
    top = analysis.top_associations(scores, cooc, k=3)
    assert [(a.source, a.target, a.score, a.cooccurrences) for a in top] == [
        (1, 2, 0.7, 1), (0, 1, 0.5, 3), (2, 1, 0.5, 1)]
    indirect = analysis.top_associations(scores, cooc, k=5, indirect_only=True)
    assert [(a.source, a.target, a.cooccurrences) for a in indirect] == [(0, 2, 0)]  # (2, 0) scores 0
    only_zero = analysis.top_associations(scores, cooc, k=5, sources=np.array([True, False, False]))
    assert [(a.source, a.target) for a in only_zero] == [(0, 1), (0, 2)]


# ---------------------------------------------------------------------------- the fingerprinter pass


def test_sample_texts_is_reproducible_and_keeps_order():
    texts = [f"t{i}" for i in range(50)]
    chosen = analysis.sample_texts(texts, 10, seed=3)
    assert chosen == analysis.sample_texts(texts, 10, seed=3)
    assert len(chosen) == 10 and chosen == sorted(chosen, key=texts.index)
    assert analysis.sample_texts(texts, 100) == texts


def test_collect_agrees_with_the_fingerprinter(fingerprinter):
    sample = analysis.collect(fingerprinter, TEXTS, batch_size=3)
    fingerprints = fingerprinter.fingerprint(TEXTS)
    assert [tuple(c.tolist()) for c in sample.token_codes] == [f.token_codes for f in fingerprints]
    assert [len(t) for t in sample.tokens] == [len(f.token_codes) for f in fingerprints]
    assert sample.tokens[2] == ["[CLS]", "ok", "[SEP]"]
    assert sample.all_codes.size == sample.all_errors.size == sample.all_z_norms.size
    # the error is the squared distance to the assigned code, never larger than to any other code
    batch = fingerprinter.tokenizer(TEXTS[:1], return_tensors="pt")
    z = fingerprinter.semantic_encoder(batch["input_ids"], batch["attention_mask"])[0]
    distances = torch.cdist(z.double(), fingerprinter.codebook.vectors.double()) ** 2
    np.testing.assert_allclose(sample.errors[0], distances.min(dim=1).values.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(sample.z_norms[0], z.norm(dim=1).numpy(), rtol=1e-5)


def test_collect_errors_and_codes_are_the_codebook_lookup(fingerprinter):
    sample = analysis.collect(fingerprinter, TEXTS[:1])
    batch = fingerprinter.tokenizer(TEXTS[:1], return_tensors="pt")
    z = fingerprinter.semantic_encoder(batch["input_ids"], batch["attention_mask"])[0]
    lookup = fingerprinter.codebook.nearest(z)
    np.testing.assert_array_equal(sample.token_codes[0], lookup.indices.numpy())
    np.testing.assert_array_equal(sample.errors[0], lookup.errors.double().numpy())
    assert sample.errors[0].dtype == sample.z_norms[0].dtype == np.float64


def test_collect_does_not_depend_on_batching_and_identical_text_is_stable(fingerprinter):
    one = analysis.collect(fingerprinter, TEXTS, batch_size=1)
    four = analysis.collect(fingerprinter, TEXTS, batch_size=4)
    assert [c.tolist() for c in one.token_codes] == [c.tolist() for c in four.token_codes]
    result = analysis.stability(one, four)
    assert (result.share, result.compared) == (1.0, len(TEXTS))
    picked = four.select([3, 1])
    assert picked.texts == [TEXTS[3], TEXTS[1]] and picked.token_codes[1] is four.token_codes[1]


def test_collect_refuses_a_bare_string_and_nothing(fingerprinter):
    with pytest.raises(TypeError):
        analysis.collect(fingerprinter, "one text")
    with pytest.raises(ValueError):
        analysis.collect(fingerprinter, [])


def test_name_edit_through_the_fingerprinter_keeps_length_and_changes_little(fingerprinter):
    indices, edited = analysis.edited_texts(TEXTS, analysis.substitute_name)
    assert indices == [0]
    sample = analysis.collect(fingerprinter, TEXTS)
    result = analysis.stability(sample.select(indices), analysis.collect(fingerprinter, edited))
    assert result.compared == 1
    assert 0.0 <= result.share <= 1.0 and not math.isnan(result.share_unedited)


def test_lexical_consistency_of_word_codes_and_of_mixed_codes():
    # One code per word: both conditional entropies are zero; specials are ignored.
    exact = hand_sample([["[CLS]", "the", "cat", "[SEP]"], ["[CLS]", "the", "dog", "[SEP]"]],
                        [[7, 1, 2, 7], [6, 1, 3, 6]])
    result = analysis.lexical_consistency(exact)
    assert (result.code_given_token, result.token_given_code, result.pairs) == (0.0, 0.0, 4)
    # "the" split evenly over two codes (1 bit for half the pairs), and code 5 shared by two
    # words seen once each next to two "the"-only codes.
    mixed = hand_sample([["the", "cat"], ["the", "dog"]], [[1, 5], [2, 5]])
    result = analysis.lexical_consistency(mixed)
    assert math.isclose(result.code_given_token, 0.5)  # P(the) = 1/2, H(code | the) = 1 bit
    assert math.isclose(result.token_given_code, 0.5)  # P(code 5) = 1/2, H(token | 5) = 1 bit
