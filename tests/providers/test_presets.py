"""The OpenAI-compatible services by name (runner/providers/presets.py): each through the openai SDK against the
simulated server (its base URL pointed there, its key variable set), as a whole job: the answers, the memo (a
second run sends nothing), a missing key named by its variable, and the price genai-prices gives the service's
model (free for the local servers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.engine.run import execute
from runner.errors import ModelSetupError
from runner.plan.request import cache_key, canonical_request
from runner.plan.stage import model_key
from runner.providers.base import ProviderSettings, provider_class
from runner.providers.capabilities import capabilities
from runner.providers.presets import PRESETS
from runner.providers.pricing import Pricing
from runner.report import summary as report
from runner.spec.job import load_job
from runner.store import open_store
from simserver import SimServer, simulated_reply, start_server
from tests.helpers import write_job, write_rows

#: each preset's key variable, and a model genai-prices lists under its provider id (None: a free local server)
SERVICES = {
    "openrouter": ("OPENROUTER_API_KEY", "openai/gpt-4o", "openrouter"),
    "together": ("TOGETHER_API_KEY", "meta-llama/Llama-3.3-70B-Instruct-Turbo", "together"),
    "groq": ("GROQ_API_KEY", "llama-3.1-8b-instant", "groq"),
    "deepseek": ("DEEPSEEK_API_KEY", "deepseek-chat", "deepseek"),
    "mistral": ("MISTRAL_API_KEY", "mistral-large-latest", "mistral"),
    "fireworks": ("FIREWORKS_API_KEY", "accounts/fireworks/models/deepseek-r1-0528", "fireworks"),
    "ollama": (None, "llama3.2", None),
    "vllm": (None, "Qwen/Qwen2.5-0.5B-Instruct", None),
}


@pytest.fixture(autouse=True)
def _keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable, _, _ in SERVICES.values():
        if variable:
            monkeypatch.setenv(variable, f"test-key-{variable.lower()}")


def make_job(tmp_path: Path, srv: SimServer, service: str, rows: int, name: str = "job"):
    dataset = write_rows(tmp_path / f"{name}.jsonl", rows)
    model = f"{service}:{SERVICES[service][1]}"
    extra = f"providers: {{{service}: {{base_url: {json.dumps(srv.url)}, timeout: 5}}}}"
    return load_job(write_job(tmp_path / f"{name}.yaml", dataset, models=[model], extra=extra, name=name))


def test_every_preset_is_a_named_provider_with_its_documented_address() -> None:
    assert set(PRESETS) == set(SERVICES)
    for service, (variable, _, price_id) in SERVICES.items():
        cls = provider_class(service)
        assert cls is PRESETS[service] and cls.name == service
        assert (cls.key_env_var, cls.price_id) == (variable, price_id)
        assert cls.default_base_url.startswith("http://127.0.0.1:" if variable is None else "https://")
        assert not cls.supports_batch
    assert provider_class("ollama").default_base_url == "http://127.0.0.1:11434/v1"
    assert provider_class("vllm").default_base_url == "http://127.0.0.1:8000/v1"
    # providers: {NAME: {base_url: ...}} points a preset elsewhere
    moved = provider_class("ollama")(ProviderSettings(base_url="http://127.0.0.1:9/v1"))
    assert moved.base_url == "http://127.0.0.1:9/v1"
    assert provider_class("groq")(ProviderSettings()).base_url == "https://api.groq.com/openai/v1"


@pytest.mark.parametrize("service", list(SERVICES))
async def test_a_preset_answers_through_the_openai_sdk_and_the_memo_keeps_it(tmp_path, service):
    async with await start_server() as srv:
        job = make_job(tmp_path, srv, service, 6)
        store = open_store(tmp_path / "s.sqlite")
        first = await execute(job, store)
        sent = srv.stats()["received"]
        again = await execute(make_job(tmp_path, srv, service, 6), store)
        assert srv.stats()["received"] == sent == 6  # the second run is all memo hits
    assert first.status == again.status == "completed"
    responses = list(store.responses())
    assert len(responses) == 6
    for row in responses:
        request = json.loads(row["request_json"])
        assert request["model"] == SERVICES[service][1]
        expected, _ = simulated_reply(request["model"], request["messages"], 0, 5)
        assert row["response_text"] == expected
    lines = [json.loads(line) for line in again.results["mc"].read_text().splitlines()]
    assert len(lines) == 6 and all(line["response"] for line in lines)
    totals = report.build(store, first.run_id)["totals"]
    assert totals["sent"] == 6
    assert (totals["cost"] > 0) == (SERVICES[service][2] is not None)


@pytest.mark.parametrize("service", [s for s, (variable, _, _) in SERVICES.items() if variable])
async def test_a_missing_key_names_the_variable_before_anything_is_sent(tmp_path, service, monkeypatch):
    variable = SERVICES[service][0]
    monkeypatch.delenv(variable)
    async with await start_server() as srv:
        job = make_job(tmp_path, srv, service, 2)
        with pytest.raises(ModelSetupError) as refused:
            await execute(job, open_store(tmp_path / "s.sqlite"))
        assert srv.stats()["received"] == 0
    assert str(refused.value) == (f"{service}:{SERVICES[service][1]} needs an API key: export {variable} "
                                  "(no request was sent)")


@pytest.mark.parametrize("service", list(SERVICES))
def test_a_presets_price_comes_from_genai_prices_under_its_own_id(service) -> None:
    _, model, price_id = SERVICES[service]
    rates = Pricing().rates(f"{service}:{model}")
    if price_id is None:
        assert rates is not None and rates.is_free and rates.source.startswith("free:")
    else:
        assert rates is not None and rates.input > 0 and rates.output > 0
        assert rates.source.startswith("genai-prices ") and f": {price_id}/" in rates.source


def test_two_services_serving_one_model_id_never_share_answers() -> None:
    messages = [{"role": "user", "content": "hi"}]
    keys = set()
    for service in ("together", "groq", "fireworks", "ollama", "vllm"):
        provider, _, model_id = model_key(f"{service}:llama-3-8b", {})
        keys.add(cache_key(canonical_request(provider, model_id, messages, {"temperature": 0})))
    assert len(keys) == 5


def test_the_capability_table_applies_to_openais_models_through_openrouter() -> None:
    openrouter = provider_class("openrouter")
    assert openrouter.capability_model("openai/o3-mini") == ("openai", "o3-mini")
    assert capabilities(*openrouter.capability_model("openai/o3-mini")).temperature is None  # a reasoning model
    assert openrouter.capability_model("meta-llama/llama-3-8b") is None
    assert provider_class("groq").capability_model("llama-3.1-8b-instant") is None
