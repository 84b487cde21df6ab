"""runner/providers/ sits below the engine in the data flow: the engine builds the providers and hands them what they
need (their settings, the connection pool their SDK clients need), and no provider module imports anything of
runner/engine, not even inside a function or for type hints. Read from the source, as tests/spec/test_layers.py
reads the spec's imports."""

from __future__ import annotations

import pytest

from tests.spec.test_layers import MODULES, every_import

PROVIDER_MODULES = sorted(name for name in MODULES if name.startswith("runner.providers."))


def test_the_providers_are_read() -> None:
    assert "runner.providers.base" in PROVIDER_MODULES and "runner.providers.openai_chat" in PROVIDER_MODULES


@pytest.mark.parametrize("module", PROVIDER_MODULES)
def test_no_provider_module_imports_the_engine(module: str) -> None:
    assert not [name for name in every_import(module) if name.startswith("runner.engine")]
