"""Hard deletion for the memory API: the store's purge (:mod:`retrieval.memory.purge`) and what
only this layer knows how to find, every derived text whose cached arrays or LLM answers must go
too: each purged turn alone and paired with its neighbours (the segmentation's exchanges), the
purged records' texts and their evidence nodes' search texts (event frames included).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from retrieval.index.evidence_nodes import segment_search_texts
from retrieval.memory.purge import Purged
from retrieval.memory.records import Exchange, Turn
from retrieval.memory.store import AMUStore


def derived_texts(purged: Purged, session_turns: Sequence[Turn]) -> list[str]:
    """Every text derived from what was purged. ``session_turns``: the turns of the sessions
    involved, in order, read before the purge (a purged turn's exchange may pair it with a kept one)."""
    gone = {turn.turn_id for turn in purged.turns}
    texts = [turn.render() for turn in purged.turns]
    for first, second in zip(session_turns, session_turns[1:], strict=False):
        if {first.turn_id, second.turn_id} & gone and first.session_id == second.session_id:
            texts.append(Exchange((first, second)).text)
    by_segment: dict[int | None, list] = {}
    for amu in purged.amus:
        by_segment.setdefault(amu.source.segment, []).append(amu)
    texts += [amu.text for amu in purged.amus] + list(purged.node_texts)
    texts += [text for amus in by_segment.values() for text in segment_search_texts(amus)]
    return list(dict.fromkeys(texts))


def drop_llm_answers(cache_dir: Path, texts: Iterable[str]) -> int:
    """Delete the LLM cache entries (``<sha256>.json``) that mention one of ``texts``; returns how many."""
    if not cache_dir.is_dir():
        return 0
    needles = {variant for text in texts if text.strip()
               for variant in (text, json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1])}
    dropped = 0
    for entry in cache_dir.glob("*.json"):
        content = entry.read_text(encoding="utf-8", errors="replace")
        if any(needle in content for needle in needles):
            entry.unlink()
            dropped += 1
    return dropped


def hard_purge(store: AMUStore, user: str, llm_cache: Path, *, session_id: str | None = None,
               amu_ids: Sequence[str] = (), turn_ids: Sequence[str] = (), everything: bool = False) -> Purged:
    """Purge the selection with everything derived from it, then scrub the store's files."""
    sessions = {session_id} if session_id else {t.session_id for t in store.turns(user)
                                                if t.turn_id in turn_ids}
    before = [turn for turn in store.turns(user) if everything or turn.session_id in sessions]
    purged = store.purge(user, session_id=session_id, amu_ids=amu_ids, turn_ids=turn_ids,
                         everything=everything)
    texts = derived_texts(purged, before)
    store.scrub(texts)
    drop_llm_answers(llm_cache, texts)
    return purged
