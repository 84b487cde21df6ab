"""Pooled endpoints (``pools:``, runner/engine/pools.py) through the whole runner against three simulated servers:
their limits add up with no 429; a prompt-cache group stays on one endpoint, so the providers' caches read as much
as one endpoint's; an endpoint stopped mid-run or refusing its key is taken out and its work moves to the others,
nothing lost or paid twice; with ``same_model: true`` an answer from any endpoint is a memo hit for the others."""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from runner.engine.run import execute
from runner.spec.job import load_job
from runner.store import open_store
from simserver import SimConfig, SimServer, start_server

MODEL = "sim:gpt-4o"
LABELS = ("sim", "sim:b", "sim:c")


async def servers(stack: AsyncExitStack, count: int = 3, **config: Any) -> list[SimServer]:
    return [await stack.enter_async_context(await start_server(SimConfig(**config))) for _ in range(count)]


def write_job(folder: Path, urls: list[str], rows: list[dict[str, Any]], *, rpm: int | None = None,
              user: str = "{{ question }}", same_model: bool = False, prices: bool = False,
              pooled: bool = True, labels: tuple[str, ...] = LABELS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    limits = {"rpm": rpm} if rpm else {"concurrency": 16}
    providers = {label: {"base_url": url, **limits} for label, url in zip(labels, urls, strict=False)}
    job: dict[str, Any] = {
        "name": "pooled", "output_dir": str(folder / "results"), "models": [MODEL], "providers": providers,
        "params": {"max_tokens": 5},
        "retry": {"max_attempts": 4, "backoff_initial": 0.01, "backoff_max": 0.05, "max_elapsed": 30},
        "stages": [{"name": "qa", "dataset": {"path": str(folder / "rows.jsonl"), "id": "id"},
                    "prompt": {"system": "Answer briefly.", "user": user}}]}
    if pooled:
        job["pools"] = {MODEL: {"endpoints": list(labels[:len(urls)]), "same_model": same_model}}
    if prices:
        job["prices"] = {MODEL: {"input": 1.0, "output": 2.0}}
    path = folder / "job.yaml"
    path.write_text(json.dumps(job), encoding="utf-8")
    return path


def questions(n: int) -> list[dict[str, Any]]:
    return [{"id": f"q{i}", "question": f"Question {i}: what is {i} plus one?"} for i in range(n)]


def stories(groups: int, per_group: int) -> list[dict[str, Any]]:
    """Questions about long stories: 24,000 characters, 6,000 tokens by the simulated server's rule, a group each."""
    return [{"id": f"s{s}q{q}", "story": f"Story {s}. " + (f"The fox number {s} ran off to the hills. " * 700)[:24000],
             "question": f"Question {q}: where did it go?"} for s in range(groups) for q in range(per_group)]


def served(srv: SimServer) -> int:
    return srv.stats()["by_status"].get("200", 0)


async def test_three_endpoints_serve_more_than_any_ones_limit_with_no_429(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        sims = await servers(stack, rpm=60)
        path = write_job(tmp_path, [s.url for s in sims], questions(150), rpm=60)
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(load_job(path), store)
        assert outcome.status == "completed", outcome.message
        counts = [served(s) for s in sims]
        # 150 answered at once: more than one endpoint's minute (60), spread over the three by their room
        assert sum(counts) == 150 and min(counts) >= 30, counts
        assert all(s.stats()["by_status"].get("429", 0) == 0 for s in sims)


async def test_a_group_stays_on_one_endpoint_so_the_caches_read_as_much_as_one_endpoints(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        sims = await servers(stack, latency=0.02)
        shares = []
        for pooled in (False, True):
            for srv in sims:
                srv.reset()
            folder = tmp_path / str(pooled)
            path = write_job(folder, [s.url for s in sims] if pooled else [sims[0].url], stories(6, 8),
                             user="{{ story }}\n\n{{ question }}", pooled=pooled)
            store = open_store(folder / "s.sqlite")
            outcome = await execute(load_job(path), store)
            assert outcome.status == "completed", outcome.message
            rows = store.responses()
            shares.append(sum(r["cached_tokens"] for r in rows) / sum(r["input_tokens"] for r in rows))
            if pooled:
                assert sum(1 for s in sims if served(s)) >= 2, "the groups are spread over the endpoints"
        single, pooled_share = shares
        assert single > 0.7 and abs(pooled_share - single) <= 0.05 * single, shares


async def test_an_endpoint_stopped_mid_run_is_taken_out_and_nothing_is_lost_or_paid_twice(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        sims = await servers(stack, latency=0.05)
        path = write_job(tmp_path, [s.url for s in sims], questions(240), prices=True)
        store = open_store(tmp_path / "s.sqlite")
        run = asyncio.ensure_future(execute(load_job(path), store))
        while served(sims[2]) < 10:
            await asyncio.sleep(0.01)
        await sims[2].close()
        outcome = await run
        assert outcome.status == "completed", outcome.message
        notes = [n for n in outcome.stats.notes if "taken out" in n]
        assert len(notes) == 1 and notes[0].startswith("endpoint sim:c of sim:gpt-4o is taken out after 5 failures")
        tasks = store.tasks(outcome.run_id)
        assert len(tasks) == 240 and all(t["status"] == "done" for t in tasks)
        charges = [r for r in store.ledger(outcome.run_id) if r["kind"] == "charge"]
        assert sorted(r["key"] for r in charges) == sorted({t["key"] for t in tasks}), "one charge per request"
        assert sum(served(s) for s in sims) == 240, "each request answered once, by one server"


async def test_a_refused_key_takes_its_endpoint_out_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with AsyncExitStack() as stack:
        good = await servers(stack, count=2)
        refusing = await stack.enter_async_context(await start_server(SimConfig(api_key="another-key")))
        path = write_job(tmp_path, [good[0].url, refusing.url, good[1].url], questions(60))
        outcome = await execute(load_job(path), open_store(tmp_path / "s.sqlite"))
        assert outcome.status == "completed", outcome.message
        assert served(good[0]) + served(good[1]) == 60
        assert [n for n in outcome.stats.notes if "taken out" in n][0].startswith(
            "endpoint sim:b of sim:gpt-4o is taken out after it refused its key")


async def test_same_model_makes_an_answer_from_any_endpoint_a_memo_hit(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        sims = await servers(stack, count=2)
        store = open_store(tmp_path / "s.sqlite")
        first = write_job(tmp_path / "a", [s.url for s in sims], questions(20), same_model=True)
        assert (await execute(load_job(first), store)).status == "completed"
        again = write_job(tmp_path / "b", [sims[1].url], questions(20), labels=("sim:c",), same_model=True)
        outcome = await execute(load_job(again), store)
        assert outcome.status == "completed"
        assert sum(served(s) for s in sims) == 20, "the second run, on another endpoint, was all memo hits"


async def test_each_endpoint_charges_at_its_own_price_in_ledger_rows_of_its_own(tmp_path: Path) -> None:
    async with AsyncExitStack() as stack:
        sims = await servers(stack, count=2)
        path = write_job(tmp_path, [s.url for s in sims], questions(40), prices=True)
        job = json.loads(path.read_text())
        job["pools"][MODEL] = {"endpoints": ["sim", {"endpoint": "sim:b", "model": "gpt-4o-dear"}], "same_model": True}
        job["prices"]["sim:gpt-4o-dear"] = {"input": 10.0, "output": 20.0}
        job["budget"] = {"usd": 1.0}
        path.write_text(json.dumps(job))
        store = open_store(tmp_path / "s.sqlite")
        outcome = await execute(load_job(path), store)
        assert outcome.status == "completed", outcome.message
        used = {r["key"]: (r["input_tokens"], r["output_tokens"]) for r in store.responses()}
        charges = store.ledger(outcome.run_id, "charge")
        assert {r["endpoint"] for r in charges} == {"sim", "sim:b"} and len(charges) == 40
        for row in charges:
            per = (10.0, 20.0) if row["endpoint"] == "sim:b" else (1.0, 2.0)
            inputs, outputs = used[row["key"]]
            assert row["amount"] == pytest.approx((inputs * per[0] + outputs * per[1]) / 1e6, rel=1e-9)


async def test_a_pooled_request_reserves_its_dearest_endpoints_price(tmp_path: Path, fake_provider) -> None:
    from tests.engine.test_reserver import PRICES, Parts

    prices = "prices: {fake:m1: {input: 1000.0, output: 3000.0}, fake:m2: {input: 3000.0, output: 9000.0}}"
    for folder in ("one", "pool"):
        (tmp_path / folder).mkdir()
    one = Parts(tmp_path / "one", PRICES).reserver
    pooled = Parts(tmp_path / "pool", f"""{prices}
providers: {{"fake:b": {{}}}}
pools: {{fake:m1: {{endpoints: [fake, {{endpoint: "fake:b", model: m2}}], same_model: true}}}}""")
    task = pooled.tasks[0]
    assert pooled.reserver.pool_prices == {"fake:m1": {"fake": "fake:m1", "fake:b": "fake:m2"}}
    assert pooled.reserver.worst_case(task)[0] == pytest.approx(3 * one.worst_case(task)[0])
