"""The package layout: dependencies point one way (training -> isq, retrieval -> isq, and down the
layers of retrieval/), no import cycles, no module over 400 lines, a module map that names every
module, the public API at the package root, one place per default."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("isq", "training", "retrieval")
MAX_LINES = 400
MODULE_MAP = REPO / "docs" / "architecture.md"

RETRIEVAL_LAYERS = {
    "retrieval.memory": 0,  # records and the store: the data floor
    "retrieval.llm_client": 1, "retrieval.contract": 1,
    "retrieval.extract": 2, "retrieval.index": 2,
    "retrieval.ingestion": 3,
    "retrieval.routes": 4,
    "retrieval.consolidation": 5,
    "retrieval.api": 6,
    "retrieval.eval": 7, "retrieval.service": 7,
}
"""retrieval/ from the floor up: a module may import its own layer and those below. Top-level
modules not listed (the command lines) sit above everything."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(path): path for package in PACKAGES
            for path in sorted((REPO / package).rglob("*.py"))}


def _type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imported_modules(path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules that ``path`` imports anywhere (functions included), except under
    ``if TYPE_CHECKING:``, which never runs."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = {id(child) for node in ast.walk(tree) if _type_checking_block(node)
               for statement in node.body for child in ast.walk(statement)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(name for name in names if name in modules)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imported_modules(path, modules) - {name} for name, path in modules.items()}


def test_dependencies_point_one_way() -> None:
    wrong = [f"{module} imports {target}" for module, targets in import_graph().items() for target in targets
             if (module.startswith("isq") and target.split(".")[0] in ("training", "retrieval"))
             or (module.startswith("retrieval") and target.split(".")[0] == "training")]
    assert not wrong, wrong


def retrieval_layer(module: str) -> int | None:
    for prefix, layer in RETRIEVAL_LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return len(RETRIEVAL_LAYERS) if module.startswith("retrieval.") else None


def test_retrieval_imports_point_down_its_layers() -> None:
    wrong = [f"{module} imports {target}" for module, targets in import_graph().items()
             if (layer := retrieval_layer(module)) is not None for target in targets
             if (target_layer := retrieval_layer(target)) is not None and target_layer > layer]
    assert not wrong, wrong


def test_the_layer_check_sees_an_upward_import() -> None:
    # A guard for the test above: the store importing the evaluation would be caught.
    assert retrieval_layer("retrieval.memory.store") == 0 and retrieval_layer("retrieval.eval.run") == 7
    assert retrieval_layer("retrieval.evaluate") > retrieval_layer("retrieval.eval.run")
    assert retrieval_layer("isq.model") is None


def mapped_modules(text: str) -> set[str]:
    """The module files that a Markdown text names as `path/to/module.py`."""
    return set(re.findall(r"`((?:isq|training|retrieval)/[\w/]*\.py)`", text))


def test_the_module_map_names_every_module_and_only_real_ones() -> None:
    named = mapped_modules(MODULE_MAP.read_text(encoding="utf-8"))
    on_disk = {str(path.relative_to(REPO)) for path in project_modules().values()
               if path.name != "__init__.py"}
    assert not on_disk - named, f"docs/architecture.md does not name {sorted(on_disk - named)}"
    assert not named - on_disk, f"docs/architecture.md names missing files {sorted(named - on_disk)}"


def test_the_module_map_parser_reads_table_rows() -> None:
    row = "| `retrieval/memory/store.py` | the store |\n| `isq/model.py`, `isq/walks.py` | x | `notes.md`"
    assert mapped_modules(row) == {"retrieval/memory/store.py", "isq/model.py", "isq/walks.py"}


def test_no_import_cycles() -> None:
    graph = import_graph()
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, cycles


def test_the_graph_sees_lazy_imports(tmp_path: Path) -> None:
    # A guard for the two tests above: an import inside a function is an edge, a TYPE_CHECKING one is not.
    source = tmp_path / "probe.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import isq.model\n"
                      "def f():\n    from retrieval.eval.dual_path import Hit\n")
    modules = project_modules()
    assert imported_modules(source, modules) == {"retrieval.eval.dual_path"}


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
