"""When a user's stream pushed each exchange into its segmenter, read back from the turn log: a
stream restarted with open segments in several sessions replays its surprise history in the
order the stream that never stopped built it (docs/design.md §5.2).

The worker feeds a user's turns in log order, and an exchange is pushed when the turn that
completes it is fed: a paired exchange at its reply, a lone turn at the next turn of its session
(the speaker did not change) or, the last turn before a flush, at that flush. Every surprise
value belongs to the push of one exchange, so the value's *key* is the log index of that
completing turn; a flush's push is keyed just after the last turn the stream had fed when it
came, which the segments the flush closed keep (``SegmentRecord.flushed_after``). A segment stored
before that was kept, or whose ``flushed_after`` turn a purge removed, has its flush keyed just
after its own last turn: exact unless turns of other sessions were fed between that turn and the
flush, or the flush's push closed the segment at its length or exchange limit and the session was
added to again. With ``SegmenterConfig.pair_turns`` off every turn is an exchange, pushed as it is
fed: its key is its own log index.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from retrieval.ingestion.segmenter import CUTS, SESSION_FLUSH, pair_exchanges
from retrieval.memory.records import Exchange, SegmentRecord, Turn

Keyed = tuple[SegmentRecord, list[Exchange], list[float]]
"""A closed segment with its exchanges and the keys of their pushes (:meth:`PushOrder.keyed`)."""


class PushOrder:
    """The keys of a user's pushes, from its stored ``turns`` (in log order) and ``segments`` (in
    the order they closed)."""

    def __init__(self, turns: Sequence[Turn], segments: Sequence[SegmentRecord], pair_turns: bool) -> None:
        self.pair_turns = pair_turns
        self.turns = {turn.turn_id: turn for turn in turns}
        self.index = {turn.turn_id: at for at, turn in enumerate(turns)}
        self.following: dict[str, str] = {}
        last: dict[str, str] = {}
        for turn in turns:
            if turn.session_id in last:
                self.following[last[turn.session_id]] = turn.turn_id
            last[turn.session_id] = turn.turn_id
        covered = {turn_id for record in segments for turn_id in record.turn_ids}
        self.open_at = {turn_id: at for turn_id, at in self.index.items() if turn_id not in covered}
        """The log index of each turn no segment covers: once all are fed, every later push comes
        after every value the log held (:meth:`fed_key`)."""
        self.first_open = min(self.open_at.values(), default=math.inf)
        """The index of the first turn no segment covers: every value keyed below it was in the
        history before any open exchange was pushed."""
        self.last_covered = max((at for turn_id, at in self.index.items() if turn_id in covered), default=-1)
        """The index of the last turn a segment covers (-1: none), which every stream fed."""

    def key(self, exchange: Exchange, flush: float | None = None) -> float:
        """The key of the push of ``exchange`` (``flush``: the key of the flush that closed its
        segment, which pushed it if it is a lone turn whose session's next turn came after the
        flush); a turn not in the log read is fed after every key."""
        own = exchange.turns[-1].turn_id
        if own not in self.index:
            return math.inf
        if len(exchange.turns) == 2 or not self.pair_turns:
            return float(self.index[own])
        following = self.following.get(own)
        if flush is not None and (following is None or self.index[following] > flush):
            return flush
        return self.index[own] + 0.5 if following is None else float(self.index[following])

    def flush_key(self, record: SegmentRecord) -> float | None:
        """The key of the push of the flush that closed the segment (just after the turn it
        names, or, where that is not known, after the segment's own last turn); None when no
        flush closed it."""
        if record.flushed_after in self.index:
            return self.index[record.flushed_after] + 0.5
        stored = [turn_id for turn_id in record.turn_ids if turn_id in self.turns]
        if record.reason != SESSION_FLUSH or not stored:
            return None
        return self.index[stored[-1]] + 0.5

    def fed_key(self, exchange: Exchange) -> float:
        """The key of a push the restarted stream makes now: :meth:`key`, except for a lone turn
        whose next turn the log read does not hold: a turn stored since (or a flush) pushes it,
        after every key."""
        own = exchange.turns[-1].turn_id
        if self.pair_turns and len(exchange.turns) == 1 and own in self.index and own not in self.following:
            return math.inf
        return self.key(exchange)

    def keyed(self, record: SegmentRecord) -> Keyed:
        """A closed segment's exchanges (its turns purged since left out) and the keys of their
        pushes (its last, alone at a flush, may have been the flush's)."""
        stored = [self.turns[turn_id] for turn_id in record.turn_ids if turn_id in self.turns]
        exchanges = pair_exchanges(stored, self.pair_turns)
        flush = self.flush_key(record)
        return record, exchanges, [self.key(exchange, flush if at == len(exchanges) - 1 else None)
                                   for at, exchange in enumerate(exchanges)]

    def closed_by(self, record: SegmentRecord, keys: Sequence[float]) -> float:
        """A bound on the key of the push that closed the segment: its session's next exchange
        (a cut), its flush, or, at the latest, just after its last turn (a full segment)."""
        stored = [t for t in record.turn_ids if t in self.turns]
        if not stored:
            return -math.inf
        flush = self.flush_key(record)
        bound = max([*keys, self.index[stored[-1]] + 0.5, -math.inf if flush is None else flush])
        first = self.following.get(stored[-1])
        if first is None:
            return bound
        second = self.following.get(first)
        turns = (self.turns[first],) if second is None else (self.turns[first], self.turns[second])
        paired = self.pair_turns and len(turns) == 2 and turns[0].speaker != turns[1].speaker
        return max(bound, self.key(Exchange(turns if paired else turns[:1])))

    def look_back(self, segments: Sequence[SegmentRecord], size: int) -> list[Keyed]:
        """The closed segments, in the order they closed, whose values a history of ``size`` needs:
        every value keyed from the first open turn on, and the ``size`` keyed last below it. Read
        back from the last: a segment closed no later than its push (:meth:`closed_by`) and holds
        no value keyed after it, so once that bound is below the ``size`` values found, neither it
        nor any before it holds one of them. Each segment's session predecessor is added when the
        segment's first exchange cut it off (its value needs that segment's embeddings)."""
        previous: dict[int, SegmentRecord] = {}
        last: dict[str, SegmentRecord] = {}
        for record in segments:
            if record.session_id in last:
                previous[record.seq] = last[record.session_id]
            last[record.session_id] = record
        chosen: dict[int, Keyed] = {}
        below: list[float] = []  # a min-heap of the ``size`` largest value keys below first_open
        for record in reversed(segments):
            _, _, keys = keyed = self.keyed(record)
            if len(below) >= size and (not below or self.closed_by(record, keys) < below[0]):
                break  # (a history of no values needs no segment)
            chosen[record.seq] = keyed
            cut = previous.get(record.seq)
            valued = keys if cut is not None and cut.reason in CUTS else keys[1:]
            for key in (k for k in valued if k < self.first_open):
                (heapq.heappush if len(below) < size else heapq.heappushpop)(below, key)
        needed = [cut for seq in list(chosen) if (cut := previous.get(seq)) is not None
                  and cut.seq not in chosen and cut.reason in CUTS]
        chosen.update((cut.seq, self.keyed(cut)) for cut in needed)
        order = {record.seq: at for at, record in enumerate(segments)}
        return sorted(chosen.values(), key=lambda keyed: order[keyed[0].seq])
