"""Budgets of Claude and Gemini reserve the exact input tokens their count endpoints give (runner/engine/
exact_counts.py), against the simulated server: each distinct prompt is counted once and the count is kept in the
store across a resume; a count endpoint that fails leaves the byte bound with one note; a budgeted run stops within
5 % of its budget and never over it; no budget, no count; ``runner estimate`` labels counted prompts exact."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from runner.engine.exact_counts import AHEAD, ATTEMPTS, FAILURES_IN_A_ROW
from runner.engine.run import execute
from runner.report import estimate as estimates
from runner.report import estimate_render
from runner.spec.job import load_job
from runner.spec.overrides import set_budget
from runner.store import Store, open_store
from simserver import SimServer, start_server

CLAUDE = "anthropic:claude-haiku-4-5"
GEMINI = "gemini:gemini-2.0-flash"
#: USD per million tokens: dear, so that a request is worth cents
PRICES = {"input": 3000.0, "output": 15000.0}
MAX_TOKENS = 10


@pytest.fixture
async def server(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    monkeypatch.setenv("GEMINI_API_KEY", "test-key")
    async with await start_server() as srv:
        yield srv


def questions(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    return [f"Question {seed}-{i}: " + " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "epsilon"])
                                                for _ in range(rng.randint(10, 150))) + "?" for i in range(n)]


def write_job(folder: Path, url: str, model: str, rows: list[str], *, usd: float | None, count: bool = True,
              concurrency: int = 4, stages: int = 1, temperature: float = 0, name: str = "counts") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    dataset = folder / f"{name}.jsonl"
    dataset.write_text("".join(json.dumps({"question": q}) + "\n" for q in rows), encoding="utf-8")
    provider = model.split(":")[0]
    job: dict[str, Any] = {
        "name": name, "output_dir": str(folder / "results"), "models": [model],
        "providers": {provider: {"base_url": url, "concurrency": concurrency, "timeout": 10, "count_tokens": count}},
        "params": {"temperature": temperature, "max_tokens": MAX_TOKENS}, "prices": {model: PRICES},
        # the same prompt in each stage, under another output cap: other cache keys, the same count
        "stages": [{"name": f"ask{n}", "dataset": {"path": str(dataset)}, "params": {"max_tokens": MAX_TOKENS - n},
                    "prompt": {"system": "Answer in a few words.", "user": "{{ question }}"}} for n in range(stages)],
    }
    if usd is not None:
        job["budget"] = {"usd": usd}
    path = folder / f"{name}.yaml"
    path.write_text(json.dumps(job), encoding="utf-8")
    return path


def spent(store: Store, run_id: str) -> float:
    return sum(row["amount"] for row in store.ledger(run_id, kind="charge"))


def worst_exact(rows: list[str]) -> float:
    """The dearest request's worst case at its exact count (the server's rule over its system and user message)."""
    from runner.providers.sim_tokens import count_prompt_tokens

    tokens = max(count_prompt_tokens([{"content": "Answer in a few words."}, {"content": q}]) for q in rows)
    return (tokens * PRICES["input"] + MAX_TOKENS * PRICES["output"]) / 1e6


async def test_each_prompt_is_counted_once_and_the_count_is_kept_across_a_resume(tmp_path, server: SimServer):
    """Two stages ask the same 30 prompts (other output caps: other requests, one count each); the first run
    runs out of budget, a resume with a larger one finishes: every prompt was counted by the server once, those
    counted ahead of a dispatch the budget stopped (runner/engine/exact_counts.py, ``AHEAD``) found in the store by
    the resume."""
    rows = questions(1, 30)
    path = write_job(tmp_path, server.root_url, CLAUDE, rows, usd=3.0, stages=2)
    job = load_job(path)
    store = open_store(tmp_path / "s.sqlite")
    first = await execute(job, store)
    assert first.status == "budget_exhausted"
    counted = server.stats()["count_tokens"]
    assert counted["received"] == len(counted["by_digest"]) and set(counted["by_digest"].values()) == {1}
    sent = server.stats()["received"]
    assert sent < len(counted["by_digest"]) <= min(30, sent + 4 + AHEAD), "counted ahead, at most AHEAD unsent"
    assert store.row("SELECT count(*) FROM token_counts") == (counted["received"],), "each count kept"
    set_budget(job, 1000.0)
    second = await execute(job, store, run_id=first.run_id)
    assert second.status == "completed"
    counted = server.stats()["count_tokens"]
    assert counted["received"] == len(counted["by_digest"]) == 30, "each prompt once, in both runs and stages"
    assert set(counted["by_digest"].values()) == {1}
    assert server.stats()["received"] == 60
    assert set(counted["by_digest"]) == set(server.stats()["completed_by_digest"])


async def test_a_failing_count_endpoint_falls_back_to_the_bound_with_one_note(tmp_path, server: SimServer):
    """Every count answered 500: a few tries, then counting is off for the run, said in one note; the run reserves
    the byte bound as a run with counting off does, to the cent."""
    rows = questions(2, 40)
    outcomes = {}
    for count in (True, False):
        server.reset()
        server.configure(count_tokens=False)  # the server's counting endpoint fails
        job = load_job(write_job(tmp_path / str(count), server.root_url, GEMINI, rows, usd=6.0, count=count,
                                 concurrency=1))
        store = open_store(tmp_path / f"{count}.sqlite")
        outcome = await execute(job, store)
        notes = [note for note in outcome.stats.notes if "token-counting endpoint" in note]
        asked = server.stats().get("count_tokens", {}).get("received", 0)
        outcomes[count] = (outcome.status, round(spent(store, outcome.run_id), 9), len(store.tasks(outcome.run_id)))
        if count:
            assert len(notes) == 1 and "500" in notes[0] and "byte bound" in notes[0], outcome.stats.notes
            assert 0 < asked <= ATTEMPTS * FAILURES_IN_A_ROW
        else:
            assert notes == [] and asked == 0
    assert outcomes[True] == outcomes[False]
    assert outcomes[True][0] == "budget_exhausted" and outcomes[True][1] <= 6.0


@pytest.mark.parametrize("model", [CLAUDE, GEMINI])
async def test_a_budgeted_run_stops_within_five_percent_of_its_budget_and_never_over(tmp_path, server: SimServer,
                                                                                    model: str):
    """Five seeds each: random prompts, a budget worth twenty of its dearest requests or more. With exact counts
    the run spends at least 95 % of it and never more; with the byte bound it leaves more unspent."""
    exact_fill, bound_fill = [], []
    for seed in range(5):
        rows = questions(100 + seed, 120)
        budget = round(random.Random(seed).uniform(20, 30) * worst_exact(rows), 4)
        for count, fills in ((True, exact_fill), (False, bound_fill)):
            folder = tmp_path / f"{seed}-{count}"
            job = load_job(write_job(folder, server.root_url, model, rows, usd=budget, count=count,
                                     concurrency=random.Random(seed).choice([1, 4, 16])))
            store = open_store(folder / "s.sqlite")
            outcome = await execute(job, store)
            used = spent(store, outcome.run_id)
            assert outcome.status == "budget_exhausted" and used <= budget + 1e-9, (seed, count, used, budget)
            fills.append(used / budget)
    assert min(exact_fill) >= 0.95, exact_fill
    assert sum(bound_fill) < sum(exact_fill), (bound_fill, exact_fill)


@pytest.mark.parametrize("model", [CLAUDE, GEMINI])
async def test_a_chunks_prompts_are_counted_ahead_of_their_reservations_not_one_after_another(
        tmp_path, server: SimServer, model: str):
    """Each count takes 50 ms: asked at each reservation, as the dispatch reaches it, they went one at a time (one
    in flight at most, a round trip per distinct prompt before the next request could go); asked ahead of the
    dispatch they overlap, each prompt still counted once and reserved at its count."""
    server.configure(count_latency=0.05)
    rows = questions(7, 24)
    job = load_job(write_job(tmp_path, server.root_url, model, rows, usd=1000.0, concurrency=8))
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    assert outcome.status == "completed"
    counted = server.stats()["count_tokens"]
    assert counted["received"] == len(counted["by_digest"]) == 24
    assert counted["peak_in_flight"] > 4, counted["peak_in_flight"]
    assert store.row("SELECT count(*) FROM token_counts") == (24,)


async def test_without_a_budget_nothing_is_counted(tmp_path, server: SimServer):
    job = load_job(write_job(tmp_path, server.root_url, CLAUDE, questions(3, 10), usd=None))
    assert (await execute(job, open_store(tmp_path / "s.sqlite"))).status == "completed"
    assert "count_tokens" not in server.stats() and server.stats()["received"] == 10


async def test_the_estimate_labels_prompts_counted_before_exact_and_the_others_bound(tmp_path, server: SimServer):
    """After a budgeted run, the estimate of the same prompts at another temperature (new requests: nothing in the
    memo) shows their input tokens exact, priced as the run reserved them; new prompts show the bound."""
    rows = questions(4, 12)
    store = open_store(tmp_path / "s.sqlite")
    await execute(load_job(write_job(tmp_path / "run", server.root_url, CLAUDE, rows, usd=1000.0)), store)
    again = load_job(write_job(tmp_path / "again", server.root_url, CLAUDE, rows + questions(5, 3), usd=1000.0,
                               temperature=0.5))
    [group] = estimates.estimate(again, store).groups
    assert group.to_send == 15 and group.input_counted == 12 and not group.input_exact
    text = estimate_render.render(estimates.estimate(again, store), "text")
    assert "(bound; 12 of 15 requests exact)" in text
    same = load_job(write_job(tmp_path / "same", server.root_url, CLAUDE, rows, usd=1000.0, temperature=0.5))
    est = estimates.estimate(same, store)
    [group] = est.groups
    from runner.providers.sim_tokens import count_prompt_tokens

    exact = sum(count_prompt_tokens([{"content": "Answer in a few words."}, {"content": q}]) for q in rows)
    assert group.input_exact and group.input_tokens == group.input_tokens_bound == exact
    assert f"{exact:,} (exact)" in estimate_render.render(est, "text")
    assert json.loads(estimate_render.render(est, "json"))["groups"][0]["input_counted"] == 12
    off = load_job(write_job(tmp_path / "off", server.root_url, CLAUDE, rows, usd=1000.0, temperature=0.5,
                             count=False))
    [group] = estimates.estimate(off, store).groups
    assert not group.input_exact and group.input_counted == 0, "counting off: a run would reserve the bound"
