"""The job's settings, each a section of the job file (or of a stage): generation parameters, retries, prices,
budgets and how the Batch APIs are used."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from runner.spec.fields import MAX_BUDGET_TOKENS, MAX_TOKENS, Seed, Strict, parse_duration, within


class Reasoning(Strict):
    """How much a reasoning model thinks: an effort level, a thinking budget in tokens, or both (the budget is then
    the thinking allowance added to the output cap). Mapped per API by ``runner.providers.capabilities``."""

    #: how hard the model thinks, among the levels it takes
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    #: the thinking budget in tokens (added to the output cap as the thinking allowance)
    budget_tokens: Annotated[int | None, within(0, MAX_TOKENS)] = None

    @model_validator(mode="after")
    def _something(self) -> Reasoning:
        if self.effort is None and self.budget_tokens is None:
            raise ValueError("reasoning: needs effort: (none, minimal, low, medium, high, xhigh, max) or "
                             "budget_tokens:")
        return self


class Params(Strict):
    """Generation parameters; every one of them is part of the cache key when set (as shaped for each model by
    ``runner.providers.capabilities.shape``: the key holds what is sent)."""

    #: the sampling temperature (what a model takes is narrower: Anthropic 0 to 1, reasoning models none)
    temperature: float | None = Field(default=None, ge=0, le=2)
    #: the answer's output cap in tokens (a thinking allowance is added on top for reasoning); budgets need it
    max_tokens: Annotated[int | None, within(1, MAX_TOKENS)] = None
    #: nucleus sampling's probability mass
    top_p: float | None = Field(default=None, gt=0, le=1)
    #: stop sequences (a string or a list; OpenAI takes at most 4, Gemini 5)
    stop: list[str] | None = None
    #: the sampling seed, where the API has one
    seed: Seed | None = None
    #: OpenAI's response_format as given (a stage's ``schema:`` sets a json_schema one)
    response_format: dict[str, Any] | None = None
    #: ask for the answer tokens' log-probabilities, where the API gives them
    logprobs: bool | None = None
    #: penalties on tokens already in the answer, -2 to 2 as OpenAI's CreateChatCompletionRequest bounds them; sent
    #: as OpenAI's presence_penalty/frequency_penalty, Gemini's presencePenalty/frequencyPenalty and llama.cpp's
    #: own arguments; Anthropic and reasoning models take none (runner/providers/capabilities.py)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    #: as presence_penalty, growing with how often a token already appeared
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    #: thinking of reasoning models: {effort: low|medium|high|...} or {budget_tokens: N}
    reasoning: Reasoning | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    def merged_over(self, base: Params) -> Params:
        # None means "not set" here: a job stored as JSON (for resume) has every field set, most to None.
        merged = base.model_dump(exclude_none=True)
        merged.update(self.model_dump(exclude_unset=True, exclude_none=True))
        return Params.model_validate(merged)


#: a service tier (runner/providers/tiers.py): what every request gets without asking, cheaper and shed when the
#: provider lacks capacity, dearer and faster
Tier = Literal["standard", "flex", "priority"]
#: what a shed flex request is sent at once ``retry.flex_wait`` has passed
Fallback = Literal["standard"]
TIER_NAMES = ("standard", "flex", "priority")


def tier_setting(value: Any) -> Any:
    """A ``tier:`` setting as given, once it is a tier or a mapping of models to tiers; else one sentence (a
    ValueError pydantic says at the key), not an error per branch of the type's union."""
    tiers = list(value.values()) if isinstance(value, dict) else [value]
    if value is None or (tiers and all(tier in TIER_NAMES for tier in tiers)):
        return value
    bad = next((tier for tier in tiers if tier not in TIER_NAMES), value)
    raise ValueError(f"{bad!r} is not a tier: write standard, flex or priority, or one per model as "
                     "{provider:model: tier}")
#: how long a shed flex request is tried again at flex, by default: the 15 minutes OpenAI's and Azure's flex guides
#: give a flex request's client timeout, the top of the 1-15 minutes Gemini's flex tier targets
FLEX_WAIT = 900.0


class RetrySettings(Strict):
    #: attempts of a request that fails with server errors, timeouts or dropped connections
    max_attempts: int = Field(default=6, ge=1, le=50)
    #: 429s a request may meet before it fails (each pauses the endpoint for its Retry-After)
    rate_limit_attempts: int = Field(default=30, ge=1, le=200)
    #: seconds from a request's first attempt after which it is not tried again
    max_elapsed: float = Field(default=300.0, gt=0)
    #: seconds: the scale of the exponential backoff between attempts (full jitter)
    backoff_initial: float = Field(default=0.5, gt=0)
    #: seconds: the longest wait between two attempts
    backoff_max: float = Field(default=30.0, gt=0)
    #: seconds from a flex request's first attempt during which the provider's shedding it (no flex capacity) is
    #: met by sending it again at flex, with the backoff above; then it fails, or goes at standard where the stage
    #: says ``fallback: standard``
    flex_wait: float = Field(default=FLEX_WAIT, gt=0, le=86400)


class TierPrice(Strict):
    """USD per million tokens at one service tier (``flex:`` or ``priority:`` of a ``prices:`` entry)."""

    #: USD per million input tokens at this tier
    input: float = Field(ge=0)
    #: USD per million output tokens at this tier
    output: float = Field(ge=0)
    #: a prompt-cache read at this tier; the tier's input price when absent
    cached_input: float | None = Field(default=None, ge=0)


class Price(Strict):
    """USD per million tokens."""

    #: USD per million input tokens
    input: float = Field(ge=0)
    #: USD per million output tokens (thinking tokens included)
    output: float = Field(ge=0)
    #: a prompt-cache read; the input price when absent
    cached_input: float | None = Field(default=None, ge=0)
    #: a prompt-cache write (Anthropic prices it above plain input); the input price when absent
    cache_write: float | None = Field(default=None, ge=0)
    #: a prompt-cache write kept for an hour (Anthropic's ttl "1h"); the cache_write price when absent
    cache_write_1h: float | None = Field(default=None, ge=0)
    #: a prompt prefix stored at the provider (Gemini's explicit cached contents), per million tokens per HOUR
    cache_storage: float | None = Field(default=None, ge=0)
    #: the Batch API's prices, when the model has one (OpenAI, Anthropic and Gemini charge half)
    batch_input: float | None = Field(default=None, ge=0)
    #: the Batch API's output price
    batch_output: float | None = Field(default=None, ge=0)
    #: the service tiers' prices (a stage's ``tier:``), for a model the job prices: without them a job that asks
    #: its model for that tier is refused before anything is sent
    flex: TierPrice | None = None
    #: the priority tier's prices (as ``flex:``)
    priority: TierPrice | None = None


Mode = Literal["online", "batch", "auto"]
PromptCacheMode = Literal["auto", "off"]


class BatchSettings(Strict):
    """How stages in ``mode: batch`` or ``auto`` use the providers' Batch APIs."""

    #: seconds between two looks at a batch in flight
    poll_interval: float = Field(default=30.0, gt=0)
    #: seconds a batch's looks (its status, or its lookup by label when its id was not recorded) may keep failing
    #: with errors that pass (timeouts, server errors, dropped connections) before the run stops; the batch is kept,
    #: and `runner resume` looks at it again
    poll_timeout: float = Field(default=3600.0, gt=0)
    #: requests per batch (OpenAI takes up to 50,000 lines a batch)
    max_requests: int = Field(default=10_000, ge=1, le=50_000)
    #: times a request the provider expired, cancelled or failed with a server error is submitted again
    max_resubmits: int = Field(default=2, ge=0, le=10)
    #: with ``mode: auto`` and a deadline: submit a batch only while at least this many seconds are left
    min_window: float = Field(default=3600.0, ge=0)


def _duration_setting(value: Any) -> Any:
    if value is None:
        return None
    parse_duration(str(value))
    return str(value)


class PlannerSettings(Strict):
    """What the deadline planner (runner/plan/deadline.py) assumes of the providers, over the store's history and
    the stated defaults (runner/plan/deadline_inputs.py): each unset figure comes from those, in that order."""

    #: a Batch API's median turnaround (a duration: "2h", "90m")
    batch_median: str | None = None
    #: a Batch API's 95th-percentile turnaround (a duration)
    batch_p95: str | None = None
    #: the mean fraction of flex attempts shed
    flex_shed: float | None = Field(default=None, ge=0, lt=1)
    #: the 95th percentile of a run's fraction of flex attempts shed
    flex_shed_p95: float | None = Field(default=None, ge=0, lt=1)
    #: an answer's 95th-percentile time at the standard tier (a duration)
    latency: str | None = None
    #: an answer's 95th-percentile time at the priority tier (a duration)
    priority_latency: str | None = None
    #: an answer's 95th-percentile time at the flex tier (a duration)
    flex_latency: str | None = None
    #: the probability the plan must finish by the deadline with
    confidence: float = Field(default=0.95, gt=0.5, lt=1)

    _durations = field_validator("batch_median", "batch_p95", "latency", "priority_latency", "flex_latency",
                                 mode="before")(lambda value: _duration_setting(value))


class BudgetLimit(Strict):
    """A spending limit: USD and/or tokens (input + output)."""

    #: the most it may spend in USD
    usd: float | None = Field(default=None, gt=0)
    #: the most input + output tokens it may spend
    tokens: Annotated[int | None, within(1, MAX_BUDGET_TOKENS)] = None


class JobBudget(BudgetLimit):
    """The run's limit, and limits per model (``provider:model``) across stages."""

    #: a limit per ``provider:model``, across stages
    models: dict[str, BudgetLimit] = Field(default_factory=dict)
