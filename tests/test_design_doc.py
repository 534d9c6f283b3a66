"""The design lives in the repository: nothing cites the shared specification file that a clone
from elsewhere lacks, and every ``docs/design.md §N`` citation names a section that exists."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DESIGN = REPO / "docs" / "design.md"
CODE = ("isq", "training", "retrieval", "benchmarks", "scripts", "configs", "tests")
OUTSIDE_SPEC = re.compile(r"\bSPEC\b|SPEC\.md")
"""The shared specification, cited by name (``SPEC section 3``, ``the SPEC's``, ``SPEC.md``)."""
CITATION = re.compile(r"docs/design\.md\s+§(\d+(?:\.\d+)?)")
SECTION = re.compile(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", re.MULTILINE)


def cited_texts() -> dict[str, str]:
    """Every text file a reader of the repository meets: code, tests, configs, notebooks, pages."""
    paths = [path for folder in CODE for path in (REPO / folder).rglob("*")
             if path.suffix in (".py", ".yaml", ".sh", ".md")]
    paths += [REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "notebooks").glob("*.ipynb")]
    return {str(path.relative_to(REPO)): path.read_text(encoding="utf-8") for path in paths
            if path.is_file() and path != Path(__file__).resolve()}


def sections(text: str) -> set[str]:
    return set(SECTION.findall(text))


def test_nothing_cites_the_shared_specification():
    citing = sorted(f"{name}:{text[:match.start()].count(chr(10)) + 1}"
                    for name, text in cited_texts().items() for match in OUTSIDE_SPEC.finditer(text))
    assert not citing, f"cite docs/design.md instead: {citing}"


def test_every_design_citation_names_an_existing_section():
    existing = sections(DESIGN.read_text(encoding="utf-8"))
    cited = {(name, number) for name, text in cited_texts().items() for number in CITATION.findall(text)}
    assert len({name for name, _ in cited}) > 40  # the code cites the design throughout
    missing = sorted(f"{name}: §{number}" for name, number in cited if number not in existing)
    assert not missing, missing


def test_the_design_numbers_its_sections_in_order():
    numbers = SECTION.findall(DESIGN.read_text(encoding="utf-8"))
    chapters = [int(n) for n in numbers if "." not in n]
    assert chapters == list(range(1, 9))
    for number in numbers:  # each subsection follows its chapter, numbered 1, 2, ...
        if "." in number:
            chapter, sub = map(int, number.split("."))
            assert f"{chapter}.{sub - 1}" in numbers[:numbers.index(number)] or (
                sub == 1 and str(chapter) in numbers[:numbers.index(number)]), number


def test_the_checks_see_a_bad_citation_and_a_specification_citation():
    assert CITATION.findall("see docs/design.md §3.2 and docs/design.md\n    §9") == ["3.2", "9"]
    assert sections("## 3. Topology\n### 3.2 S_code\n#### 3.2.1 no\n") == {"3", "3.2"}
    assert OUTSIDE_SPEC.search("(SPEC section 3)") and OUTSIDE_SPEC.search("../shared/SPEC.md")
    assert not OUTSIDE_SPEC.search("SPECIAL = ('[CLS]',)") and not OUTSIDE_SPEC.search("PAPER_FORMULA")
