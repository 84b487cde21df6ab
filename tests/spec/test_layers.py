"""runner/spec/ in layers: the schema needs nothing of the plan, the checks that need the plan or the providers sit
in a module of their own, and no module of runner/spec is on an import cycle, so none of them has to import inside
a function to dodge one. Read from the source (module-level imports), and once for real in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import ROOT
from tests.imports import MODULES, every_import, imports_in_functions, module_level_imports, reachable

#: the schema's modules: the models of a job file
SCHEMA = ("runner.spec.schema", "runner.spec.stage", "runner.spec.fields", "runner.spec.settings", "runner.spec.steps")
#: what the schema may take from runner/providers: the settings model every provider is built with, and the
#: capability table that shapes a stage's parameters per model
PROVIDER_CONTRACT = ("runner.providers.base", "runner.providers.capabilities")


SPEC_MODULES = sorted(name for name in MODULES if name.startswith("runner.spec."))


def test_the_graph_reads_the_imports_it_should() -> None:
    # the reader itself: a module-level import counts, one under TYPE_CHECKING does not, a relative one resolves
    assert "runner.spec.checks" in module_level_imports("runner.spec.job")
    assert "runner.plan.prompts" in module_level_imports("runner.spec.checks")
    assert "runner.spec.schema" not in module_level_imports("runner.spec.files")  # only for type hints
    assert "runner.spec.schema" in every_import("runner.spec.files")
    assert "runner.providers.base" in module_level_imports("runner.providers.local")  # from .base import ...


@pytest.mark.parametrize("module", SCHEMA)
def test_the_schema_imports_nothing_from_the_plan(module: str) -> None:
    names = every_import(module)
    assert not [name for name in names if name.startswith("runner.plan")]
    assert {name for name in names if name.startswith("runner.providers.")} <= set(PROVIDER_CONTRACT)


@pytest.mark.parametrize("module", PROVIDER_CONTRACT)
def test_what_the_schema_takes_from_the_providers_imports_neither_spec_nor_plan(module: str) -> None:
    assert not [name for name in reachable(module) if name.startswith(("runner.spec", "runner.plan"))]


def test_the_checks_that_need_the_plan_or_the_providers_are_not_in_the_schema() -> None:
    checks = every_import("runner.spec.checks")
    assert {"runner.plan.prompts", "runner.plan.datasets", "runner.providers.local_weights"} <= checks
    schema = set().union(*(reachable(module) for module in SCHEMA))
    assert "runner.spec.checks" not in schema and "runner.spec.job" not in schema


@pytest.mark.parametrize("module", SPEC_MODULES)
def test_no_spec_module_is_on_an_import_cycle(module: str) -> None:
    assert module not in reachable(module)


@pytest.mark.parametrize("module", SPEC_MODULES)
def test_no_spec_module_imports_the_runner_inside_a_function(module: str) -> None:
    assert imports_in_functions(module) == set()


@pytest.mark.parametrize("first", ["runner.plan.prompts", "runner.providers.local_weights", "runner.providers.local",
                                   "runner.spec.schema"])
def test_the_spec_loads_whichever_module_is_imported_first(first: str) -> None:
    # the modules that once closed the spec <-> plan cycle, imported before the loader in a fresh interpreter
    code = f"import {first}\nfrom runner.spec.job import load_job\nprint(load_job.__module__)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "runner.spec.job"
