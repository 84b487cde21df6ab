"""What the deadline planner (runner/plan/deadline.py) is told of a job: per endpoint its online figures and its Batch
API's turnaround, per stage and model the modes it may take and a request's expected price at each. Each figure
comes from the job's ``planner:`` settings, else the store's history, else a stated default, and says which
(``source``), so the estimate can print where every assumption comes from.

History: a provider's batches the store saw collected with every line answered (created -> collected; a batch
cancelled at a cutover would understate it), and the attempts of its answers served at flex (each attempt past the
first a shed, an over-count: other retries count too) with the requests that failed shed.
"""

from __future__ import annotations

import datetime as dt
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from runner.errors import RunnerError
from runner.plan.deadline import BATCH, FLEX, PRIORITY, STANDARD, Online, Turnaround
from runner.providers.base import provider_class, split_model
from runner.providers.pricing import Pricing
from runner.providers.tiers import tiers_taken
from runner.spec.fields import parse_duration
from runner.spec.pools import batch_endpoint, has_batch_api
from runner.spec.schema import Job
from runner.spec.stage import Stage
from runner.store import Store

__all__ = ["DEFAULTS", "History", "endpoint_inputs", "mode_refusals", "online_of", "read_history", "request_prices",
           "turnaround_of"]

#: the figures no job setting or history gives, each with where it comes from
DEFAULTS = {
    # platform.claude.com/docs/en/build-with-claude/batch-processing: "most batches finishing in less than 1 hour";
    # every Batch API's window is 24 h (OpenAI's completion_window, Anthropic's expires_at, Gemini's target), taken
    # as the 99th percentile: the spread is the runner's assumption
    "batch_median": (3600.0, "median 1 h: Anthropic's batch page ('most batches finishing in less than 1 hour')"),
    "batch_p95": (3600.0 * math.exp(math.log(24.0) * 1.6449 / 2.3263),
                  "p95 from the 24 h window taken as the 99th percentile (the runner's assumption)"),
    # no provider publishes a shed rate: the runner's assumptions, to be replaced by history
    "flex_shed": (0.1, "flex shed rate 10 % (assumed: no provider publishes one)"),
    "flex_shed_p95": (0.5, "flex shed p95 50 % (assumed)"),
    # ai.google.dev/gemini-api/docs (flex inference): "1-15 min" for a flex answer; its upper end for every provider
    "flex_latency": (900.0, "flex answer within 15 min: Gemini's flex page ('1-15 min')"),
    "latency": (60.0, "standard answer within 60 s (assumed)"),
    "priority_latency": (30.0, "priority answer within 30 s (assumed)"),
    # platform.openai.com/docs/guides/rate-limits: usage tier 1's 500 RPM for most models
    "rpm": (500.0, "500 requests a minute (OpenAI's usage tier 1; providers: {NAME: {rpm: N}} sets yours)"),
}

#: the fewest batches or flex answers whose history replaces a default
MIN_HISTORY = 3
#: Bedrock's batch inference page (docs.aws.amazon.com/bedrock/latest/userguide/batch-inference.html) has said
#: "Batch inference does not support tool calling (function calling) or structured output (response_format)"; a
#: later version says structured outputs are supported: the planner keeps a schema stage's Bedrock requests online
BEDROCK_BATCH_SCHEMA = ("Bedrock batch inference took no structured output (its batch-inference page), and the stage "
                        "has schema:")


@dataclass(frozen=True, slots=True)
class History:
    """One provider's history in the store: batch turnarounds (seconds) and flex attempts (answers, attempts)."""

    turnarounds: tuple[float, ...] = ()
    flex_answers: int = 0
    flex_attempts: int = 0


def read_history(store: Store | None) -> dict[str, History]:
    """Every provider's history in ``store`` (none without a store)."""
    if store is None:
        return {}
    turns: dict[str, list[float]] = {}
    for model, created, updated in store.rows(
            "SELECT model, created, updated FROM batches b WHERE state = 'collected' AND created IS NOT NULL AND NOT"
            " EXISTS (SELECT 1 FROM batch_lines l WHERE l.batch_id = b.id AND l.status <> 'done')"):
        try:
            took = dt.datetime.fromisoformat(str(updated)) - dt.datetime.fromisoformat(str(created))
            seconds = took.total_seconds()
        except ValueError:
            continue
        if seconds > 0:
            turns.setdefault(str(model).partition(":")[0], []).append(seconds)
    flex: dict[str, list[int]] = {}
    for model, answers, attempts in store.rows(
            "SELECT t.model, count(*), sum(t.attempts) FROM tasks t JOIN ledger l ON l.run_id = t.run_id AND"
            " l.key = t.key AND l.kind = 'charge' AND l.tier = 'flex' WHERE t.cache_hit = 0 GROUP BY t.model"):
        found = flex.setdefault(str(model).partition(":")[0], [0, 0])
        found[0] += int(answers or 0)
        found[1] += int(attempts or 0)
    for model, failed, attempts in store.rows(
            "SELECT model, count(*), sum(attempts) FROM tasks WHERE error_class = 'flex_unavailable' GROUP BY model"):
        found = flex.setdefault(str(model).partition(":")[0], [0, 0])
        found[1] += int(attempts or failed or 0)
    return {provider: History(tuple(turns.get(provider, ())), *flex.get(provider, (0, 0)))
            for provider in set(turns) | set(flex)}


def _setting(job: Job, name: str) -> tuple[float, str] | None:
    value = getattr(job.planner, name)
    if value is None:
        return None
    number = parse_duration(value) if isinstance(value, str) else float(value)
    return number, f"{name} {value} (the job's planner:)"


def turnaround_of(job: Job, provider: str, history: dict[str, History]) -> Turnaround:
    """A provider's batch turnaround: the job's settings, else its collected batches (lognormal fit: their
    geometric mean and spread), else the defaults."""
    median, p95 = _setting(job, "batch_median"), _setting(job, "batch_p95")
    turns = history.get(provider, History()).turnarounds
    if (median is None or p95 is None) and len(turns) >= MIN_HISTORY:
        logs = [math.log(t) for t in turns]
        mu, sd = statistics.fmean(logs), statistics.pstdev(logs)
        source = f"{len(turns)} batches of {provider} in the store"
        median = median or (math.exp(mu), f"median {math.exp(mu) / 60:.0f} min from {source}")
        p95 = p95 or (math.exp(mu + 1.6449 * sd), f"p95 from {source}")
    median = median or DEFAULTS["batch_median"]
    p95 = p95 or (max(DEFAULTS["batch_p95"][0], median[0]), DEFAULTS["batch_p95"][1])
    return Turnaround(median[0], max(p95[0], median[0]), f"{median[1]}; {p95[1]}")


def online_of(job: Job, provider: str, history: dict[str, History]) -> Online:
    """A provider's online figures: the rate limit the job gives it (``rpm``), latencies and the flex shed rate from
    the job's ``planner:``, else history (shed rate only), else the defaults."""
    settings = job.providers.get(provider)
    rpm = (float(settings.rpm), f"{settings.rpm:,} requests a minute (providers: {provider}: rpm)") \
        if settings is not None and settings.rpm else DEFAULTS["rpm"]
    past = history.get(provider, History())
    measured = None
    if past.flex_answers >= MIN_HISTORY and past.flex_attempts:
        rate = max(0.0, 1.0 - past.flex_answers / past.flex_attempts)
        measured = (rate, f"flex shed rate {rate:.0%} from {past.flex_answers} flex answers of {provider} in the store")
    shed = _setting(job, "flex_shed") or measured or DEFAULTS["flex_shed"]
    shed95 = _setting(job, "flex_shed_p95") or DEFAULTS["flex_shed_p95"]
    figures = {name: _setting(job, name) or DEFAULTS[name] for name in ("latency", "priority_latency", "flex_latency")}
    sources = [rpm[1], shed[1], shed95[1], *(f[1] for f in figures.values())]
    return Online(rpm[0], figures["latency"][0], figures["priority_latency"][0], figures["flex_latency"][0],
                  shed[0], max(shed95[0], shed[0]), "; ".join(sources))


def endpoint_inputs(job: Job, endpoints: Iterable[str], history: dict[str, History]
                    ) -> tuple[dict[str, Online], dict[str, Turnaround]]:
    """The planner's per-endpoint inputs (``State.online`` and ``State.turnaround``) for ``endpoints`` (a model
    each: its provider's figures), as the run and the estimate both build them."""
    found = set(endpoints)
    return ({e: online_of(job, provider_of(e), history) for e in found},
            {e: turnaround_of(job, provider_of(e), history) for e in found})


def mode_refusals(job: Job, stage: Stage, model: str, batch_api: bool) -> dict[str, str]:
    """Why ``model`` may not take each mode in ``stage`` (mode -> one sentence): the stage's ``mode:``, a Batch API
    the provider lacks (``batch_api``: whether its provider, with the job's settings, has one), Bedrock's batch and
    a schema, the tiers the capability table says the model is sold at, a tier the stage pins."""
    refused: dict[str, str] = {}
    mode = job.stage_mode(stage)
    if mode == "online":
        refused[BATCH] = f"stage {stage.name} has mode: online"
    elif not batch_api:
        refused[BATCH] = f"{model} has no Batch API with this job's settings"
    elif model.startswith("bedrock:") and stage.schema_ is not None:
        refused[BATCH] = BEDROCK_BATCH_SCHEMA
    if mode == "batch":
        for tier in (FLEX, STANDARD, PRIORITY):
            refused[tier] = f"stage {stage.name} has mode: batch"
        return refused
    try:
        provider, name = split_model(model)
        behind = provider_class(provider).model_behind(name, job.providers.get(provider))
        taken = tiers_taken(provider, behind)
    except (KeyError, ValueError, RunnerError):
        taken = (STANDARD,)
    for tier in (FLEX, PRIORITY):
        if tier not in taken:
            refused[tier] = f"{model} is not sold at {tier} (the capability table's tier rules)"
    pinned = {job.stage_tier(stage, model)} - {None}
    for tier in (FLEX, STANDARD, PRIORITY):
        if pinned and tier not in pinned:
            refused[tier] = f"stage {stage.name} asks tier: {next(iter(pinned))}"
    return refused


def request_prices(pricing: Pricing, model: str, input_tokens: float, output_tokens: float,
                   cached_share: float = 0.0) -> dict[str, float]:
    """The expected USD of one request of ``input_tokens`` and ``output_tokens`` at each mode with a price;
    ``cached_share``: the share of its input tokens expected from the provider's prompt cache (priced so online; a
    batch line is priced uncached, as the runner marks none)."""
    prices: dict[str, float] = {}
    tokens = max(0, round(input_tokens))
    cached = round(tokens * cached_share)
    for mode in (BATCH, FLEX, STANDARD, PRIORITY):
        rates = pricing.batch_rates(model) if mode == BATCH else pricing.tier_rates(model, mode)
        if rates is not None:
            prices[mode] = rates.cost(tokens, round(output_tokens), cached if mode != BATCH else 0)
    return prices


def provider_of(model: str) -> str:
    return model.partition(":")[0]


def batch_api(job: Job, model: str) -> bool:
    """Whether ``model``'s provider (a pooled model's: the endpoint its batches go through) has a Batch API under
    the job's settings, without building it."""
    via = batch_endpoint(job, model)
    return has_batch_api(job, via.endpoint if via is not None else provider_of(model))
