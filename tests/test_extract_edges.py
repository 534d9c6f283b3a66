"""The rule extractor at its edges: "you" in a two-party talk, the first preposition of a repeated
date, the year 9999, three ideographs of small talk, a speaker called "You", decomposed accents."""

from __future__ import annotations

import unicodedata
from datetime import date

from retrieval.extract.base import ReferenceContext
from retrieval.extract.dates import dated_absolutes, resolve_dates
from retrieval.extract.rules import RuleExtractor, is_informative
from retrieval.memory.records import AMU, Exchange, Segment, Turn
from tests.test_amu_store import WHEN


def test_you_in_a_two_party_conversation_is_the_other_participant_even_alone_in_a_segment():
    """In a two-party conversation "you" is the other participant. Without that rule the
    addressee is looked for among the segment's other speakers; a segment of one speaker's turns
    has none, and "you" stays unresolved in the stored fact."""
    turns = [Turn("u", "s", "t1", "Ann", "I think you should try the new pottery studio downtown.", WHEN)]
    segment = Segment("u", "s", 0, (Exchange((turns[0],)),), "session_flush", 12)
    (amu,) = RuleExtractor().extract(segment, ReferenceContext(("Ann", "Ben"))).amus
    assert "Ben" in amu.text and " you " not in f" {amu.text} "


def test_a_repeated_absolute_date_keeps_its_first_preposition():
    """Dated_absolutes gives a repeated value the preposition of its first occurrence (what
    decides whether it opens a validity interval); the last one's turns "since" into None."""
    assert dated_absolutes("Since 7 May 2023 I run daily; I also ran on 7 May 2023.") == {
        "2023-05-07": "since"
    }


def test_this_year_resolves_in_the_year_9999():
    """Years 1 to 9999 are representable (the bound is inclusive); "this year" in a session of
    9999 resolves to "9999" rather than being left unresolved."""
    text, found = resolve_dates("We moved this year.", date(9999, 6, 1))
    assert [d.value for d in found] == ["9999"] and text == "We moved in 9999."


def test_three_ideographs_of_small_talk_are_not_informative():
    """A turn in a script without spaces is informative from UNSPACED_LETTERS = 4 letters on;
    a three-letter thank-you ("谢谢你") stays small talk and yields no record."""
    turn = Turn("u", "s", "t1", "Ann", "谢谢你", WHEN)
    assert not is_informative(turn, ("Ann", "Ben"))
    assert is_informative(Turn("u", "s", "t2", "Ann", "我喜欢猫", WHEN), ("Ann", "Ben"))


def extracted(turns: list[Turn], participants: tuple[str, ...]) -> list[AMU]:
    segment = Segment("u", "s", 0, tuple(Exchange((turn,)) for turn in turns), "session_flush", 40)
    return RuleExtractor().extract(segment, ReferenceContext(participants)).amus


def test_a_speaker_called_you_keeps_their_own_facts():
    """Chat exports call the user "You": the speaker's name written for "I" is no "you" for the
    addressee's rules to rewrite (it was, and the user's cat and city became the assistant's)."""
    turns = [Turn("u", "s", "t1", "You", "I love my cat Pickle and I live in Lyon.", WHEN),
             Turn("u", "s", "t2", "Assistant", "Nice, I hope your cat likes Lyon.", WHEN)]
    assert [amu.text for amu in extracted(turns, ("You", "Assistant"))] == [
        "You loves You's cat Pickle and You lives in Lyon.", "Nice, Assistant hopes You's cat likes Lyon."]


def test_decomposed_accents_are_letters_not_word_ends():
    """Written decomposed (NFD), "système" ends in "me" after a combining accent, which a word
    boundary took for the pronoun (it became "systèAnn"); the record is the composed text, its
    names found."""
    text = unicodedata.normalize("NFD", "Le système de crème est même meilleur, dit Ångström. Tôi mới đến.")
    (record,) = extracted([Turn("u", "s", "t1", "Ann", text, WHEN)], ("Ann", "Ben"))
    assert record.text == "Ann: " + unicodedata.normalize("NFC", text) and "Ångström" in record.entities
    nfd = {name: unicodedata.normalize("NFD", name) for name in ("José", "Zoë")}  # names decomposed too
    said = [Turn("u", "s", "t1", nfd["José"], nfd["Zoë"] + ", I think you paint so well.", WHEN)]
    (record,) = extracted(said, (nfd["José"], nfd["Zoë"]))
    assert (record.text, record.entities) == ("Zoë, José thinks Zoë paints so well.", ("José", "Zoë"))
