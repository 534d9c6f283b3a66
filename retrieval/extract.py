"""Segment-level memory encoding (LycheeMemory section 3.3 / C.2, MemCode key design 1).

One extraction call per finalized segment turns its turns into AMUs: self-contained facts with
pronouns and relative dates resolved, absolute times and source pointers. Two extractors share
the :class:`Extractor` interface:

* :class:`RuleExtractor`: offline and deterministic, one AMU per informative turn. For tests and
  machines without an LLM.
* :class:`LLMExtractor`: any OpenAI-compatible chat endpoint, with a bounded reference context
  from earlier segments (eq. 7; 1,200 + 2,400 characters, 12 recent records, Table 11), schema
  validation, retries, an on-disk response cache and token accounting. A segment whose retries
  are exhausted is kept as raw-turn AMUs, never dropped.

:class:`ChatClient` (retries, cache, token accounting) is the HTTP side of the LLM extractor and
is shared with the answer stage of the evaluation.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import re
import tempfile
import time
import urllib.request
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol, TypeVar

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from retrieval.amu import AMU, MEMORY_TYPES, AMUValidationError, SourcePointer, Turn, amu_id
from retrieval.segmenter import Segment

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# Shared types
# ---------------------------------------------------------------------------------------------


@dataclass
class Extraction:
    """The AMUs of one segment, the extractor's disambiguation state after it (eq. 5), and
    whether the segment fell back to raw-turn AMUs."""

    amus: list[AMU]
    state: str = ""
    fallback: bool = False


@dataclass
class LLMUsage:
    """Token accounting. ``prompt_tokens`` / ``completion_tokens`` sum the ``usage`` of every HTTP
    response (what the endpoint billed); ``cached_*`` sum the usage recorded with cache hits, so
    ``prompt_tokens + cached_prompt_tokens`` is the construction cost of the memory."""

    http_calls: int = 0
    cache_hits: int = 0
    retries: int = 0
    fallback_segments: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    cached_completion_tokens: int = 0


class ReferenceContext:
    """LycheeMemory's reference context rho (eq. 7): the latest disambiguation state (at most
    1,200 characters) and summaries of recent records of the same session (at most 12 records
    and 2,400 characters, newest kept). ``participants`` are the conversation's speakers."""

    def __init__(self, participants: Sequence[str], disambiguation_chars: int = 1200,
                 recent_chars: int = 2400, recent_records: int = 12) -> None:
        self.participants = tuple(participants)
        self.disambiguation_chars = disambiguation_chars
        self.recent_chars = recent_chars
        self.disambiguation = ""
        self.recent: deque[str] = deque(maxlen=recent_records)
        self.session_id: str | None = None

    def enter(self, session_id: str) -> None:
        """Call before each segment: recent records only carry over within a session."""
        if session_id != self.session_id:
            self.recent.clear()
            self.session_id = session_id

    def record(self, state: str, texts: Sequence[str]) -> None:
        """Fold in a finished segment: its state replaces the old one, its records join the recent."""
        self.disambiguation = state[: self.disambiguation_chars]
        self.recent.extend(texts)

    def render(self) -> str:
        """The bounded context text ('' when there is nothing yet)."""
        kept: list[str] = []
        used = 0
        for text in reversed(self.recent):
            line = f"- {text}"
            if used + len(line) + 1 > self.recent_chars:
                break
            kept.append(line)
            used += len(line) + 1
        parts = []
        if self.disambiguation:
            parts.append(f"Disambiguation state:\n{self.disambiguation}")
        if kept:
            parts.append("Recent records of this session:\n" + "\n".join(reversed(kept)))
        return "\n\n".join(parts)


class Extractor(Protocol):
    """One call per finalized segment."""

    usage: LLMUsage

    def extract(self, segment: Segment, context: ReferenceContext) -> Extraction: ...


def _session_time(segment: Segment) -> datetime | None:
    return segment.turns[0].session_time


def _make_amu(segment: Segment, index: int, text: str, memory_type: str, turns: Sequence[Turn], *,
              timestamps: Sequence[str] = (), entities: Sequence[str] = (), tags: Sequence[str] = ()) -> AMU:
    when = _session_time(segment)
    return AMU(
        id=amu_id(segment.conversation_id, segment.seq, index),
        text=text,
        memory_type=memory_type,
        source=SourcePointer(segment.conversation_id, segment.session_id, tuple(t.turn_id for t in turns),
                             tuple(dict.fromkeys(t.speaker for t in turns)), segment.seq),
        observed_at=when.isoformat() if when else None,
        timestamps=tuple(timestamps),
        entities=tuple(entities),
        tags=tuple(tags),
    )


def raw_turn_amus(segment: Segment) -> list[AMU]:
    """The fallback: one ``fact`` AMU per turn, text ``"Speaker: text"`` (image caption kept)."""
    return [_make_amu(segment, index, turn.render(), "fact", [turn]) for index, turn in enumerate(segment.turns)]


# ---------------------------------------------------------------------------------------------
# Relative dates
# ---------------------------------------------------------------------------------------------

_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
            "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "a couple of": 2}
_PREPOSITIONS = ("since", "until", "till", "from", "by", "before", "after", "on", "in", "during", "of",
                 "over", "through", "around", "for")

_RELATIVE_DATE = re.compile(
    r"\b(?:(?P<prep>" + "|".join(_PREPOSITIONS) + r")\s+)?"
    r"(?P<expr>the\s+day\s+before\s+yesterday|the\s+day\s+after\s+tomorrow|yesterday|today|tonight|tomorrow"
    r"|last\s+night"
    r"|(?P<rel>last|next|this)\s+(?P<unit>week|weekend|month|year|" + "|".join(_WEEKDAYS) + r")"
    r"|(?P<num>\d+|" + "|".join(sorted(_NUMBERS, key=len, reverse=True)) + r")"
    r"\s+(?P<agounit>day|week|month|year)s?\s+ago)"
    r"\b(?P<poss>['’]s)?(?P<subject>(?=\s+(?:was|is|has|had|will|were|would)\b))?",
    re.IGNORECASE,
)


def _day_text(day: date) -> str:
    return f"{day.day} {day:%B %Y}"


def _week(day: date) -> str:
    iso = day.isocalendar()
    return f"{iso.year}-W{iso.week:02d}"


def _shift_months(day: date, months: int) -> date:
    index = day.year * 12 + day.month - 1 + months
    return date(index // 12, index % 12 + 1, 1)


def _resolve(match: re.Match[str], today: date) -> tuple[str, str, str]:
    """(absolute phrase, ISO value, default preposition) for one relative expression."""
    expr = " ".join(match["expr"].lower().split())
    fixed = {"the day before yesterday": -2, "yesterday": -1, "today": 0, "tomorrow": 1,
             "the day after tomorrow": 2}
    if expr in fixed:
        day = today + timedelta(days=fixed[expr])
        return _day_text(day), day.isoformat(), "on"
    if expr in ("tonight", "last night"):
        day = today - timedelta(days=1 if expr == "last night" else 0)
        return f"the night of {_day_text(day)}", day.isoformat(), "on"
    if match["num"]:
        count = int(match["num"]) if match["num"].isdigit() else _NUMBERS[" ".join(match["num"].lower().split())]
        unit = match["agounit"].lower()
        if unit == "day":
            day = today - timedelta(days=count)
            return _day_text(day), day.isoformat(), "on"
        if unit == "week":
            day = today - timedelta(weeks=count)
            monday = day - timedelta(days=day.weekday())
            return f"the week of {_day_text(monday)}", _week(day), "in"
        if unit == "month":
            month = _shift_months(today, -count)
            return f"{month:%B %Y}", f"{month:%Y-%m}", "in"
        return str(today.year - count), str(today.year - count), "in"
    step = {"last": -1, "this": 0, "next": 1}[match["rel"].lower()]
    unit = match["unit"].lower()
    monday = today - timedelta(days=today.weekday())
    if unit == "week":
        words = {-1: "the week before", 0: "the week of", 1: "the week after"}[step]
        return f"{words} {_day_text(today)}", _week(today + timedelta(weeks=step)), "in"
    if unit == "weekend":
        saturday = monday + timedelta(days=5 + 7 * step)
        sunday = saturday + timedelta(days=1)
        return f"the weekend of {_day_text(saturday)}", f"{saturday.isoformat()}/{sunday.isoformat()}", "on"
    if unit == "month":
        month = _shift_months(today, step)
        return f"{month:%B %Y}", f"{month:%Y-%m}", "in"
    if unit == "year":
        return str(today.year + step), str(today.year + step), "in"
    target = _WEEKDAYS.index(unit)
    if step == -1:  # the most recent such day strictly before today
        day = today - timedelta(days=(today.weekday() - target) % 7 or 7)
    elif step == 1:  # the first such day strictly after today
        day = today + timedelta(days=(target - today.weekday()) % 7 or 7)
    else:  # that day of the current Monday-to-Sunday week
        day = monday + timedelta(days=target)
    return f"{day:%A}, {_day_text(day)}", day.isoformat(), "on"


def resolve_relative_dates(text: str, when: datetime | date | None) -> tuple[str, list[str]]:
    """Rewrite relative dates against the session time; returns the text and the ISO values.

    Handled: yesterday, today, tonight, tomorrow, last night, the day before yesterday / after
    tomorrow, last/this/next week|weekend|month|year|<weekday>, and ``<n> days|weeks|months|years
    ago`` (digits or number words; vague "a few" is left alone). Conventions: "last week" is
    "the week before <session date>" (ISO week of session - 7 days, LoCoMo's answer wording);
    weekends are Saturday/Sunday intervals; "last Friday" is the latest Friday strictly before
    the session day, "next Friday" the first strictly after, "this Friday" the one in the session's
    Monday-Sunday week. A preceding preposition is kept ("since yesterday" -> "since 7 May 2023");
    otherwise "on"/"in" is added ("yesterday" -> "on 7 May 2023"), except for possessives and
    subjects ("Yesterday was fun" -> "7 May 2023 was fun").
    """
    if when is None:
        return text, []
    today = when.date() if isinstance(when, datetime) else when
    values: list[str] = []

    def replace(match: re.Match[str]) -> str:
        phrase, value, default_prep = _resolve(match, today)
        values.append(value)
        if match["poss"] or (match["subject"] is not None and not match["prep"]):
            # A possessive or grammatical subject ("Yesterday was fun") takes no preposition.
            replacement = f"{match['prep'] + ' ' if match['prep'] else ''}{phrase}{match['poss'] or ''}"
        else:
            replacement = f"{match['prep'] or default_prep} {phrase}"
        return replacement[0].upper() + replacement[1:] if match[0][0].isupper() else replacement

    return _RELATIVE_DATE.sub(replace, text), list(dict.fromkeys(values))


# ---------------------------------------------------------------------------------------------
# Pronouns
# ---------------------------------------------------------------------------------------------

_ADVERBS = ("really", "just", "also", "always", "still", "never", "actually", "totally", "definitely", "usually",
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
_BASE_FORM_TRIGGERS = ("do", "does", "did", "can", "could", "will", "would", "should", "might", "must", "shall",
                       "may", "make", "makes", "made", "let", "lets", "help", "helps", "helped", "see", "saw",
                       "watch", "hear", "heard", "have", "had", "to", "n't", "n’t")
_NOT_AFTER_BASE_FORM = "".join(rf"(?<!{re.escape(word)} )" for word in _BASE_FORM_TRIGGERS)
_APOS = r"['’]"


def _third_person(verb: str) -> str:
    lower = verb.lower()
    if lower == "go":
        return "goes"
    if re.search(r"[^aeiou]y$", lower):
        return verb[:-1] + "ies"
    if re.search(r"(s|sh|ch|x|z)$", lower):
        return verb + "es"
    return verb + "s"


def _pronoun_rules(person: str) -> list[tuple[re.Pattern[str], Callable[[re.Match[str], str], str]]]:
    """Ordered (pattern, replacement) rules for first ("I") or second ("you") person."""
    subj = r"I" if person == "first" else r"you"
    be_past = "was" if person == "first" else "were"
    rules: list[tuple[str, Callable[[re.Match[str], str], str]]] = [
        (rf"\b{subj}{_APOS}m\b" if person == "first" else rf"\byou{_APOS}re\b", lambda m, n: f"{n} is"),
        (rf"\b{subj}\s+{'am' if person == 'first' else 'are'}\b", lambda m, n: f"{n} is"),
        (rf"\b{'am' if person == 'first' else 'are'}\s+{subj}\b", lambda m, n: f"is {n}"),
        (rf"\b{subj}{_APOS}ve\b", lambda m, n: f"{n} has"),
        (rf"\b{subj}{_APOS}d\s+been\b", lambda m, n: f"{n} had been"),
        (rf"\b{subj}{_APOS}d\b", lambda m, n: f"{n} would"),
        (rf"\b{subj}{_APOS}ll\b", lambda m, n: f"{n} will"),
        (rf"\b{subj}\s+{be_past}\b", lambda m, n: f"{n} was"),
        (rf"\b{be_past}\s+{subj}\b", lambda m, n: f"was {n}"),
        (rf"\b{subj}\s+{_ADVERB_RUN}(have|do)(n{_APOS}t)?\b",
         lambda m, n: f"{n} {m[1]}{'has' if m[2].lower() == 'have' else 'does'}{m[3] or ''}"),
        (rf"\b(have|do)(n{_APOS}t)?\s+{subj}\b",
         lambda m, n: f"{'has' if m[1].lower() == 'have' else 'does'}{m[2] or ''} {n}"),
        (rf"{_NOT_AFTER_BASE_FORM}\b{subj}\s+{_ADVERB_RUN}({'|'.join(_VERBS)})\b",
         lambda m, n: f"{n} {m[1]}{_third_person(m[2])}"),
    ]
    if person == "first":
        rules += [
            (r"\b(?:my|mine)\b", lambda m, n: f"{n}'s"),
            (r"\b(?:I|me|myself)\b", lambda m, n: n),
        ]
    else:
        rules += [
            (r"\b(?:your|yours)\b", lambda m, n: f"{n}'s"),
            (r"\b(?:you|yourself|yourselves)\b", lambda m, n: n),
        ]
    return [(re.compile(pattern, re.IGNORECASE), build) for pattern, build in rules]


_FIRST_PERSON = _pronoun_rules("first")
_SECOND_PERSON = _pronoun_rules("second")


def resolve_pronouns(text: str, speaker: str, addressee: str | None) -> str:
    """Replace first-person pronouns with the speaker's name and second-person ones with the
    addressee's (left alone when unknown), fixing agreement for be/have/do, contractions and
    common present-tense verbs: "I am" -> "Caroline is", "my" -> "Caroline's", "do you" ->
    "does Melanie". Reflexives become the bare name."""
    for rules, name in ((_FIRST_PERSON, speaker), (_SECOND_PERSON, addressee)):
        if name is None:
            continue
        for pattern, build in rules:
            text = pattern.sub(lambda m, build=build, name=name: _keep_case(m[0], build(m, name)), text)
    return text


def _keep_case(original: str, replacement: str) -> str:
    return replacement[0].upper() + replacement[1:] if original[:1].isupper() else replacement


# ---------------------------------------------------------------------------------------------
# Rule-based extractor
# ---------------------------------------------------------------------------------------------

_STOPWORDS = frozenset("""
a about above after again against all am an and any are as at be because been before being below between both
but by can could did do does doing down during each few for from further had has have having he her here hers
herself him himself his how i if in into is it its itself just let me more most my myself no nor not now of off
on once only or other our ours ourselves out over own same she should so some such than that the their theirs
them themselves then there these they this those through to too under until up very was we were what when where
which while who whom why will with would you your yours yourself yourselves s t don didn doesn isn wasn aren
weren won wouldn couldn shouldn ll re ve d m it's that's what's i'm i've i'd i'll you're you've you'd you'll
there's here's let's can't don't didn't doesn't isn't wasn't won't
""".split())
# Greetings, thanks and acknowledgements: a turn made only of these (plus names) carries no fact.
_FILLERS = frozenset("""
hi hey hello hiya yo bye goodbye thanks thank ok okay yeah yes yep yup no nope sure cool wow great awesome nice
lol haha oh ah hmm good glad see talk soon later take care cheers congrats congratulations amazing totally
definitely right agreed same much really well welcome pleasure night morning evening day anytime again
absolutely exactly true love lovely sounds sound fun happy hear gonna keep going luck best wishes
""".split())
_MONTHS = frozenset(("january", "february", "march", "april", "may", "june", "july", "august", "september",
                     "october", "november", "december"))
_NOT_NAMES = _STOPWORDS | _FILLERS | _MONTHS | frozenset(_WEEKDAYS)
_WORD = re.compile(r"[A-Za-z][A-Za-z'’]*")
_PROPER = re.compile(r"\b[A-Z][\w'’&\-]*(?:\s+[A-Z][\w'’&\-]*)*")

_PREFERENCE = re.compile(r"\b(love|loves|like|likes|enjoy|enjoys|prefer|prefers|favou?rite|hate|hates|"
                         r"fan of|passionate about|dislike|dislikes)\b", re.IGNORECASE)
_CONSTRAINT = re.compile(r"\b(can['’]?t|cannot|must|have to|has to|need to|needs to|allergic|not allowed|"
                         r"unable)\b", re.IGNORECASE)
_PROCEDURE = re.compile(r"\b(step by step|steps?|recipe|how to|instructions|tutorial)\b", re.IGNORECASE)
_PAST_EVENT = re.compile(r"\b(went|visited|attended|joined|started|finished|bought|moved|met|won|lost|celebrated|"
                         r"graduated|adopted|painted|signed|received|traveled|travelled|married|ran|took|built|"
                         r"launched|got)\b", re.IGNORECASE)


def _content_words(text: str, names: set[str]) -> list[str]:
    words = (re.sub(r"['’]s$", "", word.lower()).strip("'’") for word in _WORD.findall(text))
    return [w for w in words if w not in _NOT_NAMES and w not in names and len(w) > 1]


def is_informative(turn: Turn, participants: Sequence[str]) -> bool:
    """A turn yields an AMU unless it is pure small talk: no image and fewer than two content words
    (words that are not stopwords, greeting/thanks/acknowledgement fillers or participant names)."""
    if turn.image_caption:
        return True
    names = {name.lower() for name in participants} | {turn.speaker.lower()}
    return len(_content_words(turn.text, names)) >= 2


def _entities(text: str, participants: Sequence[str]) -> list[str]:
    """Participants mentioned, then capitalised word runs. Leading stopwords, fillers and month or
    day names are dropped, and so is a sentence's first word unless it is an acronym or a
    participant (it is capitalised by position, not because it is a name); possessive 's is
    stripped."""
    found = [name for name in participants if re.search(rf"\b{re.escape(name)}\b", text)]
    for match in _PROPER.finditer(text):
        words = match[0].split()
        at_sentence_start = re.search(r"(^|[.!?:\[\]])\s*$", text[: match.start()]) is not None
        if at_sentence_start and not (words[0].isupper() and len(words[0]) > 1) and words[0] not in participants:
            words = words[1:]
        while words and words[0].lower().strip("'’") in _NOT_NAMES:
            words = words[1:]
        name = re.sub(r"['’]s$", "", " ".join(words))
        if name and name not in found and name.lower() not in _NOT_NAMES:
            found.append(name)
    return found


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


def _addressee(turn: Turn, turns: Sequence[Turn], participants: Sequence[str]) -> str | None:
    """Who "you" is: the other participant of a two-party conversation; otherwise the nearest
    other speaker in the segment, preferring the previous turn."""
    others = [name for name in participants if name != turn.speaker]
    if len(others) == 1:
        return others[0]
    index = turns.index(turn)
    for candidate in [*reversed(turns[:index]), *turns[index + 1:]]:
        if candidate.speaker != turn.speaker:
            return candidate.speaker
    return None


class RuleExtractor:
    """Offline, deterministic extraction: one AMU per informative turn (:func:`is_informative`).

    The fact text is the turn with relative dates resolved against the session time
    (:func:`resolve_relative_dates`) and pronouns replaced by names (:func:`resolve_pronouns`);
    a shared image is folded in as ``[<speaker> shares an image: <caption>]``, and when the
    speaker's name does not occur in the result it is prefixed (``"Melanie: ..."``) so that the
    fact says who stated it. Entities are capitalised names, tags the first five distinct content
    words of at least four letters, the memory type a keyword heuristic. No reference context is
    used (the state stays empty).
    """

    def __init__(self) -> None:
        self.usage = LLMUsage()

    def extract(self, segment: Segment, context: ReferenceContext) -> Extraction:
        participants = context.participants or tuple(dict.fromkeys(t.speaker for t in segment.turns))
        names = {name.lower() for name in participants}
        turns = segment.turns
        amus: list[AMU] = []
        for turn in turns:
            if not is_informative(turn, participants):
                continue
            text, timestamps = resolve_relative_dates(turn.text, turn.session_time)
            text = resolve_pronouns(text, turn.speaker, _addressee(turn, turns, participants))
            if not re.search(rf"\b{re.escape(turn.speaker)}\b", text):
                text = f"{turn.speaker}: {text}"
            if turn.image_caption:
                text = f"{text} [{turn.speaker} shares an image: {turn.image_caption}]"
            tags = list(dict.fromkeys(w for w in _content_words(text, names) if len(w) >= 4))[:5]
            amus.append(_make_amu(segment, len(amus), text, _memory_type(turn.text, timestamps), [turn],
                                  timestamps=timestamps, entities=_entities(text, participants), tags=tags))
        return Extraction(amus)


# ---------------------------------------------------------------------------------------------
# LLM extractor
# ---------------------------------------------------------------------------------------------

_ISO_TIME = r"^\d{4}(-W\d{2}|-\d{2}(-\d{2}([T ][0-9:.]+([+-]\d{2}:?\d{2}|Z)?)?)?)?(/.+)?$"

SYSTEM_PROMPT = f"""You turn one segment of a dialogue into atomic memory records.
Each record states one self-contained fact that can be understood without the dialogue:
- replace pronouns, nicknames and elliptical mentions with canonical names;
- rewrite relative dates and times (yesterday, last week, next month, ...) as absolute dates, using
  the session date;
- keep names, numbers, places and dates exact; cover every informative turn, skip pure greetings.
Return only a JSON object, without markdown fences:
{{"records": [{{"text": "...", "memory_type": "...", "entities": ["..."], "tags": ["..."],
  "timestamps": ["..."], "turn_ids": ["..."]}}],
 "disambiguation": "..."}}
memory_type is one of: {", ".join(MEMORY_TYPES)}.
entities: canonical names of people, places, organisations and things; tags: short topic tags.
timestamps: ISO 8601 values of the times the fact refers to (YYYY, YYYY-MM, YYYY-MM-DD, YYYY-Www or
an interval A/B); empty when none. turn_ids: the ids of the turns the fact comes from.
disambiguation: at most 1200 characters of notes for later segments (canonical names, aliases,
what pronouns refer to). The reference context is read-only background: extract nothing from it."""


class InvalidResponse(ValueError):
    """The endpoint answered, but not with a usable result; raised by a ``parse`` callback of
    :meth:`ChatClient.complete` to have the request retried."""


T = TypeVar("T")


class ChatClient:
    """A client for an OpenAI-compatible ``/chat/completions`` endpoint (stdlib urllib), shared
    by the LLM extractor and the evaluation's answer stage.

    ``base_url`` (e.g. ``http://127.0.0.1:8000/v1``), ``model`` and ``api_key`` default to the
    environment variables ISQ_LLM_BASE_URL, ISQ_LLM_MODEL and ISQ_LLM_API_KEY (the key may be
    absent for local servers). ``json_mode`` asks for a raw JSON object answer.

    :meth:`complete` retries HTTP errors, timeouts and answers its ``parse`` callback rejects,
    with exponential backoff (``backoff_s * 2**k`` seconds). Answers that parse are cached in
    ``cache_dir`` under the SHA-256 of the request (model, messages and parameters), so a rerun
    repeats no call. ``usage`` accounts for every call and cache hit.
    """

    def __init__(self, base_url: str | None = None, model: str | None = None, api_key: str | None = None, *,
                 cache_dir: str | Path | None = None, temperature: float = 0.0, timeout_s: float = 120.0,
                 max_retries: int = 4, backoff_s: float = 1.0, json_mode: bool = True) -> None:
        base_url = base_url or os.environ.get("ISQ_LLM_BASE_URL")
        model = model or os.environ.get("ISQ_LLM_MODEL")
        if not base_url:
            raise ValueError("an LLM endpoint needs base_url or the environment variable ISQ_LLM_BASE_URL")
        if not model:
            raise ValueError("an LLM endpoint needs model or the environment variable ISQ_LLM_MODEL")
        self.endpoint = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key = api_key or os.environ.get("ISQ_LLM_API_KEY")
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        if self.cache_dir is not None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.params: dict[str, Any] = {"temperature": temperature}
        if json_mode:
            self.params["response_format"] = {"type": "json_object"}
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.usage = LLMUsage()

    def complete(self, messages: list[dict[str, str]], parse: Callable[[str], T],
                 label: str = "request") -> T | None:
        """Send ``messages`` and return ``parse(content of the first choice)``; ``None`` once the
        retries are exhausted. ``parse`` raises :class:`InvalidResponse` for an unusable answer;
        ``label`` names the request in log messages."""
        payload = {"model": self.model, "messages": messages, **self.params}
        key = hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
        cached = self._cache_load(key)
        if cached is not None:
            try:
                result = parse(_content(cached))
            except InvalidResponse:
                logger.warning("ignoring unusable cache entry %s", key)
            else:
                self.usage.cache_hits += 1
                prompt, completion = _tokens(cached)
                self.usage.cached_prompt_tokens += prompt
                self.usage.cached_completion_tokens += completion
                return result
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.usage.retries += 1
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            self.usage.http_calls += 1
            try:
                body = self._post(payload)
            except (OSError, http.client.HTTPException, ValueError) as err:
                logger.warning("%s attempt %d: request failed: %s", label, attempt + 1, err)
                continue
            prompt, completion = _tokens(body)
            self.usage.prompt_tokens += prompt
            self.usage.completion_tokens += completion
            try:
                result = parse(_content(body))
            except InvalidResponse as err:
                logger.warning("%s attempt %d: unusable answer: %s", label, attempt + 1, err)
                continue
            self._cache_store(key, body)
            return result
        return None

    def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.endpoint, data=json.dumps(payload).encode(), headers=headers,
                                         method="POST")
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            body = json.loads(response.read())
        if not isinstance(body, dict):
            raise ValueError("response body is not a JSON object")
        return body

    def _cache_load(self, key: str) -> dict[str, Any] | None:
        if self.cache_dir is None:
            return None
        path = self.cache_dir / f"{key}.json"
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, json.JSONDecodeError):
            logger.warning("unreadable cache entry %s", path)
            return None

    def _cache_store(self, key: str, body: dict[str, Any]) -> None:
        if self.cache_dir is None:
            return
        # Write-then-rename, so a crash never leaves a truncated entry behind.
        with tempfile.NamedTemporaryFile("w", dir=self.cache_dir, suffix=".tmp", delete=False,
                                         encoding="utf-8") as handle:
            json.dump(body, handle)
        os.replace(handle.name, self.cache_dir / f"{key}.json")


def _content(body: dict[str, Any]) -> str:
    try:
        content = body["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise InvalidResponse("no choices[0].message.content in the response") from None
    return content or ""


def _tokens(body: dict[str, Any]) -> tuple[int, int]:
    """(prompt, completion) tokens from an OpenAI-style ``usage`` block; 0 where absent or malformed."""
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return 0, 0
    counts = [usage.get("prompt_tokens"), usage.get("completion_tokens")]
    return tuple(value if isinstance(value, int) else 0 for value in counts)  # type: ignore[return-value]


class LLMExtractor:
    """Extraction through an OpenAI-compatible endpoint (:class:`ChatClient`; the keyword
    options are its options). Temperature 0 and a raw JSON object answer (Table 11).

    Each response is checked against a per-segment JSON schema (record fields, memory types,
    turn ids of this segment) and turned into AMUs; invalid JSON and schema violations are
    retried like HTTP errors, and only validated responses are cached. When retries are
    exhausted the segment becomes raw-turn AMUs and ``usage.fallback_segments`` counts it.
    """

    def __init__(self, base_url: str | None = None, model: str | None = None, api_key: str | None = None,
                 **options: Any) -> None:
        self.client = ChatClient(base_url, model, api_key, **options)

    @property
    def endpoint(self) -> str:
        return self.client.endpoint

    @property
    def model(self) -> str:
        return self.client.model

    @property
    def api_key(self) -> str | None:
        return self.client.api_key

    @property
    def usage(self) -> LLMUsage:
        return self.client.usage

    def extract(self, segment: Segment, context: ReferenceContext) -> Extraction:
        validator = Draft202012Validator(self._schema(segment))
        extraction = self.client.complete(self.messages(segment, context),
                                          lambda content: self._parse(content, segment, validator),
                                          label=f"segment {segment.conversation_id}/{segment.seq}")
        if extraction is not None:
            return extraction
        self.usage.fallback_segments += 1
        logger.warning("segment %s/%d kept as raw turns after %d attempts",
                       segment.conversation_id, segment.seq, self.client.max_retries + 1)
        return Extraction(raw_turn_amus(segment), state=context.disambiguation, fallback=True)

    def messages(self, segment: Segment, context: ReferenceContext) -> list[dict[str, str]]:
        """The chat messages for one segment (system instructions, then date, context, turns)."""
        when = _session_time(segment)
        lines = [f"Session date: {when:%A, %d %B %Y, %H:%M}" if when else "Session date: unknown"]
        if context.participants:
            lines.append("Participants: " + ", ".join(context.participants))
        reference = context.render()
        if reference:
            lines += ["", "Reference context (read-only):", reference]
        lines += ["", "Segment turns:"] + [f"[{turn.turn_id}] {turn.render()}" for turn in segment.turns]
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n".join(lines)}]

    @staticmethod
    def _schema(segment: Segment) -> dict[str, Any]:
        strings = {"type": "array", "items": {"type": "string", "minLength": 1}}
        record = {
            "type": "object",
            "required": ["text", "memory_type", "turn_ids"],
            "properties": {
                "text": {"type": "string", "minLength": 1},
                "memory_type": {"enum": list(MEMORY_TYPES)},
                "entities": strings,
                "tags": strings,
                "timestamps": {"type": "array", "items": {"type": "string", "pattern": _ISO_TIME}},
                "turn_ids": {"type": "array", "minItems": 1,
                             "items": {"enum": [turn.turn_id for turn in segment.turns]}},
            },
        }
        return {
            "type": "object",
            "required": ["records"],
            "properties": {"records": {"type": "array", "items": record}, "disambiguation": {"type": "string"}},
        }

    @staticmethod
    def _parse(content: str, segment: Segment, validator: Draft202012Validator) -> Extraction:
        # Some models wrap JSON in a markdown fence despite the instruction; unwrap it.
        content = re.sub(r"^\s*```(?:json)?\s*|\s*```\s*$", "", content)
        try:
            answer = json.loads(content)
        except json.JSONDecodeError as err:
            raise InvalidResponse(f"content is not JSON: {err}") from None
        error = best_match(validator.iter_errors(answer))
        if error is not None:
            where = "/".join(str(part) for part in error.path) or "(root)"
            raise InvalidResponse(f"schema violation at {where}: {error.message}")
        by_id = {turn.turn_id: turn for turn in segment.turns}
        try:
            amus = [
                _make_amu(segment, index, record["text"].strip(), record["memory_type"],
                          [by_id[turn_id] for turn_id in dict.fromkeys(record["turn_ids"])],
                          timestamps=record.get("timestamps", []), entities=record.get("entities", []),
                          tags=record.get("tags", []))
                for index, record in enumerate(answer["records"])
            ]
        except AMUValidationError as err:
            raise InvalidResponse(str(err)) from None
        return Extraction(amus, state=answer.get("disambiguation", ""))


__all__ = [
    "SYSTEM_PROMPT", "ChatClient", "Extraction", "Extractor", "InvalidResponse", "LLMExtractor", "LLMUsage",
    "ReferenceContext", "RuleExtractor",
    "is_informative", "raw_turn_amus", "resolve_pronouns", "resolve_relative_dates",
]
