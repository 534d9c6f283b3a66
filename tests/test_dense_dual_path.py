"""Dense faiss index and dual-path retrieval (docs/design.md §4)."""

from __future__ import annotations

import re
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from isq.topology import TopologyParams
from retrieval.contract import Query
from retrieval.eval.dual_path import Channel, DualPathMode, DualPathRetriever
from retrieval.index import products
from retrieval.index.dense import DenseIndex
from retrieval.index.fts import RecordLexical
from retrieval.index.products import PRODUCT_ROWS, SHARED_BLOCKS, inner_products
from tests.multi_route_fixtures import WordEmbedder

IDENTITY = {"codebook_size": 32, "codebook_sha256": "c" * 64}
DIM = 24


def hashed_embedder() -> WordEmbedder:
    """A tiny stand-in embedder: hashed bag of words, L2-normalised."""
    return WordEmbedder(DIM, lambda text: re.findall(r"\w+", text.lower()))


def unit_rows(rng: np.random.Generator, count: int, dim: int) -> np.ndarray:
    rows = rng.standard_normal((count, dim)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


# ---------------------------------------------------------------- dense index


@pytest.mark.parametrize("count", [0, 1, 2, 5, PRODUCT_ROWS - 1, PRODUCT_ROWS, PRODUCT_ROWS + 1,
                                   PRODUCT_ROWS + 2, 2 * PRODUCT_ROWS - 1])
def test_inner_products_are_one_call_bit_for_bit(count):
    """Below 2,048 rows one numpy call runs on one BLAS thread: the blocked products equal it
    exactly, a lone last row included (it joins the block before it), for rows given too."""
    rng = np.random.default_rng(count)
    matrix, query = unit_rows(rng, count, 384), unit_rows(rng, 1, 384)[0]
    products = inner_products(matrix, query)
    assert products.dtype == np.float32 and np.array_equal(products, matrix @ query)
    rows = np.sort(rng.integers(0, max(count, 1), size=count))
    assert np.array_equal(inner_products(matrix, query, rows), matrix[rows] @ query)
    wide = query.astype(np.float64)
    assert inner_products(matrix, wide).dtype == np.float64
    assert np.array_equal(inner_products(matrix, wide), matrix @ wide)


@pytest.mark.parametrize("count", [SHARED_BLOCKS * PRODUCT_ROWS - 1, SHARED_BLOCKS * PRODUCT_ROWS,
                                   SHARED_BLOCKS * PRODUCT_ROWS + 1, 9 * PRODUCT_ROWS + 517])
def test_shared_products_are_the_blocks_one_thread_computes(count):
    """A product large enough to share its blocks with helper threads has the floats of the same
    blocks computed one after another on the calling thread, rows given or not."""
    rng = np.random.default_rng(count)
    matrix, query = unit_rows(rng, count, 384), unit_rows(rng, 1, 384)[0]
    rows = rng.permutation(count)[: count - 3]
    shared, shared_rows = inner_products(matrix, query), inner_products(matrix, query, rows)
    alone = products.SHARED_BLOCKS
    try:
        products.SHARED_BLOCKS = 10**9
        assert np.array_equal(shared, inner_products(matrix, query))
        assert np.array_equal(shared_rows, inner_products(matrix, query, rows))
    finally:
        products.SHARED_BLOCKS = alone
    np.testing.assert_allclose(shared, matrix @ query, rtol=1e-5, atol=1e-6)


def test_a_shared_product_does_not_wait_for_busy_helpers():
    """With every helper thread held by other work, a shared product is computed by its caller
    alone, and a helper freed afterwards finds nothing left to do."""
    held, done = threading.Event(), []
    helpers = [products._helpers().submit(held.wait) for _ in range(products.PRODUCT_THREADS - 1)]
    try:
        rng = np.random.default_rng(0)
        matrix, query = unit_rows(rng, SHARED_BLOCKS * PRODUCT_ROWS * 2, 64), unit_rows(rng, 1, 64)[0]
        caller = threading.Thread(target=lambda: done.append(inner_products(matrix, query)))
        caller.start()
        caller.join(timeout=60)
        assert not caller.is_alive() and len(done) == 1
        assert np.array_equal(done[0], inner_products(matrix, query))
    finally:
        held.set()
        for helper in helpers:
            helper.result(timeout=60)


def test_a_failing_shared_product_raises_in_its_caller():
    matrix = np.ones((SHARED_BLOCKS * PRODUCT_ROWS, 8), dtype=np.float32)
    with pytest.raises(ValueError):
        inner_products(matrix, np.ones(9, dtype=np.float32))


def test_flat_search_equals_numpy_ranking() -> None:
    rng = np.random.default_rng(0)
    vectors, queries = unit_rows(rng, 200, 16), unit_rows(rng, 5, 16)
    index = DenseIndex(16)
    np.testing.assert_array_equal(index.add(vectors[:120]), np.arange(120))
    np.testing.assert_array_equal(index.add(vectors[120:]), np.arange(120, 200))
    scores, ids = index.search(queries, 10)
    expected = np.argsort(-(queries @ vectors.T), axis=1)[:, :10]
    np.testing.assert_array_equal(ids, expected)
    np.testing.assert_allclose(scores, np.take_along_axis(queries @ vectors.T, expected, axis=1), rtol=1e-5)


def test_dense_edge_cases() -> None:
    index = DenseIndex(8)
    scores, ids = index.search(np.ones(8, dtype=np.float32), 5)
    assert scores.shape == ids.shape == (1, 0)
    index.add(unit_rows(np.random.default_rng(1), 3, 8))
    assert index.search(unit_rows(np.random.default_rng(2), 2, 8), 50)[1].shape == (2, 3)
    with pytest.raises(ValueError):
        index.add(np.ones((2, 7), dtype=np.float32))
    with pytest.raises(ValueError):
        DenseIndex(8, kind="lsh")


@pytest.mark.parametrize("kind", ["flat", "ivf", "hnsw"])
def test_dense_save_load_round_trip(kind: str, tmp_path) -> None:
    rng = np.random.default_rng(3)
    vectors, queries = unit_rows(rng, 300, 16), unit_rows(rng, 4, 16)
    index = DenseIndex(16, kind=kind, nlist=8, nprobe=8)
    index.add(vectors)
    before = index.search(queries, 7)
    index.save(tmp_path)
    loaded = DenseIndex.load(tmp_path)
    assert (len(loaded), loaded.kind) == (300, kind)
    after = loaded.search(queries, 7)
    np.testing.assert_array_equal(after[1], before[1])
    np.testing.assert_allclose(after[0], before[0])
    if kind != "hnsw":  # IVF probing every list is exact
        np.testing.assert_array_equal(before[1], np.argsort(-(queries @ vectors.T), axis=1)[:, :7])


def test_ivf_needs_a_training_batch() -> None:
    with pytest.raises(ValueError, match="nlist"):
        DenseIndex(16, kind="ivf", nlist=64).add(unit_rows(np.random.default_rng(4), 10, 16))


# ---------------------------------------------------------------- dual path

FACTS = [
    "Caroline went to the LGBTQ support group on 7 May 2023.",
    "Melanie painted a sunrise over the lake in 2022.",
    "Caroline is researching adoption agencies.",
    "Melanie ran a charity race for mental health on 20 May 2023.",
    "Caroline moved from Sweden four years ago.",
    "Melanie's kids love the dinosaur exhibit at the museum.",
    "Caroline wants to become a counselor.",
    "Melanie signed up for a pottery class.",
]


def make_bank(count: int = 40, seed: int = 0) -> tuple[DualPathRetriever, dict]:
    rng = np.random.default_rng(seed)
    texts = [f"{FACTS[i % len(FACTS)]} note {i}" for i in range(count)]
    data = {
        "ids": [f"amu-{i}" for i in range(count)],
        "texts": texts,
        "embeddings": hashed_embedder().encode(texts),
        "code_sets": [set(rng.integers(0, 32, size=rng.integers(1, 6)).tolist()) for _ in range(count)],
        "sources": [
            {"session_id": f"session_{i // 10 + 1}", "turn_ids": [f"D{i // 10 + 1}:{i % 10}"]}
            for i in range(count)
        ],
    }
    retriever = DualPathRetriever(DIM, IDENTITY, TopologyParams(self_term=True))
    retriever.add(**{key: value[:15] for key, value in data.items()})
    retriever.add(**{key: value[15:] for key, value in data.items()})
    return retriever, data


def query_inputs(text: str, codes: set[int]) -> Query:
    return Query(text, hashed_embedder().encode([text])[0], frozenset(codes))


MODES = [(None, True), (Channel.CODE, False), (Channel.BM25, False), (Channel.CODEBM25, False),
         (Channel.CODE, True), (Channel.BM25, True), (Channel.CODEBM25, True)]
"""(complement, with the dense path): every dual-path configuration."""


def search(retriever: DualPathRetriever, query: Query, mode=(Channel.CODE, True), k_dense: int = 20,
           k_code: int = 20):
    """The hits of one configuration: Dense-k_dense, a complement alone with k_code, or both."""
    complement, dense = mode
    if complement is None:
        return retriever.search(query, DualPathMode(None, 0), k_dense)
    return retriever.search(query, DualPathMode(complement, k_dense if dense else 0),
                            (k_dense if dense else 0) + k_code)


def check_hits(hits, retriever: DualPathRetriever, data: dict) -> None:
    """Every hit carries the id, index and source it was added with; ranks count 1.. per path."""
    for hit in hits:
        assert data["ids"][hit.index] == hit.id and retriever.ids[hit.index] == hit.id
        source = data["sources"][hit.index]
        assert (hit.session_id, hit.turns) == (source["session_id"], tuple(source["turn_ids"]))
    for path in ("dense", "code", "bm25"):
        assert [hit.rank for hit in hits if hit.channel == path] == list(
            range(1, sum(h.channel == path for h in hits) + 1)
        )


def test_dense_plus_code_complements_path_a() -> None:
    retriever, data = make_bank()
    query = query_inputs("When did Caroline go to the support group?", {1, 2, 3})
    hits = search(retriever, query, k_dense=5, k_code=8, mode=(Channel.CODE, True))
    dense = [hit for hit in hits if hit.channel == "dense"]
    code = [hit for hit in hits if hit.channel == "code"]
    assert hits == dense + code and len(dense) == 5 and 0 < len(code) <= 8
    assert not {hit.index for hit in dense} & {hit.index for hit in code}
    expected_ids, expected_scores = retriever.topology.search(
        {1, 2, 3}, 8, exclude=[hit.index for hit in dense]
    )
    assert [hit.index for hit in code] == expected_ids.tolist()
    np.testing.assert_allclose([hit.score for hit in code], expected_scores)
    check_hits(hits, retriever, data)


def test_modes_respect_budgets_and_never_repeat() -> None:
    retriever, data = make_bank()
    query = query_inputs("Melanie race mental health", {0, 4, 9, 17})
    for mode in MODES:
        for k_dense, k_code in [(0, 0), (3, 4), (20, 20), (100, 100)]:
            hits = search(retriever, query, k_dense=k_dense, k_code=k_code, mode=mode)
            indices = [hit.index for hit in hits]
            assert len(indices) == len(set(indices))
            n_dense = sum(hit.channel == "dense" for hit in hits)
            assert n_dense == (min(k_dense, len(retriever)) if mode[1] else 0)
            assert len(hits) - n_dense <= (k_code if mode[0] is not None else 0)
            assert all(hit.score > 0 for hit in hits if hit.channel != "dense")
            check_hits(hits, retriever, data)
    full = search(retriever, query, k_dense=0, k_code=100, mode=(Channel.CODE, False))
    assert len(full) == int((retriever.topology.unit_scores({0, 4, 9, 17}) > 0).sum())


def test_bm25_path_finds_rare_words_outside_dense_hits() -> None:
    retriever, data = make_bank()
    query = query_inputs("pottery", set())
    bm25 = search(retriever, query, k_dense=0, k_code=10, mode=(Channel.BM25, False))
    assert {hit.index for hit in bm25} == {i for i, text in enumerate(data["texts"]) if "pottery" in text}
    assert [hit.score for hit in bm25] == sorted((hit.score for hit in bm25), reverse=True)
    hits = search(retriever, query, k_dense=3, k_code=10, mode=(Channel.BM25, True))
    dense = {hit.index for hit in hits if hit.channel == "dense"}
    assert {hit.index for hit in hits if hit.channel == "bm25"} == {hit.index for hit in bm25} - dense
    # an empty code fingerprint gives no code hits, not an error
    assert search(retriever, query, k_code=10, mode=(Channel.CODE, False)) == []


def test_bm25_sees_amus_added_after_a_query() -> None:
    retriever, data = make_bank()
    query = query_inputs("kayaking", set())
    assert search(retriever, query, mode=(Channel.BM25, False)) == []
    retriever.add(
        ["late"], ["Caroline went kayaking."], hashed_embedder().encode(["x"]), [{5}],
        [{"session_id": "s9", "turn_ids": ["D9:1"]}]
    )
    assert [hit.id for hit in search(retriever, query, mode=(Channel.BM25, False))] == ["late"]


def test_empty_bank_and_bad_inputs() -> None:
    retriever = DualPathRetriever(DIM, IDENTITY)
    query = query_inputs("anything", {1})
    for mode in MODES:
        assert search(retriever, query, mode=mode) == []
    with pytest.raises(ValueError, match="k_dense"):
        retriever.search(query, DualPathMode(Channel.CODE, 5), 3)
    with pytest.raises(ValueError, match="embedding"):
        search(retriever, Query("x"), mode=(None, True))
    with pytest.raises(ValueError, match="codes"):
        search(retriever, Query("x", query.embedding), mode=(Channel.CODE, True), k_dense=0)
    with pytest.raises(ValueError):
        retriever.add(["a", "a"], ["x", "y"], np.zeros((2, DIM)), [{1}, {2}], [{}, {}])
    with pytest.raises(ValueError):
        retriever.add(["a"], ["x", "y"], np.zeros((1, DIM)), [{1}], [{}])
    with pytest.raises(ValueError):
        retriever.add(["a"], ["x"], np.zeros((1, DIM)), [{99}], [{}])
    assert len(retriever) == 0 and retriever.topology.num_units == 0 and len(retriever.dense) == 0


def test_retriever_save_load_round_trip(tmp_path) -> None:
    retriever, data = make_bank()
    retriever.save(tmp_path)
    loaded = DualPathRetriever.load(tmp_path, IDENTITY)
    assert loaded.topology.params.self_term and len(loaded) == len(retriever)
    query = query_inputs("Caroline adoption agencies counselor", {2, 8, 30})
    for mode in MODES:
        assert search(loaded, query, mode=mode) == search(retriever, query, mode=mode)
    check_hits(search(loaded, query), loaded, data)


def test_a_shared_lexical_channel_keeps_its_entities_and_topics_through_save_and_load(tmp_path) -> None:
    """The evaluation's bank shares the user's records' lexical table (text, entities, topics): a
    word only an entity holds is found after loading as before."""
    records = [SimpleNamespace(id="a", text="She adopted a puppy.", entities=("Caroline",),
                               tags=("adoption",)),
               SimpleNamespace(id="b", text="Melanie went hiking.", entities=("Melanie",), tags=("hiking",))]
    retriever = DualPathRetriever(4, IDENTITY, lexical=RecordLexical(records))
    sources = [{"session_id": "s", "turn_ids": [f"t{i}"]} for i in (1, 2)]
    retriever.add(["a", "b"], [record.text for record in records], np.eye(4, dtype=np.float32)[:2],
                  [{1}, {2}], sources)
    query = Query("Caroline adoption", np.eye(4, dtype=np.float32)[0], frozenset({1}))
    mode = DualPathMode(Channel.BM25, 0)
    retriever.save(tmp_path)
    loaded = DualPathRetriever.load(tmp_path, IDENTITY)
    found = [hit.id for hit in loaded.search(query, mode, 2)]
    assert found == [hit.id for hit in retriever.search(query, mode, 2)] == ["a"]


def test_retriever_refuses_another_fingerprinter(tmp_path) -> None:
    retriever, _ = make_bank()
    retriever.save(tmp_path)
    with pytest.raises(ValueError, match="c{64}.*d{64}"):
        DualPathRetriever.load(tmp_path, {"codebook_size": 32, "codebook_sha256": "d" * 64})


@pytest.fixture(scope="module")
def sentence_embedder():
    from retrieval.index.embed import SentenceEmbedder

    return SentenceEmbedder()


def test_real_embedder_feeds_path_a(sentence_embedder) -> None:
    retriever = DualPathRetriever(sentence_embedder.dim, {"codebook_size": 32, "codebook_sha256": "e" * 64})
    retriever.add(
        [f"f{i}" for i in range(len(FACTS))],
        FACTS,
        sentence_embedder.encode(FACTS),
        [{i} for i in range(len(FACTS))],
        [{"session_id": "s1", "turn_ids": [f"D1:{i}"]} for i in range(len(FACTS))],
    )
    query = sentence_embedder.encode(["Which class did Melanie enrol in?"])[0]
    hits = search(retriever, Query("Which class did Melanie enrol in?", query), (None, True), k_dense=1)
    assert [hit.id for hit in hits] == ["f7"] and hits[0].turns == ("D1:7",)
