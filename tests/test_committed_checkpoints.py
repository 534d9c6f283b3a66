"""The fingerprinters committed under ``checkpoints/``: each loads, fingerprints, and is what its
name says (the seed and the k-means control a trained seed started from), so the seeds of
``docs/results.md`` are the ones anyone evaluates."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from isq.fingerprint import Fingerprinter

CHECKPOINTS = Path(__file__).resolve().parents[1] / "checkpoints"
EXPORTS = sorted(path for path in CHECKPOINTS.iterdir() if (path / "config.json").is_file())
SEED = re.compile(r"_seed(\d+)$")


def seed_of(directory: Path) -> int:
    """The seed a directory's name says; an unsuffixed name is seed 0 (the default checkpoints)."""
    match = SEED.search(directory.name)
    return int(match.group(1)) if match else 0


def test_the_default_pair_and_three_seeds_are_committed() -> None:
    names = {path.name for path in EXPORTS}
    for seed in ("", "_seed1", "_seed2"):
        assert f"isq_minilm_dailydialog_cpu{seed}" in names
        assert f"kmeans_minilm_dailydialog{seed}" in names


@pytest.mark.parametrize("directory", EXPORTS, ids=lambda path: path.name)
def test_each_export_loads_and_is_the_seed_its_name_says(directory: Path) -> None:
    run = json.loads((directory / "training_run.json").read_text())
    if run.get("kind") == "kmeans_control":
        assert run["kmeans"]["seed"] == seed_of(directory)
        assert run["codes_used"] == run["num_codes"] == 1024
    else:
        control = CHECKPOINTS / run["optim"]["init_from"].removeprefix("checkpoints/")
        assert control.name.startswith("kmeans_") and seed_of(control) == seed_of(directory)
        assert run["global_step"] == 400
    fingerprinter = Fingerprinter.from_pretrained(directory)
    (codes,) = [fp.codes for fp in fingerprinter.fingerprint(["Melanie painted a lake at sunrise."])]
    assert codes and max(codes) < fingerprinter.codebook_size == 1024
