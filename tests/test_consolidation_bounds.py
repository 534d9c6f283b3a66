"""What consolidation's gates, clustering and fidelity check hold at their bounds (docs/design.md
§8): the time window inclusive and measured to a member's last statement, complete linkage,
zero vectors, the merge bound of 8, whole-word entities, the count lexicon."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

import pytest

from retrieval.consolidation.gates import split_by_window
from retrieval.consolidation.members import Member
from retrieval.memory.records import AMU, SourcePointer

WINDOW = timedelta(days=30)


def member(unit_id: str, first: datetime | None, last: datetime | None = None) -> Member:
    amu = AMU(
        unit_id,
        f"Ann likes pottery {unit_id}.",
        "fact",
        SourcePointer("c", "s1", (f"T{unit_id}",), ("Ann",), 0),
    )
    return Member(amu, first, last or first)


def test_statements_exactly_one_window_apart_share_a_sub_cluster():
    """Gate 3 keeps sub-clusters whose statements span *at most* the window."""
    parts = split_by_window([member("a", datetime(2023, 1, 1)), member("b", datetime(2023, 1, 31))], WINDOW)
    assert [[m.id for m in part] for part in parts] == [["a", "b"]]


def test_the_window_is_measured_to_a_members_last_statement():
    """A member restated later (first statement early, its own last statement late) spans to
    its last statement; measuring from its first lets a merge cover two months under a 30-day
    window."""
    early = member("a", datetime(2023, 1, 1))
    restated = member("b", datetime(2023, 1, 2), datetime(2023, 3, 1))
    parts = split_by_window([early, restated], WINDOW)
    assert [[m.id for m in part] for part in parts] == [["a"], ["b"]]


def _amu(unit_id: str, text: str, entities=(), timestamps=()) -> AMU:
    return AMU(
        unit_id,
        text,
        "fact",
        SourcePointer("c", "s1", (f"T{unit_id}",), ("Ann",), 0),
        entities=tuple(entities),
        timestamps=tuple(timestamps),
    )


def test_clusters_use_complete_linkage_and_do_not_chain():
    """Complete linkage puts two rows in one cluster only when every pair is within the
    threshold. a~b and b~c but a far from c: single linkage chains all three into one merge."""
    import numpy as np

    from retrieval.consolidation.clustering import hac_clusters

    angle = np.radians([0.0, 35.0, 70.0])
    vectors = np.stack(
        [np.cos(angle), np.sin(angle)], axis=1
    )  # neighbours 1 - cos 35° = 0.18 apart, ends 0.66
    clusters = hac_clusters(vectors, threshold=0.25)
    assert all(len(rows) == 2 for rows in clusters) and clusters


def test_a_zero_vector_is_at_distance_one_from_all():
    """A zero embedding is at cosine distance 1 (documented); dividing by its zero norm gives
    NaN distances and scipy's linkage raises on them."""
    import numpy as np

    from retrieval.consolidation.clustering import cosine_distances, hac_clusters

    vectors = np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 0.01]])
    assert cosine_distances(vectors)[:2].tolist() == [1.0, 1.0]
    assert hac_clusters(vectors, threshold=0.1) == [[1, 2]]


def test_nine_members_are_over_the_merge_bound():
    """A merge absorbs at most 8 AMUs (docs/design.md §8.2); the bound is stated here, not
    read from the module."""
    from retrieval.consolidation.fidelity import merge_problems

    members = [_amu(f"a{i}", "Ann likes pottery.") for i in range(9)]
    merged = _amu("m", "Ann likes pottery.")
    assert merge_problems(members, merged)[0].startswith("9 members, over the bound of 8")
    assert merge_problems(members[:8], merged) == []


def test_an_entity_is_kept_only_as_a_whole_word():
    """ "Al" is not kept by a merged text that says "Alice": the entity test is a whole-word
    match; a substring match lets a merge silently drop a name."""
    from retrieval.consolidation.fidelity import lost_content

    member_ = _amu("a", "Al went hiking with Ben.", entities=("Al", "Ben"))
    merged = _amu("m", "Alice went hiking with Ben.")
    assert lost_content(member_, merged) == ["entity 'Al'"]


def test_an_entity_not_written_in_the_members_text_need_not_be_kept():
    """Only the entities a member states in its text must survive a merge; requiring every
    attached entity refuses merges that lose nothing stated."""
    from retrieval.consolidation.fidelity import lost_content

    member_ = _amu("a", "Ann went to the support group.", entities=("Ann", "LGBTQ"))
    merged = _amu("m", "Ann went to the support group again.")
    assert lost_content(member_, merged) == []


def test_number_of_is_a_counting_phrase():
    """ "number of" is in the documented count lexicon; dropping it lets a fact like this one
    (no digit, no number word) be consolidated."""
    from retrieval.consolidation.gates import is_count_sensitive

    assert is_count_sensitive("Ann was surprised by the number of guests at the party.")


def test_a_merge_that_states_a_name_or_number_no_member_states_is_refused():
    """An operator that invents a person or an amount would make it an active fact sourced to the
    members' turns; a rephrasing that names only what they name (in any case, a sentence's first
    word aside) and the engine's time prefix pass."""
    from retrieval.consolidation.fidelity import added_content, merge_problems

    members = [_amu("a", "Ann loves jasmine green tea, never with sugar, since 2021."),
               _amu("b", "Ann drinks green tea every morning with bob at 7:30.")]
    invented = _amu("m", "[2023-05-08 to 2023-05-10] Ann loves green tea; her husband Karl owes Bob "
                         "5000 dollars.")
    assert added_content(members, invented) == ["'Karl'", "'5000'"]
    assert merge_problems(members, invented) == ["'Karl', '5000' stated by no member"]
    rephrased = _amu("m", "[2023-05-08 to 2023-05-10] Since 2021, Ann drinks jasmine green tea at 7:30 "
                          "with Bob. She never takes sugar.")
    assert added_content(members, rephrased) == [] and merge_problems(members, rephrased) == []
    met = _amu("m", "Ann loves green tea. In May she met Bob.")
    assert added_content(members[:1], met) == ["'May'", "'Bob'"]
    dated = _amu("a", "Ann loves green tea.", timestamps=("2023-05-08",))
    assert added_content([dated], met) == ["'Bob'"]  # the month of the member's date
    september = _amu("a", "Ann loves green tea.", timestamps=("2023-09-13",))
    assert added_content([september], _amu("m", "As of 13 Sept. 2023, Ann loves green tea.")) == []


@pytest.mark.parametrize(("member", "merged"), [
    ("Melanie visited Caroline at the shelter.", "Melanie finds Caroline's story inspiring."),
    ("Ann has two kids and owes Bob 5000 dollars.", "Ann has 2 kids and owes Bob 5,000 dollars."),
    ("Ann meets Bob at 3pm.", "Ann meets Bob at 3 pm."),
    ("Ann saw Doctor Smith.", "Ann saw Dr. Smith."),
    ("Ann joined the LGBTQ support group.", "Ann joined the LGBTQ-friendly support group."),
    ("She joined the support group.", "Later Caroline joined the support group."),
    ("Caroline joined the group; she found it powerful.", "Caroline:\n- She joined the group.\n- His talk."),
    ("Ann took the first step at the meeting.", "Ann took the 1st step at 13:56 on 7 May '23."),
])
def test_a_rephrasing_of_what_the_members_state_adds_nothing(member: str, merged: str) -> None:
    from retrieval.consolidation.fidelity import added_content

    stated = _amu("a", member, entities=("Caroline",), timestamps=("2023-05-07T13:56:00",))
    assert added_content([stated], _amu("m", merged)) == []
    invented = _amu("m", merged + " So said Caroline (Karl too) on 2023-05-07.")
    assert added_content([stated], invented) == ["'Karl'"]


@pytest.mark.parametrize(("merged", "added"), [
    ("Ann loves green tea; Karl brews it.", ["'Karl'"]),
    ("Ann paid three hundred dollars for green tea.", ["'3'", "'100'"]),
    ("Ann loves green tea, a dozen cups a day.", ["'12'"]),
])
def test_an_invented_name_after_a_semicolon_or_an_amount_in_words_is_refused(merged: str,
                                                                             added: list[str]) -> None:
    from retrieval.consolidation.fidelity import added_content

    assert added_content([_amu("a", "Ann loves green tea.")], _amu("m", merged)) == added


def test_an_entity_or_event_time_no_member_has_is_refused():
    """The evidence indexes file a merged record under its entities and event times: an entity no
    member names, or a time that meets none of the members' times, is as invented as a name in its
    text; a coarser or overlapping time of theirs is kept."""
    from retrieval.consolidation.fidelity import added_content

    members = [_amu("a", "Ann ran the city marathon.", entities=("Ann",), timestamps=("2023-05-07",)),
               _amu("b", "Ann finished the marathon with Bob.", entities=("Ann",))]
    invented = _amu("m", "Ann ran the city marathon with Bob.", entities=("Ann", "Bob", "Paris", "marathon"),
                    timestamps=("2023-05", "1999-12-31", "2023-05-08/2023-06-01"))
    assert added_content(members, invented) == ["entity 'Paris'", "time '1999-12-31'",
                                                "time '2023-05-08/2023-06-01'"]
    kept = _amu("m", "Ann ran the city marathon with Bob.", entities=("Bob",),
                timestamps=("2023", "2023-W18", "2023-05-06/2023-05-07"))
    assert added_content(members, kept) == []
    valid = dataclasses.replace(members[1], valid_from="2023-01", valid_to="2023-12")
    said = _amu("m", "Ann ran the marathon with Bob, said Carla.", timestamps=("2023-06",))
    assert added_content([valid], said) == ["'Carla'"]  # inside the span it is valid over
    carla = dataclasses.replace(members[1].source, speakers=("Carla",))
    speaker = dataclasses.replace(members[1], source=carla)
    assert added_content([speaker], said) == ["time '2023-06'"]  # a speaker of a member is stated


def test_a_run_of_thousands_of_digits_is_compared_as_a_number_without_reading_it():
    """Past Python's 4,300-digit limit ``int`` refuses a digit run; the comparison needs none."""
    from retrieval.consolidation.fidelity import added_content

    wide = _amu("a", "Ann paid ５ dollars in ２０２３.")  # digits of another script: the same numbers
    assert added_content([wide], _amu("m", "In 2023 Ann paid 5 dollars.")) == []
    run = "9" * 5000
    paid = _amu("m", f"Ann paid {run} dollars.")
    assert added_content([_amu("a", "Ann paid 5 dollars.")], paid) == [repr(run)]
    assert added_content([_amu("a", f"Ann's code is 00{run}.")], _amu("m", f"Ann's code is {run}.")) == []
