"""A run's reports written aside and moved into the output directory together, ``results.json``
last, so that the directory holds one run's reports: a run stopped, failed or refused half-way
(Ctrl-C, an endpoint failing in the answer stage, a sweep refused) leaves the earlier run's as they
were, never its ``questions.jsonl`` beside another run's ``results.json``."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Collection, Iterator
from pathlib import Path

from retrieval.eval.curves import CURVES_FILE
from retrieval.eval.forest import FOREST_FILE

OPTIONAL = (CURVES_FILE, FOREST_FILE, "sweep.json", "answers.jsonl")
"""The reports a run writes only sometimes (pictures of what it has, ``--sweep``, the answer
stage): an earlier run's are dropped when this one has none, lest they read as this run's (the
LLM's answers stay cached, in ``OUT/llm_cache`` or ``--llm-cache``)."""

STAGING = ".incomplete"
"""The subdirectory of the output directory a run writes its reports into until they are all written."""


def staging_dir(out_dir: Path) -> Path:
    """An empty directory for this run's reports inside ``out_dir`` (what a stopped run left
    there is dropped)."""
    staging = out_dir / STAGING
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def publish(staging: Path, out_dir: Path, optional: Collection[str] = OPTIONAL) -> None:
    """Move every report of ``staging`` into ``out_dir``, ``results.json`` last, and drop the
    ``optional`` ones an earlier run wrote and this one did not; then ``staging`` itself."""
    for name in optional:
        if not (staging / name).exists():
            (out_dir / name).unlink(missing_ok=True)
    for path in sorted(staging.iterdir(), key=lambda path: path.name == "results.json"):
        os.replace(path, out_dir / path.name)
    staging.rmdir()


@contextlib.contextmanager
def staged(out_dir: Path) -> Iterator[Path]:
    """:func:`staging_dir` for a block that writes the run's reports: one that fails or is stopped
    in it (Ctrl-C) drops what it staged."""
    staging = staging_dir(out_dir)
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def drop_if_empty(out_dir: Path, made: bool) -> None:
    """Remove ``out_dir`` where the run ``made`` it and left nothing in it (a refused ``--store``
    run); another run's reports or a memory built there keep it."""
    if made:
        with contextlib.suppress(OSError):  # not empty, or gone
            out_dir.rmdir()
