"""genai-prices' answers remembered between processes (runner/providers/price_memo.py): a remembered model's rates
are genai-prices' own, a process that finds them does not import genai-prices, and only what holds at every time
is kept. Each test has its own memo file (RUNNER_PRICE_MEMO, tests/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any

import pytest
from genai_prices.data_snapshot import get_snapshot

from runner.providers import price_memo
from runner.providers.price_ids import PROVIDER_IDS
from runner.providers.pricing import Pricing
from tests.helpers import ROOT

#: a provider of each genai-prices provider id the runner prices with (several runner providers share one id)
_BY_ID = {provider_id: provider for provider, provider_id in reversed(list(PROVIDER_IDS.items()))}
#: genai-prices providers whose model ids the runner sends as they are (azure-openai's are deployments); enough to
#: cover tiered prices, cache-write prices, batch and service-tier variants, dated prices and time-of-day prices
_SAMPLED = ("openai", "anthropic", "google", "aws", "mistral", "groq", "deepseek")


def _infos(provider_id: str) -> list[Any]:
    return list(next(p for p in get_snapshot().providers if p.id == provider_id).models)


def _answers(pricing: Pricing, model: str, when: datetime | None = None) -> tuple[object, ...]:
    return (pricing.rates(model, when), pricing.batch_rates(model, when), pricing.tier_rates(model, "flex", when),
            pricing.tier_rates(model, "priority", when), pricing.known(model, when))


def test_a_remembered_model_has_genai_prices_own_rates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every model of seven genai-prices providers, looked up by one Pricing, then by another that reads the memo
    from its file: standard, batch and service-tier rates equal those of a Pricing without a memo, now and at a
    moment before a remembered model's prices held."""
    memo = tmp_path / "rates.json"
    monkeypatch.setenv("RUNNER_PRICE_MEMO", str(memo))
    models = [(f"{_BY_ID[pid]}:{info.id}", info) for pid in _SAMPLED for info in _infos(pid)]
    assert len(models) > 400
    for model, _ in models:
        Pricing().rates(model)
    kept = json.loads(memo.read_text())["models"]
    now = datetime.now(UTC)
    fresh_now = Pricing()
    monkeypatch.setenv("RUNNER_PRICE_MEMO", "off")
    # kept: the models with token prices whose every dated price has started and none varies by the time of day
    assert set(kept) == {f"{PROVIDER_IDS[model.split(':')[0]]}/{info.id}" for model, info in models
                         if price_memo.settled_since(info, now) is not None and fresh_now.rates(model) is not None}
    assert 300 < len(kept) < len(models)
    monkeypatch.setenv("RUNNER_PRICE_MEMO", str(memo))
    price_memo._MEMO = None  # as a new process: the memo read from its file
    remembered = Pricing()
    answers = {model: _answers(remembered, model) for model, _ in models}
    found = {model: remembered._find(model) for model, _ in models}
    earlier = {model: datetime.combine(f.since - timedelta(days=1), time(12), tzinfo=UTC) for model, f in found.items()
               if isinstance(f, price_memo.Remembered) and f.since > date.min}
    answers_earlier = {model: _answers(Pricing(), model, moment) for model, moment in earlier.items()}
    assert sum(isinstance(f, price_memo.Remembered) for f in found.values()) == len(kept)
    assert len(earlier) > 20  # models whose price changed on a date (o3), or gained a batch or tier price
    assert any(answers_earlier[m] != answers[m] for m in earlier)  # where the remembered rates would be wrong
    monkeypatch.setenv("RUNNER_PRICE_MEMO", "off")
    fresh = Pricing()
    for model, _ in models:
        assert answers[model] == _answers(fresh, model), model
    for model, moment in earlier.items():
        assert answers_earlier[model] == _answers(fresh, model, moment), model
    # what the sample covers: tiered prices, batch and service-tier prices
    assert any(r.tiers for m, _ in models if (r := fresh.rates(m)) is not None)
    assert any(fresh.batch_rates(m) is not None for m, _ in models)
    assert any(fresh.tier_rates(m, "flex") is not None for m, _ in models)


def test_prices_that_change_with_the_time_are_not_remembered(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    memo = tmp_path / "rates.json"
    monkeypatch.setenv("RUNNER_PRICE_MEMO", str(memo))
    pricing = Pricing()
    # DeepSeek's off-peak prices change with the time of day
    assert pricing.rates("deepseek:deepseek-chat") is not None
    assert "deepseek/" not in memo.read_text() if memo.exists() else True
    # o3's price changed on 2025-06-10: on 2025-06-01 the later price had not started, so it could not be kept
    o3 = next(info for info in _infos("openai") if info.id == "o3")
    assert price_memo.settled_since(o3, datetime(2025, 6, 1, tzinfo=UTC)) is None
    assert price_memo.settled_since(o3, datetime(2025, 6, 11, tzinfo=UTC)) is None  # its batch price started later
    assert price_memo.settled_since(o3, datetime(2026, 10, 15, tzinfo=UTC)) == date(2026, 10, 14)
    # and priced at a request's time as before: before the change and after differ
    pricing.rates("openai:o3")
    before, after = (pricing.rates("openai:o3", datetime(year, 1, 1, tzinfo=UTC)) for year in (2025, 2026))
    assert before is not None and after is not None and before.input != after.input


def test_a_memo_of_other_data_or_code_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    memo = tmp_path / "rates.json"
    monkeypatch.setenv("RUNNER_PRICE_MEMO", str(memo))
    real = Pricing().rates("openai:gpt-4o-mini")
    data = json.loads(memo.read_text())
    entry = data["models"]["openai/gpt-4o-mini"]
    entry["rates"]["input"] = 99.0  # a memo that says something else ...
    memo.write_text(json.dumps(data))
    price_memo._MEMO = None
    assert Pricing().rates("openai:gpt-4o-mini").input == 99.0  # ... is believed while its key holds,
    monkeypatch.setattr(price_memo, "key", lambda: data["key"] + "|another genai-prices")
    price_memo._MEMO = None
    assert Pricing().rates("openai:gpt-4o-mini") == real  # and not once the data or pricing.py changed
    assert json.loads(memo.read_text())["key"].endswith("|another genai-prices")  # written again under the new key


@pytest.mark.parametrize("content", ["", "{not json", "[]", '{"key": 1, "models": []}'])
def test_an_unreadable_memo_is_no_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str) -> None:
    memo = tmp_path / "rates.json"
    memo.write_text(content)
    monkeypatch.setenv("RUNNER_PRICE_MEMO", str(memo))
    assert Pricing().rates("anthropic:claude-3-5-haiku-latest") is not None
    assert "anthropic/" in memo.read_text()


def test_unwritable_or_off_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "a file, not a folder"
    blocked.write_text("")
    monkeypatch.setenv("RUNNER_PRICE_MEMO", str(blocked / "rates.json"))
    assert Pricing().rates("openai:gpt-4o") is not None
    monkeypatch.setenv("RUNNER_PRICE_MEMO", "off")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert Pricing().rates("openai:gpt-4o") is not None
    assert not (tmp_path / "cache").exists()


def test_no_memo_without_a_home_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no home folder can be found, Python leaves ``~`` as it is: no memo is written under the working
    directory then."""
    monkeypatch.delenv("RUNNER_PRICE_MEMO")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: Path("~")))
    monkeypatch.chdir(tmp_path)
    assert Pricing().rates("openai:gpt-4o") is not None
    assert list(tmp_path.iterdir()) == []


def test_the_default_memo_is_in_the_cache_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNNER_PRICE_MEMO")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    Pricing().rates("openai:gpt-4o")
    assert "openai/gpt-4o" in json.loads((tmp_path / "llm-job-runner" / price_memo.NAME).read_text())["models"]


_COLD = """
import sys
from runner.providers.pricing import Pricing
p = Pricing()
worst = p.worst_case(sys.argv[1], 1000, 100)
print(worst, p.rates(sys.argv[1]).source, p.batch_rates(sys.argv[1]) is not None, "genai_prices" in sys.modules)
"""


def test_a_process_that_finds_its_models_remembered_does_not_import_genai_prices(tmp_path: Path) -> None:
    env = {**os.environ, "RUNNER_PRICE_MEMO": str(tmp_path / "rates.json"), "PYTHONPATH": str(ROOT)}

    def run(model: str) -> list[str]:
        out = subprocess.run([sys.executable, "-c", _COLD, model], env=env, capture_output=True, text=True,
                             check=True, timeout=60)
        return out.stdout.split()

    first, second = run("openai:gpt-4o-mini"), run("openai:gpt-4o-mini")
    assert first[-1] == "True" and second[-1] == "False"  # the second process never imported genai-prices
    assert first[:-1] == second[:-1]  # the same worst case, source and batch price
    assert second[1] == "genai-prices" and second[3] == "openai/gpt-4o-mini"
    assert run("anthropic:claude-sonnet-4-0")[-1] == "True"  # a model not remembered yet is looked up
