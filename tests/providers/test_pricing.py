"""Prices: genai-prices for the cloud providers (by date and context tier), the job's prices: over them, free
local and simulated models, and a worst case that bounds every actual cost (budget invariant 3)."""

from __future__ import annotations

import random
import subprocess
import sys
from datetime import UTC, datetime

import genai_prices
import pytest
from genai_prices import Usage, calc_price
from genai_prices.data_snapshot import get_snapshot
from genai_prices.types import TieredPrices

from runner.providers import price_ids, pricing
from runner.providers.pricing import Pricing, UnknownPrice
from runner.spec.schema import Job
from runner.spec.settings import Price

# Models the tests read from genai-prices' data; each is priced there.
FLAT = ["openai:gpt-4o", "openai:gpt-4o-mini", "anthropic:claude-haiku-4-5", "anthropic:claude-opus-4-1",
        "gemini:gemini-2.0-flash"]
TIERED = ["gemini:gemini-2.5-pro", "gemini:gemini-1.5-pro", "anthropic:claude-sonnet-4-5"]


def _package_usd(model: str, **usage: int) -> float:
    """What genai-prices itself charges for this usage."""
    provider, _, model_id = model.partition(":")
    result = calc_price(Usage(**usage), model_id, provider_id=price_ids.PROVIDER_IDS[provider])
    return float(result.total_price)


def _job(**prices: Price) -> Job:
    return Job.model_validate({"name": "t", "stages": [{"name": "s", "dataset": {"path": "rows.jsonl"},
                                                        "prompt": "{{ q }}"}], "prices": prices})


def test_a_known_openai_model_is_priced_as_genai_prices_prices_it() -> None:
    rates = Pricing().rates("openai:gpt-4o")
    assert rates is not None and rates.source == f"genai-prices {genai_prices.__version__}: openai/gpt-4o"
    million = 1_000_000
    assert rates.input == _package_usd("openai:gpt-4o", input_tokens=million)
    assert rates.output == _package_usd("openai:gpt-4o", output_tokens=million)
    assert rates.cached_input == _package_usd("openai:gpt-4o", input_tokens=million, cache_read_tokens=million)
    # Facts that would fail if the lookup broke (a zero, or the fields crossed).
    assert rates.output > rates.input > rates.cached_input > 0
    # A dated snapshot id is the same model.
    assert Pricing().rates("openai:gpt-4o-2024-08-06") == rates


def test_claude_haiku_costs_less_than_claude_opus() -> None:
    prices = Pricing()
    haiku, opus = prices.rates("anthropic:claude-haiku-4-5"), prices.rates("anthropic:claude-opus-4-1")
    assert haiku is not None and opus is not None
    assert 0 < haiku.input < opus.input and 0 < haiku.output < opus.output
    # Anthropic prices cache writes apart, above the plain input price, and cache reads below it.
    assert opus.cached_input < opus.input < opus.cache_write


def test_gemini_models_are_looked_up_under_googles_provider_id() -> None:
    prices = Pricing()
    rates = prices.rates("gemini:gemini-2.0-flash")
    assert rates is not None and "google/gemini-2.0-flash" in rates.source and rates.input > 0
    assert prices.rates("gemini:models/gemini-2.0-flash") == rates


@pytest.mark.parametrize("model", FLAT + TIERED)
def test_cost_equals_genai_prices_own_calculation(model: str) -> None:
    rng = random.Random(model)
    prices = Pricing()
    for _ in range(200):
        total = rng.choice([rng.randint(0, 5_000), rng.randint(100_000, 300_000), rng.randint(0, 1_200_000)])
        cached = rng.randint(0, total)
        written = rng.randint(0, total - cached) if model.startswith("anthropic:") else 0
        output = rng.randint(0, 20_000)
        ours = prices.cost(model, total, output, cached, written)
        theirs = _package_usd(model, input_tokens=total, output_tokens=output, cache_read_tokens=cached,
                              cache_write_tokens=written)
        assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-15), (total, cached, written, output)


@pytest.mark.parametrize("model", [m for m in FLAT + TIERED if m.startswith("anthropic:")])
def test_one_hour_cache_writes_cost_what_genai_prices_charges_for_them(model: str) -> None:
    rng = random.Random(model + "1h")
    prices = Pricing()
    rates = prices.rates(model)
    assert rates is not None and rates.hour_write > rates.cache_write, "an hour's write costs more than 5 minutes'"
    for _ in range(100):
        total = rng.randint(0, 400_000)
        cached = rng.randint(0, total)
        written = rng.randint(0, total - cached)
        hour = rng.randint(0, written)
        output = rng.randint(0, 20_000)
        ours = prices.cost(model, total, output, cached, written, cache_write_1h_tokens=hour)
        theirs = _package_usd(model, input_tokens=total, output_tokens=output, cache_read_tokens=cached,
                              cache_write_tokens=written, cache_write_1h_tokens=hour)
        assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-15), (total, cached, written, hour, output)


def test_a_job_prices_one_hour_writes_apart_or_at_its_cache_write_price() -> None:
    # 100,000 written of which 40,000 for an hour: 60,000 x $3.75 + 40,000 x $6 = 0.225 + 0.24
    both = Pricing(prices={"sim:m": Price(input=3.0, output=15.0, cache_write=3.75, cache_write_1h=6.0)})
    assert both.cost("sim:m", 100_000, 0, cache_write_tokens=100_000, cache_write_1h_tokens=40_000) == \
        pytest.approx(0.465)
    assert both.worst_case("sim:m", 1_000_000, 0) == pytest.approx(6.0), "the dearest input token bounds it"
    plain = Pricing(prices={"sim:m": Price(input=3.0, output=15.0, cache_write=3.75)})
    assert plain.cost("sim:m", 100_000, 0, cache_write_tokens=100_000, cache_write_1h_tokens=40_000) == \
        pytest.approx(0.375)


def test_job_prices_win_over_genai_prices() -> None:
    prices = Pricing(_job(**{"openai:gpt-4o": Price(input=1.0, output=2.0, cached_input=0.5)}))
    rates = prices.rates("openai:gpt-4o")
    assert rates is not None and rates.source == "job prices: openai:gpt-4o"
    assert (rates.input, rates.cached_input, rates.cache_write, rates.output) == (1.0, 0.5, 1.0, 2.0)
    assert prices.cost("openai:gpt-4o", 1_000_000, 1_000_000, 400_000) == pytest.approx(1.0 * 0.6 + 0.5 * 0.4 + 2.0)
    # Other models are still read from genai-prices.
    other = prices.rates("openai:gpt-4o-mini")
    assert other is not None and other.source.startswith("genai-prices ")


@pytest.mark.parametrize("model", ["local:smollm2", "sim:gpt-test", "openai-compatible:llama/smollm2", "fake:m1"])
def test_local_simulated_and_user_server_models_are_free_unless_priced(model: str) -> None:
    free = Pricing()
    assert free.known(model)
    assert free.cost(model, 10_000, 5_000, 1_000) == 0.0 and free.worst_case(model, 10_000, 5_000) == 0.0
    priced = Pricing(_job(**{model: Price(input=2.0, output=4.0)}))
    assert priced.cost(model, 1_000_000, 500_000) == pytest.approx(2.0 + 2.0)
    assert priced.batch_rates(model) is None


def test_an_unknown_model_is_unknown_cheaply_and_pricing_it_says_what_to_do() -> None:
    prices = Pricing()
    for model in ["openai:gpt-test", "anthropic:not-a-claude", "gemini:not-a-gemini"]:
        assert not prices.known(model) and prices.rates(model) is None
        with pytest.raises(UnknownPrice, match=r"no price for model .*prices: section"):
            prices.cost(model, 10, 10)
        with pytest.raises(UnknownPrice, match=model):
            prices.worst_case(model, 10, 10)
    # A repeated miss, even from another job's Pricing, does not search genai-prices' data again.
    misses = pricing._model_info.cache_info().misses
    for _ in range(100):
        assert not Pricing().known("openai:gpt-test")
    assert pricing._model_info.cache_info().misses == misses


def test_cost_to_the_cent_with_cache_reads_and_writes_priced_apart() -> None:
    # USD per million: input 3, cache read 0.30, output 15.
    read_only = Pricing(prices={"sim:m": Price(input=3.0, output=15.0, cached_input=0.3)})
    # 60,000 plain input x $3 + 40,000 cached x $0.30 + 20,000 output x $15 = 0.18 + 0.012 + 0.30 = $0.492
    usd = read_only.cost("sim:m", 100_000, 20_000, cached_tokens=40_000)
    assert usd == pytest.approx(0.492)
    # A job price with a cache-write price: $3.75 per million.
    writes = Pricing(prices={"sim:m": Price(input=3.0, output=15.0, cached_input=0.3, cache_write=3.75)})
    # 10,000 plain x 3 + 40,000 read x 0.30 + 50,000 written x 3.75 + 20,000 out x 15
    # = 0.03 + 0.012 + 0.1875 + 0.30 = $0.5295
    usd = writes.cost("sim:m", 100_000, 20_000, cached_tokens=40_000, cache_write_tokens=50_000)
    assert usd == pytest.approx(0.5295)
    # Without a cache_write price, written tokens pay the input price.
    assert read_only.cost("sim:m", 100_000, 0, cache_write_tokens=100_000) == pytest.approx(0.3)


def test_the_input_token_count_picks_the_context_tier() -> None:
    _, info = get_snapshot().find_provider_model("gemini-2.5-pro", None, "google", None)
    tiered = info.get_prices(datetime.now(UTC)).input_mtok
    assert isinstance(tiered, TieredPrices)
    threshold = tiered.tiers[0].start
    assert threshold == 200_000  # Google's published long-context threshold for gemini-2.5-pro
    prices = Pricing()
    rates = prices.rates("gemini:gemini-2.5-pro")
    assert rates is not None and [t for t, _ in rates.tiers] == [threshold]
    below, above = rates.at(threshold), rates.at(threshold + 1)
    assert below is rates and above.input > rates.input and above.output > rates.output
    assert above.input == float(tiered.tiers[0].price)
    # The whole request pays the higher tier once its input crosses the threshold.
    assert prices.cost("gemini:gemini-2.5-pro", threshold, 1_000) == pytest.approx(
        (threshold * rates.input + 1_000 * rates.output) / 1e6)
    assert prices.cost("gemini:gemini-2.5-pro", threshold + 1, 1_000) == pytest.approx(
        ((threshold + 1) * above.input + 1_000 * above.output) / 1e6)
    assert prices.worst_case("gemini:gemini-2.5-pro", threshold + 1, 0) == pytest.approx(
        (threshold + 1) * above.input / 1e6)


def test_prices_are_read_at_the_requests_time() -> None:
    # OpenAI cut o3's prices on 2025-06-10; genai-prices keeps both periods.
    prices = Pricing()
    before = prices.rates("openai:o3", datetime(2025, 6, 1, tzinfo=UTC))
    after = prices.rates("openai:o3", datetime(2025, 6, 20))  # naive: taken as UTC
    assert before is not None and after is not None and before.input > after.input > 0
    early = prices.cost("openai:o3", 1_000_000, 0, when=datetime(2025, 6, 1, tzinfo=UTC))
    assert early == pytest.approx(before.input)
    assert prices.cost("openai:o3", 1_000_000, 0) == pytest.approx(prices.rates("openai:o3").input)


def test_worst_case_bounds_the_cost_of_every_usage_within_its_limits() -> None:
    prices = Pricing(prices={"sim:priced": Price(input=1.0, output=3.0, cached_input=0.1, cache_write=1.25)})
    models = FLAT + TIERED + ["sim:priced", "local:smollm2"]
    rng = random.Random(20240611)
    for _ in range(1_000):
        model = rng.choice(models)
        max_input = rng.choice([rng.randint(1, 2_000), rng.randint(150_000, 260_000), rng.randint(1, 1_100_000)])
        max_output = rng.randint(0, 32_000)
        reserved = prices.worst_case(model, max_input, max_output)
        total = rng.randint(0, max_input)
        cached = rng.randint(0, total)
        written = rng.randint(0, total - cached)
        spent = prices.cost(model, total, rng.randint(0, max_output), cached, written)
        assert spent <= reserved + 1e-12, (model, max_input, max_output, total, cached, written)


def test_batch_prices_come_from_genai_prices_when_it_has_them() -> None:
    prices = Pricing()
    standard, batch = prices.rates("openai:gpt-4o"), prices.batch_rates("openai:gpt-4o")
    assert standard is not None and batch is not None and batch.source.endswith("(batch)")
    assert 0 < batch.input < standard.input and 0 < batch.output < standard.output
    assert prices.batch_rates("openai:gpt-test") is None


def test_pricing_takes_a_job_as_the_dispatcher_passes_it() -> None:
    job = _job(**{"sim:gpt-sim": Price(input=1.0, output=2.0)})
    prices = Pricing(job)
    # The dispatcher's positional call: model, input, output, cached.
    assert prices.cost("sim:gpt-sim", 1_000, 500, 200) == pytest.approx((800 * 1.0 + 200 * 1.0 + 500 * 2.0) / 1e6)


def test_genai_prices_is_imported_without_its_update_client_until_that_is_used() -> None:
    # runner/providers/price_data.py: httpx2 (genai-prices' client for network updates) is not loaded by pricing
    probe = ("import sys\n"
             "from runner.providers.pricing import Pricing\n"
             "rates = Pricing(None).rates('openai:gpt-4o-mini')\n"
             "print(rates is not None and rates.input > 0, 'genai_prices' in sys.modules, 'httpx2' in sys.modules)\n"
             "import genai_prices.update_prices as updates\n"
             "import httpx2\n"  # imported afterwards: the real module, the one genai-prices reaches too
             "print(type(httpx2).__name__, hasattr(httpx2, 'AsyncClient'), updates.httpx2.Timeout is httpx2.Timeout)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() == ["True", "True", "False", "module", "True", "True"]


def test_genai_prices_takes_httpx2_as_it_is_when_it_is_imported_already() -> None:
    probe = ("import httpx2\n"
             "from runner.providers import price_data\n"
             "price_data.load()\n"
             "import genai_prices.update_prices as updates\n"
             "print(updates.httpx2 is httpx2)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() == ["True"]
