"""The store's structured evidence indexes (schema 3; LycheeMemory section 3.4, Table 13;
docs/design.md §7.1): their maintenance inside the store's write transactions and their reads.

Writes. Every AMU the store inserts goes through :func:`index_amu` in the same transaction
(:func:`retrieval.memory.record_writes.insert_amu`, the one insert path of ingestion, retried
extraction and consolidation): it links the AMU to its evidence nodes
(:func:`retrieval.memory.evidence_keys.record_nodes`), creating a node the first time its
``node_type:key`` appears for the user (repeated nodes merge). A committed segment first gets
its event-frame node with its session and full turn range (:func:`add_event_frame`). The FTS5
rows follow by SQL triggers (:mod:`retrieval.memory.schema`), and so does archiving: an archived
AMU leaves ``amu_fts`` and its node links in the archiving transaction, so no index ever returns
it. No LLM call, no model.

Reads (:class:`EvidenceReads`, a part of the store): a conversation's nodes with their active
AMUs, and FTS5 ``bm25()`` search over a conversation's active AMUs.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from retrieval.memory.evidence_keys import node_id, record_nodes
from retrieval.memory.in_chunks import in_chunks
from retrieval.memory.reads import AMU_COLUMNS, USER_POSITIONS, amu_from_row, json_lists
from retrieval.memory.records import AMU
from retrieval.memory.sqlite_part import SQLitePart


def frame_label(session_id: str, turn_ids: Sequence[str]) -> str:
    """An event frame's own text: its session and turn range."""
    return f"{session_id} {turn_ids[0]}..{turn_ids[-1]}" if turn_ids else session_id


def add_event_frame(db: sqlite3.Connection, user_id: str, seq: int, session_id: str,
                    turn_ids: Sequence[str]) -> None:
    """The event-frame node of one finalized segment, with its session and turns (kept if it exists)."""
    label = frame_label(session_id, turn_ids)
    db.execute("INSERT OR IGNORE INTO evidence_nodes (conversation_id, node_type, key, text, session_id, "
               "turn_ids) VALUES (?, 'event_frame', ?, ?, ?, ?)",
               (user_id, str(seq), label, session_id, json.dumps(list(turn_ids))))


def index_amu(db: sqlite3.Connection, position: int, amu: AMU) -> None:
    """Link the AMU stored at ``position`` to its evidence nodes (none for an archived AMU)."""
    if amu.archived:
        return
    src = amu.source
    for node in record_nodes(amu):
        db.execute("INSERT OR IGNORE INTO evidence_nodes (conversation_id, node_type, key, text) "
                   "VALUES (?, ?, ?, ?)",
                   (src.user_id, node.node_type, node.key, node.text))
        (node_row,) = db.execute("SELECT id FROM evidence_nodes WHERE conversation_id = ? AND node_type = ? "
                                 "AND key = ?", (src.user_id, node.node_type, node.key)).fetchone()
        db.execute("INSERT OR IGNORE INTO evidence_links (node, amu) VALUES (?, ?)", (node_row, position))


def backfill(db: sqlite3.Connection) -> None:
    """Build the evidence indexes of the AMUs stored before schema 3 (the migration's last step)."""
    for user_id, seq, session_id, turn_ids in db.execute(
            "SELECT conversation_id, seq, session_id, turn_ids FROM segments ORDER BY rowid").fetchall():
        add_event_frame(db, user_id, seq, session_id, json.loads(turn_ids))
    for row in db.execute(f"SELECT position, {AMU_COLUMNS} FROM amus WHERE archived = 0 "
                          "ORDER BY position").fetchall():
        index_amu(db, row["position"], amu_from_row(row))
    db.execute("INSERT INTO amu_fts (rowid, text, entities, topics) SELECT position, text, "
               "(SELECT group_concat(value, ' ') FROM json_each(amus.entities)), "
               "(SELECT group_concat(value, ' ') FROM json_each(amus.tags)) FROM amus WHERE archived = 0")


@dataclass(frozen=True)
class EvidenceNode:
    """A node with the ids of its active AMUs (store order). Event frames also carry their
    session and turn range."""

    node_type: str
    key: str
    text: str
    amu_ids: tuple[str, ...]
    session_id: str | None = None
    turn_ids: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """``node_type:key``."""
        return node_id(self.node_type, self.key)


class EvidenceReads(SQLitePart):
    """The read side of the evidence indexes (a part of :class:`retrieval.memory.store.AMUStore`)."""


    def evidence_nodes(self, user_id: str, node_type: str | None = None) -> list[EvidenceNode]:
        """The conversation's nodes that link at least one active AMU, in creation order, each
        with its AMUs in store order: the nodes and the links are read apart (a joined row per
        link would repeat its node's columns) and grouped here (:func:`grouped_links`). The links
        are read AMU by AMU in position order (:data:`USER_POSITIONS`: no link is sorted)."""
        where, params = "conversation_id = ?", [user_id]
        if node_type is not None:
            where, params = where + " AND node_type = ?", params + [node_type]
        nodes = self._db.execute("SELECT id, node_type, key, text, session_id, turn_ids FROM evidence_nodes "
                                 f"WHERE {where} ORDER BY id", params).fetchall()
        links = self._db.execute(
            "SELECT l.node, a.id FROM amus a JOIN evidence_links l ON l.amu = a.position "
            f"WHERE a.{USER_POSITIONS} AND a.archived = 0 ORDER BY a.position",
            [user_id]).fetchall()
        members = grouped_links([row[0] for row in nodes], links)
        linked = [(row, amus) for row, amus in zip(nodes, members, strict=True) if amus]
        turn_ids = json_lists([row[5] or "[]" for row, _ in linked])
        return [EvidenceNode(row[1], row[2], row[3], amus, row[4], tuple(turns))
                for (row, amus), turns in zip(linked, turn_ids, strict=True)]

    def node_links(self, amu_ids: Sequence[str]) -> list[tuple[EvidenceNode, str]]:
        """(node, AMU id) for every evidence link of these active AMUs, in node creation order: what
        a cached search snapshot adds when a segment commits (the node carries only that AMU)."""
        found: list[tuple[EvidenceNode, str]] = []
        for marks, chunk in in_chunks(amu_ids):
            rows = self._db.execute(
                "SELECT n.node_type, n.key, n.text, n.session_id, n.turn_ids, a.id AS amu "
                "FROM evidence_nodes n JOIN evidence_links l ON l.node = n.id JOIN amus a "
                f"ON a.position = l.amu WHERE a.archived = 0 AND a.id IN ({marks}) "
                "ORDER BY n.id, a.position",
                chunk).fetchall()
            found += [(EvidenceNode(row["node_type"], row["key"], row["text"], (row["amu"],),
                                    row["session_id"],
                                    tuple(json.loads(row["turn_ids"] or "[]"))), row["amu"]) for row in rows]
        return found


def grouped_links(nodes: Sequence[int], links: Sequence[Sequence[Any]]) -> list[tuple[str, ...]]:
    """Per node id of ``nodes``, the AMU ids its ``links`` rows (node id, AMU id) name, in the
    rows' order: the rows are sorted by node in one stable sort, not appended to one list each."""
    if not links:
        return [() for _ in nodes]
    node_column, amu_column = zip(*links, strict=True)
    linked = np.fromiter(node_column, dtype=np.int64, count=len(node_column))
    order = np.argsort(linked, kind="stable")
    amus = list(map(amu_column.__getitem__, order.tolist()))
    by_node, wanted = linked[order], np.asarray(nodes, dtype=np.int64)
    starts = np.searchsorted(by_node, wanted, side="left").tolist()
    ends = np.searchsorted(by_node, wanted, side="right").tolist()
    return [tuple(amus[start:end]) for start, end in zip(starts, ends, strict=True)]
