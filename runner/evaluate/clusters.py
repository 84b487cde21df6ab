"""Means and paired differences whose items are not independent: items that share a passage, a story, a term or a
concept (a stage's ``cluster:`` field) answer alike, and treating them as independent understates the standard
error (E. Miller, "Adding Error Bars to Evals", arXiv 2411.00640, section 2.2: up to 3x).

The unit is the item (its seeds, samples or prompt variants averaged first: repeated measures of one item, never
independent items), the cluster a set of items. The standard error is the cluster-robust one of a regression on a
constant, with the small-sample factor G / (G − 1) over G clusters: what statsmodels' ``OLS(y, 1).fit(cov_type=
"cluster")`` gives (CR1; tests/evaluate/test_clusters.py checks to 1e-9), and its interval and test use Student's
t with G − 1 degrees of freedom (``use_t=True``). Without clusters every item is its own cluster and the standard
error is the usual sd / √n: the paired test is then scipy's ``ttest_rel``.

The design effect is the variance over the variance the items would have if independent: how many times as many
items the clustering costs. The intra-cluster correlation is the one-way ANOVA estimator, for planning runs
(runner/evaluate/power.py).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

#: two-sided level of the intervals and tests unless said
ALPHA = 0.05


def t_quantile(q: float, df: int) -> float:
    """Student's t quantile (scipy)."""
    from scipy.stats import t as student  # (imported when a report is built, not when the CLI starts)

    return float(student.ppf(q, df))


def t_two_sided_p(t: float, df: int) -> float:
    from scipy.stats import t as student

    return float(min(1.0, 2 * student.sf(abs(t), df)))


@dataclass(frozen=True)
class Clustered:
    """A mean over items with its cluster-robust standard error (module docstring)."""

    #: items and clusters
    n: int
    clusters: int
    mean: float | None
    #: cluster-robust standard error (CR1), and the standard error were the items independent
    se: float | None
    naive_se: float | None
    #: (se / naive_se)²: how many times the items' variance the clustering makes it
    design_effect: float | None
    #: degrees of freedom of the t distribution (clusters − 1)
    df: int | None
    low: float | None
    high: float | None
    alpha: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _groups(items: Sequence[Hashable], cluster_of: Mapping[Hashable, Hashable] | None) -> list[list[int]]:
    """Positions of ``items`` by cluster (each item alone without ``cluster_of``), clusters in first-seen order."""
    if cluster_of is None:
        return [[i] for i in range(len(items))]
    by: dict[Hashable, list[int]] = {}
    for position, item in enumerate(items):
        by.setdefault(cluster_of[item], []).append(position)
    return list(by.values())


def clustered_mean(values: Mapping[Hashable, float], cluster_of: Mapping[Hashable, Hashable] | None = None,
                   alpha: float = ALPHA) -> Clustered:
    """The mean of ``values`` (item → its mean score), with the cluster-robust standard error over the clusters
    ``cluster_of`` gives (item → cluster; every item its own without it) and a t interval at ``1 − alpha``."""
    items = list(values)
    n = len(items)
    if n == 0:
        return Clustered(0, 0, None, None, None, None, None, None, None, alpha)
    ys = [float(values[item]) for item in items]
    mean = math.fsum(ys) / n
    groups = _groups(items, cluster_of)
    g = len(groups)
    if n < 2 or g < 2:
        return Clustered(n, g, mean, None, None, None, None, None, None, alpha)
    naive_var = math.fsum((y - mean) ** 2 for y in ys) / (n - 1) / n
    # the sandwich of a regression on a constant: the squared sums of residuals per cluster, over n², times G/(G−1)
    robust_var = g / (g - 1) * math.fsum(math.fsum(ys[i] - mean for i in group) ** 2 for group in groups) / n ** 2
    se, naive_se = math.sqrt(robust_var), math.sqrt(naive_var)
    design = robust_var / naive_var if naive_var > 0 else None
    half = t_quantile(1 - alpha / 2, g - 1) * se
    return Clustered(n, g, mean, se, naive_se, design, g - 1, mean - half, mean + half, alpha)


@dataclass(frozen=True)
class PairedClustered:
    """B − A on the items both answered: the mean difference, its cluster-robust interval and t test, and the
    items each won."""

    difference: Clustered
    t: float | None
    p_value: float | None
    #: items B scored higher on, equal, lower (item means: the seeds averaged)
    wins: int
    ties: int
    losses: int
    #: items only one side answered (left out)
    only_a: int
    only_b: int

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "difference": self.difference.as_dict()}


def paired_clustered(a: Mapping[Hashable, float], b: Mapping[Hashable, float],
                     cluster_of: Mapping[Hashable, Hashable] | None = None, alpha: float = ALPHA
                     ) -> PairedClustered:
    """Compare item means ``a`` and ``b`` on their shared items (module docstring)."""
    shared = [item for item in a if item in b]
    differences = {item: float(b[item]) - float(a[item]) for item in shared}
    estimate = clustered_mean(differences, cluster_of, alpha)
    t = p = None
    if estimate.se:
        assert estimate.mean is not None and estimate.df is not None
        t = estimate.mean / estimate.se
        p = t_two_sided_p(t, estimate.df)
    wins = sum(1 for d in differences.values() if d > 0)
    losses = sum(1 for d in differences.values() if d < 0)
    return PairedClustered(estimate, t, p, wins, len(shared) - wins - losses, losses,
                           len(a) - len(shared), len(b) - len(shared))


def intra_cluster_correlation(values: Mapping[Hashable, float], cluster_of: Mapping[Hashable, Hashable]
                              ) -> float | None:
    """The one-way ANOVA estimate of the intra-cluster correlation, (MSB − MSW) / (MSB + (m₀ − 1)·MSW) with m₀ the
    size-adjusted mean cluster size, floored at 0; None with fewer than two clusters or no spread."""
    items = list(values)
    groups = _groups(items, cluster_of)
    n, g = len(items), len(groups)
    if g < 2 or n <= g:
        return None
    ys = [float(values[item]) for item in items]
    grand = math.fsum(ys) / n
    means = [math.fsum(ys[i] for i in group) / len(group) for group in groups]
    between = math.fsum(len(group) * (m - grand) ** 2 for group, m in zip(groups, means, strict=True)) / (g - 1)
    within = math.fsum((ys[i] - m) ** 2 for group, m in zip(groups, means, strict=True) for i in group) / (n - g)
    m0 = (n - math.fsum(len(group) ** 2 for group in groups) / n) / (g - 1)
    denominator = between + (m0 - 1) * within
    if denominator <= 0:
        return None
    return max(0.0, (between - within) / denominator)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of ``p_values`` (in their order): the k-th smallest becomes the largest of
    (m − j + 1)·p₍ⱼ₎ for j ≤ k, capped at 1. Strong control of the family-wise error rate at any alpha."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
