"""What an add or a read refuses in Python as over HTTP: a boolean count, a turn id twice in one add."""

from __future__ import annotations

import pytest

from retrieval import Memory
from retrieval.api.errors import InvalidInput
from tests.multi_route_fixtures import WordEmbedder, WordFingerprinter


@pytest.fixture(scope="module")
def mem(tmp_path_factory):
    with Memory.open(
        tmp_path_factory.mktemp("m") / "store", embedder=WordEmbedder(), fingerprinter=WordFingerprinter()
    ) as memory:
        memory.add(
            [
                {"speaker": "Ann", "text": "Ann grows tomatoes in her garden.", "turn_id": "t1"},
                {"speaker": "Bob", "text": "Bob keeps bees behind the shed.", "turn_id": "t2"},
            ],
            user_id="u",
            session_id="s1",
        )
        yield memory


@pytest.mark.parametrize(
    "call", [lambda m: m.search("bees", user_id="u", k=True), lambda m: m.list(user_id="u", limit=True)]
)
def test_a_boolean_count_is_refused_in_python_as_over_http(mem, call):
    """K and limit are whole numbers; True is an int in Python, and the HTTP schema refuses
    it (tests cover "k": true over HTTP), but without the bool check Python's search(k=True)
    runs with k=1: the two surfaces disagree."""
    with pytest.raises(InvalidInput) as caught:
        call(mem)
    assert caught.value.field in ("k", "limit")


def test_a_turn_id_given_twice_in_one_add_is_refused_naming_the_second(mem):
    """Two turns of one add with the same turn_id are refused, naming the second. Without the
    check the add goes through: the second turn is dropped as a "duplicate" of the first
    although its text differs (silent data loss)."""
    turns = [
        {"speaker": "Ann", "text": "I adopted a cat.", "turn_id": "dup"},
        {"speaker": "Bob", "text": "I sold my car.", "turn_id": "dup"},
    ]
    with pytest.raises(InvalidInput) as caught:
        mem.add(turns, user_id="u", session_id="s2")
    assert caught.value.field == "turns.1.turn_id"
