"""What a response cost, and the most a request can cost (for budget reservations).

A model's price comes from the first of these that has it:

1. the job's ``prices:`` section, keyed by the full model string (``openai:gpt-4o``), in USD per million tokens;
2. genai-prices, Pydantic's maintained price data, for the models of a provider class whose ``price_id`` names
   genai-prices' provider id (``openai``, ``anthropic`` and ``gemini`` models, under ``openai``, ``anthropic``
   and ``google``): the prices in force at the request's time, with their context-length tiers;
3. nothing: a model of a paid provider (``openai``, ``anthropic``, ``gemini``) that genai-prices does not list is
   unknown: ``known()`` says so and ``cost()``/``worst_case()`` raise ``UnknownPrice``. Models of every other
   provider (``local``, ``sim``, ``openai-compatible``, test providers) are free unless the job prices them, so a
   new paid provider must set its class's ``price_id`` (``PROVIDER_IDS``, runner/providers/price_ids.py, is read
   from the registry).

Usage is counted as the providers report it (after normalisation by ``providers/``): ``input_tokens`` are all
input tokens, of which ``cached_tokens`` were read from the prompt cache and ``cache_write_tokens`` written to it;
the rest pay the full input price. A cache write is priced at the model's cache-write price (Anthropic's 5-minute
cache), a cache read at its cache-read price, and either at the input price when the model has none.

Tiers follow genai-prices' "cliff" rule: when a request's input tokens exceed a tier's threshold, that tier's
prices apply to all its tokens, input and output alike (e.g. gemini-2.5-pro above 200k input tokens).

Amounts are floats in USD at full precision; the reports round them only as they print them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from functools import cache
from typing import TYPE_CHECKING

from runner.errors import RunnerError

from . import price_data, price_memo
from .price_ids import PROVIDER_IDS
from .rates import PER, Rates

if TYPE_CHECKING:  # genai-prices is imported when a price is first looked up (price_data.py): not at every start
    from genai_prices.types import ModelInfo, ModelPrice, TieredPrices

    from runner.spec.schema import Job
    from runner.spec.settings import Price

__all__ = [
    "PER",
    "STORAGE_PER_HOUR",
    "Pricing",
    "Rates",
    "UnknownPrice",
]

JOB_PRICES = "job prices:"

#: genai-prices' price-context value that selects the Batch API's prices
_BATCH = {"processing": "batch"}
#: the price contexts a remembered model's rates are kept for (price_memo.py), by the label they are asked by
_CONTEXTS = {"batch": _BATCH, "flex": {"service_tier": "flex"}, "priority": {"service_tier": "priority"}}


#: what storing a prompt prefix as an explicit cache costs, USD per million tokens per hour, by Gemini model id
#: prefix. genai-prices carries no storage price; these are Google's, from ai.google.dev/gemini-api/docs/pricing
#: ("Context caching price": the storage price per 1,000,000 tokens per hour), as published in November 2026
STORAGE_PER_HOUR = {
    "gemini-2.5-pro": 4.50,
    "gemini-3-pro": 4.50,
    "gemini-2.5-flash": 1.00,  # and 2.5 Flash-Lite
    "gemini-3-flash": 1.00,
    "gemini-2.0-flash": 1.00,
}


class UnknownPrice(RunnerError):
    """A model has no price: not in the job's ``prices:`` section, and not in genai-prices' data."""


def _free(source: str) -> Rates:
    return Rates(0.0, 0.0, 0.0, 0.0, source)


def _from_price(price: Price, source: str) -> Rates:
    """Rates from a job's ``prices:`` entry; an absent cache price is the input price."""
    cached, written = price.cached_input, price.cache_write
    return Rates(
        input=price.input,
        cached_input=price.input if cached is None else cached,
        cache_write=price.input if written is None else written,
        output=price.output,
        source=source,
        cache_write_1h=price.cache_write_1h,
    )


class Pricing:
    """Prices of one job's models. ``Pricing(job)``; tests may pass ``prices=`` alone."""

    def __init__(self, job: Job | None = None, *, prices: Mapping[str, Price] | None = None) -> None:
        given = dict(job.prices) if job is not None else {}
        #: the providers' settings (azure-openai's deployments: the model a deployment is priced as)
        self._settings = dict(job.providers) if job is not None else {}
        given.update(prices or {})
        self._job: dict[str, Rates] = {model: _from_price(p, f"{JOB_PRICES} {model}") for model, p in given.items()}
        #: the job's Batch API prices, for models whose ``prices:`` give them
        self._job_batch: dict[str, Rates] = {
            model: _from_price(p.model_copy(update={"input": p.batch_input, "output": p.batch_output,
                                                    "cached_input": None, "cache_write": None,
                                                    "cache_write_1h": None}),
                               f"{JOB_PRICES} {model} (batch)")
            for model, p in given.items() if p.batch_input is not None and p.batch_output is not None}
        #: the job's service-tier prices, by (model, tier)
        self._job_tiers: dict[tuple[str, str], Rates] = {
            (model, tier): _from_price(p.model_copy(update={**tiered.model_dump(), "cache_write": None,
                                                           "cache_write_1h": None}), f"{JOB_PRICES} {model} ({tier})")
            for model, p in given.items() for tier in ("flex", "priority") if (tiered := getattr(p, tier)) is not None}
        #: per model string: fixed rates (job, free), the genai-prices model (or its rates remembered by an earlier
        #: process, price_memo.py), or why it is unknown
        self._found: dict[str, Rates | tuple[str, ModelInfo] | price_memo.Remembered | str] = {}
        #: genai-prices' prices in a price context (batch, a service tier), by (model, context, day)
        self._variants: dict[tuple[str, str, object], Rates | None] = {}
        #: the job's storage prices of explicit prompt caches
        self._storage = {model: p.cache_storage for model, p in given.items() if p.cache_storage is not None}

    # -- lookups -----------------------------------------------------------------------------------
    def _find(self, model: str) -> Rates | tuple[str, ModelInfo] | price_memo.Remembered | str:
        found = self._found.get(model)
        if found is None:
            found = self._found[model] = self._lookup(model)
        return found

    def _info(self, model: str) -> tuple[str, ModelInfo] | Rates | str:
        """What :meth:`_find` says, genai-prices' model looked up where only its rates were remembered."""
        if isinstance(found := self._find(model), price_memo.Remembered):
            found = self._found[model] = self._lookup(model, recall=False)
        return found  # type: ignore[return-value]

    def _lookup(self, model: str, recall: bool = True) -> Rates | tuple[str, ModelInfo] | price_memo.Remembered | str:
        if model in self._job:
            return self._job[model]
        provider, _, model_id = model.partition(":")
        provider_id = PROVIDER_IDS.get(provider)
        if provider_id is None:
            return _free(f"free: {provider} model without a price in the job")
        from .base import provider_class  # the registry imports pricing's neighbours: looked up when used

        model_ref = _model_ref(provider_class(provider).model_behind(model_id, self._settings.get(provider)))
        if recall and (remembered := price_memo.recall(provider_id, model_ref)) is not None:
            return remembered
        info = _model_info(provider_id, model_ref)
        if info is None:
            return f"{_genai_prices()} does not list it"
        moment = _utc(None)
        since = price_memo.settled_since(info, moment) if recall else None
        if since is not None and (rates := _converted(info.get_prices(moment), _source(provider_id, info))):
            price_memo.remember(provider_id, model_ref, since, rates, {
                label: _variant_of(provider_id, info, moment, context, label) for label, context in _CONTEXTS.items()})
        return provider_id, info

    def _recalled(self, model: str, when: datetime | None) -> price_memo.Remembered | None:
        """The model's remembered rates where they hold at ``when`` (None: now)."""
        if not isinstance(found := self._find(model), price_memo.Remembered):
            return None
        return found if when is None or _utc(when).date() >= found.since else None

    def rates(self, model: str, when: datetime | None = None) -> Rates | None:
        """The model's rates at ``when`` (default: now), or None when it has no price."""
        found = self._find(model)  # (per request: the cheapest answers first)
        if isinstance(found, Rates):
            return found
        if isinstance(found, price_memo.Remembered):
            if when is None or _utc(when).date() >= found.since:
                return found.rates
            found = self._info(model)  # a moment before the remembered rates held: genai-prices' own
        if not isinstance(found, tuple):
            return None
        provider_id, info = found
        return _converted(info.get_prices(_utc(when)), _source(provider_id, info))

    def batch_rates(self, model: str, when: datetime | None = None) -> Rates | None:
        """The model's Batch API rates at ``when`` (default: now): the job's ``batch_input`` / ``batch_output``
        prices, or genai-prices' batch prices; else None (a model priced by the job without batch prices)."""
        if model in self._job_batch:
            return self._job_batch[model]
        return self._variant(model, when, _BATCH, "batch")

    def tier_rates(self, model: str, tier: str, when: datetime | None = None) -> Rates | None:
        """The model's rates at a service tier: standard's are :meth:`rates`; a model the job prices takes flex's and
        priority's from its entry's ``flex:`` / ``priority:`` (never genai-prices' beside the job's own), any other
        from genai-prices' ``service_tier`` prices where it has them; a free model is free at every tier. None: no
        price at that tier."""
        if tier == "standard":
            return self.rates(model, when)
        if model in self._job:
            return self._job_tiers.get((model, tier))
        found = self._find(model)  # (a remembered model's tier rates: _variant's to read)
        if isinstance(found, Rates):
            return found if found.is_free else None
        return self._variant(model, when, {"service_tier": tier}, tier)

    def _variant(self, model: str, when: datetime | None, context: dict[str, str], label: str) -> Rates | None:
        """genai-prices' prices of ``model`` in a price ``context`` (the Batch API's, a service tier's) where it has a
        variant for it in force at ``when``, else None (in a context it lacks it answers the standard prices)."""
        remembered = self._recalled(model, when)
        if remembered is not None and label in remembered.variants:
            return remembered.variants[label]
        found = self._info(model)
        if not isinstance(found, tuple):
            return None
        provider_id, info = found
        moment = _utc(when)
        key = (model, label, moment.date())
        if key not in self._variants:
            self._variants[key] = _variant_of(provider_id, info, moment, context, label)
        return self._variants[key]

    def known(self, model: str, when: datetime | None = None) -> bool:
        """Whether the model has a price; free models (local, sim, openai-compatible) count as known."""
        return self.rates(model, when) is not None

    def require(self, model: str, when: datetime | None = None) -> Rates:
        """The model's rates, or ``UnknownPrice`` with a sentence saying how to give it one."""
        rates = self.rates(model, when)
        if rates is None:
            found = self._info(model)
            reason = found if isinstance(found, str) else f"{_genai_prices()} prices it in units other than tokens"
            raise UnknownPrice(
                f"no price for model {model!r} ({reason}); give it one in the job's prices: section, in USD per "
                f"million tokens (input, output, optionally cached_input)"
            )
        return rates

    def storage(self, model: str) -> float | None:
        """USD per million tokens per hour that a prompt prefix of ``model`` stored at the provider costs (Gemini's
        explicit cached contents): the job's ``cache_storage`` price, else Google's published one; None when
        unknown (the runner then stores nothing: it would not know what it spends)."""
        if model in self._storage:
            return self._storage[model]
        provider, _, model_id = model.partition(":")
        if provider not in ("gemini", "vertex"):  # Vertex AI prices Gemini's cache storage as the Gemini API does
            return None
        name = model_id.removeprefix("models/")
        prefix = max((p for p in STORAGE_PER_HOUR if name.startswith(p)), key=len, default=None)
        return STORAGE_PER_HOUR[prefix] if prefix is not None else None

    # -- money ------------------------------------------------------------------------------------
    def cost(
        self,
        model: str,
        input_tokens: int,
        output_tokens: int,
        cached_tokens: int = 0,
        cache_write_tokens: int = 0,
        when: datetime | None = None,
        cache_write_1h_tokens: int = 0,
    ) -> float:
        """USD for one response: ``input_tokens`` are all input tokens, ``cached_tokens`` and
        ``cache_write_tokens`` the parts read from and written to the prompt cache. ``when`` is the request's
        time (default: now). Raises ``UnknownPrice`` for a model without a price."""
        return self.require(model, when).cost(input_tokens, output_tokens, cached_tokens, cache_write_tokens,
                                              cache_write_1h_tokens)

    def worst_case(self, model: str, input_tokens: int, max_output_tokens: int, when: datetime | None = None, *,
                   writable: int | None = None, hour: bool = True) -> float:
        """The most a request can cost (USD): what a budget reserves before it is sent. At least ``cost()`` of
        any usage with at most ``input_tokens`` input and ``max_output_tokens`` output tokens, of which at most
        ``writable`` written to the prompt cache (None: any), for an hour only when ``hour``."""
        return self.require(model, when).worst_case(input_tokens, max_output_tokens, writable, hour)


# -- genai-prices ----------------------------------------------------------------------------------
def _model_ref(model_id: str) -> str:
    """The id genai-prices matches: Gemini's API also accepts ``models/<id>``."""
    return model_id.removeprefix("models/")


@cache
def _genai_prices() -> str:
    """``genai-prices VERSION``, the source named in the rates it gives."""
    return f"genai-prices {price_data.load().__version__}"


def __getattr__(name: str) -> str:
    if name == "GENAI_PRICES":
        return _genai_prices()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@cache
def _model_info(provider_id: str, model_ref: str) -> ModelInfo | None:
    """genai-prices' model for this provider and model id, or None; misses are cached too (they are not in
    genai-prices)."""
    price_data.load()  # without its update client (price_data.py)
    from genai_prices.data_snapshot import get_snapshot

    try:
        _, info = get_snapshot().find_provider_model(model_ref, None, provider_id, None)
    except LookupError:
        return None
    return info


def _source(provider_id: str, info: ModelInfo, label: str = "") -> str:
    """Where rates read from genai-prices come from: ``genai-prices VERSION: PROVIDER/MODEL`` (`` (LABEL)``)."""
    return f"{_genai_prices()}: {provider_id}/{info.id}" + (f" ({label})" if label else "")


def _variant_of(provider_id: str, info: ModelInfo, moment: datetime, context: dict[str, str],
                label: str) -> Rates | None:
    """genai-prices' prices of ``info`` in a price ``context`` where it has a variant for it in force at ``moment``,
    else None (in a context it lacks it answers the standard prices)."""
    if any(variant.when == context and (variant.constraint is None or variant.constraint.active(moment))
           for variant in info.price_variants or ()):
        return _convert(info.get_prices(moment, context), _source(provider_id, info, label))
    return None


#: conversions of genai-prices' price objects, by identity (the object is kept, so its id is not reused): a
#: model's standard prices are long-lived objects of genai-prices' data, so this holds one entry per price period
_CONVERTED: dict[tuple[int, str], tuple[ModelPrice, Rates | None]] = {}


def _converted(price: ModelPrice, source: str) -> Rates | None:
    key = (id(price), source)
    entry = _CONVERTED.get(key)
    if entry is None:
        entry = _CONVERTED[key] = (price, _convert(price, source))
    return entry[1]


def _convert(price: ModelPrice, source: str) -> Rates | None:
    """Rates from genai-prices' prices; None when the model is priced only in other units (audio hours,
    characters), which the runner cannot count."""
    from genai_prices.types import TieredPrices

    keys = ("input_mtok", "cache_read_mtok", "cache_write_mtok", "output_mtok", "cache_write_1h_mtok")
    values: dict[str, Decimal | TieredPrices | None] = {key: getattr(price, key, None) for key in keys}
    if values["input_mtok"] is None and values["output_mtok"] is None and any(
        value is not None for value in vars(price).values()
    ):
        return None
    thresholds = sorted({tier.start for v in values.values() if isinstance(v, TieredPrices) for tier in v.tiers})

    def at(input_tokens: int) -> Rates:
        p = {key: _price_at(value, input_tokens) for key, value in values.items()}
        plain = p["input_mtok"] or 0.0
        cached, written = p["cache_read_mtok"], p["cache_write_mtok"]
        return Rates(
            input=plain,
            cached_input=plain if cached is None else cached,
            cache_write=plain if written is None else written,
            output=p["output_mtok"] or 0.0,
            source=source,
            cache_write_1h=p["cache_write_1h_mtok"],
        )

    return replace(at(0), tiers=tuple((threshold, at(threshold + 1)) for threshold in thresholds))


def _price_at(price: Decimal | TieredPrices | None, input_tokens: int) -> float | None:
    """A price for a request with this many input tokens (genai-prices' rule: the highest tier exceeded)."""
    if price is None:
        return None
    from genai_prices.types import TieredPrices

    if isinstance(price, TieredPrices):
        value = price.base
        for tier in reversed(price.tiers):  # genai-prices keeps them in ascending order
            if input_tokens > tier.start:
                value = tier.price
                break
        return float(value)
    return float(price)


def _utc(when: datetime | None) -> datetime:
    """The moment prices are read at; a naive time is UTC, as genai-prices takes it."""
    if when is None:
        return datetime.now(UTC)
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)

