"""Service tiers through whole runs (runner/engine/tiers.py, runner/engine/online.py) against the simulated server:
a shed flex request is tried again at flex within retry.flex_wait, then sent at standard only where the stage says
fallback: standard (and the run says so once), else it fails; a downgraded priority request is charged at
standard; every answer is charged at the tier that served it, in the ledger and the result line; a budgeted run
with flex never overshoots; a tier without a price is refused before anything is sent."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from runner.engine.control import RunControl
from runner.engine.leases import ChunkLeases
from runner.engine.reserver import Reserver, input_tokens
from runner.engine.run import execute
from runner.engine.stats import RunStats
from runner.engine.tiers import Tiers
from runner.errors import RunnerError
from runner.plan.stage import StagePlan
from runner.providers.pricing import Pricing
from runner.providers.tokens import bound_call_tokens
from runner.report import estimate as estimates
from runner.report import estimate_render
from runner.report import summary as report
from runner.spec.job import load_job
from runner.store import Store, open_store
from simserver import SimConfig, start_server

MODEL = "sim:gpt-sim"
#: USD per million tokens, dear enough that a request is worth a fraction of a cent; flex half, priority double
PRICES = {"input": 2000.0, "output": 8000.0, "flex": {"input": 1000.0, "output": 4000.0},
          "priority": {"input": 4000.0, "output": 16000.0}}


def write_job(folder: Path, root: str, rows: int, stage: dict[str, Any], *, model: str = MODEL,
              flex_wait: float = 0.3, max_attempts: int = 6, **job: Any) -> Path:
    dataset = folder / "rows.jsonl"
    dataset.write_text("".join(json.dumps({"question": f"Tier question {i}: which {i} is it?"}) + "\n"
                               for i in range(rows)), encoding="utf-8")
    provider = model.partition(":")[0]
    base = {"sim": root + "/v1", "openai": root + "/v1", "gemini": root}[provider]
    body = {
        "name": "tiers", "output_dir": str(folder / "results"), "models": [model],
        "providers": {provider: {"base_url": base, "concurrency": 4, "timeout": 10}},
        "params": {"temperature": 0, "max_tokens": 8} if provider == "sim" else {"max_tokens": 8},
        "retry": {"max_attempts": max_attempts, "backoff_initial": 0.01, "backoff_max": 0.02, "max_elapsed": 30,
                  "flex_wait": flex_wait},
        "prices": {MODEL: PRICES},
        "stages": [{"name": "ask", "dataset": {"path": str(dataset)}, "prompt": {"user": "{{ question }}"}, **stage}],
        **job,
    }
    path = folder / "tiers.yaml"
    path.write_text(json.dumps(body), encoding="utf-8")
    return path


def charges(store: Store, run_id: str) -> list[dict[str, Any]]:
    return store.ledger(run_id, kind="charge")


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def at_tier(job: Any, tier: str, usage: dict[str, Any]) -> float:
    """What an answer's usage costs at ``tier`` by the job's prices."""
    pricing = Pricing(job)
    rates = pricing.rates(MODEL) if tier == "standard" else pricing.tier_rates(MODEL, tier)
    return rates.cost(usage["input_tokens"], usage["output_tokens"])


@pytest.fixture
async def server():
    async with await start_server(SimConfig(seed=5)) as srv:
        yield srv


async def test_shed_flex_requests_are_retried_at_flex_within_the_wait_and_charged_at_flex(tmp_path, server):
    server.configure(flex_shed=0.5, flex_latency=0.01)
    # two attempts of other failures at most: the sheds are not counted among them
    job = load_job(write_job(tmp_path, server.root_url, 12, {"tier": "flex"}, flex_wait=30, max_attempts=2))
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    stats = server.stats()["tiers"]
    assert outcome.status == "completed"
    assert stats["shed"]["openai"] > 0 and stats["served"]["openai"] == {"flex": 12}
    assert outcome.stats.totals().retries == stats["shed"]["openai"]
    rows = {r["key"]: r for r in store.responses()}
    got = charges(store, outcome.run_id)
    assert [c["tier"] for c in got] == ["flex"] * 12
    assert all(c["amount"] == pytest.approx(at_tier(job, "flex", rows[c["key"]])) for c in got)
    assert {json.dumps(line["provenance"]["tier"], sort_keys=True) for line in lines(outcome.results["ask"])} == {
        '{"asked": "flex", "fallback": null, "served": "flex"}'}
    assert not any("fallback" in note for note in outcome.stats.notes)


async def test_with_fallback_a_request_still_shed_goes_at_standard_and_the_run_says_so_once(tmp_path, server):
    server.configure(flex_shed=1.0)
    job = load_job(write_job(tmp_path, server.root_url, 6, {"tier": "flex", "fallback": "standard"}, flex_wait=0.1))
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    stats = server.stats()["tiers"]
    assert outcome.status == "completed"
    assert stats["shed"]["openai"] >= 6 and stats["served"]["openai"] == {"standard": 6}
    rows = {r["key"]: r for r in store.responses()}
    got = charges(store, outcome.run_id)
    assert [c["tier"] for c in got] == ["standard"] * 6
    assert all(c["amount"] == pytest.approx(at_tier(job, "standard", rows[c["key"]])) for c in got)
    said = [note for note in outcome.stats.notes if "fallback: standard" in note]
    assert len(said) == 1 and "sent at the standard tier" in said[0]
    assert {line["provenance"]["tier"]["served"] for line in lines(outcome.results["ask"])} == {"standard"}
    # the report says the tier asked, where its price came from, and what served
    text = report.render(report.build(store, outcome.run_id), "text")
    assert (f"service tier: ask {MODEL} asked flex, fallback standard, priced by job prices: {MODEL} (flex); "
            "served and charged: standard 6") in text


async def test_without_fallback_a_request_still_shed_fails_unbilled(tmp_path, server):
    server.configure(flex_shed=1.0)
    job = load_job(write_job(tmp_path, server.root_url, 4, {"tier": "flex"}, flex_wait=0.1))
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    failed = store.tasks(outcome.run_id, status="failed")
    assert len(failed) == 4 and {task["error_class"] for task in failed} == {"flex_unavailable"}
    assert "retry.flex_wait" in failed[0]["error"] and "no fallback: standard" in failed[0]["error"]
    assert charges(store, outcome.run_id) == [] and server.stats()["by_status"].get("200") is None
    assert not any("fallback" in note for note in outcome.stats.notes)


async def test_a_downgraded_priority_request_is_charged_at_standard(tmp_path, server):
    server.configure(priority_limit=3)
    job = load_job(write_job(tmp_path, server.root_url, 8, {"tier": "priority"}))
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    assert outcome.status == "completed"
    rows = {r["key"]: r for r in store.responses()}
    got = charges(store, outcome.run_id)
    assert Counter(c["tier"] for c in got) == {"priority": 3, "standard": 5}
    assert all(c["amount"] == pytest.approx(at_tier(job, c["tier"], rows[c["key"]])) for c in got)
    served = Counter(line["provenance"]["tier"]["served"] for line in lines(outcome.results["ask"]))
    assert served == {"priority": 3, "standard": 5}
    built = report.build(store, outcome.run_id)
    assert built["totals"]["cost"] == pytest.approx(sum(c["amount"] for c in got))


def test_a_reservation_takes_the_dearest_tier_the_answer_may_come_back_at(tmp_path):
    for stage, dearest in (({"tier": "flex", "fallback": "standard"}, "standard"), ({"tier": "flex"}, "flex"),
                           ({"tier": "priority"}, "priority"), ({}, "standard")):
        job = load_job(write_job(tmp_path, "http://127.0.0.1:9", 1, stage, budget={"usd": 10}))
        (task,) = StagePlan(job, job.stages[0])
        reserver = Reserver(run_id="r", job=job, store=open_store(), stats=RunStats(), control=RunControl(),
                            leases=ChunkLeases(RunStats()))
        pricing = Pricing(job)
        rates = pricing.rates(MODEL) if dearest == "standard" else pricing.tier_rates(MODEL, dearest)
        tokens = bound_call_tokens("sim", "gpt-sim", task.messages, None, counted=input_tokens(task))
        assert reserver.worst_case(task)[0] == pytest.approx(rates.worst_case(tokens, 8)), stage
        assert Tiers(job).of(task) == (None if not stage else Tiers(job).plans[("ask", MODEL)])


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_a_budgeted_run_with_flex_never_overshoots(tmp_path, server, seed):
    rng = random.Random(seed)
    server.configure(flex_shed=0.5, seed=seed, latency=rng.choice([0.0, 0.002]))
    folder = tmp_path / f"s{seed}"
    folder.mkdir()
    budget = rng.uniform(0.4, 1.2)
    job = load_job(write_job(folder, server.root_url, 30, {"tier": "flex", "fallback": "standard"}, flex_wait=0.05,
                             budget={"usd": budget}))
    store = open_store(folder / "s.sqlite")
    outcome = await execute(job, store)
    spent = sum(c["amount"] for c in charges(store, outcome.run_id))
    assert spent <= budget + 1e-9, (spent, budget)
    assert outcome.status in ("completed", "budget_exhausted")
    assert {c["tier"] for c in charges(store, outcome.run_id)} <= {"flex", "standard"}


async def test_a_tier_without_a_price_is_refused_before_anything_is_sent(tmp_path, server):
    path = write_job(tmp_path, server.root_url, 3, {"tier": "priority"})
    body = json.loads(path.read_text())
    body["prices"][MODEL].pop("priority")
    path.write_text(json.dumps(body), encoding="utf-8")
    with pytest.raises(RunnerError) as info:
        await execute(load_job(path), open_store(tmp_path / "s.sqlite"))
    assert str(info.value) == (
        f"{path}: stage ask sends {MODEL} at the priority tier, which has no price (job prices: {MODEL} gives none "
        f"for priority): give it one in prices: {{{MODEL}: {{input: USD, output: USD, priority: {{input: USD, "
        "output: USD}}} (per million tokens)")
    assert server.stats()["received"] == 0


def test_the_estimate_prices_the_tier_and_says_from_where(tmp_path):
    job = load_job(write_job(tmp_path, "http://127.0.0.1:9", 4, {"tier": "flex", "fallback": "standard"}))
    est = estimates.estimate(job, open_store(tmp_path / "s.sqlite"))
    (group,) = est.groups
    assert group.price == f"job prices: {MODEL} (flex)" and group.tier_serves == ["flex", "standard"]
    pricing = Pricing(job)
    flex, standard = pricing.tier_rates(MODEL, "flex"), pricing.rates(MODEL)
    assert group.cost_low == pytest.approx(group.input_tokens * flex.input / 1e6)
    assert group.cost_high == pytest.approx(group.input_tokens_bound * standard.input / 1e6 + 4 * 8 * standard.output
                                            / 1e6)
    text = estimate_render.render(est, "text")
    assert (f"service tier: ask {MODEL} at flex, priced by job prices: {MODEL} (flex); its worst case at the "
            "dearest of flex, standard (what a budget reserves)") in text


@pytest.mark.usefixtures("provider_keys")
async def test_openai_flex_is_priced_by_genai_prices_and_gemini_priority_read_from_its_header(tmp_path, server):
    server.configure(priority_limit=1)
    for folder in ("o", "g"):
        (tmp_path / folder).mkdir()
    job = load_job(write_job(tmp_path / "o", server.root_url, 2, {"tier": "flex"}, model="openai:gpt-5-mini"))
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    assert outcome.status == "completed"
    pricing = Pricing(job)
    flex = pricing.tier_rates("openai:gpt-5-mini", "flex")
    assert flex is not None and flex.source.endswith("openai/gpt-5-mini (flex)")
    rows = {r["key"]: r for r in store.responses()}
    got = charges(store, outcome.run_id)
    assert [c["tier"] for c in got] == ["flex", "flex"]
    assert all(c["amount"] == pytest.approx(flex.cost(rows[c["key"]]["input_tokens"],
                                                      rows[c["key"]]["output_tokens"])) for c in got)
    gemini = load_job(write_job(tmp_path / "g", server.root_url, 3, {"tier": "priority"},
                                model="gemini:gemini-2.5-flash",
                                prices={"gemini:gemini-2.5-flash": {"input": 1.0, "output": 2.0,
                                                                    "priority": {"input": 2.0, "output": 4.0}}}))
    outcome = await execute(gemini, store)
    assert outcome.status == "completed"
    assert Counter(c["tier"] for c in charges(store, outcome.run_id)) == {"priority": 1, "standard": 2}
