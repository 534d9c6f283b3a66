"""The consolidation engine: passes of plan -> operator -> pointer forwarding over one
conversation of a store, until a pass changes nothing (docs/design.md §8).

A draft that would drop what a member states (an entity its text names, a date it mentions) or
absorb too many members is refused and counted (:mod:`retrieval.consolidation.fidelity`).

Crash safety and idempotence. Each applied draft is one store transaction
(:meth:`~retrieval.memory.store.AMUStore.forward`: insert + archive + successor), so a kill at any
point leaves the store consistent. A pass first saves its plan in the store (meta
``consolidation_plan:<user>``, with the settings that made it) and clears it when done:
a rerun after a kill resumes the saved plan (steps already applied are skipped: their members
are archived; merged ids are derived from member ids, so nothing is written twice) and then
continues with fresh passes, so it ends in the same store as an uninterrupted run. Passes repeat
until a fresh plan applies nothing, so a rerun over a consolidated store changes nothing.

Library use (the evaluation's ``--consolidate``)::

    report = consolidate_user(store, "conv-26", SentenceEmbedder(), OfflineOperator())
    report.turns_before, report.turns_after   # recall ceilings before / after
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from datetime import timedelta

from retrieval.consolidation.config import ConsolidationConfig
from retrieval.consolidation.fidelity import merge_problems
from retrieval.consolidation.forward import merged_amu
from retrieval.consolidation.members import Member, members
from retrieval.consolidation.merge_plan import make_plan
from retrieval.consolidation.operations import OfflineOperator, Operation, Operator
from retrieval.consolidation.report import ConsolidationReport
from retrieval.ingestion.pipeline import fingerprinted
from retrieval.memory.cache import CachedEmbedder, model_identity
from retrieval.memory.meta_keys import PLAN_KEY
from retrieval.memory.protocols import Embedder, TextFingerprinter
from retrieval.memory.records import AMU
from retrieval.memory.store_contract import Store

logger = logging.getLogger(__name__)



def consolidate_user(store: Store, user_id: str, embedder: Embedder,
                             operator: Operator | None = None, config: ConsolidationConfig | None = None, *,
                             fingerprinter: TextFingerprinter | None = None,
                             wanted: Callable[[], bool] | None = None) -> ConsolidationReport:
    """Consolidate the active AMUs of one conversation in ``store`` (open for writing; beside an
    ingest, open it with ``role="consolidate"``).

    ``embedder``: the sentence embedder of the AMUs (cached in the store; wrap it in
    :class:`CachedEmbedder` yourself to share one). ``operator`` defaults to the
    :class:`OfflineOperator`; ``config`` to :class:`ConsolidationConfig` with the operator's
    threshold. ``fingerprinter``: the one the store was built with (its binding is checked, as
    on ingest), so merged AMUs carry fingerprints like the others. A conversation without a
    stored segment (none yet, or all purged) has nothing to consolidate: its report is empty.
    ``wanted``, asked before every pass (after the purge count and the records are read, so a
    forget after it makes the pass stale): False ends the run there (a job whose user was
    forgotten meanwhile must not consolidate what the user stores afterwards).
    """
    started = time.perf_counter()
    operator = operator or OfflineOperator()
    config = (config or ConsolidationConfig()).resolved(operator.default_threshold)
    report = ConsolidationReport(user_id, operator.name, float(config.threshold or 0.0))
    if user_id not in store.users_with_segments():
        return report
    store.bind("fingerprinter", "none" if fingerprinter is None else model_identity(fingerprinter),
               hint="consolidate with the fingerprinter the store was built with")
    cached = embedder if isinstance(embedder, CachedEmbedder) else CachedEmbedder(embedder, store)
    cached = cached.for_user(user_id)
    usage_before = operator.usage_of(user_id)  # the user's own: other users' jobs share the operator
    purges = store.purge_count(user_id)  # before the records: a purge after them is seen (_Step.apply)
    stored = list(store.amus(user_id, include_archived=True))  # reading AMUs back is the costly part
    report.turns_before, report.amus_before = _covered(stored), sum(not amu.archived for amu in stored)
    step = _Step(store, operator, config, {}, {}, fingerprinter, report, purges)
    key = PLAN_KEY.format(user_id)
    gated = False
    for _ in range(config.max_passes):
        if wanted is not None and not wanted():
            break
        step.read_turns(user_id)  # each pass: turns stored meanwhile are its members' too
        current = members(stored, store.successors(user_id))
        saved = store.meta(key)
        resumed = saved is not None and saved.get("config") == config.key()
        if resumed:
            clusters = [tuple(ids) for ids in saved["clusters"]]
        else:
            if saved is not None:  # a plan of other settings: never resumed later either
                store.put_meta(key, None)
            fallback = {segment.seq for segment in store.segments(user_id) if segment.fallback}
            plan = make_plan(current, cached.encode, config, fallback)
            if not gated:  # what the gates held back, as the first fresh plan saw it
                gated = True
                report.count_sensitive, report.pending_reextraction = (plan.count_sensitive,
                                                                       plan.pending_reextraction)
                report.window_splits = plan.window_splits
            clusters = plan.clusters
            if not clusters:
                break
            store.put_meta(key, {"config": config.key(), "clusters": [list(ids) for ids in clusters]})
        report.passes += 1
        by_id = {member.id: member for member in current}
        applied = sum(step.apply([by_id[i] for i in ids if i in by_id]) for ids in clusters)
        store.put_meta(key, None)
        if not applied and not resumed and not step.stale:
            break
        step.purges, step.stale = store.purge_count(user_id), False
        stored = list(store.amus(user_id, include_archived=True))
    else:
        logger.warning("%s: stopped after %d consolidation passes", user_id, config.max_passes)
    report.turns_after, report.amus_active_after = _covered(stored), sum(not amu.archived for amu in stored)
    report.turns_stored = frozenset(turn.turn_id for turn in store.turns(user_id))
    report.llm = operator.usage_of(user_id).since(usage_before)
    report.seconds = time.perf_counter() - started
    return report


def _covered(amus: Sequence[AMU]) -> frozenset[str]:
    """The turn ids the active ones of ``amus`` point to."""
    return frozenset(turn_id for amu in amus if not amu.archived for turn_id in amu.source.turn_ids)


@dataclasses.dataclass
class _Step:
    """Applies one cluster of a plan: the operator's drafts, each forwarded in one transaction."""

    store: Store
    operator: Operator
    config: ConsolidationConfig
    turn_order: dict[str, int]
    offsets: dict[str, timedelta]
    """The UTC offsets the user's turns were given with (turn id -> offset), for merged records'
    time prefixes on the speaker's clock."""
    fingerprinter: TextFingerprinter | None
    report: ConsolidationReport
    purges: int
    """The user's purge count read before the members were."""
    seen: set[tuple[str, ...]] = dataclasses.field(default_factory=set)
    refusals: set[tuple[tuple[str, ...], str]] = dataclasses.field(default_factory=set)
    """The drafts refused so far (members, text): a cluster planned again in a later pass is
    asked again, and its refusal counted once."""
    stale: bool = False
    """A purge committed since the members were read: the rest of the pass is skipped and the
    next one reads the records again."""

    def read_turns(self, user_id: str) -> None:
        """The user's turns' order and UTC offsets as stored now."""
        turns = self.store.turns(user_id)
        self.turn_order = {turn.turn_id: index for index, turn in enumerate(turns)}
        self.offsets = {turn.turn_id: turn.utc_offset for turn in turns if turn.utc_offset is not None}

    def apply(self, cluster: Sequence[Member]) -> int:
        """Drafts applied for the still-active members of a planned cluster; none once a purge
        of the user committed since the members were read, as read just before the operator's call
        (the members may hold purged text, which no operator may see; a purge committing between
        that read and the call's request is not seen) and after it (its answer may restate it)."""
        if len(cluster) < 2:
            return 0  # applied before a crash, or archived meanwhile by a retried extraction
        if self._purged(cluster):
            return 0
        ids = tuple(member.id for member in cluster)
        first_time = ids not in self.seen
        self.seen.add(ids)
        self.report.clusters += first_time
        drafts = self.operator.decide(cluster)
        if self._purged(cluster):
            return 0
        if drafts is None:
            self.report.unanswered += first_time
            return 0
        if not drafts:
            self.report.operations[Operation.KEEP.value] += first_time
        applied = 0
        for draft in drafts:
            amu = merged_amu(cluster, draft, self.turn_order, self.config.prefix_min_span, self.offsets)
            absorbed = [member for member in cluster if member.id in draft.member_ids]
            problems = merge_problems([member.amu for member in absorbed], amu,
                                      [old for member in absorbed for old in member.forwarded])
            if problems:  # the members stay active: a merge never drops what they state
                refusal = (draft.member_ids, amu.text)
                self.report.refused += refusal not in self.refusals
                self.refusals.add(refusal)
                # counted, not quoted: the problems name what the user said, and the log outlives a forget
                logger.info("%s: %s of %d records refused (%d problems)", amu.source.user_id,
                            draft.operation.value, len(draft.member_ids), len(problems))
                continue
            (amu,) = fingerprinted([amu], self.fingerprinter)
            if not self.store.forward(draft.member_ids, amu, draft.operation.value):
                self.report.conflicts += 1
                continue
            applied += 1
            self.report.operations[draft.operation.value] += 1
            self.report.archived += len(draft.member_ids)
            self.report.created += 1
            self.report.exact_duplicates += draft.exact
        return applied

    def _purged(self, cluster: Sequence[Member]) -> bool:
        """Whether the pass is stale; on finding it so, the operator forgets the user's answers."""
        user = cluster[0].amu.source.user_id
        if not self.stale and self.store.purge_count(user) != self.purges:
            self.stale = True
            self.operator.forget(user)
        return self.stale
