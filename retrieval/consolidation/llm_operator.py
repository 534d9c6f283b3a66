"""The LLM operator: one call per gated cluster chooses AGGREGATE, MERGE, UPDATE or KEEP and
writes the compact AMU (MemCode key design 4), through the project's one client
(:class:`retrieval.llm_client.ChatClient`: retries, response cache, token accounting).

The answer is a JSON object validated against :data:`ANSWER_SCHEMA` (and its event times against
:func:`retrieval.memory.times.time_interval`); an invalid answer is retried like an HTTP error
and never cached. The prompt lists the members oldest first with their statement time, speaker,
memory type and event times, so the same cluster always makes the same request (a rerun is
served from the cache). Without a usable answer after the retries, the cluster is left as it is
and a later run asks again.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from jsonschema import Draft202012Validator

from retrieval.consolidation.config import LLM_THRESHOLD
from retrieval.consolidation.members import Member
from retrieval.consolidation.operations import Draft, Operation, keep_newest, union
from retrieval.consolidation.prefix import strip_prefix
from retrieval.llm_client import InvalidResponse, LLMRole, json_answer, one_line
from retrieval.memory.records import MAX_WRITTEN_KEYS, MEMORY_TYPES, written_limit
from retrieval.memory.times import time_interval

_STRINGS = {"type": "array", "items": {"type": "string", "minLength": 1, "pattern": r"\S"}}
ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["operation"],
    "properties": {
        "operation": {"enum": [operation.value for operation in Operation]},
        "text": {"type": "string"},
        "memory_type": {"enum": list(MEMORY_TYPES)},
        "entities": _STRINGS,
        "tags": _STRINGS,
        "timestamps": _STRINGS,
    },
    "if": {"properties": {"operation": {"const": Operation.KEEP.value}}},
    "then": {},
    "else": {"required": ["text", "memory_type"], "properties": {"text": {"minLength": 1, "pattern": r"\S"}}},
}
"""What the endpoint must answer (the text and type are required unless the answer is KEEP)."""
_VALIDATOR = Draft202012Validator(ANSWER_SCHEMA)

SYSTEM_PROMPT = f"""You consolidate the long-term memory of a dialogue agent. You get a cluster of memory
records stated by the same speaker, close in time and similar in meaning, oldest first. Choose one operation:
- MERGE: the records state the same fact (duplicates, paraphrases): write it once.
- UPDATE: a newer record changes a state an older one describes (a plan that happened, a changed
  preference, a new job): write the current state; keep the earlier one only if it still matters.
- AGGREGATE: distinct but related facts about one topic: write one compact record that keeps every
  name, number, place and date.
- KEEP: the records are unrelated, or combining them would lose information: change nothing.
The text must be self-contained (canonical names, no pronouns, absolute dates as the records give them);
never invent facts; keep the exact dates of events.
Return only a JSON object, without markdown fences:
{{"operation": "MERGE", "text": "...", "memory_type": "...", "entities": ["..."], "tags": ["..."],
 "timestamps": ["..."]}}
For KEEP, return {{"operation": "KEEP"}}. memory_type is one of: {", ".join(MEMORY_TYPES)}.
entities: canonical names of people, places, organisations and things; tags: short topic tags;
timestamps: ISO 8601 values (YYYY, YYYY-MM, YYYY-MM-DD, YYYY-Www or an interval A/B) of the times the
new record refers to; empty when none. Add at most {MAX_WRITTEN_KEYS} entities, tags or timestamps each to
those the records have."""


class LLMOperator(LLMRole):
    """Consolidation through an OpenAI-compatible endpoint (:class:`ChatClient`; the keyword
    options are its options: ``cache_dir``, ``max_retries``, ...). Temperature 0, JSON answers."""

    default_threshold = LLM_THRESHOLD

    def decide(self, cluster: Sequence[Member]) -> list[Draft] | None:
        ordered = sorted(cluster, key=lambda m: m.last or datetime.min)  # stable: store order within a time
        answer = self.client.complete(self.messages(ordered), lambda content: _parse(content, ordered),
                                      label=f"cluster {ordered[0].id} (+{len(ordered) - 1})",
                                      user=ordered[0].amu.source.user_id)
        return None if answer is None else [answer] if answer.operation != Operation.KEEP else []

    @staticmethod
    def messages(ordered: Sequence[Member]) -> list[dict[str, str]]:
        """The chat messages for one cluster (its members oldest first)."""
        lines = ["Records (oldest first):"]
        for number, member in enumerate(ordered, start=1):
            amu = member.amu
            when = f"{member.last:%Y-%m-%d %H:%M}" if member.last else "an unknown time"
            events = ", ".join(amu.timestamps) or "none"
            speakers = ", ".join(amu.source.speakers) or "unknown"
            lines += [f"[{number}] stated {when} by {speakers} (type {amu.memory_type}; "
                      f"event times {events})",
                      one_line(amu.text)]
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n".join(lines)}]


def _parse(content: str, ordered: Sequence[Member]) -> Draft:
    """The draft an answer describes; :class:`InvalidResponse` for anything unusable."""
    answer = json_answer(content, _VALIDATOR)
    operation = Operation(answer["operation"])
    if operation == Operation.KEEP:
        return Draft(operation, (), "", "fact")
    for field in ("entities", "tags", "timestamps"):
        held = len({value for member in ordered for value in getattr(member.amu, field)})
        if len(answer.get(field, ())) > held + MAX_WRITTEN_KEYS:
            raise InvalidResponse(f"{field}: {len(answer[field])} values, more than the {held} its members "
                                  f"have and {MAX_WRITTEN_KEYS} more")
    for value in answer.get("timestamps", []):
        try:
            time_interval(value)
        except ValueError:
            raise InvalidResponse("timestamps: a value is not an ISO 8601 time value") from None
    text = answer["text"].strip()
    if not strip_prefix(text).strip():
        raise InvalidResponse("text: nothing but a time prefix")
    limit = written_limit(member.amu.text for member in ordered)
    if len(text) > limit:
        raise InvalidResponse(f"text: {len(text)} characters, more than the {limit} its members allow")
    base = keep_newest(operation, ordered)  # the newest statement's scope for MERGE and UPDATE
    scope = ((None, None, None) if operation == Operation.AGGREGATE
             else (base.t_ref, base.valid_from, base.valid_to))
    return Draft(operation, base.member_ids, text, answer["memory_type"],
                 union([answer.get("entities", base.entities)]), union([answer.get("tags", base.tags)]),
                 union([answer.get("timestamps", base.timestamps)]), *scope)
