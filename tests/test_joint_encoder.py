"""One encoder forward per text: the joint encoder against the embedder and the fingerprinter run
separately (the committed MiniLM fingerprinter), pairs that must not be joined, and the memory
opened with either form on the same store."""

from __future__ import annotations

import copy
import dataclasses
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from isq.fingerprint import FINGERPRINT_BATCH, Fingerprinter
from isq.identity import normalise_identity
from isq.model import ISQModel
from retrieval import Memory
from retrieval.api.errors import StoreUnavailable
from retrieval.api.loading import load_models
from retrieval.consolidation.worker import SerializedFingerprinter
from retrieval.index.embed import SentenceEmbedder
from retrieval.index.joint import JointEncoder, JointModels, why_not_joined
from retrieval.index.model_thread import on_model_thread
from retrieval.memory.cache import CachedFingerprinter, model_identity
from retrieval.memory.store import AMUStore
from tests.conftest import tiny_config

CHECKPOINT = Path(__file__).resolve().parents[1] / "checkpoints" / "isq_minilm_dailydialog_cpu"

LONG = " ".join(f"word{i}" for i in range(400))
"""Far beyond the 256-token truncation."""

TEXTS = [
    "What pet does Maria have?", "Hi", "", "   spaced   out   ", "ok.",
    "Café, naïve façade — 東京で猫を飼っています 🐱🐶 ½ ﬁ",
    "\u2028line\u2029separators\x0b\x0cand controls\x1f",
    "I adopted a cat called Pickle last spring, and she sleeps on the piano all afternoon.",
    LONG,
    "x" * 3000,  # one word too long for the vocabulary: [UNK]
    "What pet does Maria have?",  # a duplicate
]


@pytest.fixture(scope="module")
def embedder() -> SentenceEmbedder:
    return SentenceEmbedder()


@pytest.fixture(scope="module")
def fingerprinter() -> Fingerprinter:
    return Fingerprinter.from_pretrained(CHECKPOINT)


@pytest.fixture(scope="module")
def joint(embedder, fingerprinter) -> JointEncoder:
    return JointEncoder(embedder, fingerprinter)


def many_texts(n: int) -> list[str]:
    rng = np.random.default_rng(7)
    words = "the cat sat on a warm mat while Maria read about Lisbon trains and blue tomatoes".split()
    return [" ".join(rng.choice(words, int(rng.integers(1, 60)))) for _ in range(n)] + TEXTS


def test_one_forward_gives_the_embedders_vectors_and_the_fingerprinters_codes_bit_for_bit(
        joint, embedder, fingerprinter):
    before = joint.forwards
    encoded = joint.compute(TEXTS)
    assert joint.forwards == before + 1
    assert np.array_equal(encoded.vectors, embedder.encode(TEXTS))
    assert encoded.prints == fingerprinter.fingerprint(TEXTS)
    assert len(encoded.prints[TEXTS.index(LONG)].token_codes) == fingerprinter.config.max_length  # truncated


def test_more_texts_than_one_batch_keep_the_codes_exactly_and_the_vectors_to_float_rounding(
        joint, embedder, fingerprinter):
    texts = many_texts(3 * FINGERPRINT_BATCH)
    encoded = joint.compute(texts)
    assert encoded.prints == fingerprinter.fingerprint(texts)
    # other batches than the embedder's own, so other padding: measured ≤ 2e-7
    assert np.allclose(encoded.vectors, embedder.encode(texts), rtol=0, atol=1e-6)


def test_a_text_beside_texts_padded_to_its_length_keeps_its_codes_and_its_floats_to_rounding(joint):
    """Bit for bit on some CPUs, not on every one: the matrix kernels of a batch of two may sum in
    another order than those of one text (seen on an AVX-512 Xeon: 1.4e-7 apart)."""
    alone = joint.compute(["the cat sat on the mat"])
    beside = joint.compute(["the cat sat on the mat", "the dog ran to the car"])
    assert joint.token_counts(["the cat sat on the mat"]) == joint.token_counts(["the dog ran to the car"])
    assert np.allclose(beside.part(0, 1).vectors, alone.vectors, rtol=0, atol=1e-6)
    assert beside.part(0, 1).prints == alone.prints


def test_token_counts_of_more_texts_than_one_batch_are_each_texts_own(joint, monkeypatch):
    """Counted a batch at a time (a backlog of long turns tokenised at once took gigabytes), each
    count is the text's alone, cut at the model's length."""
    texts = many_texts(3 * FINGERPRINT_BATCH) + ["tomato " * 600]
    tokenizer, batches = joint.fingerprinter.tokenizer, []

    def counted(batch, **options):
        batches.append(len(batch))
        return tokenizer(batch, **options)

    monkeypatch.setattr(joint.fingerprinter, "tokenizer", counted)
    counts = joint.token_counts(texts)
    assert max(batches) == FINGERPRINT_BATCH and sum(batches) == len(texts)
    assert counts == [joint.token_counts([text])[0] for text in texts]
    assert counts[-1] == joint.fingerprinter.config.max_length


def test_texts_of_other_lengths_in_one_forward_differ_from_alone_in_float_rounding_only(joint):
    """What the model queue does with concurrent searches (retrieval.index.query_batcher): each
    padded to the longest. Measured over 288 dev questions and 288 dev turns in forwards of 16:
    largest difference 1.9e-7, no code changed (0 of 15,506 token codes)."""
    texts = many_texts(12)[:12] + TEXTS[:8]
    joined = joint.compute(texts)
    assert len(set(joint.token_counts(texts))) > 5
    for i, text in enumerate(texts):
        alone = joint.compute([text])
        assert np.allclose(joined.vectors[i], alone.vectors[0], rtol=0, atol=1e-6)
        assert joined.prints[i] == alone.prints[0]


def test_encode_then_fingerprint_of_the_same_texts_costs_one_forward(joint, embedder, fingerprinter):
    models = JointModels(joint.compute, embedder, fingerprinter)
    before = joint.forwards
    vectors = models.embedder.encode(TEXTS[:5])
    prints = models.fingerprinter.fingerprint(TEXTS[:5])
    assert joint.forwards == before + 1
    assert np.array_equal(vectors, embedder.encode(TEXTS[:5]))
    assert prints == fingerprinter.fingerprint(TEXTS[:5])
    models.fingerprinter.fingerprint(TEXTS[:5])  # what was kept serves one call only
    assert joint.forwards == before + 2
    # and the other way round (ingestion): the records' codes, then their vectors beside other texts
    records, others = TEXTS[5:8], TEXTS[8:10]
    models.fingerprinter.fingerprint(records)
    vectors = models.embedder.encode(others + records)
    assert joint.forwards == before + 4
    assert np.allclose(vectors, embedder.encode(others + records), rtol=0, atol=1e-6)


def test_the_halves_carry_the_separate_models_identities(joint, embedder, fingerprinter):
    models = JointModels(joint.compute, embedder, fingerprinter)
    assert model_identity(models.embedder) == model_identity(embedder)
    assert model_identity(models.fingerprinter) == model_identity(fingerprinter)
    assert models.embedder.dim == embedder.dim
    assert models.fingerprinter.codebook_size == fingerprinter.codebook_size
    with pytest.raises(TypeError):
        models.fingerprinter.fingerprint("one string")


def test_a_batch_the_two_models_would_tokenize_differently_runs_both(joint, embedder, fingerprinter):
    long_text = LONG
    embedder._model.max_seq_length = 128  # the embedder now truncates sooner than the fingerprinter
    try:
        before = joint.forwards
        encoded = joint.compute(["short one", long_text])
        assert joint.forwards == before + 2  # not shared
        assert np.array_equal(encoded.vectors, embedder.encode(["short one", long_text]))
        assert encoded.prints == fingerprinter.fingerprint(["short one", long_text])
        joint.compute(["short one"])
        assert joint.forwards == before + 3  # a batch both see alike is still shared
    finally:
        embedder._model.max_seq_length = 256


def test_a_fingerprinter_over_another_encoder_is_not_joined(embedder, fingerprinter, tmp_path):
    other = ISQModel(tiny_config()).fingerprinter()
    thawed = copy.deepcopy(fingerprinter)
    thawed.semantic_encoder.frozen = False
    for pair in ((embedder, other), (embedder, thawed), (embedder, SerializedFingerprinter(fingerprinter))):
        assert why_not_joined(*pair) is not None
    assert why_not_joined(embedder, fingerprinter) is None
    with pytest.raises(ValueError, match="cannot join"):
        JointEncoder(embedder, other)
    models = load_models(tmp_path, embedder=embedder, fingerprinter=other)
    assert models.encoder is None and models.embedder is embedder and models.fingerprinter is other


def team_threads_left_by(function) -> set[str]:
    """The native threads, other than Python's, that ``function`` called on a fresh thread left
    running while that thread lives: the workers of an OpenMP team of the thread's own, which
    slow every forward of the model thread's team while they stay (retrieval.index.model_thread)."""
    on_model_thread(lambda: torch.ones(1000, 1000).sum())  # the model thread's team is up
    left: set[str] = set()

    def call() -> None:
        before = set(os.listdir("/proc/self/task"))
        function()
        python = {str(thread.native_id) for thread in threading.enumerate()}
        left.update(set(os.listdir("/proc/self/task")) - before - python)

    caller = threading.Thread(target=call)
    caller.start()
    caller.join()
    return left


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="Linux's /proc lists a process's threads")
def test_deciding_whether_to_join_gives_the_calling_thread_no_team_of_its_own(embedder, fingerprinter):
    """The decision loads the installed encoder and compares its weights with the fingerprinter's
    (torch operators): it runs them on the model thread, as the memory's loading does, so that a
    caller deciding, as the benchmarks' batch floor does, keeps the process at one team."""
    assert team_threads_left_by(lambda: torch.ones(1000, 1000).sum())  # what the check sees
    assert team_threads_left_by(lambda: why_not_joined(embedder, fingerprinter)) == set()


def chat(n: int, session: str = "s1") -> list[dict]:
    lines = ["I adopted a cat called Pickle.", "Pickle sleeps on the piano.", "We moved to Lisbon in May.",
             "My sister Ana plays the cello.", "The trains in Lisbon are blue.", "I bake bread on Sundays."]
    return [{"speaker": ("Maria", "Joe")[i % 2], "text": lines[i % len(lines)], "turn_id": f"{session}-{i}"}
            for i in range(n)]


def search(memory: Memory, query: str) -> list[tuple[str, float]]:
    return [(hit.id, pytest.approx(hit.score, abs=1e-5))
            for hit in memory.search(query, user_id="maria", k=5).hits]


def test_a_store_opens_with_either_form_and_finds_the_same(embedder, fingerprinter, tmp_path):
    separate = {"embedder": embedder, "fingerprinter": SerializedFingerprinter(fingerprinter)}
    with Memory.open(tmp_path / "two", **separate) as memory:
        assert memory.models.encoder is None
        memory.add(chat(12), user_id="maria", session_id="s1")
        memory.flush(user_id="maria", session_id="s1")
        found_two = search(memory, "What pet does Maria have?")
    with Memory.open(tmp_path / "two", embedder=embedder, fingerprinter=fingerprinter) as memory:
        batcher = memory.models.encoder
        assert batcher is not None
        assert search(memory, "What pet does Maria have?") == found_two
        before = (batcher.forwards, batcher.encoder.forwards)
        search(memory, "Where did they move?")
        assert (batcher.forwards, batcher.encoder.forwards) == (before[0] + 1, before[1] + 1)
        memory.add(chat(6, "s2"), user_id="maria", session_id="s2")
    assert not any(t.name == "query-batcher" for t in threading.enumerate())
    with Memory.open(tmp_path / "one", embedder=embedder, fingerprinter=fingerprinter) as memory:
        memory.add(chat(12), user_id="maria", session_id="s1")
        memory.flush(user_id="maria", session_id="s1")
        assert search(memory, "What pet does Maria have?") == found_two
    with Memory.open(tmp_path / "one", **separate) as memory:
        assert search(memory, "What pet does Maria have?") == found_two
    store = AMUStore(tmp_path / "one", read_only=True)
    try:
        assert store.meta("embedder") == model_identity(embedder)
        assert store.meta("fingerprinter") == model_identity(fingerprinter)
    finally:
        store.close()


def test_a_users_turns_embedded_by_its_search_are_stored_from_a_forward_of_its_own_texts(
        embedder, fingerprinter, tmp_path):
    """A search embeds its user's turns the ingestion worker has not embedded yet and the vectors
    are stored: queued among another user's queries (the model thread held, so all three queue),
    they run in a forward of their own and are stored bit for bit as that text alone gives them,
    whatever the others asked. (Order, not timing: each step waits for the queue's state.)"""
    with Memory.open(tmp_path, embedder=embedder, fingerprinter=fingerprinter) as memory:
        for other in ("bob", "cid"):  # two other users: one user's searches run one at a time
            memory.add(chat(4), user_id=other, session_id="s1")
            memory.flush(user_id=other, session_id="s1")
        batcher = memory.models.encoder
        assert batcher is not None
        forwards: list[list[str]] = []
        compute = batcher.encoder.compute
        batcher.encoder.compute = lambda texts: forwards.append(list(texts)) or compute(texts)
        entered, release = threading.Event(), threading.Event()
        holder = threading.Thread(target=on_model_thread, args=(lambda: entered.set() or release.wait(30),))
        holder.start()
        assert entered.wait(30)
        long_query = "Tell me everything about the cello, the bread, the piano and the trains in " * 3
        searches = [threading.Thread(target=memory.search, args=("Where is Pickle?",),
                                     kwargs={"user_id": "bob"})]
        searches[0].start()
        wait_for(lambda: batcher._running)  # bob's first query holds the next forward
        memory.add([{"speaker": "Ann", "text": "My tortoise Quill eats dandelions.", "turn_id": "t1"}],
                   user_id="ann", session_id="s1")
        searches.append(threading.Thread(target=memory.search, args=("Quill?",), kwargs={"user_id": "ann"}))
        searches[1].start()
        wait_for(lambda: any("Quill eats" in text for call in batcher._foreground for text in call.texts))
        searches.append(threading.Thread(target=memory.search, args=(long_query,), kwargs={"user_id": "cid"}))
        searches[2].start()
        wait_for(lambda: len(batcher._foreground) == 2)
        release.set()
        for thread in [holder, *searches]:
            thread.join(30)
        turn = "Ann: My tortoise Quill eats dandelions."
        # the search's forward, and the ingestion worker's if it ran before the vectors were stored
        assert {tuple(call) for call in forwards if turn in call} == {(turn,)}
        assert [call for call in forwards if long_query in call] == [[long_query]]
        alone = on_model_thread(lambda: compute([turn])).vectors
        stored = memory._embedder.for_user("ann").encode([turn])
        assert np.array_equal(stored, alone)


def wait_for(condition) -> None:
    for _ in range(3000):  # bounded: 30 s at most
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError("the condition never held")


def test_the_ingest_ratios_batch_floor_runs_the_one_forward_the_memory_runs(embedder, fingerprinter):
    """bench_memory's batch floor for the ingest ratio computes what the memory computes: one
    forward for vectors and codes where the models join, not each model's own."""
    from benchmarks.bench_memory import batch_floor

    floor, texts = batch_floor(embedder, fingerprinter), ["A first turn.", "A second turn, longer."]
    encoded = floor(texts)
    assert isinstance(floor.__self__, JointEncoder) and floor.__self__.forwards == 1  # type: ignore[attr-defined]
    assert encoded.vectors.shape == (2, embedder.dim) and len(encoded.prints) == 2


def test_a_fingerprinter_with_the_same_codebook_and_another_encoder_part_has_codes_of_its_own(
        tmp_path, embedder, fingerprinter):
    """The same codebook behind another maximum length gives a text other codes: its identity
    names its encoder part, so a store's cache holds its codes apart, a store bound to the first
    refuses it, and a store bound before identities named the encoder still opens with the first."""
    short = Fingerprinter(dataclasses.replace(fingerprinter.config, max_length=8), fingerprinter.tokenizer,
                          fingerprinter.semantic_encoder, fingerprinter.codebook)
    text = "We could meet at the old harbour café on Saturday morning, if the ferry is running."
    assert normalise_identity(short.identity) == normalise_identity(fingerprinter.identity)
    assert short.identity != fingerprinter.identity
    with AMUStore(tmp_path / "cache") as store:
        long_codes = CachedFingerprinter(fingerprinter, store, "u").fingerprint([text])[0].token_codes
        cached = CachedFingerprinter(short, store, "u")
        assert cached.fingerprint([text])[0].token_codes == short.fingerprint([text])[0].token_codes
        assert cached.computed == 1 and len(long_codes) > 8 == len(short.fingerprint([text])[0].token_codes)
    with Memory.open(tmp_path / "bound", embedder=embedder, fingerprinter=fingerprinter) as memory:
        memory.add([{"speaker": "Ann", "text": text}], user_id="u", session_id="s")  # built: bound
    with pytest.raises(StoreUnavailable, match="was built with fingerprinter"):
        Memory.open(tmp_path / "bound", embedder=embedder, fingerprinter=short)
    with AMUStore(tmp_path / "bound") as store:  # as written before identities named the encoder
        store.put_meta("fingerprinter", normalise_identity(fingerprinter.identity))
    with Memory.open(tmp_path / "bound", embedder=embedder, fingerprinter=fingerprinter) as memory:
        memory.add([{"speaker": "Ann", "text": text}] * 3, user_id="u", session_id="s")
        memory.flush(user_id="u", session_id="s")  # the segment's store bind, then consolidation's
        assert memory.consolidate(user_id="u", wait=True, timeout_s=120).state == "done"


def test_a_recorded_identity_that_is_not_one_binds_nothing_alike():
    from isq.identity import same_text_codes

    current = {"codebook_size": 64, "codebook_sha256": "a" * 64, "encoder_sha256": "b" * 64}
    assert not same_text_codes({"codebook_size": None, "codebook_sha256": "a" * 64}, current)
    assert not same_text_codes({"codebook_sha256": "a" * 64}, current)
    assert same_text_codes({"codebook_size": 64, "codebook_sha256": "a" * 64}, current)
    assert not same_text_codes({**current, "encoder_sha256": "c" * 64}, current)
