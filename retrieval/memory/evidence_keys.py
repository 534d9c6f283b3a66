"""The evidence nodes of a record (LycheeMemory section 3.4, appendix C.3, Table 13;
docs/design.md §7.1): which ``node_type:key`` nodes a record links to, and how keys are normalised.

Five node types: ``entity`` (one per entity), ``topic`` (one per topic tag), ``entity_topic``
(one per co-occurring entity x tag pair), ``temporal`` (day keys ``YYYY-MM-DD`` and month keys
``YYYY-MM`` of the record's temporal scope) and ``event_frame`` (the finalized segment the
record came from, key = its sequence number). Keys are normalised as Table 13 says (case
folding, separator normalisation, punctuation clean-up, repeated whitespace merged), so nodes
whose keys normalise alike merge: "LGBTQ" and "lgbtq" are one entity node. Everything here is
derived from record metadata: no LLM call, no model. The store
maintains the nodes inside its write transactions (:mod:`retrieval.memory.indexing`); the
search side is :mod:`retrieval.index.evidence_nodes`.
"""


from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from retrieval.memory.records import AMU, MAX_NAME_CHARS
from retrieval.memory.scripts import MARKS
from retrieval.memory.times import time_interval

PAIR_SEPARATOR = "|"
"""Joins the entity and topic keys of an entity-topic node (normalisation never leaves one)."""

MAX_DAY_KEYS = 14
"""A time value spanning more days than this gets month keys only: a month value is month-level
(Table 13's two levels), and a year is not 365 day nodes; a week gets its seven day keys."""

MAX_MONTH_KEYS = 24
"""At most this many month keys per time value (an open decade is not 120 month nodes)."""

_SEPARATORS = re.compile(r"[\s_\-–—/\\|.·•:;,+&]+")
_PUNCTUATION = re.compile(rf"[^\w\s{MARKS}]")  # a combining mark is part of its letter


def normalise_key(text: str) -> str:
    """Table 13's normalisation: Unicode NFKC and case folding, separators (``_ - / . : ; , + &``
    and dashes) to spaces, remaining punctuation removed, repeated whitespace merged.
    ``"  LGBTQ+ Support-Group "`` -> ``"lgbtq support group"``; '' for punctuation only."""
    folded = unicodedata.normalize("NFKC", text).casefold().replace("’", "'")
    folded = re.sub(r"'s\b", "", folded)  # possessive: "Caroline's" is Caroline
    return " ".join(_PUNCTUATION.sub("", _SEPARATORS.sub(" ", folded)).split())


def node_id(node_type: str, key: str) -> str:
    """The ``node_type:key`` name of a node."""
    return f"{node_type}:{key}"


@dataclass(frozen=True)
class NodeRef:
    """One node a record links to: type, normalised key and a searchable text (the record's
    spelling of the entity or tag; the key itself for temporal nodes; '' for event frames,
    whose text is that of their records)."""

    node_type: str
    key: str
    text: str

    @property
    def name(self) -> str:
        return node_id(self.node_type, self.key)


def _normalised(values: Iterable[str], longest: int | None) -> dict[str, str]:
    """normalised key -> first spelling, first occurrence kept; empty keys dropped, and keys longer
    than ``longest`` (normalising may lengthen a name: NFKC spells out ligatures)."""
    keys: dict[str, str] = {}
    for value in values:
        key = normalise_key(value)
        if key and (longest is None or len(key) <= longest) and key not in keys:
            keys[key] = value.strip()
    return keys


def temporal_values(amu: AMU) -> list[str]:
    """The time values that key a record's temporal nodes: ``t_ref``, ``valid_from`` and
    ``valid_to`` (Table 13); a record without any (written before schema 3) falls back to its
    first timestamp, else the day it was stated."""
    values = [value for value in (amu.t_ref, amu.valid_from, amu.valid_to) if value]
    if values:
        return values
    if amu.timestamps:
        return [amu.timestamps[0]]
    return [amu.observed_at[:10]] if amu.observed_at else []


def temporal_keys(values: Sequence[str]) -> list[str]:
    """Day keys (``YYYY-MM-DD``) of every day a value covers, when it covers at most
    :data:`MAX_DAY_KEYS` days, and month keys (``YYYY-MM``) of every month it touches (at most
    :data:`MAX_MONTH_KEYS`); in order, without repeats."""
    keys: dict[str, None] = {}
    for value in values:
        start, end = time_interval(value)
        first, last = start.date(), end.date()
        days = (last - first).days  # days covered - 1; no date past `last` is formed (9999-12-31)
        if days < MAX_DAY_KEYS:
            keys.update(((first + timedelta(days=n)).isoformat(), None) for n in range(days + 1))
        first_month, last_month = first.year * 12 + first.month - 1, last.year * 12 + last.month - 1
        for index in range(first_month, min(last_month + 1, first_month + MAX_MONTH_KEYS)):
            keys[f"{index // 12:04d}-{index % 12 + 1:02d}"] = None  # four-digit years, as ISO values
    return list(keys)


def record_nodes(amu: AMU, longest: int | None = MAX_NAME_CHARS) -> list[NodeRef]:
    """Every node ``amu`` links to, without repeats: entities, topics, entity-topic pairs,
    temporal keys and the event frame of its segment (when it has one). An entity or topic key
    longer than ``longest`` keys no node (None: every key, as a store written before the bound
    may hold)."""
    entities, topics = _normalised(amu.entities, longest), _normalised(amu.tags, longest)
    nodes = [NodeRef("entity", key, text) for key, text in entities.items()]
    nodes += [NodeRef("topic", key, text) for key, text in topics.items()]
    nodes += [NodeRef("entity_topic", f"{entity}{PAIR_SEPARATOR}{topic}",
                      f"{entities[entity]} {topics[topic]}")
              for entity in entities for topic in topics if entity != topic]
    nodes += [NodeRef("temporal", key, key) for key in temporal_keys(temporal_values(amu))]
    if amu.source.segment is not None:
        nodes.append(NodeRef("event_frame", str(amu.source.segment), ""))
    return nodes


def node_text(amu: AMU, node_type: str, key: str) -> str | None:
    """The text ``amu`` gives its node ``node_type:key`` (a node keeps the text of the first record
    that linked it: "Jon DeLuca" or "Jon Deluca" for the key ``jon deluca``); None if it has none.
    Any key is looked up, however long: a store written before :data:`MAX_NAME_CHARS` holds some."""
    return next((node.text for node in record_nodes(amu, longest=None)
                 if (node.node_type, node.key) == (node_type, key)), None)
