"""Memory records: raw turns, source pointers, atomic memory units (AMUs) and segment markers.

An AMU (MemCode key design 1, record schema of LycheeMemory Table 12; docs/design.md §5.1) is one
self-contained fact: pronouns and relative dates already resolved, absolute times attached,
and a source pointer back to the original dialogue turns (MemCode's Lambda_src), so that the
raw context can always be recovered.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from retrieval.memory.times import naive_utc, time_interval

MEMORY_TYPES = (
    "fact", "preference", "event", "constraint", "procedure", "failure_pattern", "tool_affordance",
)
"""The finite memory-type schema of LycheeMemory section 3.3 / Table 12."""


MAX_TURN_CHARS = 20_000
"""The longest turn text accepted (about 4,000 words; LoCoMo's longest is under 1,000 characters):
longer input is refused by the loaders and by ingestion rather than processed for minutes."""


def lone_surrogate(text: str) -> int | None:
    """Where ``text`` holds a lone surrogate, a string no store, JSON file or tokenizer takes (not
    UTF-8), else None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        return err.start
    return None


def written_limit(sources: Iterable[str]) -> int:
    """The longest record text an LLM may write from ``sources`` (a segment's turns, a cluster's
    records): as long as a turn may be, or as all it restates together where that is longer."""
    return max(MAX_TURN_CHARS, sum(len(text) for text in sources))


MAX_WRITTEN_KEYS = 16
"""The most entities, topic tags or timestamps an LLM may give a record it extracts, and may add to
those a consolidated record's members have: evidence nodes pair every entity of a record with every
tag, so an answer without a bound (a model looping, a turn asking for it) could grow one record
into thousands of nodes."""


MAX_NAME_CHARS = 200
"""The longest entity or topic tag a new record keeps, and the longest entity or topic key of an
evidence node (an entity-topic pair's key joins two): a longer one (a pasted key, an unbroken run of
a script without spaces) names nothing a question would. Bounded so that every key fits a database
index on either backend (PostgreSQL indexes at most ~2.7 KB a row)."""


def names(values: Iterable[str]) -> tuple[str, ...]:
    """The entities or tags of a new record: ``values`` without those longer than
    :data:`MAX_NAME_CHARS`."""
    return tuple(value for value in values if len(value) <= MAX_NAME_CHARS)


class AMUValidationError(ValueError):
    """A record does not satisfy the AMU schema; the message names the offending field, and so
    does ``field`` alone (for a message that must not quote the value)."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class InputFormatError(ValueError):
    """An input file (LoCoMo JSON, JSONL turn stream) is malformed; the message names file and place."""


SHOWN_CHARS = 60
"""How much of a refused value an error message quotes."""


def shown(value: Any) -> str:
    """``value`` as an error message quotes it: its repr, a long string cut after
    :data:`SHOWN_CHARS` characters with its length (a message must not repeat a huge input)."""
    if isinstance(value, str) and len(value) > SHOWN_CHARS:
        return f"{value[:SHOWN_CHARS]!r}… ({len(value)} characters)"
    return repr(value)


@dataclass(frozen=True)
class Turn:
    """One raw dialogue turn, as ingested and as stored for source-pointer lookups.

    ``session_time`` is naive and read as UTC: a time with an offset is converted to UTC on
    construction (``13:56+02:00`` -> ``11:56``), a naive one is taken as written. One rule for
    every loader, so that sessions with and without offsets compare (the same rule as AMU time
    values, :func:`retrieval.memory.times.time_interval`). The offset is kept (``utc_offset``) and
    stored with the time (:meth:`stored_time`): "yesterday" is the day before the speaker's own
    date (:attr:`local_time`), which is not always the UTC one.
    """

    user_id: str
    session_id: str
    turn_id: str
    speaker: str
    text: str
    session_time: datetime | None = None
    image_caption: str | None = None
    utc_offset: timedelta | None = None

    def __post_init__(self) -> None:
        if self.session_time is not None and self.session_time.tzinfo is not None:
            object.__setattr__(self, "utc_offset", self.session_time.utcoffset())
            object.__setattr__(self, "session_time", naive_utc(self.session_time))

    @property
    def local_time(self) -> datetime | None:
        """The time on the speaker's clock: ``session_time`` in the offset it was given with."""
        if self.session_time is None or self.utc_offset is None:
            return self.session_time
        return self.session_time + self.utc_offset

    def stored_time(self) -> str | None:
        """The time as the store keeps it: ISO 8601 in the offset it was given with (read back, it
        makes the same turn)."""
        local = self.local_time
        if local is None:
            return None
        zone = None if self.utc_offset is None else timezone(self.utc_offset)
        return local.replace(tzinfo=zone).isoformat()

    def render(self) -> str:
        """``"Speaker: text [shares an image: caption]"``: the raw-turn form used for embedding,
        prompts and the raw-turn fallback AMUs."""
        caption = f" [shares an image: {self.image_caption}]" if self.image_caption else ""
        return f"{self.speaker}: {self.text}{caption}"


@dataclass(frozen=True)
class SourcePointer:
    """Where an AMU came from (MemCode Lambda_src): conversation, session, turn ids (LoCoMo
    dia_ids), the speakers of those turns (their role in the dialogue) and the segment index."""

    user_id: str
    session_id: str
    turn_ids: tuple[str, ...]
    speakers: tuple[str, ...] = ()
    segment: int | None = None


_STRING_LIST = {"type": "array", "items": {"type": "string", "minLength": 1}}

AMU_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["id", "text", "memory_type", "source", "timestamps", "entities", "tags", "archived"],
    "properties": {
        "id": {"type": "string", "minLength": 1},
        "text": {"type": "string", "minLength": 1, "pattern": r"\S"},
        "memory_type": {"enum": list(MEMORY_TYPES)},
        "observed_at": {"type": ["string", "null"]},
        "t_ref": {"type": ["string", "null"]},
        "valid_from": {"type": ["string", "null"]},
        "valid_to": {"type": ["string", "null"]},
        "timestamps": _STRING_LIST,
        "entities": _STRING_LIST,
        "tags": _STRING_LIST,
        "source": {
            "type": "object",
            "required": ["user_id", "session_id", "turn_ids", "speakers"],
            "properties": {
                "user_id": {"type": "string", "minLength": 1},
                "session_id": {"type": "string", "minLength": 1},
                "turn_ids": {**_STRING_LIST, "minItems": 1},
                "speakers": _STRING_LIST,
                "segment": {"type": ["integer", "null"], "minimum": 0},
            },
        },
        "fingerprint": {"type": ["array", "null"], "items": {"type": "integer", "minimum": 0}},
        "archived": {"type": "boolean"},
    },
}
"""JSON schema of :meth:`AMU.to_dict`; every AMU is checked against it on construction."""

_AMU_VALIDATOR = Draft202012Validator(AMU_SCHEMA)


def amu_id(user_id: str, segment: int, index: int, revision: int = 0) -> str:
    """Deterministic AMU id: the k-th record of a user's n-th segment (``:r<n>`` appended for the
    n-th retried extraction of that segment)."""
    return f"{user_id}:{segment}:{index}" + (f":r{revision}" if revision else "")


TURN_MARK = ":turn:"
"""What separates the user and the turn id in a raw turn's item id."""


def raw_turn_id(user_id: str, turn_id: str) -> str:
    """A raw turn's item id: ``<user>:turn:<turn id>``."""
    return f"{user_id}{TURN_MARK}{turn_id}"


def turn_id_of(user_id: str, item_id: str) -> str | None:
    """The turn id inside ``item_id`` when it is one of this user's raw-turn ids, else None."""
    prefix = user_id + TURN_MARK
    return item_id[len(prefix):] if item_id.startswith(prefix) else None


@dataclass(frozen=True)
class AMU:
    """An atomic memory unit.

    ``observed_at`` is when the fact was stated (the session time, ISO datetime); ``timestamps``
    are the absolute event or validity times it mentions (ISO values of :func:`time_interval`).
    The temporal scope of LycheeMemory's Table 12: ``t_ref`` is the time the fact refers to (the
    event time, else the day it was stated), ``valid_from`` / ``valid_to`` bound when it holds
    (either may be None); all three are ISO values of :func:`time_interval`.
    ``fingerprint`` is the ISQ code sequence S_fp(text) when a fingerprinter was used.
    Sequences may be passed as lists; they are stored as tuples. Invalid values raise
    :class:`AMUValidationError` naming the field.
    """

    id: str
    text: str
    memory_type: str
    source: SourcePointer
    observed_at: str | None = None
    timestamps: tuple[str, ...] = ()
    entities: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    fingerprint: tuple[int, ...] | None = None
    archived: bool = False
    t_ref: str | None = None
    valid_from: str | None = None
    valid_to: str | None = None

    def __post_init__(self) -> None:
        error = best_match(_AMU_VALIDATOR.iter_errors(self.to_dict()))
        if error is not None:
            where = ".".join(str(part) for part in error.path) or "(record)"
            raise AMUValidationError(f"AMU {self.id!r}: field {where!r}: {error.message}", where)
        for name in ("observed_at", "timestamps", "t_ref", "valid_from", "valid_to"):
            values = getattr(self, name)
            for value in [values] if isinstance(values, str) else values or ():
                try:
                    time_interval(value)
                except ValueError as err:
                    raise AMUValidationError(f"AMU {self.id!r}: field {name!r}: {err}", name) from None
        # Freeze the sequences only after validation, so a bare string is rejected, not split.
        for name in ("timestamps", "entities", "tags"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.fingerprint is not None:
            object.__setattr__(self, "fingerprint", tuple(int(code) for code in self.fingerprint))
        source = self.source
        object.__setattr__(self, "source", SourcePointer(
            source.user_id, source.session_id, tuple(source.turn_ids), tuple(source.speakers),
            source.segment,
        ))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready form (lists for sequences)."""
        source = self.source
        return {
            "id": self.id,
            "text": self.text,
            "memory_type": self.memory_type,
            "observed_at": self.observed_at,
            "t_ref": self.t_ref,
            "valid_from": self.valid_from,
            "valid_to": self.valid_to,
            "timestamps": _listed(self.timestamps),
            "entities": _listed(self.entities),
            "tags": _listed(self.tags),
            "source": {
                "user_id": source.user_id,
                "session_id": source.session_id,
                "turn_ids": _listed(source.turn_ids),
                "speakers": _listed(source.speakers),
                "segment": source.segment,
            },
            "fingerprint": None if self.fingerprint is None else _listed(self.fingerprint),
            "archived": self.archived,
        }


def _listed(value: Any) -> Any:
    """Lists for list/tuple values; anything else unchanged, so the schema can reject it."""
    return list(value) if isinstance(value, (list, tuple)) else value


@dataclass(frozen=True)
class SegmentRecord:
    """The progress marker of one ingested segment. ``state`` is the extractor's disambiguation
    state after the segment (LycheeMemory eq. 5), kept so that a resumed run rebuilds the same
    reference context. ``content_sha256`` fingerprints what the segment's turns say (the store
    computes it); ``revision`` counts retried extractions (0 = the first). ``flushed_after`` is
    the id of the last turn the stream had fed when a flush closed the segment (None for one
    closed by a fed turn, or stored before it was kept): the flush's place in the turn log, which
    a restarted stream needs to replay its surprise history (:mod:`retrieval.ingestion.push_order`)."""

    user_id: str
    seq: int
    session_id: str
    turn_ids: tuple[str, ...]
    reason: str
    state: str = ""
    fallback: bool = False
    amu_count: int = 0
    content_sha256: str | None = None
    revision: int = 0
    flushed_after: str | None = None


class BacklogRead(NamedTuple):
    """A read of a user's ingestion backlog (:meth:`retrieval.memory.store_contract.Turns.backlog`):
    ``turns`` in log order, ``last`` the highest turn position read (where the next read starts),
    and ``unread`` the turns stored after ``last`` that the read's limit left for a later one."""

    turns: list[Turn]
    last: int
    unread: int = 0


@dataclass(frozen=True)
class Exchange:
    """A turn and, when another speaker answers it, that reply (:mod:`retrieval.ingestion.segmenter` pairs
    them)."""

    turns: tuple[Turn, ...]

    @property
    def text(self) -> str:
        return "\n".join(turn.render() for turn in self.turns)


@dataclass(frozen=True)
class Segment:
    """A finalized segment: consecutive exchanges of one session of one conversation."""

    user_id: str
    session_id: str
    seq: int
    exchanges: tuple[Exchange, ...]
    reason: str
    tokens: int

    @property
    def turns(self) -> list[Turn]:
        return [turn for exchange in self.exchanges for turn in exchange.turns]
