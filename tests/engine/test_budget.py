"""Budgets with in-flight reservations: what fits, waiting for in-flight work to settle, exhaustion."""

from __future__ import annotations

import asyncio
import random

import pytest

from runner.engine.budget import Budgets, Exhausted, Reservation, Scope


def budgets(usd: float | None = None, tokens: int | None = None, **extra: Scope) -> Budgets:
    stages = {s.name: s for s in extra.values() if s.kind == "stage"}
    models = {s.name: s for s in extra.values() if s.kind == "model"}
    return Budgets(Scope("run", "job", usd, tokens), stages, models)


async def test_a_reservation_that_fits_is_granted_against_every_covering_budget():
    b = budgets(1.0, stage=Scope("stage", "s", 0.5), model=Scope("model", "m", 0.8))
    got = await b.reserve("s", "m", 0.2, 100)
    assert isinstance(got, Reservation) and [s.kind for s in got.scopes] == ["run", "stage", "model"]
    assert b.run.reserved_usd == b.stages["s"].reserved_usd == b.models["m"].reserved_usd == 0.2
    other = await b.reserve("t", "n", 0.2, 100)  # another stage and model: only the run's budget covers it
    assert isinstance(other, Reservation) and [s.kind for s in other.scopes] == ["run"]


async def test_settling_charges_the_actual_cost_and_gives_the_rest_back():
    b = budgets(1.0)
    got = await b.reserve("s", "m", 0.3, 100)
    assert isinstance(got, Reservation)
    b.settle(got, 0.05, 40)
    assert (b.run.spent_usd, b.run.reserved_usd, b.run.spent_tokens, b.run.inflight) == (0.05, 0.0, 40, 0)


async def test_with_nothing_in_flight_a_request_that_does_not_fit_exhausts_its_budget():
    b = budgets(0.1, stage=Scope("stage", "s", 1.0))
    got = await b.reserve("s", "m", 0.2, 10)
    assert isinstance(got, Exhausted) and got.scope is b.run
    assert b.run.reserved_usd == 0.0  # nothing was taken


async def test_a_request_that_does_not_fit_waits_for_in_flight_work_to_settle():
    b = budgets(1.0)
    first = await b.reserve("s", "m", 0.6, 10)
    assert isinstance(first, Reservation)
    waiting = asyncio.ensure_future(b.reserve("s", "m", 0.6, 10))
    await asyncio.sleep(0)
    assert not waiting.done()  # 0.6 + 0.6 > 1.0 while the first is in flight
    b.settle(first, 0.1, 5)  # it cost far less than its worst case
    second = await waiting
    assert isinstance(second, Reservation)
    assert b.run.spent_usd == pytest.approx(0.1) and b.run.reserved_usd == pytest.approx(0.6)


async def test_a_waiting_request_gives_up_when_the_settled_spend_leaves_no_room():
    b = budgets(1.0)
    first = await b.reserve("s", "m", 0.6, 10)
    assert isinstance(first, Reservation)
    waiting = asyncio.ensure_future(b.reserve("s", "m", 0.6, 10))
    await asyncio.sleep(0)
    b.settle(first, 0.5, 5)
    got = await waiting
    assert isinstance(got, Exhausted) and got.scope is b.run


async def test_token_budgets_count_input_plus_output():
    b = budgets(tokens=1000)
    got = await b.reserve("s", "m", 0.0, 600)
    assert isinstance(got, Reservation)
    b.settle(got, 0.0, 500)
    second = await b.reserve("s", "m", 0.0, 500)  # exactly the 500 left
    assert isinstance(second, Reservation)
    b.settle(second, 0.0, 500)
    assert isinstance(await b.reserve("s", "m", 0.0, 1), Exhausted)


async def test_a_model_budget_exhausts_only_that_model():
    b = budgets(10.0, model=Scope("model", "m", 0.1))
    assert isinstance(await b.reserve("s", "m", 0.2, 1), Exhausted)
    assert isinstance(await b.reserve("s", "other", 0.2, 1), Reservation)


async def test_spend_never_exceeds_the_budget_under_concurrency_and_most_of_it_is_used():
    """A seeded loop: 200 trials of up to 128 concurrent requests whose actual cost is a random fraction of
    their worst case. Spend never exceeds the budget; the run stops with less than one worst case unspent."""
    rng = random.Random(1)
    for _ in range(200):
        limit = rng.uniform(0.5, 5.0)
        b = budgets(limit)
        worst = rng.uniform(0.01, 0.1)
        stopped = asyncio.Event()

        async def one(b: Budgets = b, worst: float = worst, stopped: asyncio.Event = stopped) -> None:
            got = await b.reserve("s", "m", worst, 0)
            if isinstance(got, Exhausted):
                stopped.set()
                return
            await asyncio.sleep(rng.uniform(0, 0.002))
            b.settle(got, worst * rng.uniform(0.1, 1.0), 0)

        concurrency = rng.randint(1, 128)
        while not stopped.is_set():
            await asyncio.gather(*(one() for _ in range(concurrency)))
        assert b.run.spent_usd <= limit + 1e-9
        assert b.run.spent_usd >= limit - worst - 1e-9
        assert b.run.reserved_usd == 0.0 and b.run.inflight == 0


def test_the_live_view_shows_spent_reserved_budget_saved_and_the_projection():
    from runner.engine.stats import RunStats
    from runner.report.progress import budget_line

    stats = RunStats()
    c = stats.counters("s", "m")
    c.total, c.done, c.cache_hits, c.spend, c.saved = 100, 30, 10, 2.0, 0.5
    assert budget_line(stats) == "spent $2.00, saved by the cache $0.5000, projected $9.00 at completion"
    b = budgets(10.0)
    b.run.spent_usd, b.run.reserved_usd = 2.0, 0.25
    stats.budgets = b
    assert budget_line(stats) == ("budget: spent $2.00 + reserved $0.2500 of $10.00 (20%), saved by the cache "
                                  "$0.5000, projected $9.00 at completion")
