"""The texts a purge also forgets, because their cached vectors hold the purged words: the
records' evidence-node texts, every state of a touched event frame, the segments' search texts."""

from __future__ import annotations

from datetime import datetime

from retrieval.api.purge import derived_texts
from retrieval.index.evidence_nodes import searchable_text, segment_search_texts
from retrieval.memory.purge import Purged
from retrieval.memory.records import AMU, SourcePointer

WHEN = datetime(2023, 5, 8, 10, 0)
MERGED = AMU(
    "u:m",
    "[2023-05-01 to 2023-05-08] Ann went to the Zorblax support group on 7 May 2023.",
    "event",
    SourcePointer("u", "s", ("t1",), ("Ann",), 3),
    entities=("Ann", "Zorblax"),
    tags=("support",),
)


def test_evidence_node_texts_are_forgotten():
    """The purged records' evidence nodes' search texts are derived texts."""
    assert "Zorblax support" in derived_texts(Purged(amus=[MERGED], node_texts=["Zorblax support"]), [])


def test_every_state_of_a_touched_event_frame_is_forgotten():
    """The event frame's search text at each point of its history (as a search snapshot
    embedded it) is a derived text."""
    members = ["Ann went to the Zorblax support group.", "Ann liked it."]
    texts = derived_texts(Purged(amus=[MERGED], frames=[members]), [])
    assert searchable_text("event_frame", "", members) in texts


def test_the_segment_search_texts_of_purged_records_are_forgotten():
    """The search texts built from a purged segment's records (segment_search_texts) are
    derived texts."""
    wanted = segment_search_texts([MERGED])
    assert wanted and set(wanted) <= set(derived_texts(Purged(amus=[MERGED]), []))
