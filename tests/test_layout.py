"""The package layout: no module over 400 lines, a module map that names every module, the public
API at the package root, light imports, one place per default, comments that say what and why
(not which issue brought them). The import directions and the absence of cycles are
import-linter contracts (pyproject.toml, run by .ci/run)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("isq", "training", "retrieval")
MAPPED = (*PACKAGES, "benchmarks")
"""Whose module files docs/architecture.md names (the 400-line rule is the packages')."""
MAX_LINES = 400
MODULE_MAP = REPO / "docs" / "architecture.md"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules(packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    return {module_name(path): path for package in packages
            for path in sorted((REPO / package).rglob("*.py"))}


def mapped_modules(text: str) -> set[str]:
    """The module files that a Markdown text names as `path/to/module.py`."""
    return set(re.findall(r"`((?:isq|training|retrieval|benchmarks)/[\w/]*\.py)`", text))


def test_the_module_map_names_every_module_and_only_real_ones() -> None:
    named = mapped_modules(MODULE_MAP.read_text(encoding="utf-8"))
    on_disk = {str(path.relative_to(REPO)) for path in project_modules(MAPPED).values()
               if path.name != "__init__.py"}
    assert not on_disk - named, f"docs/architecture.md does not name {sorted(on_disk - named)}"
    assert not named - on_disk, f"docs/architecture.md names missing files {sorted(named - on_disk)}"


def test_the_module_map_parser_reads_table_rows() -> None:
    row = "| `retrieval/memory/store.py` | the store |\n| `isq/model.py`, `isq/walks.py` | x | `notes.md`"
    assert mapped_modules(row) == {"retrieval/memory/store.py", "isq/model.py", "isq/walks.py"}


WHEN = re.compile(r"\bissues? #?\d+|\bround[- ]\d+\b|\bnewcomer", re.IGNORECASE)
"""Which issue, round or reviewer brought a line: history, kept in docs/results.md and git, not in code."""
SAYS_WHAT = ("isq", "training", "retrieval", "tests", "benchmarks", "scripts", "configs")


def test_code_says_what_and_why_not_which_issue_or_round():
    files = [path for folder in SAYS_WHAT for path in sorted((REPO / folder).rglob("*"))]
    found = [f"{path.relative_to(REPO)}:{number}" for path in files
             if path.suffix in (".py", ".yaml", ".sh") and path != Path(__file__).resolve()
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
             if WHEN.search(line)]
    assert not found, found
    assert not WHEN.search("rounded half up; an issue of scale")


def test_no_module_over_400_lines() -> None:
    long = {name: n for name, path in project_modules().items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, long


def test_public_api_at_the_package_root() -> None:
    import isq

    for name in isq.__all__:
        assert getattr(isq, name) is not None, name
    from isq import CooccurrenceTopology, EMAQuantizer, Fingerprinter, ISQConfig, ISQModel, TopologyParams

    assert Fingerprinter.__module__ == "isq.fingerprint" and ISQModel.__module__ == "isq.model"
    assert [cls.__module__ for cls in (ISQConfig, EMAQuantizer, CooccurrenceTopology, TopologyParams)] == [
        "isq.config", "isq.quantizer", "isq.topology", "isq.topology"]
    with pytest.raises(AttributeError):
        isq.NotAThing  # noqa: B018


@pytest.mark.parametrize(("statement", "absent"), [
    ("import isq", ("torch", "lightning")),
    ("import isq.markdown", ("torch", "numpy")),
    ("from isq import Fingerprinter", ("lightning", "training", "retrieval")),
    ("import retrieval.eval.paired_differences", ("torch", "transformers", "faiss")),
    # the store commands (check, compact) and the key commands start in a second, not eight
    ("import retrieval.store, retrieval.service.keys", ("torch", "transformers")),
    ("from isq.codes import Fingerprint", ("torch",)),
])
def test_imports_stay_light(statement: str, absent: tuple[str, ...]) -> None:
    check = f"{statement}; import sys; print([m for m in {absent!r} if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, cwd=REPO,
                            check=True)
    assert result.stdout.strip() == "[]", result.stdout


def test_topology_defaults_are_defined_once() -> None:
    from isq.topology import TopologyParams
    from retrieval.eval.dual_path import DualPathRetriever
    from retrieval.evaluate import _parser

    defaults = TopologyParams()
    args = _parser().parse_args(["--locomo", "x", "--fingerprinter", "y", "--out", "z"])
    assert TopologyParams(args.max_hops, args.alpha, args.self_term, args.aggregate, args.association,
                          args.length_norm) == defaults
    retriever = DualPathRetriever(4, {"codebook_size": 8, "codebook_sha256": "0" * 64})
    assert retriever.topology.params == defaults
