"""How many items a run needs before anything is paid: to detect a difference between two models (a paired test at
``alpha`` with ``power``), or to know one model's accuracy to within a half-width.

Normal approximations, as in E. Miller, "Adding Error Bars to Evals" (arXiv 2411.00640), section 4: to detect a
mean paired difference ``delta`` whose per-item differences have standard deviation ``sd``, a two-sided test needs

    n = design_effect · (z(1 − alpha/2) + z(power))² · sd² / delta²

items, and a mean with standard deviation ``sd`` is known to ± ``halfwidth`` after n = design_effect · z(1 −
alpha/2)² · sd² / halfwidth² items. The design effect of clusters of m items with intra-cluster correlation rho is
1 + (m − 1)·rho (Kish). ``sd`` and rho come from a pilot run when there is one (runner/evaluate/clusters.py on its
item scores), else from :data:`DEFAULTS`, which lean to more items, never fewer: said beside every figure.
Checked by simulation in tests/evaluate/test_power.py (the predicted count against the one at which 80 % of
simulated runs reach significance).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

_NORMAL = statistics.NormalDist()


@dataclass(frozen=True)
class Assumptions:
    """What a plan assumed, and where it came from."""

    #: standard deviation of one item's score (its seeds averaged), and of the per-item paired difference
    sd: float
    sd_difference: float
    #: intra-cluster correlation and mean items per cluster (1: no clusters)
    icc: float
    cluster_size: float
    #: "defaults" or "pilot run RUN"
    source: str

    @property
    def design_effect(self) -> float:
        return design_effect(self.icc, self.cluster_size)


#: without a pilot: accuracy near 0.5 (the largest spread of a 0/1 score), two models correlated 0.3 per item (the
#: low end of the 0.3-0.7 Miller reports, so the larger spread of their difference: 2·0.25·(1 − 0.3) = 0.35), and
#: when the stage has clusters an intra-cluster correlation of 0.3
DEFAULT_SD = 0.5
DEFAULT_MODEL_CORRELATION = 0.3
DEFAULT_ICC = 0.3


def defaults(cluster_size: float = 1.0) -> Assumptions:
    sd_difference = math.sqrt(2 * DEFAULT_SD ** 2 * (1 - DEFAULT_MODEL_CORRELATION))
    return Assumptions(DEFAULT_SD, sd_difference, DEFAULT_ICC if cluster_size > 1 else 0.0, cluster_size,
                       "defaults")


def design_effect(icc: float, cluster_size: float) -> float:
    """Kish's design effect of clusters of ``cluster_size`` items (on average) with intra-cluster correlation
    ``icc``."""
    return 1 + max(0.0, cluster_size - 1) * max(0.0, icc)


def _check(alpha: float, power: float | None = None) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be between 0 and 1, not {alpha}")
    if power is not None and not 0 < power < 1:
        raise ValueError(f"power must be between 0 and 1, not {power}")


def items_to_detect(delta: float, sd_difference: float, *, alpha: float = 0.05, power: float = 0.8,
                    design: float = 1.0, cluster_size: float = 1.0) -> int:
    """Items needed to detect a mean paired difference ``delta`` (module docstring) in clusters of
    ``cluster_size`` items, rounded up."""
    _check(alpha, power)
    if delta == 0:
        raise ValueError("a difference of 0 cannot be detected")
    z = _NORMAL.inv_cdf(1 - alpha / 2) + _NORMAL.inv_cdf(power)
    n = design * (z * sd_difference / abs(delta)) ** 2
    # the test is a t test over the clusters (every item its own without them): with few clusters its quantiles
    # are wider than the normal's, so the count is found again with them until it settles
    from scipy.stats import t as student

    for _ in range(20):
        df = max(1.0, n / cluster_size - 1)
        wider = design * ((student.ppf(1 - alpha / 2, df) + student.ppf(power, df)) * sd_difference / abs(delta)) ** 2
        if abs(wider - n) < 0.5:
            break
        n = wider
    return max(2, math.ceil(n))


def items_for_halfwidth(halfwidth: float, sd: float, *, alpha: float = 0.05, design: float = 1.0) -> int:
    """Items after which a mean with standard deviation ``sd`` has a (fixed-sample) interval of ± ``halfwidth``."""
    _check(alpha)
    if halfwidth <= 0:
        raise ValueError(f"a half-width must be positive, not {halfwidth}")
    return max(2, math.ceil(design * (_NORMAL.inv_cdf(1 - alpha / 2) * sd / halfwidth) ** 2))


def power_at(n: int, delta: float, sd_difference: float, *, alpha: float = 0.05, design: float = 1.0) -> float:
    """The power a paired test of ``n`` items has against a mean difference ``delta`` (the inverse of
    :func:`items_to_detect`)."""
    _check(alpha)
    if n <= 0 or sd_difference <= 0:
        return 0.0
    shift = abs(delta) / (sd_difference * math.sqrt(design / n))
    z = _NORMAL.inv_cdf(1 - alpha / 2)
    return _NORMAL.cdf(shift - z) + _NORMAL.cdf(-shift - z)
