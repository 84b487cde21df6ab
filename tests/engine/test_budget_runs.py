"""Budgets through the whole runner against the simulated server with prices set: spend never exceeds a
budget whatever the concurrency, most of the budget is used, the ledger adds up, and a resume continues a
budget-exhausted run with a larger budget."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest

from runner.engine.budget import Scope
from runner.engine.run import execute
from runner.errors import RunnerError
from runner.providers.pricing import Pricing
from runner.report import summary as report
from runner.spec.job import load_job
from runner.spec.overrides import set_budget
from runner.store import Store, open_store
from simserver import SimConfig, SimServer, start_server

MODEL = "sim:priced"
#: USD per million tokens: dear enough that a few requests are worth cents
PRICES = {"input": 2000.0, "output": 8000.0}


def write_job(folder: Path, url: str, rows: list[str], *, usd: float | None, concurrency: int, max_tokens: int,
              name: str = "budget") -> Path:
    dataset = folder / f"{name}.jsonl"
    dataset.write_text("".join(json.dumps({"question": q}) + "\n" for q in rows), encoding="utf-8")
    job = {
        "name": name, "output_dir": str(folder / "results"), "models": [MODEL],
        "providers": {"sim": {"base_url": url, "concurrency": concurrency, "timeout": 10}},
        "params": {"temperature": 0, "max_tokens": max_tokens},
        "prices": {MODEL: PRICES},
        "stages": [{"name": "ask", "dataset": {"path": str(dataset)}, "prompt": {"user": "{{ question }}"}}],
    }
    if usd is not None:
        job["budget"] = {"usd": usd}
    path = folder / f"{name}.yaml"
    path.write_text(json.dumps(job), encoding="utf-8")
    return path


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]) for _ in range(n))


def charged(store: Store, run_id: str) -> float:
    return sum(row["amount"] for row in store.ledger(run_id, kind="charge"))


@pytest.fixture
async def server():
    async with await start_server(SimConfig()) as srv:
        yield srv


#: the trials, in blocks that are tests of their own (the suite's test processes share them)
TRIALS, BLOCK = 1000, 250


@pytest.mark.slow  # many budgets x concurrencies against the server: about 20 s a block
@pytest.mark.parametrize("first", range(0, TRIALS, BLOCK), ids=lambda first: f"trials-{first}-{first + BLOCK - 1}")
async def test_spend_never_exceeds_the_budget_and_uses_most_of_it(tmp_path, server: SimServer, first):
    """1,000 seeded trials (each its own seed, so the blocks draw the same trials however they are cut): random
    budgets, concurrency up to 128, random prompt and completion sizes and latencies. In every trial the spend stays
    within the budget; when the budget ran out, less than one request's worst case was left unspent (so at least
    90 % of any budget worth ten requests was used)."""
    exhausted = 0
    # one store for the block's runs (each trial's rows are its own, so none is another's cache hit): a new store
    # file per trial cost about 20 ms of CPU to make and close
    store = open_store(tmp_path / "s.sqlite")
    for trial in range(first, first + BLOCK):
        rng = random.Random(f"20261121-{trial}")
        server.configure(latency=rng.choice([0.0, 0.0, 0.001, 0.005]))
        max_tokens = rng.randint(4, 60)
        rows = [f"Trial {trial} row {i}: {words(rng, rng.randint(1, 80))}?" for i in range(rng.randint(5, 40))]
        folder = tmp_path / f"t{trial}"
        folder.mkdir()
        path = write_job(folder, server.url, rows, usd=rng.uniform(0.01, 2.0), concurrency=rng.randint(1, 128),
                         max_tokens=max_tokens, name=f"t{trial}")
        job = load_job(path)
        outcome = await execute(job, store)
        budget = job.budget.usd
        spent = charged(store, outcome.run_id)
        assert spent <= budget + 1e-9, (trial, spent, budget)
        if outcome.status == "budget_exhausted":
            exhausted += 1
            pricing = Pricing(job)
            # the dearest request of the job, at its worst case, bounds what may be left unspent
            from runner.providers.tokens import count_input_tokens

            worst = max(pricing.worst_case(MODEL, count_input_tokens("sim", "priced",
                                                                     [{"role": "user", "content": q}]), max_tokens)
                        for q in rows)
            assert spent >= budget - worst - 1e-9, (trial, spent, budget, worst)
            if budget >= 10 * worst:
                assert spent >= 0.9 * budget
        else:
            assert outcome.status == "completed"
    store.close()
    assert BLOCK // 10 < exhausted < BLOCK  # both outcomes were exercised


async def test_the_report_the_ledger_and_the_usage_agree_to_the_cent(tmp_path, server: SimServer):
    server.configure(latency=0.0)
    rng = random.Random(3)
    rows = [f"Question {i}: {words(rng, rng.randint(3, 60))}?" for i in range(40)]
    job = load_job(write_job(tmp_path, server.url, rows, usd=None, concurrency=16, max_tokens=30))
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    assert outcome.status == "completed"
    built = report.build(store, outcome.run_id)
    pricing = Pricing(job)
    from_usage = sum(pricing.cost(MODEL, r["input_tokens"], r["output_tokens"], r["cached_tokens"])
                     for r in store.responses())
    assert round(built["totals"]["cost"], 2) == round(charged(store, outcome.run_id), 2) == round(from_usage, 2)
    assert built["totals"]["cost"] == pytest.approx(from_usage, abs=1e-9)
    # a re-run is all cache hits: free, and the money it saved is what the first run cost
    again = await execute(job, store)
    built_again = report.build(store, again.run_id)
    assert built_again["totals"]["cost"] == 0 and built_again["totals"]["saved"] == pytest.approx(from_usage)


async def test_a_budget_exhausted_run_resumes_with_a_larger_budget(tmp_path, server: SimServer):
    server.configure(latency=0.0)
    rows = [f"Resume question {i}: {words(random.Random(i), 20)}?" for i in range(30)]
    job = load_job(write_job(tmp_path, server.url, rows, usd=1.0, concurrency=8, max_tokens=20))
    store = open_store(tmp_path / "s.sqlite")
    first = await execute(job, store)
    assert first.status == "budget_exhausted" and "--budget" in first.message
    done = len(store.tasks(first.run_id))
    assert 0 < done < 30
    received = server.stats()["received"]
    set_budget(job, 10.0)
    second = await execute(job, store, run_id=first.run_id)
    assert second.status == "completed"
    assert server.stats()["received"] - received == 30 - done  # only the requests not yet answered were sent
    assert report.build(store, first.run_id)["totals"]["done"] == 30


async def test_a_stage_budget_stops_only_that_stage(tmp_path, server: SimServer):
    server.configure(latency=0.0)
    rows = [f"Stage question {i}: {words(random.Random(i), 20)}?" for i in range(20)]
    path = write_job(tmp_path, server.url, rows, usd=None, concurrency=4, max_tokens=20)
    job = json.loads(path.read_text())
    second = dict(job["stages"][0], name="second")
    job["stages"][0]["budget"] = {"usd": 1.0}
    job["stages"].append(second)
    path.write_text(json.dumps(job))
    loaded = load_job(path)
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(loaded, store)
    counts = dict(Counter(task["stage"] for task in store.tasks()))
    assert counts["ask"] < 20 and counts["second"] == 20
    assert outcome.status == "completed"  # the run's own budget never ran out
    assert charged(store, outcome.run_id) > 0


async def test_an_unknown_price_with_a_budget_refuses_to_start(tmp_path, server: SimServer, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    path = write_job(tmp_path, server.url, ["q"], usd=1.0, concurrency=1, max_tokens=5)
    job = json.loads(path.read_text())
    job["models"] = ["openai:no-such-model-2099"]
    job["providers"] = {"openai": {"base_url": server.url}}
    job["prices"] = {}
    path.write_text(json.dumps(job))
    store = open_store(tmp_path / "s.sqlite")
    with pytest.raises(RunnerError, match=r"price of openai:no-such-model-2099 is unknown.*add prices:"):
        await execute(load_job(path), store)
    assert store.list_runs() == []


async def test_a_budget_needs_max_tokens(tmp_path, server: SimServer):
    path = write_job(tmp_path, server.url, ["q"], usd=1.0, concurrency=1, max_tokens=5)
    job = json.loads(path.read_text())
    del job["params"]["max_tokens"]
    path.write_text(json.dumps(job))
    with pytest.raises(RunnerError, match=r"stage ask has no params.max_tokens"):
        await execute(load_job(path), open_store(tmp_path / "s.sqlite"))


def test_scope_describes_itself():
    assert Scope("run", "j", 1.5).describe() == "the run's budget ($1.50)"
    assert Scope("stage", "s", None, 100).describe() == "the budget of stage s (100 tokens)"


async def test_budget_warnings_name_what_to_add(tmp_path, server: SimServer, monkeypatch):
    from runner.engine.checks import budget_warnings

    job = load_job(write_job(tmp_path, server.url, ["q"], usd=None, concurrency=1, max_tokens=5))
    assert budget_warnings(job) == [
        "warning: no budget is set for sim:priced; add budget: {usd: N} to the job or `--budget USD` to cap what "
        "this run may spend"]
    set_budget(job, 1.0)
    assert budget_warnings(job) == []
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    path = write_job(tmp_path, server.url, ["q"], usd=None, concurrency=1, max_tokens=5, name="unknown")
    data = json.loads(path.read_text())
    data["models"] = ["openai:no-such-model-2099"]
    path.write_text(json.dumps(data))
    assert budget_warnings(load_job(path)) == [
        "warning: no price is known for openai:no-such-model-2099; its cost is counted as 0: add prices: "
        "{openai:no-such-model-2099: {input: USD, output: USD}} (per million tokens) to count it"]


def test_a_zero_budget_is_one_sentence(tmp_path):
    from runner.spec.job import Job

    job = Job.model_validate({"name": "j", "stages": [{"name": "s", "dataset": {"path": "x"}, "prompt": "p"}]})
    with pytest.raises(RunnerError, match=r"^--budget must be more than 0 USD \(got 0\)$"):
        set_budget(job, 0.0)
