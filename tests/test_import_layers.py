"""runner/ in layers, read from its imports: a module imports only from its own layer or the layers below it, and
no import cycle joins modules of two subpackages. The layers follow the data flow of ARCHITECTURE.md: what a job
is, how it is run, what is read of it, and the doors a user comes in by. Imports under ``if TYPE_CHECKING:`` are
type hints, not loaded, and are not counted; imports inside functions are."""

from __future__ import annotations

import functools

import pytest

from tests.imports import MODULES, runtime_imports

#: lowest first; a module belongs to the layer of the longest prefix naming it
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # what everything may use: the errors, processes, the version, the bundled files, patterns compiled on first use
    # (runner/lazy_re.py), where a job's file is found (runner/spec/files.py imports nothing of the job but its
    # type hint: the local weights use it too), and the runner's cache folder (runner/user_cache.py)
    ("foundation", ("runner.errors", "runner.processes", "runner.version", "runner.bundled", "runner.spec.files",
                    "runner.lazy_re", "runner.user_cache")),
    # what is kept and what is spoken: neither knows a job
    ("store and providers", ("runner.store", "runner.providers")),
    # what a job is: its file, what it asks, how answers are read, the papers' recipes
    ("the job", ("runner.spec", "runner.plan", "runner.evaluate", "runner.recipes")),
    ("the engine", ("runner.engine",)),
    ("the reports", ("runner.report",)),
    # what the front doors share: the run service, the pre-flight, the viewer, the cluster's workers, the Python API
    ("the services", ("runner.service", "runner.preflight", "runner.view", "runner.cluster", "runner.api")),
    ("the command line", ("runner.cli", "runner")),
]


def layer_of(module: str) -> int:
    # "runner" names the package itself only: a new module of runner/ must be given its layer
    best = max(((len(prefix), number) for number, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes
                if module == prefix or (prefix != "runner" and module.startswith(prefix + "."))), default=None)
    assert best is not None, f"{module} is in no layer: add it to LAYERS in {__file__}"
    return best[1]


def subpackage(module: str) -> str:
    """``runner.engine`` for ``runner.engine.run``; a module at the top of runner/ is its own."""
    parts = module.split(".")
    return ".".join(parts[:2])


@functools.cache
def graph() -> dict[str, set[str]]:
    """Each module of runner/ -> what it imports at run time: read when a test first asks, not while the suite is
    collected (every test process collects this file, and the read costs about 2 s of CPU)."""
    return {module: runtime_imports(module) for module in sorted(MODULES)}


def test_the_reader_sees_the_imports() -> None:
    assert sum(len(targets) for targets in graph().values()) > 500
    assert "runner.engine.assembly" in graph()["runner.engine.run"] or "runner.engine.dispatch" in graph()[
        "runner.engine.run"]
    assert "runner.spec.files" in graph()["runner.providers.local_weights"]  # the deepest module, not its package
    assert "runner.spec" not in graph()["runner.providers.local_weights"]
    # and the rule can fail: the engine imports the providers, two layers apart
    assert layer_of("runner.providers.base") < layer_of("runner.engine.run")
    assert any(target.startswith("runner.providers.") for target in graph()["runner.engine.endpoints"])


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_module_imports_only_from_its_layer_or_below(module: str) -> None:
    own = layer_of(module)
    upward = sorted(f"{target} ({LAYERS[layer_of(target)][0]})" for target in graph()[module]
                    if layer_of(target) > own)
    assert not upward, f"{module} ({LAYERS[own][0]}) imports from a higher layer: {', '.join(upward)}"


def _cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph():
        if root in index:
            continue
        work = [(root, iter(sorted(graph()[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in graph():
                    continue
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph()[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert any("runner.providers.vertex" in cycle for cycle in _cycles())  # a provider and its batch client


def test_no_import_cycle_joins_two_subpackages() -> None:
    across = [cycle for cycle in _cycles() if len({subpackage(module) for module in cycle}) > 1]
    assert not across, f"import cycles across subpackages: {across}"
