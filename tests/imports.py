"""The project's own imports read from its source, for the tests that pin its structure (tests/spec/test_layers.py,
tests/test_import_layers.py): which runner modules a module imports, at import time or anywhere."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import ROOT

PACKAGE = ROOT / "runner"


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


MODULES = module_names()


def imported(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The runner modules an import statement of ``module`` loads (a package's ``__init__`` included)."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            base = f"{package}.{base}" if base else package
        targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
    loaded = set()
    for target in targets:
        parts = target.split(".")
        loaded.update(".".join(parts[:end]) for end in range(1, len(parts) + 1) if ".".join(parts[:end]) in MODULES)
    return sorted(loaded - {module})


def is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name | ast.Attribute) and ast.unparse(node.test).endswith("TYPE_CHECKING")


def module_level_imports(module: str) -> set[str]:
    """What importing ``module`` imports of runner: statements run at import time (not in a function, not under
    ``if TYPE_CHECKING:``)."""
    found: set[str] = set()

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.Import | ast.ImportFrom):
                found.update(imported(module, node))
            elif isinstance(node, ast.If) and not is_type_checking(node):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, ast.ClassDef):
                visit(node.body)

    visit(ast.parse(MODULES[module].read_text(encoding="utf-8")).body)
    return found


def every_import(module: str) -> set[str]:
    """Every runner module ``module`` names in an import, wherever the statement is (functions, TYPE_CHECKING)."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    return {name for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)
            for name in imported(module, node)}


def imports_in_functions(module: str) -> set[str]:
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    return {name for function in ast.walk(tree) if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef)
            for node in ast.walk(function) if isinstance(node, ast.Import | ast.ImportFrom)
            for name in imported(module, node)}


def reachable(start: str) -> set[str]:
    """The runner modules importing ``start`` loads, ``start`` itself only when a cycle leads back to it."""
    seen: set[str] = set()
    todo = sorted(module_level_imports(start))
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(module_level_imports(name))
    return seen


def runtime_imports(module: str) -> set[str]:
    """The runner modules ``module`` imports when it runs, wherever the statement is (a function's too; not under
    ``if TYPE_CHECKING:``), each the deepest module a statement names (``from runner.spec.files import x`` is
    ``runner.spec.files``, not also its package)."""
    found: set[str] = set()

    class Reader(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            if is_type_checking(node):
                for statement in node.orelse:
                    self.visit(statement)
            else:
                self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            self._add(node)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            self._add(node)

        def _add(self, node: ast.Import | ast.ImportFrom) -> None:
            names = imported(module, node)
            found.update(name for name in names if not any(other.startswith(name + ".") for other in names))

    Reader().visit(ast.parse(MODULES[module].read_text(encoding="utf-8")))
    return found
