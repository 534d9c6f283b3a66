"""The evidence nodes on PostgreSQL (the SQLite store's :mod:`retrieval.memory.indexing`): each
record's links are written in the inserting transaction, a segment's event frame when it commits;
archiving drops a record's links by trigger (:mod:`retrieval.memory.postgres.schema`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from retrieval.memory.evidence_keys import record_nodes
from retrieval.memory.indexing import EvidenceNode, frame_label
from retrieval.memory.records import AMU

if TYPE_CHECKING:
    from retrieval.memory.postgres.database import Connection, Database


_LINK = """
WITH made AS (INSERT INTO evidence_nodes (user_id, node_type, key, text) VALUES (%s, %s, %s, %s)
              ON CONFLICT DO NOTHING RETURNING id),
     node AS (SELECT id FROM made UNION ALL
              SELECT id FROM evidence_nodes WHERE user_id = %s AND node_type = %s AND key = %s)
INSERT INTO evidence_links (user_id, node, amu) SELECT %s, id, %s FROM node LIMIT 1 ON CONFLICT DO NOTHING
"""
"""One statement per node of a record (the record's nodes go in one pipelined batch): the node made
the first time its key appears for the user (the user's lock keeps that race-free), then linked."""


def add_event_frame(conn: Connection, user_id: str, seq: int, session_id: str,
                    turn_ids: Sequence[str]) -> None:
    """The event-frame node of one finalized segment, with its session and turns (kept if it exists)."""
    conn.execute("INSERT INTO evidence_nodes (user_id, node_type, key, text, session_id, turn_ids) "
                 "VALUES (%s, 'event_frame', %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                 (user_id, str(seq), frame_label(session_id, turn_ids), session_id,
                  json.dumps(list(turn_ids))))


def index_amu(conn: Connection, position: int, amu: AMU) -> None:
    """Link the record stored at ``position`` to its evidence nodes (none for an archived one)."""
    if amu.archived:
        return
    user = amu.source.user_id
    conn.cursor().executemany(_LINK, [(user, node.node_type, node.key, node.text, user, node.node_type,
                                       node.key, user, position) for node in record_nodes(amu)])


def _node(row: Any, amu_ids: tuple[str, ...]) -> EvidenceNode:
    return EvidenceNode(row["node_type"], row["key"], row["text"], amu_ids, row["session_id"],
                        tuple(json.loads(row["turn_ids"] or "[]")))


class Evidence:
    """The read side of the evidence nodes."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def evidence_nodes(self, user_id: str, node_type: str | None = None) -> list[EvidenceNode]:
        """The user's nodes that link at least one active record, in creation order."""
        where, params = "n.user_id = %s AND NOT a.archived", [user_id]
        if node_type is not None:
            where, params = where + " AND n.node_type = %s", params + [node_type]
        rows = self.db.rows(
            "SELECT n.id, n.node_type, n.key, n.text, n.session_id, n.turn_ids, a.id AS amu "
            "FROM evidence_nodes n "
            "JOIN evidence_links l ON l.node = n.id JOIN amus a ON a.position = l.amu "
            f"WHERE {where} ORDER BY n.id, a.position", params)
        grouped: dict[int, list[Any]] = {}
        for row in rows:
            grouped.setdefault(row["id"], []).append(row)
        return [_node(group[0], tuple(r["amu"] for r in group)) for group in grouped.values()]

    def node_links(self, amu_ids: Sequence[str]) -> list[tuple[EvidenceNode, str]]:
        """(node, record id) for every evidence link of these active records, in node creation order."""
        rows = self.db.rows(
            "SELECT n.node_type, n.key, n.text, n.session_id, n.turn_ids, a.id AS amu FROM evidence_nodes n "
            "JOIN evidence_links l ON l.node = n.id JOIN amus a ON a.position = l.amu "
            "WHERE NOT a.archived AND a.id = ANY(%s) ORDER BY n.id, a.position", (list(amu_ids),))
        return [(_node(row, (row["amu"],)), row["amu"]) for row in rows]
