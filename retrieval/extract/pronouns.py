"""First- and second-person pronouns replaced by the speaker's and the addressee's names."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache, partial

_ADVERBS = ("really", "just", "also", "always", "still", "never", "actually", "totally", "definitely",
            "usually",
            "often", "sometimes", "truly", "absolutely", "already", "even", "only", "kinda", "honestly")
# Present-tense verbs conjugated after a resolved "I"/"you" ("I love" -> "Caroline loves"). A closed
# list, because guessing whether an arbitrary word is a present-tense verb would mangle past forms.
_VERBS = ("love", "like", "want", "need", "think", "feel", "know", "hope", "guess", "mean", "plan", "enjoy",
          "believe", "wish", "miss", "prefer", "hate", "remember", "agree", "appreciate", "understand", "see",
          "try", "go", "work", "live", "play", "paint", "run", "write", "cook", "use", "get", "make",
          "take", "find", "keep", "say", "look", "wonder", "care", "admire", "adore", "dream", "struggle",
          "volunteer", "teach", "study", "practice", "own", "collect", "dance", "sing", "swim", "watch")
_ADVERB_RUN = r"((?:(?:" + "|".join(_ADVERBS) + r")\s+)*)"
# The verb keeps its base form after an auxiliary ("can you see") or a causative/perception verb
# ("makes you feel"), where the pronoun is not the subject of a present-tense verb.
_BASE_FORM_TRIGGERS = ("do", "does", "did", "can", "could", "will", "would", "should", "might", "must",
                       "shall",
                       "may", "make", "makes", "made", "let", "lets", "help", "helps", "helped", "see", "saw",
                       "watch", "hear", "heard", "have", "had", "to", "n't", "n’t")
_NOT_AFTER_BASE_FORM = "".join(rf"(?<!{re.escape(word)} )" for word in _BASE_FORM_TRIGGERS)
_APOS = r"['’]"
_NUMBERED = ("War", "Type", "Part", "Phase", "Chapter", "Act", "Volume", "Level", "Stage", "Grade", "Class",
             "Season", "Book", "Episode", "Round", "Tier", "Section", "Article", "Title", "Category")
_NOT_A_NUMERAL = "".join(rf"(?<!\b{word} )" for word in _NUMBERED) + r"(?<!['’])"
"""Before "I": the words that take a Roman numeral ("World War I", "Type I diabetes"), and an
apostrophe, after which an "i" ends a word ("Hawai'i")."""
_PARTICIPLES = tuple("""
been gone done seen had made taken got gotten known written thought bought heard left told found given
eaten met felt kept lost won spent sent begun forgotten brought taught""".split())
_PARTICIPLE = r"(\w+[^e\W]ed|" + "|".join(_PARTICIPLES) + r")"
"""A past participle after "'d" ("I'd booked", "you'd seen"): "had", where a base form means "would"
("I'd need": "-eed" is a base form)."""
_NOUN_MINE = "".join(rf"(?<!\b{word} )" for word in ("a", "the", "gold", "coal", "salt", "diamond", "silver",
                                                       "copper", "land"))
"""Before "mine": the words that make it the noun ("a gold mine")."""
_MINE = rf"{_NOUN_MINE}(?:\b(?-i:mine|MINE)\b|(?:^|(?<=[.!?]\s))(?-i:Mine)\b)"
"""The pronoun "mine": in lower case or shouted anywhere, capitalised only where a sentence starts.
Inside a sentence a capitalised "Mine" is a name (a Turkish one: "Kızım Mine 15 Nisan'da doğdu")."""
_QUOTED = re.compile(r"(\"[^\"]*\"|“[^”]*”)")
"""Quoted speech: another voice's "I" and "you", left as written."""
_PLURAL_YOU = re.compile(r"\byou\s+(?:both|guys|folks)\b|\by['’]all\b"
                         r"|\byou\s+(?:two|three)\b(?=\s*(?:[^\w\s]|$)|\s+(?:are|were|have|had|should|can|could"
                         r"|will|would|must|look|did|do)\b)"
                         r"|\b(?:both|all|each|either|neither|any)\s+of\s+you\b", re.IGNORECASE)
"""A "you" of several people ("you both", "you guys", "all of you", "you two are"): no one
addressee's name. Not "you all", which is as often one person's ("rooting for you all the way"),
nor "you two" before a noun ("I owe you two coffees")."""
_CLAUSE_START = r"[,;:]\s*"
_INTERJECTION = r"\b(?:[Hh]ey|[Hh]i|[Ww]ow|[Yy]eah|[Tt]hanks|[Oo]h|[Aa]w)\s+"
"""Where a name is called rather than spoken of: after a clause's start within a sentence or an
interjection ("No doubt, Jon you", "Thanks Jon"), or, with a comma after it, at the start of the
text ("Jon, you ..."). Not after a sentence's end: "Great. Will you come?" asks, it calls no Will."""


def mentions(name: str, text: str) -> bool:
    """Whether ``text`` names ``name`` as a whole word: not inside a longer word, also when the
    name starts or ends with punctuation ("C.J.", where ``\\b`` would need a letter after it)."""
    return name in text and re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text) is not None


def _third_person(verb: str) -> str:
    lower = verb.lower()
    if lower == "go":
        return "goes"
    if re.search(r"[^aeiou]y$", lower):
        return verb[:-1] + "ies"
    if re.search(r"(s|sh|ch|x|z)$", lower):
        return verb + "es"
    return verb + "s"


def _reflexive(match: re.Match[str], name: _Name) -> str:
    """A reflexive whose antecedent is now the name ("I challenged myself" -> "Maria challenged
    themselves", not "... challenged Maria"): singular "themselves", as the extractor knows no
    one's gender. Without the name earlier in the text ("Myself, I ...") the name itself."""
    return "themselves" if name.mentioned_in(match.string[: match.start()]) else name


class _Name(str):
    """The stand-in the rules write for a person's name (a word of letters, spelt as no rule
    matches, so a later rule never rewrites a name written by an earlier one: a speaker called
    "You"), with the name it stands for (``real``)."""

    real: str

    @classmethod
    def standing_for(cls, real: str, text: str, role: str) -> _Name:
        number = 0
        while f"qq{role}{number}qq" in text.lower():
            number += 1
        name = cls(f"qq{role}{number}qq")
        name.real = real
        return name

    def mentioned_in(self, text: str) -> bool:
        """Whether ``text`` names the person: as written, or as the rules wrote them (capitalised
        or not)."""
        return any(mentions(name, text) for name in (self, self.capitalize(), self.real))

    def put_back(self, text: str) -> str:
        """``text`` with the name where the rules wrote the stand-in (capitalised where they
        capitalised it)."""
        return text.replace(self.capitalize(), self.real[:1].upper() + self.real[1:]).replace(self, self.real)


def _pronoun_rules(person: str) -> list[tuple[re.Pattern[str], Callable[[re.Match[str], _Name], str]]]:
    """Ordered (pattern, replacement) rules for first ("I") or second ("you") person."""
    subj = rf"{_NOT_A_NUMERAL}I" if person == "first" else r"you"
    be_past = "was" if person == "first" else "were"
    rules: list[tuple[str, Callable[[re.Match[str], _Name], str]]] = [
        (rf"\b{subj}{_APOS}m\b" if person == "first" else rf"\byou{_APOS}re\b", lambda m, n: f"{n} is"),
        (rf"\b{subj}\s+{'am' if person == 'first' else 'are'}\b", lambda m, n: f"{n} is"),
        (rf"\b{'am' if person == 'first' else 'are'}\s+{subj}\b", lambda m, n: f"is {n}"),
        (rf"\b{subj}{_APOS}ve\b", lambda m, n: f"{n} has"),
        (rf"\b{subj}{_APOS}d\s+{_ADVERB_RUN}{_PARTICIPLE}\b", lambda m, n: f"{n} had {m[1]}{m[2]}"),
        (rf"\b{subj}{_APOS}d\b", lambda m, n: f"{n} would"),
        (rf"\b{subj}{_APOS}ll\b", lambda m, n: f"{n} will"),
        (rf"\b{subj}\s+{be_past}\b", lambda m, n: f"{n} was"),
        (rf"\b{be_past}\s+{subj}\b", lambda m, n: f"was {n}"),
        (rf"{_NOT_AFTER_BASE_FORM}\b{subj}\s+{_ADVERB_RUN}(have|do)(n{_APOS}t)?\b",
         lambda m, n: f"{n} {m[1]}{'has' if m[2].lower() == 'have' else 'does'}{m[3] or ''}"),
        (rf"{_NOT_AFTER_BASE_FORM}\b(have|do)(n{_APOS}t)?\s+{subj}\b",
         lambda m, n: f"{'has' if m[1].lower() == 'have' else 'does'}{m[2] or ''} {n}"),
        (rf"{_NOT_AFTER_BASE_FORM}\b{subj}\s+{_ADVERB_RUN}({'|'.join(_VERBS)})\b",
         lambda m, n: f"{n} {m[1]}{_third_person(m[2])}"),
    ]
    if person == "first":
        rules += [
            (rf"\bmy\b|{_MINE}", lambda m, n: f"{n}'s"),
            (rf"{_NOT_A_NUMERAL}\b(?:I|me)\b(?!\.\w|-\d)", lambda m, n: n),  # not "i.e.", "I-95"
            (r"\bmyself\b", _reflexive),
        ]
    else:
        rules += [
            (r"\b(?:your|yours)\b", lambda m, n: f"{n}'s"),
            (r"\byou\b", lambda m, n: n),
            (r"\b(?:yourself|yourselves)\b", _reflexive),
        ]
    return [(re.compile(pattern, re.IGNORECASE), build) for pattern, build in rules]


_FIRST_PERSON = _pronoun_rules("first")
_SECOND_PERSON = _pronoun_rules("second")


def resolve_pronouns(text: str, speaker: str, addressee: str | None) -> str:
    """Replace first-person pronouns with the speaker's name and second-person ones with the
    addressee's (left alone when unknown), fixing agreement for be/have/do, contractions and
    common present-tense verbs: "I am" -> "Caroline is", "my" -> "Caroline's", "do you" ->
    "does Melanie". Reflexives after their antecedent become "themselves" ("letting you express
    yourself" -> "letting Melanie express themselves"), otherwise the name. Quoted speech is
    another voice's and stays as written; a Roman numeral ("World War I") and "i.e." are no "I". A
    text that speaks to several people ("you both", "all of you") keeps its "you"; the addressee's
    name called right before "you" is dropped ("Jon, you did it" -> "Jon did it")."""
    parts = _QUOTED.split(text)  # odd positions: the quotations
    addressee = addressee or None  # an empty name is no name: its pronouns stay as written
    if addressee is not None and any(_PLURAL_YOU.search(part) for part in parts[::2]):
        addressee = None  # the text speaks to several people
    if addressee is not None:  # a name called before "you(r)" ("Jon, you did it") would be written twice
        uncalled = _called(addressee)
        parts[::2] = [uncalled(part) for part in parts[::2]]
    names: list[_Name] = []
    for rules, real, role in ((_FIRST_PERSON, speaker or None, "speaker"),
                              (_SECOND_PERSON, addressee, "addressee")):
        if real is None:
            continue
        names.append(name := _Name.standing_for(real, text, role))
        for pattern, build in rules:
            parts[::2] = [pattern.sub(partial(_replace, build=build, name=name), part) for part in parts[::2]]
    resolved = "".join(parts)
    for name in names:
        resolved = name.put_back(resolved)
    return resolved


@lru_cache(maxsize=256)  # one pattern per addressee, not per turn
def _called(name: str) -> Callable[[str], str]:
    """``text`` without the addressee's ``name`` (as written: "Will" is a name, "will" no) where
    it is called right before "you" or "your": followed by a comma, or without one after a
    clause's start within a sentence or an interjection ("No doubt, Jon you've", "Thanks Jon you
    rock"), never opening a sentence without a comma ("Great. Will you come?"). What precedes the
    name is kept."""
    word, you = re.escape(name), r"(?=you(?:r|rs)?\b)"
    pattern = re.compile(rf"(^|[.!?]\s*|{_CLAUSE_START}|{_INTERJECTION}){word},\s+{you}"
                         rf"|({_CLAUSE_START}|{_INTERJECTION}){word}\s+{you}")
    return partial(pattern.sub, lambda match: match[1] if match[1] is not None else match[2])


def _replace(match: re.Match[str], *, build: Callable[[re.Match[str], _Name], str], name: _Name) -> str:
    return _keep_case(match[0], build(match, name))


def _keep_case(original: str, replacement: str) -> str:
    return replacement[0].upper() + replacement[1:] if original[:1].isupper() else replacement
