"""The betting confidence sequence (runner/evaluate/sequential.py) by simulation, at small counts (bench/sequential.py
runs the issue's 2,000 runs of 1,000 items): it covers the benchmark's mean at every look in at least 1 − alpha of
runs where a normal interval recomputed at every look does not, it closes on the exact mean when the last item is
in, and a paired difference is decided the right way. Seeds are printed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from runner.evaluate.sequential import (
    BettingSequence,
    Interval,
    difference_interval,
    difference_score,
    expected_halfwidths,
    expected_stop,
)

Z95 = 1.959963984540054


def clustered_benchmark(rng: np.random.Generator, runs: int, items: int, size: int, mean: float, icc: float
                        ) -> np.ndarray:
    """0/1 scores, shape (runs, items): clusters of ``size`` items whose success probability is Beta-distributed
    around ``mean`` with intra-cluster correlation ``icc``; each run is another benchmark, in a random order."""
    total = 1 / icc - 1
    p = rng.beta(mean * total, (1 - mean) * total, size=(runs, items // size, 1))
    scores = (rng.random((runs, items // size, size)) < p).astype(float).reshape(runs, items)
    return rng.permuted(scores, axis=1)  # asked in a random order, without replacement


def every_look(scores: np.ndarray, alpha: float, population: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Per run, whether the sequence and a normal interval recomputed at every look (from the 10th item) held the
    benchmark's mean at every look."""
    runs, items = scores.shape
    truth = scores.mean(axis=1)
    sequence = BettingSequence(alpha, population, runs=runs, resolution=1)
    covered = np.ones(runs, dtype=bool)
    wald = np.ones(runs, dtype=bool)
    for t in range(items):
        sequence.update(scores[:, t])
        low, high = sequence.interval().T
        covered &= (low <= truth + 1e-12) & (truth - 1e-12 <= high)  # (k / N computed two ways)
        if t >= 9:
            seen = scores[:, : t + 1]
            centre = seen.mean(axis=1)
            half = Z95 * np.sqrt(np.maximum(centre * (1 - centre), 1e-12) / (t + 1))
            wald &= (centre - half <= truth) & (truth <= centre + half)
    return covered, wald


@pytest.mark.parametrize("seed", [1, 2])
def test_the_sequence_covers_the_benchmarks_mean_at_every_look_and_a_recomputed_interval_does_not(seed):
    rng = np.random.default_rng(seed)
    scores = clustered_benchmark(rng, runs=300, items=300, size=10, mean=0.6, icc=0.3)
    covered, wald = every_look(scores, 0.05, population=300)
    print(f"seed {seed}: the sequence covered at every look in {covered.mean():.3f} of 300 runs, a normal interval "
          f"recomputed at every look in {wald.mean():.3f}")
    # 300 runs: a coverage of 0.95 would be seen above 0.92 with probability 0.99
    assert covered.mean() >= 0.92
    assert wald.mean() < 0.85


@pytest.mark.parametrize(("seed", "items", "halfwidth"), [(6, 300, 0.05), (7, 500, 0.04)])
def test_a_halfwidth_stop_comes_where_theory_says_within_15_percent(seed, items, halfwidth):
    rng = np.random.default_rng(seed)
    scores = clustered_benchmark(rng, runs=200, items=items, size=10, mean=0.6, icc=0.3)
    sequence = BettingSequence(0.05, items, runs=200, resolution=1)
    stopped = np.full(200, -1)
    for t in range(items):
        sequence.update(scores[:, t])
        low, high = sequence.interval().T
        stopped[(stopped < 0) & ((high - low) / 2 <= halfwidth)] = t + 1
    means = scores.mean(axis=1)
    theory = expected_stop(float((means * (1 - means)).mean()), 0.05, halfwidth, items)
    median = float(np.median(stopped[stopped > 0]))
    print(f"seed {seed}: halfwidth {halfwidth} over {items} items: stopped in {(stopped > 0).mean():.3f} of 200 runs, "
          f"median {median:.0f} items, theory {theory}")
    assert (stopped > 0).all() and theory is not None
    assert abs(median / theory - 1) <= 0.15


def test_the_expected_halfwidth_narrows_and_without_replacement_closes():
    with_replacement = expected_halfwidths(0.24, 0.05, 2000)
    without = expected_halfwidths(0.24, 0.05, 2000, population=2000)
    assert np.all(np.diff(with_replacement[10:]) < 0) and np.all(without <= with_replacement + 1e-12)
    assert without[-1] < with_replacement[-1] / 4  # the last items pin the mean of a finite set
    # at most the fixed-sample count's price for looking at every answer, and an unreachable width says so
    fixed = Z95 ** 2 * 0.24 / 0.03 ** 2
    assert fixed < expected_stop(0.24, 0.05, 0.03) < 5 * fixed
    assert expected_stop(0.24, 0.05, 0.001, population=500) is None


def test_without_replacement_the_sequence_closes_on_the_exact_mean():
    rng = np.random.default_rng(3)
    scores = rng.random(200) < 0.37
    sequence = BettingSequence(0.05, population=200)
    widths = []
    for x in scores:
        sequence.update(float(x))
        widths.append(sequence.interval().halfwidth)
    final = sequence.interval()
    assert final.low - 1e-12 <= scores.mean() <= final.high + 1e-12 and final.halfwidth <= 2 * sequence.step
    assert all(later <= earlier + 1e-12 for earlier, later in zip(widths, widths[1:], strict=False))  # only narrows
    assert widths[49] < 0.25 and widths[149] < widths[49]


def test_with_replacement_the_sequence_stays_open_but_narrows():
    rng = np.random.default_rng(4)
    sequence = BettingSequence(0.05)
    for x in rng.random(2000) < 0.8:
        sequence.update(float(x))
    found = sequence.interval()
    assert found.low <= 0.8 <= found.high and 0.01 < found.halfwidth < 0.04


def test_a_difference_of_ten_points_is_decided_the_right_way_early():
    # seed 5: A right on 60 % of 1,000 items, B on 70 %, the two agreeing on most items
    rng = np.random.default_rng(5)
    u = rng.random(1000)
    v = np.where(rng.random(1000) < 0.7, u, rng.random(1000))
    a, b = (u < 0.6).astype(float), (v < 0.7).astype(float)
    sequence = BettingSequence(0.05, population=1000, resolution=2)
    decided_at = None
    for t, (x, y) in enumerate(zip(a, b, strict=True), start=1):
        sequence.update(float(difference_score(x, y)))
        found = difference_interval(sequence.interval())
        if found.excludes(0.0):
            decided_at = t
            break
    print(f"decided after {decided_at} of 1,000 items")
    assert decided_at is not None and decided_at < 400, decided_at
    assert found.low > 0  # B better, as it is


def test_bad_input_is_refused():
    with pytest.raises(ValueError):
        BettingSequence(0.0)
    sequence = BettingSequence(0.05, population=1)
    with pytest.raises(ValueError):
        sequence.update(1.5)
    sequence.update(1.0)
    with pytest.raises(ValueError):
        sequence.update(1.0)
    assert Interval(0.2, 0.4).halfwidth == pytest.approx(0.1) and not math.isnan(sequence.interval().low)
