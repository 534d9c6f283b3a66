"""Adding a whole recorded conversation through the memory API (the ingest command line and the
evaluation): the conversation is a user, each session is added in one :meth:`Memory.add` call
and then flushed (a recorded session is complete; the flush processes the session's turns, so
a session's exchanges are embedded in one call and its segments close before the next session
is added, as the batch pipeline does). A rerun adds nothing: stored turn ids replay.
The cost comes back as :class:`retrieval.ingestion.pipeline.IngestStats` (construction ledger, summary).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from tqdm.auto import tqdm

from retrieval.api.memory import Memory
from retrieval.ingestion.pipeline import IngestStats
from retrieval.ingestion.segmenter import pair_exchanges
from retrieval.memory.records import Turn


def add_conversation(memory: Memory, turns: Sequence[Turn], *, progress: bool = False,
                     stats: IngestStats | None = None) -> IngestStats:
    """Add the turns of one or more conversations (each its own user), session by session, with a
    progress bar of turns when ``progress``; the cost is counted into ``stats`` (a new one when
    None) as it is spent, so a caller stopped half-way (Ctrl-C) still has what its committed
    segments cost."""
    started = time.perf_counter()
    extractor, counted = memory.models.extractor, memory.extraction
    usage_before = dataclasses.replace(extractor.usage)
    users = {turn.user_id for turn in turns}
    fallbacks_before, unresolved_before = counted.counts(users)
    stats = IngestStats() if stats is None else stats
    sessions: dict[tuple[str, str], list[Turn]] = {}
    for turn in turns:
        sessions.setdefault((turn.user_id, turn.session_id), []).append(turn)
    stats.conversations = len({user for user, _ in sessions})
    stored_before = sum(len(memory.store.segments(user)) for user in users)  # an earlier run's
    stats.segments += stored_before
    stats.resumed_segments += stored_before
    bar = tqdm(total=len(turns), unit="turn", disable=not progress)
    try:
        for (user, session_id), session_turns in sessions.items():
            first_seq, first_count = memory.store.next_seq(user), memory.store.count(user)
            try:
                added = memory.add(session_turns, user_id=user, session_id=session_id)
                memory.flush(user_id=user, session_id=session_id)
            finally:  # the worker's segments and the flush's, those of a session stopped half-way too
                stats.amus += memory.store.count(user) - first_count
                stats.segments += memory.store.next_seq(user) - first_seq
            stats.sessions += 1
            stored = set(added.turn_ids)
            stats.turns += len(stored)
            stats.exchanges += len(pair_exchanges([t for t in session_turns if t.turn_id in stored],
                                                  memory.segmenter.pair_turns))
            bar.update(len(session_turns))
    finally:
        bar.close()
        fallbacks, unresolved = counted.counts(users)
        stats.fallback_segments = fallbacks - fallbacks_before
        stats.unresolved_dates = unresolved - unresolved_before
        stats.llm = extractor.usage.since(usage_before)
        stats.wall_s = time.perf_counter() - started
    return stats
