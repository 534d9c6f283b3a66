"""Hard deletion for the memory API: the store's purge (:mod:`retrieval.memory.purge`), the user's
cached LLM answers, and what only this layer knows how to find, every derived text whose cached
arrays must go too: each purged turn alone and paired with its neighbours (the segmentation's
exchanges), the purged records' texts (also without a merge's time prefix, as consolidation
embeds them), their evidence nodes' search texts, and the search text of
each state the event frame of a touched segment went through (its records' texts, as a search
snapshot embedded it).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from retrieval.consolidation.prefix import strip_prefix
from retrieval.index.evidence_nodes import searchable_text, segment_search_texts
from retrieval.llm_client import drop_user_answers
from retrieval.memory.purge import Purged
from retrieval.memory.records import AMU, Exchange, Turn
from retrieval.memory.store_contract import Store


def derived_texts(purged: Purged, turns_before: Sequence[Turn]) -> list[str]:
    """Every text derived from what was purged. ``turns_before``: the user's turns in order, read
    before the purge (a purged turn's exchange may pair it with a kept one of its session)."""
    gone = {turn.turn_id for turn in purged.turns}
    texts = [turn.render() for turn in purged.turns]
    by_session: dict[str, list[Turn]] = {}
    for turn in turns_before:
        by_session.setdefault(turn.session_id, []).append(turn)
    for session in by_session.values():
        for first, second in zip(session, session[1:], strict=False):
            if {first.turn_id, second.turn_id} & gone:
                texts.append(Exchange((first, second)).text)
    by_segment: dict[int | None, list[AMU]] = {}
    for amu in purged.amus:
        by_segment.setdefault(amu.source.segment, []).append(amu)
    texts += [amu.text for amu in purged.amus] + list(purged.node_texts)
    texts += [strip_prefix(amu.text) for amu in purged.amus]  # as consolidation's plan embeds them
    texts += [text for amus in by_segment.values() for text in segment_search_texts(amus)]
    texts += [searchable_text("event_frame", "", members) for members in purged.frames]
    return list(dict.fromkeys(texts))


def drop_llm_answers(cache_dir: Path, user: str, texts: Iterable[str]) -> None:
    """Delete the user's LLM answers in ``cache_dir``: all of them (:func:`retrieval.llm_client.
    drop_user_answers`), since an answer may restate a purged text in other words (the extractor's
    disambiguation note is carried from segment to segment), and the entries kept for no user
    (made before answers were kept per user, or by no user's request) that quote one of ``texts``."""
    drop_user_answers(cache_dir, user)
    if not cache_dir.is_dir():
        return
    needles = {variant for text in texts if text.strip() for variant in _quoted(text)}
    for entry in cache_dir.glob("*.json"):
        content = entry.read_text(encoding="utf-8", errors="replace")
        if any(needle in content for needle in needles):
            entry.unlink()


def _quoted(text: str) -> set[str]:
    """``text`` as a cache file may hold it: as is, and inside a JSON string once or twice (a
    model's JSON answer is a string of the response's JSON), with and without ASCII escapes."""
    found = {text}
    for ascii_only in (True, False):
        once = json.dumps(text, ensure_ascii=ascii_only)[1:-1]
        found |= {once, json.dumps(once, ensure_ascii=ascii_only)[1:-1]}
    return found


def hard_purge(store: Store, user: str, llm_caches: Sequence[Path], *, session_id: str | None = None,
               amu_ids: Sequence[str] = (), turn_ids: Sequence[str] = (), everything: bool = False) -> Purged:
    """Purge the selection with everything derived from it (:mod:`retrieval.memory.purge`): in the
    purge's own transaction the cached arrays of the derived texts, and before it commits the
    user's LLM answers cached in each of ``llm_caches`` (:func:`drop_llm_answers`; a cache: gone early,
    they are computed again if the purge fails), so a process killed after the commit leaves
    neither, and the user's answers again after it commits (a consolidation's operator call that
    answered meanwhile checks the purge count only after caching; one answering later sees the
    purge and forgets its answers itself); the compaction of the store's files it owes is the caller's
    (:mod:`retrieval.api.compaction`). It holds the user's ingestion lock, so no node commits a
    segment of a purged turn meanwhile."""
    def derived(purged: Purged) -> list[str]:
        texts = derived_texts(purged, before)
        for cache in llm_caches:
            drop_llm_answers(cache, user, texts)
        return texts

    with store.ingestion_lock(user, wait=True):
        before = store.turns(user)
        purged = store.purge(user, session_id=session_id, amu_ids=amu_ids, turn_ids=turn_ids,
                             everything=everything, derived=derived)
    for cache in llm_caches:  # again once committed: an LLM call that answered between the first
        drop_user_answers(cache, user)  # drop and the commit cached its answer unaware of the purge
    return purged

