"""Online segmentation for the memory API (docs/design.md §5.2, LycheeMemory C.1): one open segment
per (user, session), closed by the boundary policy, by :meth:`UserStream.flush` or never (it
stays open across restarts: its turns are stored, and :meth:`UserStream.load` feeds them again).

It is the one ingestion pipeline (:func:`retrieval.api.batch.ingest_turns` feeds recorded sessions
through it too), turn by turn:

* exchanges pair a turn with the next turn of its session when the speaker changes
  (:func:`retrieval.ingestion.segmenter.pair_exchanges`): a turn waits for its reply before it
  enters the segmenter (it is stored, hence searchable, at once);
* the surprise history is the user's, shared by its sessions, as one conversation's is in the
  batch; segment numbers are the user's, in the order segments close;
* the extractor's reference context is the user's: participants are the speakers of the user's
  turns stored up to the segment's last turn (not those stored after it, which depends on how far
  the adds had got when the segment closed), the state and recent records are replayed from the
  stored segments after a restart.

Each closed segment embeds its texts into the store's vector cache, then commits its AMUs,
fingerprints and index rows in one transaction
(:meth:`retrieval.memory.store_contract.Store.commit_stored_turns`), as batch ingestion does
(:meth:`UserStream.store_segment`; the memory's
ingestion worker wraps it to update the user's search state under the user's guard,
:mod:`retrieval.api.backlog`). A stream is used by one thread at a time.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from retrieval.api import limits
from retrieval.extract.base import Extractor, ReferenceContext
from retrieval.ingestion.pipeline import embed_segment, fingerprinted, segment_record
from retrieval.ingestion.push_order import PushOrder
from retrieval.ingestion.segmenter import SegmenterConfig, SemanticSegmenter, replayed_history
from retrieval.memory.cache import for_user
from retrieval.memory.records import AMU, Exchange, Segment, SegmentRecord, Turn
from retrieval.memory.store_contract import Store


@dataclass
class OpenSession:
    """One session's open segment and the turn waiting for its reply."""

    segmenter: SemanticSegmenter
    waiting: Turn | None = None

    @property
    def holding(self) -> bool:
        """Whether the session holds turns that a flush would close into a segment."""
        return self.waiting is not None or self.segmenter.holds_exchanges


@dataclass
class StreamModels:
    """What closing a segment needs: the cached embedder, the extractor, the fingerprinter."""

    embedder: Any
    extractor: Extractor
    fingerprinter: Any | None
    config: SegmenterConfig = field(default_factory=SegmenterConfig)

    def for_user(self, user: str, purges: int | None = None) -> StreamModels:
        """These models with the cached ones caching under ``user`` (from texts read after the
        user's purge count was ``purges``, else after this call: :mod:`retrieval.memory.cache`)."""
        return dataclasses.replace(self, embedder=for_user(self.embedder, user, purges),
                                   fingerprinter=for_user(self.fingerprinter, user, purges))


class UserStream:
    """One user's online segmentation and extraction state."""

    def __init__(self, user: str, store: Store, models: StreamModels, purges: int | None = None) -> None:
        self.user, self.store, self.models = user, store, models.for_user(user, purges)
        self.publish: Callable[[SegmentRecord, list[AMU]], None] = self.store_segment
        self.history: deque[float] = deque(maxlen=models.config.history_size)
        self.sessions: dict[str, OpenSession] = {}
        self.context = ReferenceContext(())
        self.next_seq = store.next_seq(user)
        self._order: PushOrder | None = None  # after a restart, until the values in _later are merged
        self._later: deque[tuple[float, float]] = deque()
        self._caught_up = False  # the log's open turns all fed: _later joins the history after this feed
        self._unfed: dict[str, int] = {}  # after a restart, the log's open turns (by index) until fed again
        self.fed_through: str | None = None
        """The id of the turn latest in the log among those this stream has fed (the open turns a
        restart feeds again may come before the last one a segment covers): where a flush now
        stands in the log (``SegmentRecord.flushed_after``)."""
        self._fed_at = -1.0  # its index in the log read at the restart (inf: a turn stored since)

    @classmethod
    def load(cls, user: str, store: Store, models: StreamModels, turns: Sequence[Turn] | None = None,
             publish: Callable[[UserStream, SegmentRecord, list[AMU]], None] | None = None,
             purges: int | None = None) -> tuple[UserStream, list[AMU]]:
        """The stream after a restart: the reference context replayed from the stored segments of
        the last session, the surprise history from the last stored segments (:meth:`_replay`),
        the stored turns no segment covers (or ``turns``: none when the caller feeds them itself,
        read after the user's purge count was ``purges``) fed again (segments they close are
        committed now, through ``publish`` when given). So it cuts and extracts as the stream that
        never stopped would, the open exchanges of several sessions included, each flush at the
        place in the log its segments keep (:mod:`retrieval.ingestion.push_order`).
        Returns it and the AMUs so committed."""
        stream = cls(user, store, models, purges)
        if publish is not None:
            stream.publish = lambda record, amus: publish(stream, record, amus)
        segments = store.segments(user)
        trailing: list[SegmentRecord] = []
        for record in reversed(segments):  # the context only carries over within the last session
            if trailing and record.session_id != trailing[-1].session_id:
                break
            trailing.append(record)
        for record in reversed(trailing):
            stream.context.enter(record.session_id)
            texts = [amu.text for amu in store.by_segment(user, record.seq) if not amu.archived]
            stream.context.record(record.state, texts)
        stream._replay(segments)
        return stream, stream.push(store.uncovered_turns(user) if turns is None else turns)

    def _replay(self, segments: Sequence[SegmentRecord]) -> None:
        """The surprise history as it stood before the first open exchange was pushed, and the
        closed segments' values pushed after it, to join the history as the open exchanges are
        fed again (:meth:`feed`), in the order the stream that never stopped appended them
        (:mod:`retrieval.ingestion.push_order`; the segments' exchange vectors read from the
        store's cache; :func:`replayed_history`)."""
        log = self.store.turns(self.user)
        order = PushOrder(log, segments, self.models.config.pair_turns)
        self._unfed, self._fed_at = dict(order.open_at), float(order.last_covered)
        self.fed_through = log[order.last_covered].turn_id if order.last_covered >= 0 else None
        closed = order.look_back(segments, self.models.config.history_size)
        texts = [exchange.text for _, exchanges, _ in closed for exchange in exchanges]
        vectors = iter(self.models.embedder.encode(texts) if texts else [])
        values, cut_off = replayed_history([(record.session_id, record.reason, keys,
                                             [next(vectors) for _ in exchanges])
                                            for record, exchanges, keys in closed if exchanges])
        values.sort(key=lambda keyed: keyed[0])  # stable: a segment's values keep their order
        self.history.extend(value for key, value in values if key < order.first_open)
        self._later = deque((key, value) for key, value in values if key >= order.first_open)
        self._order = order if self._later else None
        for session, segment in cut_off.items():
            self.open_session(session).segmenter.cut_off = segment

    def _release(self, key: float) -> None:
        """The closed segments' values pushed before the push keyed ``key`` join the history."""
        while self._later and self._later[0][0] < key:
            self.history.append(self._later.popleft()[1])
        if not self._later:
            self._order = None  # all merged: the user's turn index is not kept

    def open_session(self, session_id: str) -> OpenSession:
        if session_id not in self.sessions:
            segmenter = SemanticSegmenter(self.models.embedder, self.user, self.models.config)
            segmenter.history = self.history  # the user's surprise history, shared by its sessions
            self.sessions[session_id] = OpenSession(segmenter)
        return self.sessions[session_id]

    def _latest(self, session_id: str) -> OpenSession:
        """The session's open segment, moved last: ``sessions`` is in the log's order of each
        session's latest turn fed, whatever the exchanges' order (:meth:`_make_room`)."""
        session = self.open_session(session_id)
        self.sessions[session_id] = self.sessions.pop(session_id)
        return session

    def push(self, turns: Sequence[Turn], prepare: Callable[[list[str]], None] | None = None) -> list[AMU]:
        """Feed stored turns in order, at most :data:`MAX_OPEN_SESSIONS` of the user's sessions
        holding turns at a time; returns the AMUs of the segments they closed. A turn that would
        open one more first closes the sessions whose latest turn came earliest, as a flush after
        the turn before it would (:meth:`_make_room`), so where they close depends on the log alone,
        not on how its turns are split into calls, and a reloaded stream closes them where this one
        did (docs/design.md §5.2: a store written before the bound aside). The turns are paired
        and fed in runs, each ended before a turn that may open a session past the bound
        (``prepare`` sees each run's exchange texts before they are embedded: one call for the
        vectors of a run)."""
        amus: list[AMU] = []
        start = 0
        while start < len(turns):
            amus += self._make_room(turns[start].session_id)
            end = self._run_end(turns, start)
            exchanges = self.pair(turns[start:end])
            if prepare is not None:
                prepare([exchange.text for exchange in exchanges])
            amus += self.feed(exchanges)
            start = end
        return amus

    def _run_end(self, turns: Sequence[Turn], start: int) -> int:
        """Where the run of ``turns`` from ``start`` ends: before the first later turn that may open
        a session past the bound (whether it does depends on the run's segments, known once fed)."""
        holding = {session_id for session_id, session in self.sessions.items() if session.holding}
        for end in range(start, len(turns)):
            if turns[end].session_id not in holding:
                if end > start and len(holding) >= limits.MAX_OPEN_SESSIONS:
                    return end
                holding.add(turns[end].session_id)
        return len(turns)

    def _make_room(self, session_id: str) -> list[AMU]:
        """Before a turn of ``session_id``: flush the sessions whose latest turn came earliest while
        the turn would make more than :data:`MAX_OPEN_SESSIONS` hold turns, and forget those that
        hold nothing (their segment filled up and closed); returns the AMUs so committed."""
        holding = []
        for other, session in list(self.sessions.items()):
            if session.holding:
                holding.append(other)
            elif session.segmenter.cut_off is None and other != session_id:  # nothing to carry over
                del self.sessions[other]
        if session_id in holding:
            return []
        excess = len(holding) + 1 - limits.MAX_OPEN_SESSIONS
        return [amu for other in holding[:max(0, excess)] for amu in self.flush(other)]

    def pair(self, turns: Sequence[Turn]) -> list[Exchange]:
        """The exchanges that stored turns complete, in order (a turn waits for its reply); the
        caller feeds them (:meth:`feed`), so it may embed their texts beside others first."""
        exchanges: list[Exchange] = []
        for turn in turns:
            self._fed(turn)
            session = self._latest(turn.session_id)
            if not self.models.config.pair_turns:  # every turn an exchange, complete as it comes
                exchanges.append(Exchange((turn,)))
                continue
            waiting = session.waiting
            if waiting is None:
                session.waiting = turn
            elif waiting.speaker != turn.speaker:
                exchanges.append(Exchange((waiting, turn)))
                session.waiting = None
            else:
                exchanges.append(Exchange((waiting,)))
                session.waiting = turn
        return exchanges

    def _fed(self, turn: Turn) -> None:
        """``turn`` is fed: the last fed in log order unless it is an open turn fed again that came
        before the last covered one (a turn stored since the restart's log read comes after all)."""
        at = self._unfed.pop(turn.turn_id, math.inf)
        if at >= self._fed_at:
            self.fed_through, self._fed_at = turn.turn_id, at
        if at < math.inf and not self._unfed:  # every open turn of the log read is fed again
            self._caught_up = self._order is not None

    def flush(self, session_id: str) -> list[AMU]:
        """Close the session's open segment (the waiting turn joins it as an exchange alone). The
        segments so closed keep where in the log the flush came (``flushed_after``)."""
        session = self.sessions.get(session_id)
        if session is None:
            return []
        after = self.fed_through
        amus = self.feed([Exchange((session.waiting,))], after) if session.waiting is not None else []
        session.waiting = None
        closed = session.segmenter.flush()
        del self.sessions[session_id]
        return amus + (self._commit(closed, after) if closed is not None else [])

    def feed(self, exchanges: Sequence[Exchange], flushed_after: str | None = None) -> list[AMU]:
        """Segment the exchanges (:meth:`pair`) in order; returns the AMUs of the segments they
        closed (``flushed_after``: a flush pushes them, after that turn of the log)."""
        amus: list[AMU] = []
        vectors = self.models.embedder.encode([exchange.text for exchange in exchanges]) if exchanges else []
        for exchange, vector in zip(exchanges, vectors, strict=True):
            self._release(math.inf if self._order is None else self._order.fed_key(exchange))
            session = self.open_session(exchange.turns[0].session_id)
            for segment in session.segmenter.push(exchange, vector):
                amus += self._commit(segment, flushed_after)
        if self._caught_up:  # no later push comes before the values still held: they join now
            self._release(math.inf)
        return amus

    def _commit(self, segment: Segment, flushed_after: str | None = None) -> list[AMU]:
        """Extract a closed segment (numbered in the user's order) and commit it in one transaction
        (``flushed_after``: closed by a flush made after that turn of the log)."""
        segment = dataclasses.replace(segment, seq=self.next_seq)
        self.next_seq += 1
        models, context = self.models, self.context
        context.participants = self.store.speakers(self.user, segment.turns[-1].turn_id)
        context.enter(segment.session_id)
        extraction = models.extractor.extract(segment, context)
        # its texts before its codes: with the joint models (retrieval.index.joint) the codes are
        # then read from the forward that embedded them, one forward per segment
        embed_segment(models.embedder, segment.turns, extraction.amus)
        amus = fingerprinted(extraction.amus, models.fingerprinter)
        self.publish(segment_record(segment, extraction.state, extraction.fallback, len(amus), flushed_after),
                     amus)
        context.record(extraction.state, [amu.text for amu in amus])
        return amus

    def store_segment(self, record: SegmentRecord, amus: list[AMU]) -> None:
        """Commit a closed segment's records in one transaction (:meth:`_commit` embedded its
        texts before, so a publisher holding the user's guard runs no forward under it)."""
        self.store.commit_stored_turns(record, amus)
