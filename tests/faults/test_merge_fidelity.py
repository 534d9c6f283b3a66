"""The consolidation audit counts facts, not only turns, so a merge that drops a fact is caught:
with loose settings a merge may not lump unrelated facts into one statement, and a store where
one did (written by an older version) fails the audit, naming what was lost."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from retrieval.api.batch import ingest_turns
from retrieval.consolidate import main as consolidate_main
from retrieval.consolidation.audit import audit
from retrieval.consolidation.config import ConsolidationConfig
from retrieval.consolidation.engine import consolidate_user
from retrieval.consolidation.fidelity import MAX_MERGE_MEMBERS, lost_content, merge_problems
from retrieval.consolidation.forward import merged_id
from retrieval.extract.rules import RuleExtractor
from retrieval.memory.records import AMU, SourcePointer
from retrieval.memory.store import AMUStore
from tests.test_consolidation import CID, NamedHashEmbedder, duplicate_turns
from tests.test_ingest import HashEmbedder

LOOSE = ["--threshold", "2", "--linkage", "single", "--window-days", "100000"]


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    """test_consolidation's conversation of known duplicates, ingested, not consolidated."""
    with AMUStore(tmp_path / "store") as store:
        ingest_turns(duplicate_turns(), store, HashEmbedder(), RuleExtractor(), progress=False)
    return tmp_path / "store"


def test_loose_settings_keep_every_fact(store_dir: Path, capsys, monkeypatch):
    monkeypatch.setattr("retrieval.consolidate.SentenceEmbedder", NamedHashEmbedder)
    with AMUStore(store_dir, read_only=True) as store:
        before = list(store.amus(CID))
    assert consolidate_main(["--store", str(store_dir), *LOOSE]) == 0
    out = capsys.readouterr().out
    assert "audit ok" in out and "merges refused" in out
    with AMUStore(store_dir, read_only=True) as store:
        after = {amu.id: amu for amu in store.amus(CID, include_archived=True)}
        successors = store.successors(CID)
        for amu in before:  # every fact is still stated by the active AMU that carries it
            end = amu.id
            while end in successors:
                end = successors[end]
            assert not after[end].archived and lost_content(amu, after[end]) == []
        assert len(list(store.amus(CID))) > len(before) // 2


def test_a_merge_that_drops_facts_is_refused(store_dir: Path):
    with AMUStore(store_dir) as store:
        report = consolidate_user(store, CID, HashEmbedder(),
                                          config=ConsolidationConfig(threshold=2.0, linkage="single",
                                                                     window_days=100000))
        assert report.refused > 0 and audit(store).ok


def test_the_audit_fails_a_lumped_merge_naming_what_was_lost(store_dir: Path):
    with AMUStore(store_dir) as store:
        members = [amu for amu in store.amus(CID) if amu.source.speakers == ("Ann",)][:4]
        keep = members[0]
        lumped = AMU(merged_id(CID, [m.id for m in members]), keep.text, keep.memory_type,
                     SourcePointer(CID, keep.source.session_id,
                                   tuple(t for m in members for t in m.source.turn_ids), ("Ann",)),
                     observed_at=keep.observed_at, entities=keep.entities)
        assert merge_problems(members, lumped)  # the engine would refuse it; an older version did not
        assert store.forward([m.id for m in members], lumped, "MERGE")
        result = audit(store)
    assert not result.ok and not any(result.lost_turns.values())  # every turn is still reachable ...
    # ... not every fact
    assert any("not stated by" in problem and lumped.id in problem for problem in result.problems)


def test_a_merge_may_absorb_at_most_the_bound():
    base = AMU("c:0:0", "Ann likes tea.", "fact", SourcePointer("c", "s", ("D1",), ("Ann",), 0),
               entities=("Ann",))
    members = [dataclasses.replace(base, id=f"c:0:{i}") for i in range(MAX_MERGE_MEMBERS + 1)]
    merged = dataclasses.replace(base, id="c:c:1", source=SourcePointer("c", "s", ("D1",), ("Ann",)))
    assert merge_problems(members[:MAX_MERGE_MEMBERS], merged) == []
    assert merge_problems(members, merged) == [f"{MAX_MERGE_MEMBERS + 1} members, over the bound of "
                                               f"{MAX_MERGE_MEMBERS}"]
