"""The deadline planner (runner/plan/deadline.py) on small cases whose answers are known by hand: the cheapest mode
that meets the deadline, online as the deadline nears, batches cancelled at the cutover, the modes a group may not
take left out, and a deadline no mode meets refused with the fastest mode's estimate."""

from __future__ import annotations

import math

import pytest

from runner.plan.deadline import BATCH, FLEX, PRIORITY, STANDARD, Group, Online, State, Turnaround, plan

PRICES = {BATCH: 0.5, FLEX: 0.5, STANDARD: 1.0, PRIORITY: 2.0}
#: 600 requests a minute, answers within 10 s (priority 5 s, flex 60 s), flex shed at most 50 %
ONLINE = Online(600.0, 10.0, 5.0, 60.0, 0.1, 0.5, "the test's figures")
#: batches: median 1 h, 95th percentile 4 h
TURNAROUND = Turnaround(3600.0, 4 * 3600.0, "the test's figures")


def state(deadline: float, remaining: int = 6000, *, now: float = 0.0, refused: dict[str, str] | None = None,
          in_batch: int = 0, batch_age: float = 0.0, prices: dict[str, float] | None = None) -> State:
    group = Group("s", "m", "e", remaining, prices or PRICES, in_batch, batch_age, refused or {})
    return State(now, deadline, (group,), {"e": ONLINE}, {"e": TURNAROUND})


def test_the_turnaround_is_the_lognormal_of_its_median_and_p95() -> None:
    assert TURNAROUND.cdf(3600.0) == pytest.approx(0.5)
    assert TURNAROUND.cdf(4 * 3600.0) == pytest.approx(0.95, abs=1e-6)
    assert TURNAROUND.within(0.0, 0.95) == pytest.approx(4 * 3600.0, rel=1e-6)
    # a batch already an hour old and not ended: P(ends within the next hour) = (F(2h) - F(1h)) / (1 - F(1h))
    assert TURNAROUND.done_by(3600.0, 3600.0) == pytest.approx((TURNAROUND.cdf(7200.0) - 0.5) / 0.5)


def test_a_long_deadline_goes_to_the_cheapest_mode_that_meets_it() -> None:
    # a day: a batch ends within 4 h with 95 %; flex and batch cost the same, the plan costs half of standard
    found = plan(state(24 * 3600.0))
    mix = found.of("s", "m")
    assert found.problem is None
    assert set(mix.counts) <= {BATCH, FLEX} and sum(mix.counts.values()) == 6000
    assert mix.expected == pytest.approx(3000.0, rel=1e-3)
    assert mix.standard == 6000.0


def test_a_mode_the_group_may_not_take_is_never_planned() -> None:
    found = plan(state(24 * 3600.0, refused={FLEX: "not sold at flex", BATCH: "a schema on Bedrock"}))
    assert found.of("s", "m").counts == {STANDARD: 6000}


def test_without_flex_a_batch_is_waited_for_and_cut_over_at_the_last_moment() -> None:
    # 6 h, no flex: the batch's fallback (6,000 online at 600 a minute, 10 min, plus 10 s) sets the cutover
    found = plan(state(6 * 3600.0, refused={FLEX: "not sold at flex"}))
    mix = found.of("s", "m")
    assert mix.counts == {BATCH: 6000}
    assert found.cutover["e"] == pytest.approx(6 * 3600.0 - 600.0 - 10.0)
    done = TURNAROUND.cdf(found.cutover["e"])
    assert mix.expected == pytest.approx(6000 * (0.5 * done + 1.0 * (1 - done)))


def test_a_short_deadline_mixes_flex_and_standard_as_capacity_allows() -> None:
    # 20 min: 12,000 attempts fit (600 a minute); flex takes 2 attempts at p95 and answers within 60 s, so
    # f * 2 + (6000 - f) <= 600 * (20 min - 60 s) / 60 -> f <= 5,400; a batch's fallback leaves no room to gain
    found = plan(state(20 * 60.0, refused={BATCH: "no Batch API"}))
    mix = found.of("s", "m")
    assert mix.counts[FLEX] <= 5400 and mix.counts[FLEX] >= 5000
    assert mix.counts[FLEX] + mix.counts[STANDARD] == 6000
    assert found.finish["e"] <= 20 * 60.0


def test_as_the_deadline_nears_the_plan_goes_online_and_the_batch_is_cancelled() -> None:
    # the same job half-done, 5,000 lines waiting in a 5 h old batch and 9 min left: only online meets it
    found = plan(state(6 * 3600.0, 1000, now=6 * 3600.0 - 540.0, in_batch=5000, batch_age=5 * 3600.0,
                       refused={FLEX: "not sold at flex"}))
    mix = found.of("s", "m")
    assert mix.cancel_now
    assert BATCH not in mix.counts and sum(mix.counts.values()) == 1000
    # and earlier, with room to wait, the batch is left to run
    calm = plan(state(6 * 3600.0, 1000, now=3600.0, in_batch=5000, batch_age=600.0,
                      refused={FLEX: "not sold at flex"}))
    assert not calm.of("s", "m").cancel_now and calm.cutover["e"] > 3600.0


def test_priority_only_where_standard_answers_too_late() -> None:
    # 8 s: standard's answers take up to 10 s, priority's 5 s
    found = plan(state(8.0, 10, refused={FLEX: "no", BATCH: "no"}))
    assert found.problem is None and found.of("s", "m").counts == {PRIORITY: 10}


def test_a_deadline_no_mode_meets_is_said_with_the_fastest_estimate() -> None:
    # 6,000 requests at 600 a minute take 10 min online; a batch's 95th percentile is 4 h
    found = plan(state(300.0))
    assert found.problem is not None
    assert "no mode can finish the 6,000 requests of s (m) by the deadline (5 min from now)" in found.problem
    assert "needs about 10 min" in found.problem and "within 4.0 h with 95% confidence" in found.problem
    # the best effort: everything online at standard at once
    assert found.of("s", "m").counts == {STANDARD: 6000}
    assert not math.isinf(found.finish["e"])


def test_the_plan_is_a_pure_function_of_the_state() -> None:
    one = state(3 * 3600.0, 2500, now=600.0, in_batch=300, batch_age=60.0)
    assert plan(one) == plan(one)
