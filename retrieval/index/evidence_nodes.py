"""The search side of the structured evidence nodes (LycheeMemory section 3.4, Algorithm B.2 line 8;
docs/design.md §7.1): which node types semantic search matches and the text it embeds for a node.
The nodes themselves (keys, normalisation) are :mod:`retrieval.memory.evidence_keys`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from retrieval.memory.evidence_keys import record_nodes
from retrieval.memory.records import AMU

SEARCHABLE_TYPES = ("entity", "topic", "event_frame")
"""Node types matched by semantic search (Algorithm B.2 line 8); temporal nodes are filtered.
Entity-topic nodes are matched by key only (the plan's entity x topic pairs): this project's
choice, against line 8, for cost. Their text is an entity and a tag whose own nodes are already
searched, they are 63% of all nodes (2,961 of 4,668 on the LoCoMo dev conversations), and
searching them too needed 6,317 instead of 3,356 embeddings to build the dev memory and several
times the query latency (49 against 8 ms median), for no recall on the dev file (82.6 / 84.1
with them against 83.1 / 84.7 without, multi / multi+code)."""

EVENT_FRAME_CHARS = 2000
"""The searchable text of an event frame is its records' texts, cut at this many characters."""


def searchable_text(node_type: str, text: str, member_texts: Iterable[str]) -> str:
    """What semantic node search embeds: the key's spelling, or an event frame's record texts
    (``member_texts`` is read only for an event frame)."""
    if node_type == "event_frame":
        return " ".join(member_texts)[:EVENT_FRAME_CHARS] or text
    return text


def segment_search_texts(amus: Sequence[AMU]) -> list[str]:
    """The searchable texts of the nodes one segment's records link to (its event frame included),
    without repeats: what ingestion embeds so that retrieval finds them cached."""
    texts = [node.text for amu in amus for node in record_nodes(amu)
             if node.node_type in SEARCHABLE_TYPES and node.node_type != "event_frame"]
    if any(amu.source.segment is not None for amu in amus):
        texts.append(searchable_text("event_frame", "", [amu.text for amu in amus]))
    return list(dict.fromkeys(text for text in texts if text))
