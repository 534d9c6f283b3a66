"""One consolidation pass's plan: which active AMUs form clusters that pass the gates.

Per speaker key (gate 2), the eligible members (not count-sensitive, gate 1; not in a segment
that fell back to raw turns and awaits a retried extraction) are clustered by HAC on their
embeddings; each cluster is split by the time window (gate 3); sub-clusters of two or more
members are the plan, in store order. A plan is a list of id tuples so that it can be saved
in the store and resumed after a crash.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import numpy as np

from retrieval.consolidation.clustering import hac_clusters
from retrieval.consolidation.config import ConsolidationConfig
from retrieval.consolidation.gates import is_count_sensitive, split_by_window
from retrieval.consolidation.members import Member, speaker_key
from retrieval.consolidation.prefix import strip_prefix


@dataclass
class Plan:
    """The clusters of a pass (member ids in store order) and what the gates held back."""

    clusters: list[tuple[str, ...]] = field(default_factory=list)
    count_sensitive: int = 0
    pending_reextraction: int = 0
    window_splits: int = 0


def make_plan(members: Sequence[Member], embed: Callable[[list[str]], np.ndarray],
              config: ConsolidationConfig, fallback_segments: Collection[int] = ()) -> Plan:
    """The plan over a conversation's active ``members`` (store order). ``embed`` maps texts to
    vectors (the store's cached embedder); ``config.threshold`` must be resolved."""
    assert config.threshold is not None, "resolve the threshold first"
    plan = Plan()
    eligible: list[Member] = []
    for member in members:
        if member.amu.source.segment in fallback_segments:
            plan.pending_reextraction += 1
        elif is_count_sensitive(member.amu.text):
            plan.count_sensitive += 1
        else:
            eligible.append(member)
    # The statement without a merge's time prefix: the prefix is provenance, not content.
    vectors = embed([strip_prefix(member.amu.text) for member in eligible]) if eligible else np.zeros((0, 1))
    groups: dict[tuple[str, ...], list[int]] = {}
    for row, member in enumerate(eligible):
        groups.setdefault(speaker_key(member.amu), []).append(row)
    order = {member.id: index for index, member in enumerate(members)}
    found: list[list[Member]] = []
    for group in groups.values():
        for rows in hac_clusters(vectors[group], config.threshold, config.linkage):
            parts = split_by_window([eligible[group[row]] for row in rows], config.window)
            plan.window_splits += len(parts) - 1
            found += [part for part in parts if len(part) > 1]
    found = [sorted(part, key=lambda m: order[m.id]) for part in found]
    plan.clusters = [tuple(m.id for m in part) for part in sorted(found, key=lambda part: order[part[0].id])]
    return plan
