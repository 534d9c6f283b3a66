"""Extraction through an OpenAI-compatible chat endpoint (LycheeMemory C.2, Table 11)."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from jsonschema import Draft202012Validator

from retrieval.extract.base import (
    DISAMBIGUATION_CHARS,
    Extraction,
    ReferenceContext,
    make_amu,
    raw_turn_amus,
    session_time,
)
from retrieval.llm_client import InvalidResponse, LLMRole, json_answer, one_line
from retrieval.memory.records import (
    MAX_WRITTEN_KEYS,
    MEMORY_TYPES,
    AMUValidationError,
    Segment,
    Turn,
    written_limit,
)

logger = logging.getLogger(__name__)


_SCOPE = ("t_ref", "valid_from", "valid_to")
"""The temporal scope of a record (Table 12), optional in the answer."""
MAX_RECORDS_PER_TURN = 8
"""The most records an answer may write per turn of its segment (with at most
:data:`retrieval.memory.records.MAX_WRITTEN_KEYS` entities, tags and timestamps each): an answer
past either bound is unusable, and retried like any other."""
_ISO_TIME = r"^\d{4}(-W\d{2}|-\d{2}(-\d{2}([T ][0-9:.]+([+-]\d{2}:?\d{2}|Z)?)?)?)?(/.+)?$"

SYSTEM_PROMPT = f"""You turn one segment of a dialogue into atomic memory records.
Each record states one self-contained fact that can be understood without the dialogue:
- replace pronouns, nicknames and elliptical mentions with canonical names;
- rewrite relative dates and times (yesterday, last week, next month, ...) as absolute dates, using
  the session date;
- keep names, numbers, places and dates exact; cover every informative turn, skip pure greetings.
Return only a JSON object, without markdown fences:
{{"records": [{{"text": "...", "memory_type": "...", "entities": ["..."], "tags": ["..."],
  "timestamps": ["..."], "t_ref": "...", "valid_from": null, "valid_to": null, "turn_ids": ["..."]}}],
 "disambiguation": "..."}}
memory_type is one of: {", ".join(MEMORY_TYPES)}.
entities: canonical names of people, places, organisations and things; tags: short topic tags.
timestamps: ISO 8601 values of the times the fact refers to (YYYY, YYYY-MM, YYYY-MM-DD, YYYY-Www or
an interval A/B); empty when none. t_ref: the one time the fact refers to (the event time, else the
session date); valid_from / valid_to: when the fact starts / stops holding, or null.
turn_ids: the ids of the turns the fact comes from.
At most {MAX_RECORDS_PER_TURN} records per turn of the segment, and at most {MAX_WRITTEN_KEYS} entities, tags
and timestamps each per record.
disambiguation: at most {DISAMBIGUATION_CHARS} characters of notes for later segments (canonical \
names, aliases,
what pronouns refer to). The reference context is read-only background: extract nothing from it."""


class LLMExtractor(LLMRole):
    """Extraction through an OpenAI-compatible endpoint (:class:`ChatClient`; the keyword
    options are its options). Temperature 0 and a raw JSON object answer (Table 11).

    Each response is checked against a per-segment JSON schema (record fields, memory types,
    turn ids of this segment) and turned into AMUs; invalid JSON and schema violations are
    retried like HTTP errors, and only validated responses are cached. When retries are
    exhausted the segment becomes raw-turn AMUs and ``usage.fallback_segments`` counts it.
    """

    @property
    def endpoint(self) -> str:
        return self.client.endpoint

    @property
    def api_key(self) -> str | None:
        return self.client.api_key

    def extract(self, segment: Segment, context: ReferenceContext) -> Extraction:
        validator = Draft202012Validator(self._schema(segment))
        extraction = self.client.complete(self.messages(segment, context),
                                          lambda content: self._parse(content, segment, validator),
                                          label=f"segment {segment.user_id}/{segment.seq}",
                                          user=segment.user_id)
        if extraction is not None:
            return extraction
        self.client.count(segment.user_id, fallback_segments=1)  # the user's tally too
        logger.warning("segment %s/%d kept as raw turns after %d attempts",
                       segment.user_id, segment.seq, self.client.max_retries + 1)
        return Extraction(raw_turn_amus(segment), state=context.disambiguation, fallback=True)

    def messages(self, segment: Segment, context: ReferenceContext) -> list[dict[str, str]]:
        """The chat messages for one segment (system instructions, then date, context, turns). A
        turn said on another day than the session date (past midnight, out of order) carries its
        own time, "(said ...)", to resolve its relative dates against; the others carry none, so
        the prompts of segments within one day are what they were."""
        when = session_time(segment)
        lines = [f"Session date: {when:%A, %d %B %Y, %H:%M}" if when else "Session date: unknown"]
        if context.participants:
            lines.append("Participants: " + ", ".join(context.participants))
        reference = context.render()
        if reference:
            lines += ["", "Reference context (read-only):", reference]
        lines += ["", "Segment turns:"]
        lines += [f"[{turn.turn_id}]{_said(turn, when)} {one_line(turn.render())}" for turn in segment.turns]
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n".join(lines)}]

    @staticmethod
    def _schema(segment: Segment) -> dict[str, Any]:
        strings = {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": MAX_WRITTEN_KEYS}
        record = {
            "type": "object",
            "required": ["text", "memory_type", "turn_ids"],
            "properties": {
                "text": {"type": "string", "minLength": 1,
                         "maxLength": written_limit(turn.render() for turn in segment.turns)},
                "memory_type": {"enum": list(MEMORY_TYPES)},
                "entities": strings,
                "tags": strings,
                "timestamps": {"type": "array", "items": {"type": "string", "pattern": _ISO_TIME},
                               "maxItems": MAX_WRITTEN_KEYS},
                **{field: {"type": ["string", "null"], "pattern": _ISO_TIME} for field in _SCOPE},
                "turn_ids": {"type": "array", "minItems": 1,
                             "items": {"enum": [turn.turn_id for turn in segment.turns]}},
            },
        }
        return {
            "type": "object",
            "required": ["records"],
            "properties": {"records": {"type": "array", "items": record,
                                       "maxItems": MAX_RECORDS_PER_TURN * len(segment.turns)},
                           "disambiguation": {"type": "string"}},
        }

    @staticmethod
    def _parse(content: str, segment: Segment, validator: Draft202012Validator) -> Extraction:
        answer = json_answer(content, validator)
        by_id = {turn.turn_id: turn for turn in segment.turns}
        try:
            amus = [
                make_amu(segment, index, record["text"].strip(), record["memory_type"],
                          [by_id[turn_id] for turn_id in dict.fromkeys(record["turn_ids"])],
                          timestamps=record.get("timestamps", []), entities=record.get("entities", []),
                          tags=record.get("tags", []), **{field: record.get(field) for field in _SCOPE})
                for index, record in enumerate(answer["records"])
            ]
        except AMUValidationError as err:
            raise InvalidResponse(f"a record's {err.field!r} is not a valid value") from None
        # the note as later segments see it: a longer one would be stored whole with the segment
        return Extraction(amus, state=answer.get("disambiguation", "")[:DISAMBIGUATION_CHARS])


def _said(turn: Turn, session: datetime | None) -> str:
    """`` (said <its time>)`` for a turn said on another day than ``session``, else nothing."""
    local = turn.local_time
    if local is None or session is None or local.date() == session.date():
        return ""
    return f" (said {local:%A, %d %B %Y, %H:%M})"
