"""Prompt prefixes stored at the provider (Gemini's explicit cached contents, runner/engine/stored_prompts.py),
through the whole runner and google-genai against the simulated server (simserver/cached_contents.py): a shared
system prompt is stored once, every request names it and sends the rest, the creation and storage are charged in
the ledger to the second the prefix lived, it is deleted when the run is done, and nothing about the answers or the
memo changes."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from runner.engine.control import RunControl
from runner.engine.leases import ChunkLeases
from runner.engine.reserver import Reserver
from runner.engine.run import execute
from runner.engine.stats import RunStats
from runner.engine.stored_prompts import KEY, TTL, StoredPrompts
from runner.plan.prefixes import cache_rule
from runner.plan.stage import StagePlan
from runner.providers.base import CacheMarks, ProviderSettings, provider_class
from runner.providers.pricing import STORAGE_PER_HOUR, Pricing
from runner.report import summary as report
from runner.spec.job import load_job
from runner.store import open_store
from simserver import SimConfig, SimServer, start_server
from tests.helpers import write_rows

MODEL = "gemini:gemini-2.5-flash"
#: a system prompt of 6,000 characters: 1,500 tokens by the simulated server's rule, past 2.5 Flash's 1,024
SHARED = ("Read the question and the options, then answer with the letter of the right option only. " * 70)[:6000]
ROWS = 24


@pytest.fixture
async def server(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("GEMINI_API_KEY", "test-key")
    async with await start_server(SimConfig(latency=0.05)) as srv:
        yield srv


def write_job(folder: Path, server: SimServer, *, prompt_cache: str = "auto", rows: int = ROWS,
              gemini: dict[str, Any] | None = None, budget: float | None = None,
              model: str = MODEL) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    dataset = write_rows(folder / "rows.jsonl", rows)
    job: dict[str, Any] = {
        "name": "stored", "output_dir": str(folder / "results"), "models": [model],
        "providers": {"gemini": {"base_url": server.root_url, "concurrency": 8, **(gemini or {})}},
        "params": {"temperature": 0, "max_tokens": 5}, "prompt_cache": prompt_cache,
        "retry": {"max_attempts": 3, "backoff_initial": 0.01, "backoff_max": 0.05, "max_elapsed": 30},
        "stages": [{"name": "mc", "dataset": {"path": str(dataset)},
                    "prompt": {"system": SHARED, "user": "{{ question }}\n{{ options_block }}\nAnswer:"},
                    "choices": {"seeds": [0], "gold": "gold"}, "parse": "letter"}],
    }
    if budget is not None:
        job["budget"] = {"usd": budget}
    path = folder / "job.yaml"
    path.write_text(json.dumps(job), encoding="utf-8")
    return path


async def run(path: Path, store: Any = None) -> tuple[Any, Any]:
    store = store or open_store(path.parent / "s.sqlite")
    outcome = await execute(load_job(path), store)
    assert outcome.status == "completed", outcome.message
    return outcome, store


@contextlib.asynccontextmanager
async def gemini_of(job: Any) -> AsyncIterator[Any]:
    """The job's gemini provider, started (its client pointed at the simulated server)."""
    provider = provider_class("gemini")(ProviderSettings.model_validate(job.providers["gemini"].model_dump()))
    await provider.start()
    try:
        yield provider
    finally:
        await provider.aclose()


def output(usage: dict[str, Any]) -> int:
    """Output tokens as billed: the answer's and the thinking's (2.5 Flash thinks unless told not to)."""
    return usage["candidatesTokenCount"] + usage.get("thoughtsTokenCount", 0)


def stored_charges(store: Any, run_id: str) -> list[dict[str, Any]]:
    return [row for row in store.ledger(run_id) if row["key"].startswith(KEY)]


async def test_a_shared_system_prompt_is_stored_once_read_by_every_request_and_deleted_at_the_end(
        tmp_path: Path, server: SimServer):
    outcome, store = await run(write_job(tmp_path, server))
    stats = server.stats()["cached_contents"]
    assert (stats["created"], stats["deleted"], stats["live"]) == (1, 1, 0)
    assert stats["reads"] == ROWS, "every request named the stored prefix"
    tokens = 3 + 3 + len(SHARED) // 4  # the system instruction as the server counts it
    responses = store.responses()
    assert [r["cached_tokens"] for r in responses] == [tokens] * ROWS
    sent = [json.loads(r["request_json"]) for r in responses]
    assert all(req["messages"][0] == {"role": "system", "content": SHARED} for req in sent), \
        "the memo keeps the whole prompt: the stored prefix changes what is sent, not the request"

    # the money: its creation at the input price, its storage for the seconds it lived, at Google's storage price
    rates = Pricing().rates(MODEL)
    assert rates is not None and rates.cached_input < rates.input
    charges = stored_charges(store, outcome.run_id)
    assert charges and all(row["kind"] == "charge" for row in charges)
    storage = sum(row["amount"] for row in charges) - tokens * rates.input / 1e6
    lived = stats["stored_token_seconds"] / tokens  # seconds, by the server's clock
    assert storage == pytest.approx(tokens * STORAGE_PER_HOUR["gemini-2.5-flash"] * lived / 3600 / 1e6, rel=0.05)
    assert charges[-1]["amount"] < 0, "deleted before its TTL: the storage not used is given back"
    assert 0 < lived < TTL

    # each answer read the prefix at the cached price; the report's cost and saving count the storage
    usages = [json.loads(r["response_json"])["usageMetadata"] for r in responses]
    for response, usage in zip(responses, usages, strict=True):
        assert usage["cachedContentTokenCount"] == tokens
        by_hand = ((usage["promptTokenCount"] - tokens) * rates.input + tokens * rates.cached_input
                   + output(usage) * rates.output) / 1e6
        assert response["cost"] == pytest.approx(by_hand, rel=1e-9)
    data = report.build(store, outcome.run_id)
    paid = sum(row["amount"] for row in charges)
    assert data["totals"]["stored_prompts"] == pytest.approx(paid, abs=1e-9)
    assert data["totals"]["cost"] == pytest.approx(sum(r["cost"] for r in responses) + paid, abs=1e-9)
    assert data["totals"]["ledger_charged"] == pytest.approx(data["totals"]["cost"], abs=1e-9)
    uncached = sum((u["promptTokenCount"] * rates.input + output(u) * rates.output) / 1e6 for u in usages)
    assert data["totals"]["cache_saved"] == pytest.approx(uncached - data["totals"]["cost"], rel=1e-6)
    assert data["totals"]["cache_saved"] > 0
    assert "for the prompt prefixes it stored" in report.render(data, "text")
    assert outcome.stats.totals().spend == pytest.approx(data["totals"]["cost"], rel=1e-6)


async def test_the_answers_are_those_of_the_whole_prompt_and_the_memo_keys_do_not_change(
        tmp_path: Path, server: SimServer):
    stored_outcome, store = await run(write_job(tmp_path / "a", server))
    sent = server.stats()["received"]
    # the same job without caching, in the same store: every answer from the memo
    plain, _ = await run(write_job(tmp_path / "a", server, prompt_cache="off"), store)
    assert server.stats()["received"] == sent
    assert plain.stats.totals().cache_hits == ROWS
    # and in a fresh store, sent whole: the same answers
    server.reset()
    whole, fresh = await run(write_job(tmp_path / "b", server, prompt_cache="off"))
    assert server.stats().get("cached_contents", {}).get("created", 0) == 0
    answers = {r["key"]: r["response_text"] for r in store.responses()}
    assert answers == {r["key"]: r["response_text"] for r in fresh.responses()}


async def test_explicit_cache_false_orders_only(tmp_path: Path, server: SimServer):
    outcome, store = await run(write_job(tmp_path, server, gemini={"explicit_cache": False}))
    assert server.stats().get("cached_contents", {}).get("created", 0) == 0
    assert not stored_charges(store, outcome.run_id)
    # the implicit cache still serves the group's later requests
    assert sum(1 for r in store.responses() if r["cached_tokens"]) == ROWS - 1


async def test_no_budget_room_for_the_prefix_sends_the_requests_whole(tmp_path: Path, server: SimServer):
    rates = Pricing().rates(MODEL)
    assert rates is not None
    tokens = 3 + 3 + len(SHARED) // 4
    prefix = tokens * (rates.input + STORAGE_PER_HOUR["gemini-2.5-flash"] * TTL / 3600) / 1e6
    job = load_job(write_job(tmp_path, server, budget=prefix * 0.9))
    async with gemini_of(job) as provider:
        store = open_store(tmp_path / "s.sqlite")
        stats = RunStats()
        reserver = Reserver(run_id="r1", job=job, store=store, stats=stats, control=RunControl(),
                            leases=ChunkLeases(stats))
        tasks = list(StagePlan(job, job.stages[0]))[:4]
        stored = StoredPrompts(run_id="r1", providers={"gemini": provider}, reserver=reserver)
        chosen = stored.choose(cache_rule(MODEL), [(t, CacheMarks("g", ((1, 0),))) for t in tasks])
        assert len(chosen) == 4, "four requests sharing it: storing it pays"
        ready = await stored.ready(tasks[0], chosen[tasks[0].key])
        assert ready.stored is None and ready.store_key is None and ready.held == 0, "sent whole"
        assert server.stats().get("cached_contents", {}).get("created", 0) == 0
        assert not store.ledger("r1"), "nothing reserved or charged"
        assert reserver.budgets is not None and reserver.budgets.all()[0].reserved_usd == 0
        assert any("no budget room to store a prompt prefix" in note for note in stats.notes)
        assert (await stored.ready(tasks[1], chosen[tasks[1].key])).store_key is None, "not tried again"


async def test_a_prefix_stored_by_an_earlier_process_is_used_not_stored_again(tmp_path: Path, server: SimServer):
    """A resumed run (or another worker) finds the prefix by its label in the provider's list."""
    job = load_job(write_job(tmp_path, server))
    store = open_store(tmp_path / "s.sqlite")
    async with gemini_of(job) as provider:
        stats = RunStats()
        reserver = Reserver(run_id="r1", job=job, store=store, stats=stats, control=RunControl(),
                            leases=ChunkLeases(stats))
        tasks = list(StagePlan(job, job.stages[0]))[:4]
        marks = [(t, CacheMarks("g", ((1, 0),))) for t in tasks]

        first = StoredPrompts(run_id="r1", providers={"gemini": provider}, reserver=reserver)
        chosen = first.choose(cache_rule(MODEL), marks)
        assert len(chosen) == 4 and {m.held for m in chosen.values()} == {1}
        ready = await first.ready(tasks[0], chosen[tasks[0].key])
        assert ready.stored is not None and server.stats()["cached_contents"]["created"] == 1

        # a second process of the same run: the prefix is listed under its label, and used
        second = StoredPrompts(run_id="r1", providers={"gemini": provider}, reserver=reserver)
        again = second.choose(cache_rule(MODEL), marks)
        got = await second.ready(tasks[1], again[tasks[1].key])
        assert got.stored == ready.stored and server.stats()["cached_contents"]["created"] == 1
        assert len(stored_charges(store, "r1")) == 1, "paid once"

        # the prefix gone at the provider: the request is sent whole, and the next stores it again
        await provider.drop_prompt(ready.stored)
        completion = await provider.execute(tasks[2].model_name, *provider.mark_prompt_cache(
            tasks[2].model_name, tasks[2].call.messages, tasks[2].call.params, got))
        assert completion.text and completion.cached_tokens == 0
        renewed = await second.ready(tasks[3], again[tasks[3].key])
        assert renewed.stored not in (None, ready.stored)
        assert server.stats()["cached_contents"]["created"] == 2
        await second.close()
        assert server.stats()["cached_contents"]["live"] == 0
