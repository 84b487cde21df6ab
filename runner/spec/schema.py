"""The job file's schema: typed models (pydantic) of a job, its stages and its settings, with their defaults.

A job is a list of stages. An LLM stage reads a JSONL dataset (or, in a pipeline, the rows of earlier
stages: ``from:``), renders a prompt per row, sends it to each of its models once per variant (seed of the
option shuffle, sample index, any user variable), parses the answers and scores them. A data stage (join,
explode, filter, a named recipe, ...) turns the rows of earlier stages into new rows without a request
(runner/spec/steps.py). A stage's own model is runner/spec/stage.py's.

What one model checks of its own fields is with the model; checks that need the plan or the providers (prompts exist,
models are known, a capability refuses a setting) are runner/spec/checks.py's, run by runner/spec/job.py. From
runner/providers this module takes only the provider contract (``ProviderSettings``, ``split_model``, in
runner/providers/base.py) and the capability table's ``shape`` (runner/providers/capabilities.py), neither of
which imports runner/spec; it imports nothing from runner/plan.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from runner.errors import RunnerError
from runner.providers.base import ProviderEntry, ProviderSettings, provider_class, split_model
from runner.providers.capabilities import Shaped, shape
from runner.spec.fields import MAX_ROWS, Seed, Strict, deadline_seconds, within
from runner.spec.pools import Pool
from runner.spec.settings import (
    BatchSettings,
    Fallback,
    JobBudget,
    Mode,
    Params,
    PlannerSettings,
    Price,
    PromptCacheMode,
    RetrySettings,
    Tier,
    tier_setting,
)
from runner.spec.stage import NAME_PATTERN, Stage, deadline_setting


class ReportLayout(Strict):
    """A paper's table layout for ``runner report``: NewTerm's Table 1, Know-No's Table 3 or WinoDict's Table 2."""

    #: which paper's table
    layout: Literal["newterm", "knowno", "winodict"]
    #: winodict: the log-likelihood stage (and the prompt-form stage for chat models, if any)
    stage: str | None = None
    #: winodict: the stage asking chat models the same items as a two-option question
    chat_stage: str | None = None
    #: newterm: which stage holds each task, e.g. {COMA: coma, COST: cost, CSJ: csj}
    tasks: dict[Literal["COMA", "COST", "CSJ"], str] = Field(default_factory=dict)
    #: knowno: which stage holds each prompt style
    styles: dict[Literal["with_gold", "hint_option", "hint_instruction", "no_hint"], str] = Field(default_factory=dict)


#: the provider of the user's servers a job's ``endpoints:`` names
OPENAI_COMPATIBLE = "openai-compatible"


class Job(Strict):
    #: the job's name: its results go under ``<output_dir>/<name>/<run id>/``, and reports and the ledger name it
    name: str = Field(pattern=NAME_PATTERN)
    #: free text
    description: str | None = None
    #: the models every LLM stage asks, as ``provider:model`` (a stage's ``models:`` replaces them for that stage)
    models: list[str] = Field(default_factory=list)
    #: the generation parameters of every stage (a stage's ``params:`` are merged over them)
    params: Params = Field(default_factory=Params)
    #: settings per provider (``providers: {openai: {rpm: 500}}``): its address, key variable, limits and bounds;
    #: a ``provider:label`` key is one more endpoint of that provider, for ``pools:``
    providers: dict[str, ProviderSettings] = Field(default_factory=dict)
    #: the user's OpenAI-compatible servers, named in models as ``openai-compatible:NAME/MODEL``
    endpoints: dict[str, ProviderSettings] = Field(default_factory=dict)
    #: models served by several endpoints, by the model as ``models:`` names it: ``{anthropic:claude-haiku-4-5:
    #: {endpoints: [anthropic, anthropic:eu], same_model: false}}``. Their limits add up; each endpoint keeps its own
    #: limiter, prompt cache and price; a ``provider:label`` endpoint's settings are ``providers: {provider:label:
    #: {...}}``, over the provider's own (runner/spec/pools.py)
    pools: dict[str, Pool] = Field(default_factory=dict)
    #: how failed requests are tried again (the runner's own retries: the SDKs' are off)
    retry: RetrySettings = Field(default_factory=RetrySettings)
    #: prices per ``provider:model``, in USD per million tokens, over genai-prices' (or for a model it lacks)
    prices: dict[str, Price] = Field(default_factory=dict)
    #: the most the run may spend, in USD and/or tokens, for the whole run and per model
    budget: JobBudget | None = None
    #: online (each request at once), batch (the providers' Batch APIs: half the price, answers within a day)
    #: or auto (batch while the deadline allows, then online)
    mode: Mode = "online"
    #: the service tier of every stage's requests, or one per model (``{provider:model: tier}``); a stage's wins
    tier: Tier | dict[str, Tier] | None = None
    #: ``standard``: shed flex requests go at standard once ``retry.flex_wait`` has passed (a stage may say
    #: otherwise)
    fallback: Fallback | None = None
    #: auto: requests sharing a long prefix are sent so that the provider's prompt cache serves the repeats (one of
    #: them first, the rest once it answered; Anthropic's cache_control breakpoints and OpenAI's prompt_cache_key
    #: set for them); off: sent as planned, unmarked
    prompt_cache: PromptCacheMode = "auto"
    #: when the answers are needed: a duration from the run's start ("90m", "6h", "1d" or a number of seconds) or
    #: an ISO 8601 time with its zone ("2026-12-01T18:00Z"). The deadline planner (runner/plan/deadline.py) then
    #: sends each stage's requests the cheapest way that finishes by it with 95 % confidence (batch, flex,
    #: standard, priority), ``mode`` being auto unless the job says otherwise; what no batch has answered by the
    #: cutover is sent online
    deadline: str | None = None
    #: what the deadline planner assumes where the store has no history (runner/plan/deadline_inputs.py)
    planner: PlannerSettings = Field(default_factory=PlannerSettings)
    #: how stages in ``mode: batch`` or ``auto`` use the providers' Batch APIs
    batch: BatchSettings = Field(default_factory=BatchSettings)
    #: requests in flight per endpoint at most, a memory bound (15-20 kB each: bench/latency.py); a
    #: provider's own ``max_in_flight`` wins, an explicit ``concurrency`` caps it further
    max_in_flight: Annotated[int | None, within(1, 1_000_000)] = None

    _tier = field_validator("tier", mode="before")(tier_setting)

    @field_validator("providers", "endpoints", mode="before")
    @classmethod
    def _for_their_providers(cls, value: Any, info: ValidationInfo) -> Any:
        """Each entry's settings marked with the provider they are for (a ``provider:label`` key's provider; an
        endpoint's, openai-compatible), whose own keys alone they may add (``ProviderEntry``)."""
        if not isinstance(value, dict):
            return value
        return {name: ProviderEntry(settings, OPENAI_COMPATIBLE if info.field_name == "endpoints"
                                    else str(name).split(":")[0]) if isinstance(settings, dict) else settings
                for name, settings in value.items()}

    _deadline = field_validator("deadline", mode="before")(lambda value: deadline_setting(value))
    #: read only the first N items of every stage's dataset (``runner submit --limit N`` sets it too)
    limit: Annotated[int | None, within(1, MAX_ROWS)] = None
    #: a paper's table for ``runner report`` (NewTerm's, Know-No's or WinoDict's layout)
    report: ReportLayout | None = None
    #: the folder results files go under: ``<output_dir>/<job>/<run id>/<stage>.jsonl``
    output_dir: str = "results"
    #: values for ``${name}`` in the file's strings (``--var name=value`` overrides them)
    vars: dict[str, str] = Field(default_factory=dict)
    #: the seed of the data steps' random choices (sample, shuffle, recipes) unless a step sets its own
    seed: Seed = 0
    #: text similarity for the steps that need it: all-MiniLM-L6-v2 (the [embed] extra), a lexical measure,
    #: or auto (the model when installed)
    embeddings: Literal["auto", "minilm", "lexical"] = "auto"
    #: leave out what a model cannot take (a stage may say otherwise) instead of refusing the job
    drop_unsupported: bool = False
    #: what the job does, in order: LLM stages (a prompt) and, in a pipeline, data stages
    stages: list[Stage] = Field(min_length=1)

    # Filled in by load_job, not read from the file.
    path: str = ""
    base_dir: str = ""
    #: what the requests were shaped for: API versions, SDK and capability-table versions, and per stage and model
    #: the settings left out (``drop_unsupported``); stored with the run (its job JSON)
    sent_with: dict[str, Any] = Field(default_factory=dict)

    def stage_models(self, stage: Stage) -> list[str]:
        if not stage.is_llm:
            return []
        return stage.models if stage.models is not None else self.models

    @property
    def is_pipeline(self) -> bool:
        """A job whose stages read each other's rows (or transform them) rather than only datasets."""
        return any(stage.from_ is not None or not stage.is_llm for stage in self.stages)

    def llm_stages(self) -> list[Stage]:
        return [stage for stage in self.stages if stage.is_llm]

    def stage_limit(self, stage: Stage) -> int | None:
        limits = [x for x in (self.limit, stage.dataset.limit if stage.dataset else None) if x is not None]
        return min(limits) if limits else None

    def stage_mode(self, stage: Stage) -> Mode:
        """The stage's ``mode:``, else the job's; a stage with a deadline and no mode said anywhere is ``auto``:
        the deadline planner chooses."""
        if stage.mode is not None:
            return stage.mode
        if "mode" not in self.model_fields_set and self.stage_deadline(stage) is not None:
            return "auto"
        return self.mode

    def stage_deadline(self, stage: Stage) -> str | None:
        return stage.deadline if stage.deadline is not None else self.deadline

    def stage_prompt_cache(self, stage: Stage) -> PromptCacheMode:
        return stage.prompt_cache or self.prompt_cache

    def stage_tier(self, stage: Stage, model: str) -> Tier | None:
        """The tier ``model``'s requests of ``stage`` ask for: the first of the stage's ``tier:`` and the job's
        that names it (a plain tier names every model); None: none asked, nothing sent."""
        for setting in (stage.tier, self.tier):
            found = setting.get(model) if isinstance(setting, dict) else setting
            if found is not None:
                return found
        return None

    def stage_fallback(self, stage: Stage) -> Fallback | None:
        return stage.fallback or self.fallback

    def deadline_seconds(self, now: float | None = None) -> float | None:
        """The job's deadline as seconds from ``now`` (epoch seconds; the run's start), or None."""
        return deadline_seconds(self.deadline, now) if self.deadline is not None else None

    def stage_deadline_seconds(self, stage: Stage, now: float | None = None) -> float | None:
        """The stage's deadline (its own, else the job's) as seconds from ``now`` (the run's start), or None."""
        text = self.stage_deadline(stage)
        return deadline_seconds(text, now) if text is not None else None

    def stage_params(self, stage: Stage) -> Params:
        """The stage's parameters over the job's; a stage ``schema:`` becomes a json_schema response format."""
        params = stage.params.merged_over(self.params)
        if isinstance(stage.schema_, dict):
            params = params.model_copy(update={"response_format": {
                "type": "json_schema",
                "json_schema": {"name": _schema_name(stage), "schema": stage.schema_, "strict": True}}})
        return params

    def stage_drops(self, stage: Stage) -> bool:
        return stage.drop_unsupported if stage.drop_unsupported is not None else self.drop_unsupported

    def model_params(self, stage: Stage, model: str) -> dict[str, Any]:
        """What ``model`` is sent for ``stage``: the stage's parameters shaped by the model's capabilities (what it
        cannot take left out under drop_unsupported; refusals are ``runner validate``'s, runner/spec/checks.py)."""
        return shaped_params(self, stage, model).params

    def results_path(self, stage: Stage, run_id: str) -> Path:
        """``output:`` when the stage sets one, else ``<output_dir>/<job>/<run id>/<stage>.jsonl``."""
        if stage.output:
            return Path(stage.output)
        return Path(self.output_dir) / self.name / run_id / f"{stage.name}.jsonl"

    def fingerprint(self) -> str:
        body = self.model_dump(mode="json", by_alias=True, exclude={"path", "base_dir", "sent_with"})
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]



def _schema_name(stage: Stage) -> str:
    """OpenAI's json_schema needs a name (``^[a-zA-Z0-9_-]{1,64}$``): the schema's title, else the stage's."""
    title = stage.schema_.get("title") if isinstance(stage.schema_, dict) else None
    return re.sub(r"[^a-zA-Z0-9_-]", "_", str(title or stage.name))[:64]


def shaped_params(job: Job, stage: Stage, model: str) -> Shaped:
    """The stage's parameters as ``model`` (``provider:name``) is sent them (``capabilities.shape``)."""
    provider, name = split_model(model)
    settings = job.providers.get(provider)
    api_version = settings.api_version if settings else None
    try:
        name = provider_class(provider).model_behind(name, settings)
        api_version = provider_class(provider).api_version_of(settings)
    except (KeyError, RunnerError):  # an unknown or broken provider is said where the job names it
        pass
    return shape(provider, name, job.stage_params(stage).model_dump(exclude_none=True),
                 drop_unsupported=job.stage_drops(stage), api_version=api_version, label=model)
