"""A copy of one user's built memory under another user id, written in one transaction.

    copy_user(memory, "u000", "u001")   # u001 now holds what u000 holds, as its own rows

A load test needs many users with real memories; building each through :meth:`Memory.add` repeats
the same extraction, commits and search-state work for identical conversations. The copy reads
the source's raw turns, segments and records and commits them for the target through the store's
segment write (:meth:`retrieval.memory.store.AMUStore.commit_segments`: the turns, the records
with their evidence nodes and FTS rows, the progress rows), so the target is a user like any
other: scoped by its own id, searchable, deletable, its records renamed ``<target>:<seq>:<n>``.
Then the source's cached vectors and codes are copied to the target (the store keeps them per
user, :mod:`retrieval.memory.cache`), so the target's first search reads them instead of
computing them again. Nothing is shared; a change to one user after the copy never shows in the
other.

Only a settled user is copied: every turn in a committed segment (no ingestion backlog, no open
segment; :meth:`Memory.drain` first) and no archived record (a consolidated or re-extracted user
has history the segment write does not carry). The target must hold nothing and never have held
anything: the copy keeps the source's segment numbers and turn ids, so a purged user's old ids
would name the copied data. Each refusal is one typed error naming the argument. The copy is one
store transaction holding both users' write locks (:meth:`retrieval.memory.store_contract.Handle.transaction`)
from its checks to its commit, and both users' writes in this process
(:meth:`Memory.writes_held`): a delete, add or consolidation of either user, in this process or
another, lands before the copy reads (the copy has its result) or waits until the copy has
committed (the copy is of the state before it). A deleted turn never lives on in the target and no
copy is of half a change; on PostgreSQL, another node's write of the source waits at most the
store's lock wait, so copy a large user when it is quiet.
"""

from __future__ import annotations

import dataclasses

from retrieval.api.errors import InvalidInput, NotFound
from retrieval.api.inputs import check_id, check_new_id
from retrieval.api.memory import Memory
from retrieval.memory.reads import stored_amu
from retrieval.memory.records import AMU, SegmentRecord, SourcePointer, Turn

Segments = list[tuple[SegmentRecord, list[Turn], list[AMU]]]


def copy_user(memory: Memory, source_user_id: str, target_user_id: str) -> int:
    """Copy the settled user ``source_user_id`` to the empty user ``target_user_id`` in one
    transaction (all or none); returns the number of records copied."""
    source = check_id("source_user_id", source_user_id)
    target = check_new_id("target_user_id", target_user_id)
    if source == target:
        raise InvalidInput(f"target_user_id must differ from source_user_id ({source!r})", "target_user_id")
    store = memory.store
    with memory.writes_held(source, target), store.transaction([source, target]):
        if not store.has_user(source):
            raise NotFound(f"no user {source!r} to copy", "source_user_id")
        if store.has_user(target) or store.count(target) or store.purge_count(target):
            raise InvalidInput(f"user {target!r} holds or held turns or records; copy into a new user id",
                               "target_user_id")
        segments = _settled(memory, source)
        store.commit_segments(_renamed(segments, source, target))
        store.copy_cache(source, target)
    return sum(len(amus) for _, _, amus in segments)


def _settled(memory: Memory, user: str) -> Segments:
    """The user's segments with their turns and records, or a refusal if the user is not settled."""
    store = memory.store
    if store.uncovered_turns(user):
        raise InvalidInput(f"user {user!r} has turns not yet in a segment; drain and flush before "
                           "copying it", "source_user_id")
    if store.count(user, include_archived=True) != store.count(user, include_archived=False):
        raise InvalidInput(f"user {user!r} has archived records (consolidated or re-extracted); only a "
                           "user without history is copied", "source_user_id")
    turns = {turn.turn_id: turn for turn in store.turns(user)}
    records: dict[int | None, list[AMU]] = {}
    for amu in store.amus(user):
        records.setdefault(amu.source.segment, []).append(amu)
    return [(record, [turns[turn_id] for turn_id in record.turn_ids], records.get(record.seq, []))
            for record in store.segments(user)]


def _renamed(segments: Segments, source: str, target: str) -> Segments:
    return [(dataclasses.replace(record, user_id=target),
             [dataclasses.replace(turn, user_id=target) for turn in turns],
             [_renamed_record(amu, source, target) for amu in amus])
            for record, turns, amus in segments]


def _renamed_record(amu: AMU, source: str, target: str) -> AMU:
    """The stored record under the target's id and scope; its other fields as they are (they were
    validated when the source's record was made)."""
    prefix = f"{source}:"
    assert amu.id.startswith(prefix), f"record {amu.id!r} is not named after its user {source!r}"
    fields = {field.name: getattr(amu, field.name) for field in dataclasses.fields(amu)}
    source_pointer: SourcePointer = amu.source
    return stored_amu(**{**fields, "id": f"{target}:{amu.id[len(prefix):]}",
                         "source": dataclasses.replace(source_pointer, user_id=target)})
