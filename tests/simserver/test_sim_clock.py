"""The simulated server's time (simserver/clock.py): a clock scaled by ``time_scale`` and every duration with it,
and batch turnarounds drawn from a seeded lognormal of a stated median and 95th percentile, cut at the window."""

from __future__ import annotations

import asyncio
import statistics
from typing import Any

import openai
import pytest

from simserver import SimConfig, SimServer
from simserver import clock as sim_clock
from simserver.clock import ScaledClock, turnaround
from tests.simserver.test_sim_batch import chat_bodies, openai_batch

in_module_loop = pytest.mark.asyncio(loop_scope="module")


def test_a_scaled_clock_runs_faster_and_never_jumps_when_rescaled(monkeypatch: pytest.MonkeyPatch) -> None:
    wall = [100.0]
    monkeypatch.setattr(sim_clock.time, "monotonic", lambda: wall[0])
    clock = ScaledClock(0.001)
    start = clock()
    wall[0] += 3.6
    assert clock() - start == pytest.approx(3600.0)  # an hour in 3.6 s
    clock.rescale(1.0)
    assert clock() - start == pytest.approx(3600.0)
    wall[0] += 2.0
    assert clock() - start == pytest.approx(3602.0)


def test_turnarounds_are_seeded_lognormal_draws_of_the_stated_median_and_p95() -> None:
    draws = sorted(turnaround(3600.0, 4 * 3600.0, 38, i) for i in range(1500))
    assert turnaround(3600.0, 4 * 3600.0, 38, 9) == turnaround(3600.0, 4 * 3600.0, 38, 9)  # the same each time
    assert statistics.median(draws) == pytest.approx(3600.0, rel=0.1)
    assert draws[int(0.95 * len(draws))] == pytest.approx(4 * 3600.0, rel=0.2)
    assert turnaround(3600.0, 4 * 3600.0, 39, 0) != turnaround(3600.0, 4 * 3600.0, 38, 0)
    assert turnaround(60.0, 10.0, 1, 5) == 60.0  # a p95 under the median: no spread


def test_time_scale_and_the_window_must_be_positive() -> None:
    for bad in ({"time_scale": 0}, {"batch_window": 0}, {"batch_median": -1}):
        with pytest.raises(ValueError, match="must be positive"):
            SimConfig(**bad)


@in_module_loop
async def test_a_batch_ends_at_its_drawn_turnaround_and_one_past_the_window_expires(
        srv: SimServer, oa: openai.AsyncOpenAI, now: list[float]) -> None:
    srv.configure(batch_median=3600.0, batch_p95=4 * 3600.0, seed=7)
    first = turnaround(3600.0, 4 * 3600.0, 7, 0)
    created = await openai_batch(oa, {f"r{i}": body for i, body in enumerate(chat_bodies(4))})
    now[0] += first - 1.0
    assert (await oa.batches.retrieve(created.id)).status in ("in_progress", "finalizing")
    now[0] += 1.0
    assert (await oa.batches.retrieve(created.id)).status == "completed"
    # the second batch's draw; a window at half of it: lines done by then (2 of 4) answered, the rest expired
    second = turnaround(3600.0, 4 * 3600.0, 7, 1)
    srv.configure(batch_window=second / 2)
    created = await openai_batch(oa, {f"s{i}": body for i, body in enumerate(chat_bodies(4))})
    now[0] += second / 2 + 1.0
    ended = await oa.batches.retrieve(created.id)
    assert ended.status == "expired" and ended.request_counts is not None
    assert (ended.request_counts.completed, ended.request_counts.failed) == (2, 0)


@in_module_loop
async def test_time_scale_scales_what_the_server_sleeps_and_the_waits_it_asks(
        srv: SimServer, oa: openai.AsyncOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(seconds: float, *args: Any) -> Any:
        slept.append(seconds)
        return await real_sleep(0, *args)

    monkeypatch.setattr("simserver.server.asyncio.sleep", sleep)
    srv.configure(latency=20.0, flex_latency=600.0, time_scale=0.001)
    await oa.chat.completions.create(model="sim-a", messages=[{"role": "user", "content": "hi"}])
    await oa.chat.completions.create(model="sim-a", messages=[{"role": "user", "content": "hi"}],
                                     service_tier="flex")
    assert slept == [pytest.approx(0.02), pytest.approx(0.62)]
    srv.configure(fault_429=1.0, retry_after=100.0)
    with pytest.raises(openai.RateLimitError) as limited:
        await oa.chat.completions.create(model="sim-a", messages=[{"role": "user", "content": "hi"}])
    assert limited.value.response.headers["retry-after-ms"] == "100"
