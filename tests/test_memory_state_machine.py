"""A hypothesis state machine over the memory API: three users, random interleavings of add,
replayed add, search, delete, forget and consolidate. Invariants: no result ever carries another
user's text; once the compaction behind a ``forget`` has run (:mod:`retrieval.api.compaction`,
started at once here), the user's canary is in no file of the store; replays add nothing
(and a key given again with another body is a conflict that adds nothing); a turn is found by
the next search."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import retrieval.api.compaction as compaction
from retrieval import Memory
from retrieval.api.errors import Conflict
from retrieval.memory.meta_keys import COMPACTION_OWED
from retrieval.memory.store import AMUStore
from tests.multi_route_fixtures import WordEmbedder, WordFingerprinter

USERS = ("alice", "bob", "carol")
WORDS = ("garden", "violin", "puppy", "bread", "hiking", "lake", "museum", "pottery")


def canary(user: str) -> str:
    """A word only this user ever says (the same for every add: it must vanish with ``forget``)."""
    return f"Qx{user}canary"


class MemoryMachine(RuleBasedStateMachine):
    @initialize()
    def open_memory(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="memory-sm-"))
        self.compact_after_s, compaction.COMPACT_AFTER_S = compaction.COMPACT_AFTER_S, 0.0
        self.memory = Memory.open(self.path, embedder=WordEmbedder(), fingerprinter=WordFingerprinter())
        self.turns: dict[str, int] = dict.fromkeys(USERS, 0)
        self.keys: dict[str, tuple[str, str, list[dict]]] = {}
        self.key_turns: dict[str, set[str]] = {}
        self.counter = 0

    def teardown(self) -> None:
        if hasattr(self, "memory"):
            self.memory.close()
            shutil.rmtree(self.path, ignore_errors=True)
            compaction.COMPACT_AFTER_S = self.compact_after_s

    def stored(self, user: str) -> int:
        with AMUStore(self.path, read_only=True) as reader:
            return len(reader.turns(user))

    @rule(user=st.sampled_from(USERS), session=st.sampled_from(("s1", "s2")), word=st.sampled_from(WORDS),
          size=st.integers(1, 4))
    def add(self, user: str, session: str, word: str, size: int) -> None:
        self.counter += 1
        key = f"k{self.counter}"
        turns = [{"speaker": "AB"[i % 2],
                  "text": f"{canary(user)} talks about the {word} number{self.counter}x{i}"}
                 for i in range(size)]
        result = self.memory.add(turns, user_id=user, session_id=session, idempotency_key=key)
        assert len(result.turn_ids) == size and not result.replayed
        self.turns[user] += size
        self.keys[key] = (user, session, turns)
        self.key_turns[key] = set(result.turn_ids)
        hits = self.memory.search(f"number{self.counter}x0", user_id=user, k=5).hits
        assert any(f"number{self.counter}x0" in hit.text for hit in hits)

    @precondition(lambda self: bool(self.keys))
    @rule(data=st.data())
    def replay(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.keys)))
        user, session, turns = self.keys[key]
        before = self.stored(user)
        if data.draw(st.booleans()):
            result = self.memory.add(turns, user_id=user, session_id=session, idempotency_key=key)
            assert result.replayed and result.turn_ids == ()
        else:
            with pytest.raises(Conflict):
                self.memory.add([{"speaker": "A", "text": "a retried write"}], user_id=user,
                                session_id=session, idempotency_key=key)
        assert self.stored(user) == before

    @rule(user=st.sampled_from(USERS), word=st.sampled_from(WORDS))
    def search(self, user: str, word: str) -> None:
        for hit in self.memory.search(f"{word} {canary('alice')} {canary('bob')}", user_id=user, k=10).hits:
            assert hit.id.startswith(f"{user}:")
            assert all(canary(other) not in hit.text for other in USERS if other != user), hit

    @rule(user=st.sampled_from(USERS), data=st.data())
    def delete(self, user: str, data: st.DataObject) -> None:
        items = self.memory.list(user_id=user, limit=50).items
        if items:
            victim = data.draw(st.sampled_from(items))
            self.memory.delete(victim.id, user_id=user)  # with the turns it names
            assert victim.id not in {item.id for item in self.memory.list(user_id=user, limit=100).items}
            # a key that stored one of the deleted record's turns is forgotten with them
            self.keys = {key: stored for key, stored in self.keys.items()
                         if stored[0] != user or not self.key_turns[key] & set(victim.turns)}

    @rule(user=st.sampled_from(USERS))
    def forget(self, user: str) -> None:
        self.memory.forget(user_id=user)
        self.turns[user] = 0
        self.keys = {key: add for key, add in self.keys.items() if add[0] != user}
        for _ in range(600):  # at most 60 s for the compaction behind the forget
            if self.memory.store.meta(COMPACTION_OWED) is None:
                break
            time.sleep(0.1)
        data = b"".join(p.read_bytes() for p in self.path.rglob("*") if p.is_file())
        assert canary(user).encode() not in data and canary(user).lower().encode() not in data

    @rule(user=st.sampled_from(USERS))
    def consolidate(self, user: str) -> None:
        if self.memory.list(user_id=user, limit=1).items:
            assert self.memory.consolidate(user_id=user, wait=True, timeout_s=60).state == "done"

    @invariant()
    def turns_are_counted(self) -> None:
        if hasattr(self, "memory"):
            for user in USERS:
                assert self.stored(user) <= self.turns[user]


MemoryMachine.TestCase.settings = settings(max_examples=12, stateful_step_count=12, deadline=None,
                                           suppress_health_check=[HealthCheck.too_slow])
test_memory_state_machine = MemoryMachine.TestCase
