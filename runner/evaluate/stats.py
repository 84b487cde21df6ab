"""Statistics of item scores: the standard error and 95 % interval of a mean accuracy, and the paired comparison of
two sets of answers to the same items. Pure functions (scores in, numbers out), standard library only.

The unit is the item (a dataset row): a row answered under several seeds, samples or prompt variants is one
cluster, so its scores are averaged first (:class:`ItemScores`) and every figure here is over those item means.

- :func:`mean_interval`: mean ± z·SE with SE = sd(item means, n − 1) / √n (a normal interval). With one seed and
  0/1 scores that is the binomial SE with the n − 1 correction, √(p(1 − p)/(n − 1)). Where SE is 0 (one item, or
  every item alike) the normal interval says nothing: 0/1 item scores then get a Wilson score interval, others none.
- :func:`paired`: the difference B − A on the items both answered, its normal interval from the SE of the per-item
  differences, and a two-sided test: McNemar's exact (binomial) test on the discordant items when every item score
  is 0 or 1, else a sign-flip permutation test (exact up to :data:`EXACT_FLIPS` non-zero differences, else Monte
  Carlo under a fixed seed).
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

#: the two-sided 95 % normal quantile
Z95 = statistics.NormalDist().inv_cdf(0.975)
#: non-zero paired differences up to which the sign-flip test enumerates every sign pattern
EXACT_FLIPS = 12
#: Monte Carlo sign flips beyond that
RESAMPLES = 10_000
#: the sign-flip test's default seed (a report is the same every time it is built)
SEED = 0


class ItemScores:
    """Per item, the sum and count of its scores, added one task at a time; :meth:`means` gives each item's mean."""

    __slots__ = ("_sums",)

    def __init__(self) -> None:
        self._sums: dict[Hashable, list[float]] = {}

    def add(self, item: Hashable, score: float) -> None:
        total = self._sums.get(item)
        if total is None:
            self._sums[item] = [float(score), 1.0]
        else:
            total[0] += score
            total[1] += 1

    def means(self) -> dict[Hashable, float]:
        return {item: total / count for item, (total, count) in self._sums.items()}

    def __len__(self) -> int:
        return len(self._sums)


@dataclass(frozen=True)
class Estimate:
    """A mean over items with its standard error and 95 % interval (None where there is none)."""

    #: items
    n: int
    #: mean of the item means (None without items)
    mean: float | None
    #: standard error over items (None with fewer than two items)
    se: float | None
    low: float | None
    high: float | None
    #: how the interval was made: "normal", "wilson", "cluster-t" (runner/evaluate/clusters.py), or None
    ci_method: str | None
    #: with a stage's clusters: how many, and the design effect (the variance over the items' own)
    clusters: int | None = None
    design_effect: float | None = None

    def as_dict(self) -> dict[str, Any]:
        found = asdict(self)
        if self.clusters is None:  # an estimate without clusters reads as it always did
            del found["clusters"], found["design_effect"]
        return found


def _binary(values: Iterable[float]) -> bool:
    return all(v in (0.0, 1.0) for v in values)


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval of a proportion ``successes / n``."""
    if n <= 0:
        raise ValueError("a Wilson interval needs at least one trial")
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z / denominator * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_interval(values: Iterable[float], z: float = Z95, clip: tuple[float, float] | None = None) -> Estimate:
    """The mean of item means, SE = sd/√n, and mean ± z·SE (module docstring); ``clip`` bounds the interval to
    the scores' range (0 and 1 for accuracies)."""
    values = list(values)
    n = len(values)
    if n == 0:
        return Estimate(0, None, None, None, None, None)
    mean = statistics.fmean(values)
    se = statistics.stdev(values, mean) / math.sqrt(n) if n > 1 else None
    if se:
        low, high = mean - z * se, mean + z * se
        if clip is not None:
            low, high = max(clip[0], low), min(clip[1], high)
        return Estimate(n, mean, se, low, high, "normal")
    if _binary(values):  # one item, or all right, or all wrong
        low, high = wilson(sum(values), n, z)
        return Estimate(n, mean, se, low, high, "wilson")
    return Estimate(n, mean, se, None, None, None)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p: twice the smaller binomial(b + c, ½) tail of the discordant counts ``b`` and
    ``c`` (capped at 1)."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1))
    return min(1.0, 2 * tail / 2 ** n)


def sign_flip_test(differences: Iterable[float], seed: int = SEED, resamples: int = RESAMPLES) -> tuple[float, int]:
    """Two-sided sign-flip permutation test of paired differences centred on 0: (p, sign patterns drawn; 0 when
    every pattern was enumerated). The statistic is |sum of differences|; zeros flip to themselves and drop out."""
    nonzero = [d for d in differences if d != 0]
    observed = abs(sum(nonzero)) - 1e-12 * max(1, len(nonzero))  # ties count as at least as extreme
    m = len(nonzero)
    if m == 0:
        return 1.0, 0
    if m <= EXACT_FLIPS:
        hits = sum(abs(sum(s * d for s, d in zip(signs, nonzero, strict=True))) >= observed
                   for signs in itertools.product((1, -1), repeat=m))
        return hits / 2 ** m, 0
    # Differences grouped by size: flipping k of the m_v differences of size v adds v·(m_v − 2k), with
    # k ~ binomial(m_v, ½), the popcount of m_v random bits.
    groups: dict[float, int] = {}
    for d in nonzero:
        groups[abs(d)] = groups.get(abs(d), 0) + 1
    base = sum(v * count for v, count in groups.items())
    rng = random.Random(seed)
    sizes = list(groups.items())
    hits = 0
    for _ in range(resamples):
        total = base - 2 * sum(v * rng.getrandbits(count).bit_count() for v, count in sizes)
        hits += abs(total) >= observed
    return (hits + 1) / (resamples + 1), resamples


@dataclass(frozen=True)
class Paired:
    """Two sets of item means compared on the items both have: B − A."""

    #: items in both
    n: int
    only_a: int
    only_b: int
    #: means over the shared items
    mean_a: float | None
    mean_b: float | None
    #: mean of the per-item differences B − A, its SE and 95 % normal interval
    difference: float | None
    se: float | None
    low: float | None
    high: float | None
    ci_method: str | None
    #: "mcnemar-exact" (every item score 0 or 1) or "sign-flip" (permutation); None without shared items
    test: str | None
    p_value: float | None
    #: items right in A only and in B only (McNemar's discordant pairs; None for the sign-flip test)
    a_only_right: int | None
    b_only_right: int | None
    #: Monte Carlo sign patterns drawn (0: exact), and their seed
    resamples: int | None
    seed: int | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def paired(a: Mapping[Hashable, float], b: Mapping[Hashable, float], z: float = Z95, seed: int = SEED,
           resamples: int = RESAMPLES) -> Paired:
    """Compare item means ``a`` and ``b`` (item → mean score) on their shared items (module docstring)."""
    shared = [item for item in a if item in b]
    only_a, only_b = len(a) - len(shared), len(b) - len(shared)
    n = len(shared)
    if n == 0:
        return Paired(0, only_a, only_b, None, None, None, None, None, None, None, None, None, None, None, None,
                      None)
    left = [a[item] for item in shared]
    right = [b[item] for item in shared]
    differences = [y - x for x, y in zip(left, right, strict=True)]
    difference = statistics.fmean(differences)
    se = statistics.stdev(differences, difference) / math.sqrt(n) if n > 1 else None
    low = high = None
    if se:
        low, high = difference - z * se, difference + z * se
    if _binary(left) and _binary(right):
        a_only = sum(1 for x, y in zip(left, right, strict=True) if x > y)
        b_only = sum(1 for x, y in zip(left, right, strict=True) if y > x)
        test, p, drawn, used_seed = "mcnemar-exact", mcnemar_exact(a_only, b_only), None, None
    else:
        a_only = b_only = None
        p, drawn = sign_flip_test(differences, seed, resamples)
        test, used_seed = "sign-flip", (seed if drawn else None)
    return Paired(n, only_a, only_b, statistics.fmean(left), statistics.fmean(right), difference, se, low, high,
                  "normal" if low is not None else None, test, p, a_only, b_only, drawn, used_seed)
