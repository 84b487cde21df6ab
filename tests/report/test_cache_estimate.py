"""``runner estimate`` with provider prompt caching: each stage's expected cost with and without it, worked out here
from genai-prices' rates and the runner's token counter (not from runner/plan/prefixes.py), and the warning for a
prompt whose varying part comes before a long shared part."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.providers.pricing import PER, Pricing
from runner.providers.tokens import count_input_tokens
from runner.report.estimate import estimate
from runner.report.estimate_render import render
from runner.spec.job import load_job
from runner.store import open_store

#: about 1,400 tokens of instruction shared by every request
SHARED = "Read the question and answer with the letter of the right option, nothing else. " * 90
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]


def write_job(tmp_path: Path, model: str, *, prompt_cache: str = "auto", user: str = "{{ question }}",
              system: str | None = SHARED, rows: int = len(WORDS)) -> Path:
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(json.dumps({"id": str(i), "question": f"{WORDS[i]} is which letter?",
                                          "passage": SHARED}) for i in range(rows)), encoding="utf-8")
    prompt = {"user": user, **({"system": system} if system else {})}
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps({"name": "est", "models": [model], "params": {"max_tokens": 5},
                                "prompt_cache": prompt_cache,
                                "stages": [{"name": "s", "dataset": {"path": str(data), "id": "id"},
                                            "prompt": prompt}]}), encoding="utf-8")
    return path


def test_openai_reads_the_shared_instruction_in_128_token_steps_for_every_request_but_the_first(tmp_path):
    model = "openai:gpt-4o"
    est = estimate(load_job(write_job(tmp_path, model)), open_store(tmp_path / "s.sqlite"))
    [group] = est.groups
    shared = count_input_tokens("openai", "gpt-4o", [{"role": "system", "content": SHARED}])
    assert shared > 1024
    read = 1024 + (shared - 1024) // 128 * 128
    assert group.cache_read_tokens == (len(WORDS) - 1) * read
    rates = Pricing().rates(model)
    assert rates is not None and rates.cached_input < rates.input
    assert group.cost_low_cached == pytest.approx(
        group.cost_low - (len(WORDS) - 1) * read * (rates.input - rates.cached_input) / PER, rel=1e-12)
    text = render(est, "text")
    assert "with provider prompt caching (prompt_cache: auto): expected" in text
    assert f"{(len(WORDS) - 1) * read:,} of the" in text


def test_anthropic_pays_the_write_premium_once_and_reads_at_a_tenth(tmp_path):
    model = "anthropic:claude-opus-4-1"
    est = estimate(load_job(write_job(tmp_path, model)), open_store(tmp_path / "s.sqlite"))
    [group] = est.groups
    shared = count_input_tokens("anthropic", "claude-opus-4-1", [{"role": "system", "content": SHARED}])
    rates = Pricing().rates(model)
    assert rates is not None and rates.cache_write > rates.input
    saving = ((len(WORDS) - 1) * shared * (rates.input - rates.cached_input)
              - shared * (rates.cache_write - rates.input)) / PER
    assert group.cache_read_tokens == (len(WORDS) - 1) * shared
    assert group.cost_low_cached == pytest.approx(group.cost_low - saving, rel=1e-9)


def test_gemini_stores_the_instruction_and_pays_its_storage_for_the_stored_prompts_ttl(tmp_path):
    """Gemini's explicit caching (runner/engine/stored_prompts.py): the instruction is stored once (its tokens at
    the input price, as a plain first request's), read by every request, the first too, and kept for the TTL at
    Google's storage price; ``explicit_cache: false`` leaves the implicit expectation."""
    model = "gemini:gemini-2.5-flash"
    est = estimate(load_job(write_job(tmp_path, model)), open_store(tmp_path / "s.sqlite"))
    [group] = est.groups
    shared = count_input_tokens("gemini", "gemini-2.5-flash", [{"role": "system", "content": SHARED}])
    rates = Pricing().rates(model)
    assert rates is not None and shared > 1024
    storage = 1.00 * 600 / 3600  # USD per million tokens per hour, for the 600 s a prefix is stored
    saving = ((len(WORDS) - 1) * shared * (rates.input - rates.cached_input)
              - shared * (rates.cached_input + storage)) / PER
    assert group.cost_low_cached == pytest.approx(group.cost_low - saving, rel=1e-9)
    path = write_job(tmp_path, model)
    job = json.loads(path.read_text())
    path.write_text(json.dumps({**job, "providers": {"gemini": {"explicit_cache": False}}}), encoding="utf-8")
    [implicit] = estimate(load_job(path), open_store(tmp_path / "t.sqlite")).groups
    assert implicit.cost_low_cached == pytest.approx(
        implicit.cost_low - (len(WORDS) - 1) * shared * (rates.input - rates.cached_input) / PER, rel=1e-9)


def test_without_planned_caching_there_is_no_cached_figure(tmp_path):
    off = estimate(load_job(write_job(tmp_path, "openai:gpt-4o", prompt_cache="off")), open_store(tmp_path / "s"))
    assert off.groups[0].cost_low_cached is None and "cost_low_cached" not in off.totals
    free = estimate(load_job(write_job(tmp_path, "local:smollm2-135m-instruct")), open_store(tmp_path / "t"))
    assert free.groups[0].cost_low_cached is None, "a local model caches nothing the runner plans"


def test_a_varying_part_before_a_long_shared_one_is_warned_with_the_reorder(tmp_path):
    wrong = estimate(load_job(write_job(tmp_path, "openai:gpt-4o", system=None,
                                        user="{{ question }}\n\n{{ passage }}")), open_store(tmp_path / "s"))
    [warning] = wrong.totals["warnings"]
    assert warning.startswith("stage s: its prompts to openai:gpt-4o end with the same ~")
    assert 'put the varying fields after the text starting "is which letter?' in warning
    assert warning in render(wrong, "text")
    right = estimate(load_job(write_job(tmp_path, "openai:gpt-4o", system=None,
                                        user="{{ passage }}\n\n{{ question }}")), open_store(tmp_path / "t"))
    assert right.totals["warnings"] == [] and right.groups[0].cache_read_tokens
