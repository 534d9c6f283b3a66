"""Replays that are not replays: an idempotency key or a stored turn id given again with another
body is a conflict (a typed error in Python, 409 over HTTP, one ``error:`` line from the ingest
command), and nothing of it is stored; an identical replay stays a no-op."""

from __future__ import annotations

import json

import pytest

from retrieval import Memory, ingest
from retrieval.api.errors import Conflict
from tests.multi_route_fixtures import WordEmbedder, WordFingerprinter


def open_memory(path) -> Memory:
    return Memory.open(path, embedder=WordEmbedder(), fingerprinter=WordFingerprinter())


def turns(*texts: str, ids: bool = False) -> list[dict]:
    return [{"speaker": ("Ann", "Bob")[n % 2], "text": text, "time": "2023-05-08T10:00:00",
             **({"turn_id": f"t{n}"} if ids else {})} for n, text in enumerate(texts)]


def stored_texts(mem: Memory, user: str) -> list[tuple[str, str, str]]:
    return [(t.session_id, t.turn_id, t.text) for t in mem.store.turns(user)]


def test_an_identical_replay_of_a_key_adds_nothing_and_says_so(tmp_path):
    with open_memory(tmp_path) as mem:
        first = mem.add(turns("I adopted a cat.", "What is its name?"), user_id="u", session_id="s1",
                        idempotency_key="k1")
        again = mem.add(turns("I adopted a cat.", "What is its name?"), user_id="u", session_id="s1",
                        idempotency_key="k1")
        assert first.turn_ids == ("s1:1", "s1:2") and not first.replayed
        assert (again.turn_ids, again.duplicates, again.replayed) == ((), ("s1:1", "s1:2"), True)
        assert len(stored_texts(mem, "u")) == 2


@pytest.mark.parametrize(("body", "session"), [
    (turns("I adopted a dog.", "What is its name?"), "s1"),  # other text
    (turns("I adopted a cat."), "s1"),  # fewer turns
    (turns("I adopted a cat.", "What is its name?"), "s2"),  # another session
    ([{"speaker": "Cy", "text": "I adopted a cat.", "time": "2023-05-08T10:00:00"},
      {"speaker": "Bob", "text": "What is its name?", "time": "2023-05-08T10:00:00"}], "s1"),  # speaker
    (turns("I adopted a cat.", "What is its name?", ids=True), "s1"),  # other turn ids
])
def test_a_key_reused_with_another_body_is_a_conflict_and_stores_nothing(tmp_path, body, session):
    with open_memory(tmp_path) as mem:
        mem.add(turns("I adopted a cat.", "What is its name?"), user_id="u", session_id="s1",
                idempotency_key="k1")
        before = stored_texts(mem, "u")
        with pytest.raises(Conflict, match="idempotency_key 'k1'") as caught:
            mem.add(body, user_id="u", session_id=session, idempotency_key="k1")
        assert caught.value.field == "idempotency_key"
        assert stored_texts(mem, "u") == before
        # the same key is another user's own
        assert mem.add(body, user_id="v", session_id=session, idempotency_key="k1").turn_ids


def test_a_turn_id_names_one_turn(tmp_path):
    with open_memory(tmp_path) as mem:
        mem.add(turns("I adopted a cat.", "Nice!", ids=True), user_id="u", session_id="s1")
        same = mem.add(turns("I adopted a cat.", "Nice!", ids=True), user_id="u", session_id="s1")
        assert (same.turn_ids, same.duplicates, same.replayed) == ((), ("t0", "t1"), False)
        edited = turns("I adopted a cat.", "Lovely!", ids=True)
        with pytest.raises(Conflict, match=r"turns\[1\]: turn_id 't1' is stored with another text") as caught:
            mem.add(edited, user_id="u", session_id="s1")
        assert caught.value.field == "turns.1.turn_id"
        with pytest.raises(Conflict, match="another session"):
            mem.add(turns("I adopted a cat.", ids=True), user_id="u", session_id="s2")
        assert stored_texts(mem, "u") == [("s1", "t0", "I adopted a cat."), ("s1", "t1", "Nice!")]


def test_the_same_instant_at_another_utc_offset_is_another_time(tmp_path):
    """01:00+09:00 and 16:00+00:00 the day before are one instant but two local dates ("yesterday"
    is read from the speaker's): a turn id or key given again with the other is a conflict."""
    tokyo = [{"speaker": "Ann", "text": "I met Lena yesterday.", "time": "2023-05-08T01:00:00+09:00",
              "turn_id": "t0"}]
    with open_memory(tmp_path) as mem:
        mem.add(tokyo, user_id="u", session_id="s1", idempotency_key="k1")
        assert mem.add(tokyo, user_id="u", session_id="s1", idempotency_key="k1").replayed
        for time in ("2023-05-07T16:00:00+00:00", "2023-05-07T16:00:00"):
            moved = [{**tokyo[0], "time": time}]
            with pytest.raises(Conflict, match="stored with another time") as caught:
                mem.add(moved, user_id="u", session_id="s1")
            assert caught.value.field == "turns.0.turn_id"
            with pytest.raises(Conflict, match="idempotency_key 'k1'"):
                mem.add(moved, user_id="u", session_id="s1", idempotency_key="k1")
        assert [t.stored_time() for t in mem.store.turns("u")] == ["2023-05-08T01:00:00+09:00"]


def test_ingesting_an_edited_conversation_into_its_store_is_refused_naming_the_turn(tmp_path, monkeypatch,
                                                                                    capsys):
    monkeypatch.setattr(ingest, "SentenceEmbedder", lambda name: WordEmbedder())
    rows = [{"session_id": "s1", "session_time": "2023-05-08T13:56:00", "speaker": ("Ann", "Bob")[n % 2],
             "turn_id": f"D1:{n}", "text": f"Turn {n} about the garden and its tomatoes."} for n in range(6)]
    original, edited = tmp_path / "talk.jsonl", tmp_path / "edited" / "talk.jsonl"
    edited.parent.mkdir()
    original.write_text("".join(json.dumps(row) + "\n" for row in rows))
    rows[3]["text"] = "Turn 3 was edited: it is about roses now."
    edited.write_text("".join(json.dumps(row) + "\n" for row in rows))
    store = tmp_path / "store"
    arguments = ["--store", str(store), "--no-progress"]
    assert ingest.main(["--jsonl", str(original), *arguments]) == 0
    assert ingest.main(["--jsonl", str(original), *arguments]) == 0  # a rerun replays
    capsys.readouterr()
    assert ingest.main(["--jsonl", str(edited), *arguments]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "'D1:3'" in err, err
    with Memory.open(store, embedder=WordEmbedder(), read_only=True) as mem:
        assert mem.get("talk:turn:D1:3", user_id="talk").text.endswith("garden and its tomatoes.")


def test_a_key_reused_with_another_image_caption_is_a_conflict(tmp_path):
    """The caption is part of what the turn says: a replay that changes it would drop the new one."""
    shared = [{"speaker": "Ann", "text": "Look at this!", "time": "2023-05-08T10:00:00",
               "image_caption": "a red kayak on a lake"}]
    other = [{**shared[0], "image_caption": "a blue canoe"}]
    with open_memory(tmp_path) as mem:
        mem.add(shared, user_id="u", session_id="s1", idempotency_key="k1")
        with pytest.raises(Conflict, match="idempotency_key 'k1'"):
            mem.add(other, user_id="u", session_id="s1", idempotency_key="k1")
        assert [turn.image_caption for turn in mem.store.turns("u")] == ["a red kayak on a lake"]
