"""The audit of pointer forwarding: every archived AMU leads to an active one and no source
turn became unreachable.

Checks, per conversation:
- every AMU with a ``successor`` is archived, and its chain of successors ends, without a cycle,
  at an active AMU of the same conversation whose source turns include its own;
- an archived AMU without a successor was superseded by a retried extraction of its segment
  (the only other way the store archives; the segment's revision is above 0);
- the source turns of the active AMUs equal the union over all AMUs except those superseded ones
  (a retried extraction may legitimately skip a greeting turn that the raw-turn fallback kept);
- facts, not only turns: the active end of every chain states what each AMU forwarded into it
  stated (its entities and dates), and no merge absorbed more than the bound
  (:mod:`retrieval.consolidation.fidelity`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from retrieval.consolidation.fidelity import MAX_MERGE_MEMBERS, lost_content
from retrieval.memory.records import AMU
from retrieval.memory.store_contract import Store


@dataclass
class AuditReport:
    """What :func:`audit` found; ``ok`` when ``problems`` and ``lost_turns`` are empty."""

    active: int = 0
    forwarded: int = 0
    superseded: int = 0
    longest_chain: int = 0
    problems: list[str] = field(default_factory=list)
    lost_turns: dict[str, set[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems and not any(self.lost_turns.values())

    def summary(self) -> str:
        lost = sum(len(turns) for turns in self.lost_turns.values())
        verdict = "ok" if self.ok else f"FAILED ({len(self.problems)} problems, {lost} turns lost)"
        return (f"audit {verdict}: active {self.active} | forwarded {self.forwarded} (longest chain "
                f"{self.longest_chain}) | superseded by re-extraction {self.superseded}")


def audit(store: Store) -> AuditReport:
    """Audit every conversation of the store."""
    report = AuditReport()
    for cid in store.users_with_segments():
        _audit_conversation(store, cid, report)
    return report


def _audit_conversation(store: Store, user_id: str, report: AuditReport) -> None:
    amus = {amu.id: amu for amu in store.amus(user_id, include_archived=True)}
    successors = store.successors(user_id)
    revisions = {segment.seq: segment.revision for segment in store.segments(user_id)}
    counted: list[AMU] = []
    for amu in amus.values():
        if not amu.archived:
            report.active += 1
            counted.append(amu)
            if amu.id in successors:
                report.problems.append(f"{amu.id}: active but forwarded to {successors[amu.id]}")
        elif amu.id in successors:
            report.forwarded += 1
            counted.append(amu)
            _walk(amu, amus, successors, report)
        elif revisions.get(amu.source.segment, 0) > 0:  # type: ignore[arg-type]
            report.superseded += 1
        else:
            report.problems.append(f"{amu.id}: archived without a successor")
            counted.append(amu)
    absorbed = Counter(successors[amu_id] for amu_id in successors if amu_id in amus)
    report.problems += [f"{merged}: absorbed {count} AMUs, over the bound of {MAX_MERGE_MEMBERS}"
                        for merged, count in absorbed.items() if count > MAX_MERGE_MEMBERS]
    reachable = {turn for amu in counted if not amu.archived for turn in amu.source.turn_ids}
    report.lost_turns[user_id] = {turn for amu in counted for turn in amu.source.turn_ids} - reachable


def _walk(amu: AMU, amus: dict[str, AMU], successors: dict[str, str], report: AuditReport) -> None:
    """Follow ``amu``'s successors to the active end of its chain."""
    chain = [amu.id]
    current = amu
    while current.id in successors:
        following = successors[current.id]
        if following in chain:
            report.problems.append(f"{amu.id}: successor cycle {' -> '.join(chain + [following])}")
            return
        if following not in amus:
            report.problems.append(f"{amu.id}: successor {following} is not an AMU of this conversation")
            return
        chain.append(following)
        current = amus[following]
    report.longest_chain = max(report.longest_chain, len(chain) - 1)
    if current.archived:
        report.problems.append(f"{amu.id}: chain {' -> '.join(chain)} ends at an archived AMU")
    missing = set(amu.source.turn_ids) - set(current.source.turn_ids)
    if missing:
        report.problems.append(f"{amu.id}: its turns {sorted(missing)} are not in {current.id}'s source "
                               "pointer")
    if lost := lost_content(amu, current):
        report.problems.append(f"{amu.id}: {', '.join(lost)} not stated by {current.id}")
