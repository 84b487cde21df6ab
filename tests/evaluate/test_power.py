"""The items a plan asks for, against simulated runs: at the predicted count about 80 % of paired comparisons reach
significance, and the count at which 80 % do is within 15 % of the prediction (issue 36's acceptance), with and
without clusters. Each simulation prints its seed; the simulated test is the one the reports use
(runner/evaluate/clusters.py), vectorised here."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from runner.evaluate.power import (
    defaults,
    design_effect,
    items_for_halfwidth,
    items_to_detect,
    power_at,
)

RUNS = 2000


def _paired_scores(rng: np.random.Generator, runs: int, clusters: int, size: int, p_a: float, p_b: float,
                   icc: float) -> tuple[np.ndarray, np.ndarray]:
    """0/1 scores of models A and B, shape (runs, clusters, size): each cluster's difficulty is Beta-distributed
    with intra-cluster correlation ``icc`` (none when 0), the two models share each item's uniform draw (they
    agree on most items, as models do)."""
    shape = (runs, clusters, size)
    if icc > 0:
        total = 1 / icc - 1
        base = rng.beta(0.5 * total, 0.5 * total, size=(runs, clusters, 1))
        # and B's advantage varies by cluster (better on some topics than others): the differences cluster too
        lift = rng.normal(0, 0.15, size=(runs, clusters, 1))
    else:
        base, lift = np.full((runs, clusters, 1), 0.5), np.zeros((runs, clusters, 1))
    u = rng.random(shape)
    # B's draw is A's on 60 % of the items (the models agree), its own elsewhere: each is right where the other is
    # wrong on some items; both move with the cluster's difficulty, B's success probability p_b − p_a higher
    v = np.where(rng.random(shape) < 0.6, u, rng.random(shape))
    a = u < np.clip(base + (p_a - 0.5), 0, 1)
    b = v < np.clip(base + lift + (p_b - 0.5), 0, 1)
    return a.astype(float), b.astype(float)


def _significant(a: np.ndarray, b: np.ndarray, alpha: float, clustered: bool) -> np.ndarray:
    """Per run, whether the paired test (cluster-robust with clusters, else the paired t) rejects at ``alpha``."""
    runs, g, m = a.shape
    d = (b - a).reshape(runs, g * m)
    n = g * m
    mean = d.mean(axis=1)
    if clustered:
        sums = (b - a - mean[:, None, None]).sum(axis=2)
        se = np.sqrt(g / (g - 1) * (sums ** 2).sum(axis=1) / n ** 2)
        df = g - 1
    else:
        se = d.std(axis=1, ddof=1) / math.sqrt(n)
        df = n - 1
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(se > 0, mean / se, 0.0)
    return 2 * scipy_stats.t.sf(np.abs(t), df) < alpha


def _power(seed: int, n_clusters: int, size: int, p_a: float, p_b: float, icc: float) -> float:
    rng = np.random.default_rng(seed)
    a, b = _paired_scores(rng, RUNS, n_clusters, size, p_a, p_b, icc)
    return float(_significant(a, b, 0.05, clustered=icc > 0).mean())


def _pilot(seed: int, p_a: float, p_b: float, icc: float, size: int) -> tuple[float, float, float]:
    """The mean and spread of the paired differences and the design effect, measured on one large simulated pilot
    (the mean is the true difference: a cluster's probabilities are clipped to [0, 1])."""
    rng = np.random.default_rng(seed)
    a, b = _paired_scores(rng, 1, 200_000 // size, size, p_a, p_b, icc)
    d = (b - a)[0]
    sd, mean = float(d.std(ddof=1)), float(d.mean())
    if size == 1:
        return mean, sd, 1.0
    g, m = d.shape
    robust = g / (g - 1) * (((d - mean).sum(axis=1)) ** 2).sum() / (g * m) ** 2
    return mean, sd, float(robust / (sd ** 2 / (g * m)))


@pytest.mark.parametrize(("seed", "icc", "size"), [(1, 0.0, 1), (2, 0.3, 5)])
def test_the_predicted_item_count_is_within_15_percent_of_where_80_percent_of_runs_are_significant(seed, icc, size):
    print(f"seed {seed}")
    p_a, p_b = 0.60, 0.68
    delta, sd, design = _pilot(seed + 1000, p_a, p_b, icc, size)
    predicted = items_to_detect(delta, sd, design=design, cluster_size=size)
    clusters = lambda n: max(2, round(n / size))  # noqa: E731
    at = {factor: _power(seed, clusters(factor * predicted), size, p_a, p_b, icc) for factor in (0.85, 1.0, 1.15)}
    print(f"difference {delta:.4f}, sd {sd:.4f}, design effect {design:.3f}: predicted {predicted} items; power at "
          f"85/100/115 %: {at}")
    # 2,000 runs: the power's standard error is about 0.009
    assert at[0.85] < 0.80 < at[1.15]
    if icc:
        assert design > 1.3  # the clusters cost items, and the plan counted them


def test_the_formulas_agree_with_each_other_and_with_the_textbook():
    # 0.35 = 2·0.25·(1 − 0.3): the default spread of a difference of two 0/1 scores
    plan = defaults()
    assert plan.sd_difference ** 2 == pytest.approx(0.35) and plan.design_effect == 1.0 and plan.source == "defaults"
    # (1.96 + 0.8416)² · 0.35 / 0.02² = 7.849 · 875 = 6,867.8: the usual paired sample size (t quantiles at 6,867
    # degrees of freedom add 2)
    assert items_to_detect(0.02, math.sqrt(0.35)) == 6870
    n = items_to_detect(0.05, 0.4, design=2.0)
    assert power_at(n, 0.05, 0.4, design=2.0) == pytest.approx(0.8, abs=0.005)
    # ± 0.02 on an accuracy near 0.5: 1.96² · 0.25 / 0.0004 = 2,400.9
    assert items_for_halfwidth(0.02, 0.5) == 2401
    assert design_effect(0.3, 5) == pytest.approx(2.2) and defaults(5).design_effect == pytest.approx(2.2)
    with pytest.raises(ValueError):
        items_to_detect(0.0, 0.5)
    with pytest.raises(ValueError):
        items_to_detect(0.1, 0.5, power=1.0)
