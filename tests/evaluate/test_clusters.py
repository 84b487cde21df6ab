"""Cluster-robust means and paired differences, Holm's adjustment and the intra-cluster correlation, each against
a library this project did not write: statsmodels' cluster-robust OLS and multipletests, scipy's paired t test.
Data drawn from seeded generators (the seed is in each test's parameters)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from scipy import stats as scipy_stats

from runner.evaluate.clusters import clustered_mean, holm, intra_cluster_correlation, paired_clustered

#: statsmodels is imported by the tests that use it, and they run in one test process: its import costs about 3 s
#: of CPU, which every process collecting this file would pay
pytestmark = pytest.mark.xdist_group("statsmodels")


def _clustered_scores(seed: int, clusters: int, icc: float, mean: float = 0.6) -> tuple[dict, dict]:
    """0/1 item scores in clusters of 1 to 12 items whose success probability is Beta-distributed around ``mean``
    with intra-cluster correlation ``icc``: (item → score, item → cluster)."""
    rng = random.Random(seed)
    total = 1 / icc - 1
    values, cluster_of = {}, {}
    for c in range(clusters):
        p = rng.betavariate(mean * total, (1 - mean) * total)
        for k in range(rng.randint(1, 12)):
            item = f"{c}-{k}"
            values[item], cluster_of[item] = float(rng.random() < p), f"c{c}"
    return values, cluster_of


def _statsmodels(values: dict, cluster_of: dict | None):
    import statsmodels.api as sm

    y = np.array(list(values.values()))
    X = np.ones((len(y), 1))
    if cluster_of is None:
        return sm.OLS(y, X).fit(use_t=True)
    groups = np.unique([cluster_of[item] for item in values], return_inverse=True)[1]
    return sm.OLS(y, X).fit(cov_type="cluster", cov_kwds={"groups": groups}, use_t=True)


@pytest.mark.parametrize("seed", range(5))
def test_the_cluster_robust_mean_is_statsmodels_cluster_robust_regression_on_a_constant(seed):
    values, cluster_of = _clustered_scores(seed, clusters=40, icc=0.3)
    ours = clustered_mean(values, cluster_of)
    fit = _statsmodels(values, cluster_of)
    assert ours.mean == pytest.approx(fit.params[0], abs=1e-12)
    assert ours.se == pytest.approx(fit.bse[0], abs=1e-9)
    assert ours.df == 39 and ours.clusters == 40 and ours.n == len(values)
    low, high = fit.conf_int(alpha=0.05)[0]
    assert (ours.low, ours.high) == (pytest.approx(low, abs=1e-9), pytest.approx(high, abs=1e-9))
    # clusters this correlated cost more than independent items would
    assert ours.design_effect > 1.5


@pytest.mark.parametrize("seed", range(3))
def test_without_clusters_the_standard_error_is_the_items_own(seed):
    values, _ = _clustered_scores(seed, clusters=30, icc=0.2)
    ours = clustered_mean(values)
    fit = _statsmodels(values, None)
    assert ours.se == pytest.approx(fit.bse[0], abs=1e-12) and ours.design_effect == pytest.approx(1.0)
    assert ours.clusters == ours.n and ours.df == ours.n - 1


@pytest.mark.parametrize("seed", range(5))
def test_the_paired_difference_without_clusters_is_scipys_paired_t_test(seed):
    rng = random.Random(seed)
    items = [str(i) for i in range(200)]
    a = {item: float(rng.random() < 0.6) for item in items}
    # B agrees with A on most items (models correlate per question) and is a little better
    b = {item: a[item] if rng.random() < 0.7 else float(rng.random() < 0.7) for item in items}
    ours = paired_clustered(a, b)
    expected = scipy_stats.ttest_rel([b[i] for i in items], [a[i] for i in items])
    assert ours.t == pytest.approx(expected.statistic, abs=1e-9)
    assert ours.p_value == pytest.approx(expected.pvalue, abs=1e-9)
    assert ours.wins + ours.ties + ours.losses == 200


@pytest.mark.parametrize("seed", range(3))
def test_the_clustered_paired_difference_is_statsmodels_on_the_differences(seed):
    a, cluster_of = _clustered_scores(seed, clusters=25, icc=0.3)
    rng = random.Random(seed + 100)
    b = {item: a[item] if rng.random() < 0.6 else float(rng.random() < 0.5) for item in a}
    del b[next(iter(b))]  # one item B never answered: left out of the pair
    ours = paired_clustered(a, b, cluster_of)
    shared = {item: b[item] - a[item] for item in b}
    fit = _statsmodels(shared, cluster_of)
    assert ours.difference.se == pytest.approx(fit.bse[0], abs=1e-9)
    assert ours.t == pytest.approx(fit.tvalues[0], abs=1e-9)
    assert ours.p_value == pytest.approx(fit.pvalues[0], abs=1e-9)
    assert ours.only_a == 1 and ours.only_b == 0


@pytest.mark.parametrize("seed", range(5))
def test_holm_is_statsmodels_multipletests(seed):
    from statsmodels.stats.multitest import multipletests

    rng = random.Random(seed)
    p = [rng.random() ** 3 for _ in range(rng.randint(1, 15))]
    assert holm(p) == pytest.approx(list(multipletests(p, method="holm")[1]), abs=1e-12)


def test_the_intra_cluster_correlation_comes_back_near_the_one_drawn():
    # seed 11, 600 clusters: the ANOVA estimator of the ICC of 0/1 scores drawn with ICC 0.3
    values, cluster_of = _clustered_scores(11, clusters=600, icc=0.3)
    assert intra_cluster_correlation(values, cluster_of) == pytest.approx(0.3, abs=0.05)
    independent, cluster_of = _clustered_scores(12, clusters=600, icc=0.001)
    assert intra_cluster_correlation(independent, cluster_of) < 0.03


def test_edges_say_nothing_rather_than_something_wrong():
    assert clustered_mean({}).mean is None
    one_cluster = clustered_mean({"a": 1.0, "b": 0.0}, {"a": "x", "b": "x"})
    assert one_cluster.mean == 0.5 and one_cluster.se is None and one_cluster.low is None
    same = paired_clustered({"a": 1.0, "b": 0.0}, {"a": 1.0, "b": 0.0})
    assert same.difference.mean == 0.0 and same.p_value is None and same.ties == 2
    assert intra_cluster_correlation({"a": 1.0}, {"a": "x"}) is None
    assert holm([]) == []
