"""The load test's pre-fill: ``args.users`` users in a store (a directory, reused between runs,
or a database), the first the dev conversations through ``Memory.add``, every other a copy of it
(:func:`retrieval.api.user_copy.copy_user`): real rows under its own ids, so the load test's leak
checks still bite, in seconds instead of a rebuild of each user."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Any

PREFILL_MARK = "prefill.json"


def user_name(number: int) -> str:
    return f"u{number:03d}"


def prefill(args: argparse.Namespace) -> dict[str, Any]:
    """Build the pre-filled store under ``args.prefilled``, or reuse one built with these settings
    and at least ``args.users`` users (the load test uses the first ``args.users``); one with
    fewer grows by copies (:func:`add_users`)."""
    wanted = {"locomo": str(args.locomo.resolve()),
              "fingerprinter": str(args.fingerprinter.resolve()) if args.fingerprinter else None}
    mark = args.prefilled / PREFILL_MARK
    built = json.loads(mark.read_text()) if mark.is_file() else {}
    if built and {k: built.get(k) for k in wanted} != wanted:
        shutil.rmtree(args.prefilled)  # built with other settings
        built = {}
    if built.get("users", 0) >= args.users:
        return {**built, "reused": True}
    built = {**wanted, **add_users(args, args.prefilled, built)}
    mark.write_text(json.dumps(built, indent=2) + "\n")
    return {**built, "reused": False}


def add_users(args: argparse.Namespace, store: Path | str,
              built: dict[str, Any] | None = None) -> dict[str, Any]:
    """``args.users`` users in ``store`` (a directory or a database URL), ``built`` saying how many
    it holds already: the first is the dev conversations through ``Memory.add`` session by session
    (an interrupted build resumes: stored turns replay); every other user is a copy of it
    (:func:`copy_user`, one transaction each: real rows of its own, so the leak checks still bite)."""
    from retrieval.api.bulk import add_conversation
    from retrieval.api.memory import Memory
    from retrieval.api.user_copy import copy_user
    from retrieval.eval.locomo import load_locomo

    built = dict(built or {})
    seed = user_name(0)
    with Memory.open(store, fingerprinter=args.fingerprinter) as memory:
        began = time.perf_counter()
        if not built:
            conversations = load_locomo(args.locomo)
            add_conversation(memory, [dataclasses.replace(
                turn, user_id=seed, session_id=f"{conversation.conversation_id}-{turn.session_id}",
                turn_id=f"{conversation.conversation_id}-{turn.turn_id}")
                for conversation in conversations for turn in conversation.turns])
            memory.drain()
            built = {"users": 1, "turns_per_user": sum(len(c.turns) for c in conversations),
                     "records_per_user": memory.store.count(seed),
                     "seed_s": round(time.perf_counter() - began, 1), "copy_s": 0.0}
            print(f"prefill: {seed} built in {built['seed_s']} s", flush=True)
        began = time.perf_counter()
        for number in range(built["users"], args.users):
            if not memory.store.has_user(user_name(number)):  # a copy is all or none
                copy_user(memory, seed, user_name(number))
        copied_s = time.perf_counter() - began
    built = {**built, "users": max(built["users"], args.users),
             "copy_s": round(built["copy_s"] + copied_s, 2)}
    built["copy_s_per_user"] = round(built["copy_s"] / max(1, built["users"] - 1), 3)
    built["seconds"] = round(built["seed_s"] + built["copy_s"], 1)
    print(f"prefill: {built['users'] - 1} copies in {built['copy_s']} s", flush=True)
    return built
