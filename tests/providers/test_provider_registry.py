"""Providers register themselves: a new ``runner/providers/foo.py`` is all a new provider needs (its name, key
variable, own settings, token counting and genai-prices id), and discovering the providers imports no SDK."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import runner.providers
from runner.errors import ModelSetupError
from runner.providers import base, pricing, tokens
from runner.providers.base import Provider, ProviderSettings, provider_class, provider_names, register, unregister
from tests.helpers import ROOT

BUILT_IN = ["anthropic", "gemini", "local", "openai", "openai-compatible", "sim"]

FOO = '''
from __future__ import annotations

from typing import Any, ClassVar

from .base import Completion, Provider, register


@register(aliases=("foo-alias",))
class FooProvider(Provider):
    name: ClassVar[str] = "foo"
    key_env_var: ClassVar[str | None] = "FOO_API_KEY"
    price_id: ClassVar[str | None] = "mistral"

    class Options(Provider.Options):
        region: str = "eu"

    @classmethod
    def count_input_tokens(cls, model: str, messages: Any) -> int:
        return 1000 + len(list(messages))

    @classmethod
    def tokens_exact(cls, model: str) -> bool:
        return True

    async def execute(self, model: str, messages: list[dict[str, str]], params: dict[str, Any]) -> Completion:
        return Completion(text=self.options.region)
'''


@pytest.fixture
def foo_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``foo.py`` in a folder added to the package's path, and the registry asked to discover again."""
    (tmp_path / "foo.py").write_text(textwrap.dedent(FOO), encoding="utf-8")
    monkeypatch.setattr(runner.providers, "__path__", [*runner.providers.__path__, str(tmp_path)])
    monkeypatch.setattr(base, "_discovered", False)
    try:
        yield
    finally:
        unregister("foo")
        sys.modules.pop("runner.providers.foo", None)


def test_the_built_in_providers_are_discovered() -> None:
    assert provider_names() == BUILT_IN
    for name in BUILT_IN:
        assert provider_class(name).name == name
    with pytest.raises(KeyError, match="unknown provider 'nosuch'"):
        provider_class("nosuch")
    assert dict(pricing.PROVIDER_IDS) == {"openai": "openai", "anthropic": "anthropic", "gemini": "google"}


def test_discovering_the_providers_imports_no_sdk() -> None:
    script = ("import sys\n"
              "from runner.providers.base import provider_names\n"
              "names = provider_names()\n"
              "print(len(names), [m for m in ('openai', 'anthropic', 'google.genai', 'llama_cpp', 'aiohttp', 'numpy')"
              " if m in sys.modules])\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(maxsplit=1) == ["6", "[]\n"]


def test_a_new_provider_is_one_module(foo_module: None) -> None:
    assert "foo" in provider_names() and "foo-alias" in provider_names(aliases=True)
    foo = provider_class("foo")
    assert provider_class("foo-alias") is foo and foo.key_env_var == "FOO_API_KEY"
    # its own setting passes the shared settings' validation, and reaches its Options
    settings = ProviderSettings.model_validate({"rpm": 10, "region": "us"})
    assert settings.rpm == 10 and foo(settings).options.region == "us"
    assert foo(ProviderSettings()).options.region == "eu"
    # a key no provider declares is still an unknown key, at its own location
    with pytest.raises(ValueError) as unknown:
        ProviderSettings.model_validate({"regoin": "us"})
    assert [(e["type"], e["loc"]) for e in unknown.value.errors()] == [("extra_forbidden", ("regoin",))]
    # another provider given foo's setting says so
    with pytest.raises(ModelSetupError, match="providers: sim: region is not one of its settings"):
        provider_class("sim")(settings)
    # token counting and prices come from the class
    messages = [{"role": "user", "content": "hi"}]
    assert tokens.count_input_tokens("foo", "m", messages) == 1001 and tokens.exact("foo", "m")
    assert pricing.PROVIDER_IDS["foo"] == "mistral" and pricing.PROVIDER_IDS["foo-alias"] == "mistral"
    assert "foo" in dict(pricing.PROVIDER_IDS)


def test_the_embedded_models_settings_are_its_options() -> None:
    local = provider_class("local")
    options = local(ProviderSettings.model_validate({"n_ctx": 512, "model_path": "x.gguf"})).options
    assert (options.n_ctx, options.model_path) == (512, "x.gguf")
    assert local(ProviderSettings()).options.n_ctx == 2048
    # the shared settings keep accepting them for every provider, as job files always could
    assert provider_class("sim")(ProviderSettings(n_ctx=512)).options.model_dump() == {}


def test_register_is_a_decorator_and_refuses_a_taken_name() -> None:
    @register(aliases=("tmp-alias",))
    class TmpProvider(Provider):
        name = "tmp"

        async def execute(self, model, messages, params):  # type: ignore[no-untyped-def]
            raise NotImplementedError

    try:
        assert provider_class("tmp-alias") is TmpProvider
        assert register(TmpProvider) is TmpProvider  # the same class again: fine

        class Other(TmpProvider):
            name = "tmp"

        with pytest.raises(ValueError, match="'tmp' is taken"):
            register(Other)

        class Clash(TmpProvider):
            name = "clash"

        with pytest.raises(ValueError, match="'sim' is taken"):
            register(Clash, aliases=("sim",))
        with pytest.raises(TypeError):
            register(object)  # type: ignore[type-var]
    finally:
        assert unregister("tmp") is TmpProvider
    assert "tmp" not in provider_names() and "tmp-alias" not in provider_names(aliases=True)
    # an unregistered provider's requests are estimated, as before
    assert tokens.count_input_tokens("tmp", "m", [{"role": "user", "content": "hi"}]) == \
        tokens.estimate_input_tokens([{"role": "user", "content": "hi"}])
    assert not tokens.exact("tmp", "m")


def test_the_fake_provider_fixture_registers_and_unregisters(fake_provider: type) -> None:
    assert provider_class("fake") is fake_provider
    assert tokens.count_input_tokens("fake", "m", []) == tokens.estimate_input_tokens([])
