"""ARCHITECTURE.md stays true to the tree: every project path it names exists (and every ``file::test`` it names is a
test of that file), and every "invariant N" the code cites under runner/ and simserver/ is an invariant it numbers.

The code's docstrings and comments point at ARCHITECTURE.md for the invariants ("ARCHITECTURE.md invariant 3"), so
a renamed module, a removed test or a renumbered invariant fails here until the document follows.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "ARCHITECTURE.md"

#: the folders whose paths the document names: a backticked token starting with one of these is a project path
PROJECT_ROOTS = ("runner/", "simserver/", "tests/", "bench/", "scripts/", "jobs/", "prompts/", "data/")
#: where the code cites invariants
CITING = ("runner", "simserver")

_BACKTICKED = re.compile(r"`([^`\n]+)`")
_NUMBERED = re.compile(r"^### Invariant (\d+): \S", re.MULTILINE)
_CITED = re.compile(r"\binvariant\s+(\d+)\b", re.IGNORECASE)


def _doc() -> str:
    return DOC.read_text(encoding="utf-8")


def _project_paths() -> list[str]:
    return sorted({token for token in _BACKTICKED.findall(_doc()) if token.startswith(PROJECT_ROOTS)})


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


def _sources() -> list[Path]:
    return sorted(path for folder in CITING for path in (ROOT / folder).rglob("*.py")
                  if "__pycache__" not in path.parts)


def _citations() -> dict[int, list[str]]:
    cited: dict[int, list[str]] = {}
    for path in _sources():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in _CITED.finditer(line):
                cited.setdefault(int(match.group(1)), []).append(f"{path.relative_to(ROOT)}:{number}")
    return cited


def test_the_document_names_project_paths() -> None:
    assert len(_project_paths()) > 50  # the check below checks something


@pytest.mark.parametrize("token", _project_paths())
def test_every_path_the_document_names_exists(token: str) -> None:
    path, _, test = token.partition("::")
    target = ROOT / path
    assert target.exists(), f"ARCHITECTURE.md names `{token}`, which is not in the tree"
    if path.endswith("/"):
        assert target.is_dir(), f"ARCHITECTURE.md names `{token}` as a folder"
    if test:
        assert target.suffix == ".py" and test in _test_names(target), \
            f"ARCHITECTURE.md names `{token}`, but {path} has no test {test}"


def test_invariants_are_numbered_one_by_one() -> None:
    numbers = [int(n) for n in _NUMBERED.findall(_doc())]
    assert numbers == list(range(1, len(numbers) + 1)), numbers
    assert len(numbers) >= 5


def test_every_invariant_the_code_cites_is_numbered_in_the_document() -> None:
    numbered = {int(n) for n in _NUMBERED.findall(_doc())}
    cited = _citations()
    assert {1, 2, 3, 4, 5} <= set(cited), f"the scan found only invariants {sorted(cited)}"
    missing = {number: places for number, places in cited.items() if number not in numbered}
    assert not missing, f"cited but not numbered in ARCHITECTURE.md: {missing}"


def test_the_code_cites_the_shipped_document() -> None:
    """The design notes the project started from are not shipped with it: citations name ARCHITECTURE.md."""
    stale = [f"{path.relative_to(ROOT)}:{number}" for path in _sources()
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"\bDESIGN\b", line)]
    assert not stale, f"cite ARCHITECTURE.md instead: {stale}"
