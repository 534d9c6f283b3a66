"""The store contract on both backends where a user would see a slip: a user's turns and speakers in
the order stored (not sorted by id or name), a record's source turns read from its own user when
another user has the same turn id, a backlog of one uncovered turn, a page of at most its limit, an
archive moving the user's version (other nodes' search states check it), a forgotten user's
idempotency keys gone, and a merge refused once one member is merged elsewhere."""

from __future__ import annotations

from retrieval.memory.records import AMU, SourcePointer, Turn
from tests.test_amu_store import WHEN, commit, make_amu


def _turn(user: str, turn_id: str, text: str, speaker: str = "Ann") -> Turn:
    return Turn(user, "s", turn_id, speaker, text, WHEN)


def test_a_users_turns_and_speakers_come_back_in_the_order_they_were_stored(backend):
    with backend.open() as store:
        store.append_turns("u", [_turn("u", "s:9", "nine", "Zed"), _turn("u", "s:10", "ten", "Amy"),
                                 _turn("u", "a", "last", "Zed")])
        assert [t.turn_id for t in store.turns("u")] == ["s:9", "s:10", "a"]
        assert store.speakers("u") == ("Zed", "Amy")


def test_a_records_source_turns_are_its_own_users_when_another_user_has_the_same_turn_id(backend):
    with backend.open() as store:
        for user, text in (("a", "Ann's words"), ("b", "Bob's secret"), ("c", "Cy's secret")):
            store.append_turns(user, [_turn(user, "s:1", text)])
        record = AMU(id="a:0:0", text="Ann said words.", memory_type="fact",
                     source=SourcePointer("a", "s", ("s:1",), ("Ann",), 0))
        assert [t.text for t in store.source_turns(record)] == ["Ann's words"]


def test_a_user_with_one_uncovered_turn_has_a_backlog(backend):
    with backend.open() as store:
        store.append_turns("u", [_turn("u", "t1", "only turn")])
        assert store.backlog_users() == ["u"]


def test_a_page_holds_at_most_its_limit(backend):
    with backend.open() as store:
        commit(store, 0, [make_amu(0, 0), make_amu(0, 1, "Melanie runs."), make_amu(0, 2, "Caroline swims.")])
        assert len(store.page("conv-x", limit=1)) == 1 and len(store.page("conv-x", limit=2)) == 2


def test_archiving_a_record_changes_its_users_version(backend):
    """Another node's search state is checked against user_version: an archive (consolidation) must
    move it, or that node keeps serving the archived record."""
    with backend.open() as store:
        commit(store, 0, [make_amu(0, 0), make_amu(0, 1, "Melanie runs.")])
        before = store.user_version("conv-x")
        store.archive(["conv-x:0:0"])
        assert store.user_version("conv-x") != before


def test_forgetting_a_user_forgets_its_idempotency_keys(backend):
    """After forget, an add replaying the key must store its turns again, not be taken as a replay."""
    with backend.open() as store:
        store.append_turns("u", [_turn("u", "t1", "my address is 5 Elm St")], key="k-1")
        store.append_turns("u", [_turn("u", "t2", "and my phone")], key="k-2")
        store.purge("u", everything=True)
        assert store.idempotent_turn_ids("u", "k-1") is None and store.idempotent_turn_ids("u", "k-2") is None


def test_forwarding_refuses_when_one_member_is_no_longer_active(backend):
    """Two nodes consolidating one user: a member another node merged already must stop this merge."""
    import dataclasses

    with backend.open() as store:
        commit(store, 0, [make_amu(0, 0), make_amu(0, 1, "Melanie runs."), make_amu(0, 2, "Caroline swims.")])
        first = dataclasses.replace(make_amu(0, 0), id="conv-x:m1")
        assert store.forward(["conv-x:0:0", "conv-x:0:1"], first, "MERGE")
        second = dataclasses.replace(make_amu(0, 0), id="conv-x:m2")
        assert not store.forward(["conv-x:0:1", "conv-x:0:2"], second, "MERGE")
        assert store.successor("conv-x:0:1") == "conv-x:m1" and not store.get("conv-x:0:2").archived


def test_a_users_speakers_up_to_a_turn_are_those_of_the_turns_stored_until_it(backend):
    """The extractor's participants for a segment: the speakers of the user's turns stored up to
    its last turn, in order of their first turn; another user's turn of the same id counts not."""
    with backend.open() as store:
        store.append_turns("v", [_turn("v", "t2", "elsewhere", "Eve")])
        store.append_turns("u", [_turn("u", "t1", "one", "Zed"), _turn("u", "t2", "two", "Amy"),
                                 _turn("u", "t3", "three", "Cat")])
        assert store.speakers("u", "t1") == ("Zed",)
        assert store.speakers("u", "t2") == ("Zed", "Amy")
        assert store.speakers("u") == store.speakers("u", "t3") == ("Zed", "Amy", "Cat")
