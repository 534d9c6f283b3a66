"""The offline, deterministic extractor: one AMU per informative turn."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence, Set

from retrieval.extract.base import Extraction, ReferenceContext, make_amu, session_time
from retrieval.extract.dates import MONTHS, WEEKDAYS, dated_absolutes, resolve_dates
from retrieval.extract.pronouns import mentions, resolve_pronouns
from retrieval.index.stopwords import STOPWORDS
from retrieval.llm_usage import LLMUsage
from retrieval.memory.records import AMU, Segment, Turn
from retrieval.memory.scripts import MARKS, UNSPACED, composed

# Greetings, thanks and acknowledgements: a turn made only of these (plus names) carries no fact.
_FILLERS = frozenset("""
hi hey hello hiya yo bye goodbye thanks thank ok okay yeah yes yep yup no nope sure cool wow great awesome \
nice
lol haha oh ah hmm good glad see talk soon later take care cheers congrats congratulations amazing totally
definitely right agreed same much really well welcome pleasure night morning evening day anytime again
absolutely exactly true love lovely sounds sound fun happy hear gonna keep going luck best wishes
""".split())
_NOT_NAMES = STOPWORDS | _FILLERS | frozenset(MONTHS) | frozenset(WEEKDAYS)
# Frequent verbs, adverbs and time words that say nothing about the topic of a turn: never topic tags.
_GENERIC = frozenset("""
also always anything back come comes coming could does done doing ever even every everything feel feeling \
feels
felt find found gets getting give gives going gone gonna gotta know knew kind kinda last later lately like \
made
make makes making many maybe mean means might much need never next nothing often pretty quite recently said
says seem seems something sometimes soon still stuff sure tell tells thing things think thinking thought time
times told took tried trying used want wanted wants went whole will without yeah years lots little
take takes taking since ago week weeks weekend month months year today tonight tomorrow yesterday days night
""".split())
_VALID_FROM, _VALID_TO = frozenset(("since", "from", "after")), frozenset(("until", "till", "by", "before"))
TAGS_PER_RECORD = 5
_WORD = re.compile(rf"[^\W\d_](?:[^\W\d_]|[{MARKS}]|['’])*")
"""A word: letters of any script with their combining marks (and inner apostrophes), so "café",
"гитару" and "किताब" are words."""
_POSSESSIVE = ("'s", "’s")
"""The endings of a possessive, dropped from a word (and from a name's last word)."""
_UPPER = "[" + "".join(re.escape(chr(code)) for code in range(0x530) if chr(code).isupper()) + "]"
"""Capital letters of the Latin, Greek and Cyrillic scripts ("Émilie", "Łódź", "Олег")."""
_PROPER = re.compile(rf"\b{_UPPER}[\w'’&\-]*(?:\s+{_UPPER}[\w'’&\-]*)*")
UNSPACED_LETTERS = 4
"""How many such letters make a turn informative (its words cannot be counted)."""

_PREFERENCE = re.compile(r"\b(love|loves|like|likes|enjoy|enjoys|prefer|prefers|favou?rite|hate|hates|"
                         r"fan of|passionate about|dislike|dislikes)\b", re.IGNORECASE)
_CONSTRAINT = re.compile(r"\b(can['’]?t|cannot|must|have to|has to|need to|needs to|allergic|not allowed|"
                         r"unable)\b", re.IGNORECASE)
_PROCEDURE = re.compile(r"\b(step by step|steps?|recipe|how to|instructions|tutorial)\b", re.IGNORECASE)
_PAST_EVENT = re.compile(r"\b(went|visited|attended|joined|started|finished|bought|moved|met|won|lost|"
                         r"celebrated|graduated|adopted|painted|signed|received|traveled|travelled|married|ran|"
                         r"took|built|launched|got)\b", re.IGNORECASE)


def content_words(text: str, names: Set[str]) -> list[str]:
    """Lower-cased words that are neither stopwords, fillers, month or day names nor ``names``, a
    possessive 's dropped and apostrophes stripped from both ends. Runs for every item a search
    selects among (its signature), so plain string methods, not a regex per word."""
    kept = []
    for word in _WORD.findall(text):
        word = word.lower()
        if word.endswith(_POSSESSIVE):
            word = word[:-2]
        word = word.strip("'’")
        if len(word) > 1 and word not in _NOT_NAMES and word not in names:
            kept.append(word)
    return kept


def composed_turn(turn: Turn) -> Turn:
    """``turn`` with its speaker, text and caption composed (:func:`retrieval.memory.scripts.composed`):
    decomposed, "même" would hold the pronoun "me" and "Ångström" be no name."""
    speaker, text = composed(turn.speaker), composed(turn.text)
    caption = turn.image_caption and composed(turn.image_caption)
    if (speaker, text, caption) == (turn.speaker, turn.text, turn.image_caption):
        return turn
    return dataclasses.replace(turn, speaker=speaker, text=text, image_caption=caption)


def is_informative(turn: Turn, participants: Sequence[str]) -> bool:
    """A turn yields an AMU unless it is pure small talk: no image and fewer than two content words
    (words that are not stopwords, greeting/thanks/acknowledgement fillers or participant names),
    and fewer than :data:`UNSPACED_LETTERS` letters of a script without spaces between words."""
    if turn.image_caption or len(UNSPACED.findall(turn.text)) >= UNSPACED_LETTERS:
        return True
    names = {name.lower() for name in participants} | {turn.speaker.lower()}
    return len(content_words(turn.text, names)) >= 2


def find_entities(text: str, participants: Sequence[str]) -> list[str]:
    """Participants mentioned, then capitalised word runs. Leading stopwords, fillers and month or
    day names are dropped, and so is a sentence's first word unless it is an acronym or a
    participant (it is capitalised by position, not because it is a name); possessive 's is
    stripped. Linear in the text's length (each match looks back only over the whitespace
    before it). A participant is looked for as a whole word only when the text holds it at all
    (a memory may have hundreds of speakers and a question names few)."""
    found = [name for name in participants if mentions(name, text)]
    seen = set(found)
    for match in _PROPER.finditer(text):
        words = match[0].split()
        before = match.start() - 1
        while before >= 0 and text[before].isspace():
            before -= 1
        at_sentence_start = before < 0 or text[before] in ".!?:[]"
        if at_sentence_start and not (words[0].isupper()
                                      and len(words[0]) > 1) and words[0] not in participants:
            words = words[1:]
        while words and words[0].lower().strip("'’") in _NOT_NAMES:
            words = words[1:]
        name = " ".join(words)
        if name.endswith(_POSSESSIVE):
            name = name[:-2]
        if name and name not in seen and name.lower() not in _NOT_NAMES:
            found.append(name)
            seen.add(name)
    return found


_CAPTION_OPENING = re.compile(r"^\s*(?:there is\s+)?(?:a|an)\s+(?:close up\s+)?"
                              r"(?:photo(?:graph|graphy)?|picture|image)\s+of\s+", re.IGNORECASE)
"""How an image captioner opens a caption ("a photo of a dog"): what the image shows follows."""


def topic_tags(text: str, names: set[str], entities: Sequence[str]) -> list[str]:
    """The first :data:`TAGS_PER_RECORD` distinct content words of at least four letters that are
    neither generic verbs or adverbs nor words of the record's entities (those have entity nodes)."""
    entity_words = {word.lower() for entity in entities for word in _WORD.findall(entity)}
    words = (w for w in content_words(text, names)
             if len(w) >= 4 and w not in _GENERIC and w not in entity_words)
    return list(dict.fromkeys(words))[:TAGS_PER_RECORD]


def temporal_scope(resolved: Sequence[tuple[str, str | None]]) -> dict[str, str | None]:
    """``t_ref``, ``valid_from`` and ``valid_to`` from (ISO value, preposition) pairs in text
    order: a value after "since"/"from"/"after" opens the validity interval, one after
    "until"/"till"/"by"/"before" closes it, and the first other value is the event time (None:
    the session day is used)."""
    scope: dict[str, str | None] = {"t_ref": None, "valid_from": None, "valid_to": None}
    for value, preposition in resolved:
        field = ("valid_from" if preposition in _VALID_FROM else "valid_to" if preposition in _VALID_TO
                 else "t_ref")
        scope[field] = scope[field] or value
    return scope


def _memory_type(text: str, timestamps: Sequence[str]) -> str:
    """Keyword heuristic: a resolved date makes an event; then preference, constraint and
    procedure cues; then past-tense event verbs; otherwise a fact."""
    if timestamps:
        return "event"
    for pattern, kind in ((_PREFERENCE, "preference"), (_CONSTRAINT, "constraint"), (_PROCEDURE, "procedure"),
                          (_PAST_EVENT, "event")):
        if pattern.search(text):
            return kind
    return "fact"


def _folded(text: str) -> str:
    """``text`` case-folded, and its dotless ı and dotted İ read as i, as ``re.IGNORECASE`` reads
    them: a name found by a case-insensitive pattern is found in the folded text too."""
    return text.casefold().replace("\u0131", "i").replace("i\u0307", "i")


def _addressee(turn: Turn, turns: Sequence[Turn], participants: Sequence[str]) -> str | None:
    """Who "you" is: the other participant of a two-party conversation; otherwise the one the turn
    calls by name ("Carol, you ...", "Thanks, Carol!"), else the nearest other speaker in the
    segment, preferring the previous turn."""
    others = [name for name in participants if name != turn.speaker]
    if len(others) == 1:
        return others[0]
    # only the names the text holds are looked for: a pattern compiled for every participant of
    # every turn took seconds a turn once a user's participants outnumbered re's cache of patterns
    folded = _folded(turn.text)
    called = [name for name in others if _folded(name) in folded and re.search(
        rf"(?:^|[,!?.]\s*|\b(?:hey|hi|hello|thanks|thank you)\s+){re.escape(name)}\s*[,!?]", turn.text, re.I)]
    if len(called) == 1:
        return called[0]
    index = turns.index(turn)
    for candidate in [*reversed(turns[:index]), *turns[index + 1:]]:
        if candidate.speaker != turn.speaker:
            return candidate.speaker
    return None


class RuleExtractor:
    """Offline, deterministic extraction: one AMU per informative turn (:func:`is_informative`).

    The fact text is the turn (in composed Unicode, :func:`composed_turn`) with relative dates resolved
    against the session time (:func:`resolve_relative_dates`) and pronouns replaced by names
    (:func:`resolve_pronouns`); a shared image is folded in as ``[<speaker> shares an image:
    <caption>]``, and when the speaker's name does not occur in the result it is prefixed
    (``"Melanie: ..."``) so that the fact says who stated it. Deterministic metadata: entities are
    the participants named and the capitalised word runs (:func:`find_entities`); topic tags come
    from :func:`topic_tags`; timestamps are the resolved relative dates and the absolute dates of
    the turn (:func:`retrieval.extract.dates.dated_absolutes`), and the temporal scope follows their
    prepositions (:func:`temporal_scope`; ``t_ref`` defaults to the session day); the memory type is
    a keyword heuristic. A relative date outside the years 1 to 9999 stays as written, with no
    timestamp, and is counted in ``Extraction.unresolved_dates``. No reference context is used (the
    state stays empty).
    """

    name = "rule"

    def __init__(self) -> None:
        self.usage = LLMUsage()

    def extract(self, segment: Segment, context: ReferenceContext) -> Extraction:
        turns = [composed_turn(turn) for turn in segment.turns]
        participants = tuple(dict.fromkeys(map(composed, context.participants or (t.speaker for t in turns))))
        names = {name.lower() for name in participants}
        amus: list[AMU] = []
        unresolved = 0
        for turn in turns:
            if not is_informative(turn, participants):
                continue
            text, resolved = resolve_dates(turn.text, turn.local_time or session_time(segment))
            dated = [(date.value, date.preposition) for date in resolved if date.value is not None]
            unresolved += len(resolved) - len(dated)
            dated += list(dated_absolutes(turn.text).items())
            timestamps = list(dict.fromkeys(value for value, _ in dated))
            text = resolve_pronouns(text, turn.speaker, _addressee(turn, turns, participants))
            if not mentions(turn.speaker, text):
                text = f"{turn.speaker}: {text}"
            tagged = text  # the words topics are read from: the turn's and its caption's, no wrapper
            if turn.image_caption:
                text = f"{text} [{turn.speaker} shares an image: {turn.image_caption}]"
                tagged = f"{tagged} {_CAPTION_OPENING.sub('', turn.image_caption)}"
            entities = find_entities(text, participants)
            amus.append(make_amu(segment, len(amus), text, _memory_type(turn.text, timestamps), [turn],
                                  timestamps=timestamps, entities=entities,
                                  tags=topic_tags(tagged, names, entities), **temporal_scope(dated)))
        return Extraction(amus, unresolved_dates=unresolved)
