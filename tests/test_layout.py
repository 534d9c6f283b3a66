"""The package layout: dependencies point one way (training -> isq, retrieval -> isq), no import
cycles, no module over 400 lines, the public API at the package root, one place per default."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("isq", "training", "retrieval")
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(path): path for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))}


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
                      "def f():\n    from retrieval.retriever import Hit\n")
    modules = project_modules()
    assert imported_modules(source, modules) == {"retrieval.retriever"}


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
    assert {ISQConfig, EMAQuantizer, CooccurrenceTopology, TopologyParams}
    with pytest.raises(AttributeError):
        isq.NotAThing  # noqa: B018


@pytest.mark.parametrize(("statement", "absent"), [
    ("import isq", ("torch", "lightning")),
    ("import isq.markdown", ("torch", "numpy")),
    ("from isq import Fingerprinter", ("lightning", "training", "retrieval")),
    ("import retrieval.eval.paired", ("torch", "transformers", "faiss")),
])
def test_imports_stay_light(statement: str, absent: tuple[str, ...]) -> None:
    check = f"{statement}; import sys; print([m for m in {absent!r} if m in sys.modules])"
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, cwd=REPO, check=True)
    assert result.stdout.strip() == "[]", result.stdout


def test_topology_defaults_are_defined_once() -> None:
    from isq.topology import TopologyParams
    from retrieval.evaluate import _parser
    from retrieval.retriever import DualPathRetriever

    defaults = TopologyParams()
    args = _parser().parse_args(["--locomo", "x", "--fingerprinter", "y", "--out", "z"])
    assert TopologyParams(args.max_hops, args.alpha, args.self_term, args.aggregate, args.association,
                          args.length_norm) == defaults
    retriever = DualPathRetriever(4, {"codebook_size": 8, "codebook_sha256": "0" * 64})
    assert retriever.topology.params == defaults
