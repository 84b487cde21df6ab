"""Providers are named by entry points of the group ``runner.providers``, the bundled ones (this package's
pyproject.toml) as a plug-in's: listing them imports nothing, a class is loaded when it is asked for, and a new
provider is one class and one entry point (its name, key variable, own settings, token counting and genai-prices
id). The plug-in package's whole path (pip install, runner submit) is tests/providers/test_plugins.py."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.errors import ModelSetupError
from runner.providers import base, price_ids, tokens
from runner.providers.base import Provider, ProviderSettings, provider_class, provider_names, register, unregister
from tests.helpers import ROOT

#: the entry points this package declares: every bundled provider
DECLARED = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["runner.providers"]

FOO = '''
from __future__ import annotations

from typing import Any, ClassVar

from runner.providers.base import Completion, Provider, register


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


def install_dist(folder: Path, dist: str, entry_points: dict[str, str], modules: dict[str, str]) -> None:
    """A distribution as pip leaves it in a folder on the path: its modules, and a dist-info folder holding its
    METADATA and its ``runner.providers`` entry points (what importlib.metadata reads)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, source in modules.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
    info = folder / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n", encoding="utf-8")
    lines = [f"{name} = {target}" for name, target in entry_points.items()]
    (info / "entry_points.txt").write_text("[runner.providers]\n" + "\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture
def on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder put on sys.path (distributions installed into it with :func:`install_dist` are found), and the
    registry's entry points read again; the providers loaded from it are forgotten afterwards."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setattr(base.PROVIDERS, "_entry_points", None)
    before = set(base.PROVIDERS.classes)
    try:
        yield folder
    finally:
        for name in set(base.PROVIDERS.classes) - before:
            unregister(name)
        # a copy: a thread another test left running (an executor's, the embedded model's) may import meanwhile
        for name, module in list(sys.modules.items()):
            if str(folder) in str(getattr(module, "__file__", None) or ""):
                sys.modules.pop(name, None)


@pytest.fixture
def foo_plugin(on_path: Path) -> Path:
    install_dist(on_path, "foo-dist", {"foo": "foo_plugin:FooProvider"}, {"foo_plugin": FOO})
    return on_path


def test_every_bundled_provider_is_an_entry_point_of_this_package() -> None:
    assert set(DECLARED) <= set(provider_names())
    assert {"openai", "anthropic", "gemini", "sim", "openai-compatible", "local", "azure-openai", "vertex",
            "bedrock", "openrouter", "together", "groq", "deepseek", "mistral", "fireworks", "ollama",
            "vllm"} == set(DECLARED)
    for name, target in DECLARED.items():
        module, _, attribute = target.partition(":")
        if importlib.util.find_spec(module) is None:  # a provider still being written: said when it is named
            with pytest.raises(ModelSetupError, match=f"provider {name!r} cannot be loaded from the llm-job-runner "
                                                      f"package's entry point {name} = '{target}': "
                                                      "ModuleNotFoundError"):
                provider_class(name)
            continue
        cls = provider_class(name)
        assert (cls.name, cls.__module__, cls.__qualname__) == (name, module, attribute)
    with pytest.raises(KeyError, match="unknown provider 'nosuch'"):
        provider_class("nosuch")
    assert {name: price_ids.PROVIDER_IDS.get(name) for name in ("openai", "anthropic", "gemini", "sim", "local")} \
        == {"openai": "openai", "anthropic": "anthropic", "gemini": "google", "sim": None, "local": None}


def test_listing_and_loading_the_providers_imports_no_sdk() -> None:
    script = ("import sys\n"
              "from runner.errors import ModelSetupError\n"
              "from runner.providers.base import provider_class, provider_names\n"
              "names = provider_names()\n"
              "listed = [m for m in ('runner.providers.openai_chat', 'runner.providers.presets') if m in sys.modules]\n"
              "for name in names:\n"
              "    try:\n"
              "        provider_class(name)\n"
              "    except ModelSetupError:\n"
              "        pass\n"
              "print(len(names), listed, [m for m in ('openai', 'anthropic', 'google.genai', 'boto3', 'llama_cpp',"
              " 'aiohttp', 'numpy') if m in sys.modules])\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{len(DECLARED)} [] []\n"


def test_a_new_provider_is_one_class_and_one_entry_point(foo_plugin: Path) -> None:
    assert "foo" in provider_names() and "foo_plugin" not in sys.modules  # listed, not imported
    foo = provider_class("foo")
    assert foo.__module__ == "foo_plugin" and "foo-alias" in provider_names(aliases=True)
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
    assert price_ids.PROVIDER_IDS["foo"] == "mistral" and price_ids.PROVIDER_IDS["foo-alias"] == "mistral"


def test_a_plug_ins_own_setting_is_known_before_its_class_is_loaded(foo_plugin: Path) -> None:
    settings = ProviderSettings.model_validate({"region": "us"})  # loads the providers to learn their keys
    assert settings.provider_options == {"region": "us"} and "foo_plugin" in sys.modules


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
