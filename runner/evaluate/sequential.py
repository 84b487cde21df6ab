"""Confidence sequences: intervals for a benchmark's mean that stay valid however often they are looked at, so a
run may stop as soon as the answer is known. An interval computed for a fixed number of items and recomputed after
every answer is not: the chance that it misses at some look grows with the looks (bench/sequential.py shows it).

The construction is betting (I. Waudby-Smith and A. Ramdas, "Estimating means of bounded random variables by
betting", JRSS-B 2023): for each candidate mean m of scores in [0, 1], a gambler bets on each new score against m;
were m the mean, no bet could be expected to win, so by Ville's inequality the wealth exceeds 1/alpha with
probability at most alpha at any time. The sequence is the set of candidates whose wealth is still below 1/alpha.
This module takes the paper's hedged capital process (section 4.3: half the wealth bets up, half down, theta = 1/2)
with its predictable plug-in bets (section 5.1, eq. 26: lambda_t = sqrt(2 log(2/alpha) / (sigma_{t-1}^2 t
log(1 + t))), truncated at c / m upwards and c / (1 − m) downwards, c = 1/2, as the authors' confseq package does
by default) and a further cap at c itself, as their empirical-Bernstein sequence has. The cap keeps the first bets,
made on the prior spread 1/4 when the plug-in asks for bets of 6, from losing wealth that draws from an unlimited
source never win back: without it a ``halfwidth: 0.05`` stop over such draws came 70 % later in simulated runs
(200 runs of 0/1 scores of mean 0.6, seed 1), though a paired difference was decided 17 % sooner.

A benchmark is a finite set asked in a random order, without replacement, and what a run reports is that set's
mean: the sequence is the paper's version for sampling without replacement (section 6, after Waudby-Smith and
Ramdas, "Confidence sequences for sampling without replacement", NeurIPS 2020), which bets against the mean of the
items not yet drawn, (N m − sum so far) / (N − t + 1), and so closes on the exact mean when the last item is in.
A candidate that the answers so far already rule out (the rest could not bring the mean there) leaves at once.

Candidates are a grid over [0, 1]. When the scores are multiples of 1 / r (0/1 scores, r = 1; a paired difference of
them, r = 2) and the benchmark has N items, its mean is one of the N·r + 1 multiples of 1 / (N·r), and those are the
grid: exact. Otherwise the grid is fine and an interval's ends are widened by one grid step, so a mean between two
grid points is inside whenever either neighbour is (approximate: bench/sequential.py measures it). The sequence is
intersected over time (each answer can only narrow it), and its state may carry leading dimensions (many simulated
runs at once, bench/sequential.py).

Own code, not a library: ``confseq`` (the authors' package) ships only as a source archive that needs Boost to
build, and ``expectation`` needs Python 3.12 (ARCHITECTURE.md, "Own code here, a library there").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: candidate means (grid points over [0, 1])
GRID = 2001
#: the bets' truncation (the paper's c)
TRUNCATION = 0.5


@dataclass(frozen=True)
class Interval:
    low: float
    high: float

    @property
    def halfwidth(self) -> float:
        return (self.high - self.low) / 2

    def excludes(self, value: float) -> bool:
        return value < self.low or value > self.high


class BettingSequence:
    """An anytime-valid confidence sequence for the mean of scores in [0, 1], updated one score at a time.

    ``population``: the benchmark's size N when its items are drawn without replacement (the sequence is then for
    their mean, and exact once all N are in); None for draws from an unlimited source. ``runs``: the number of
    sequences kept side by side (each :meth:`update` then takes one score per run)."""

    def __init__(self, alpha: float, population: int | None = None, *, runs: int | None = None,
                 resolution: int | None = None, grid: int = GRID) -> None:
        """``resolution``: the scores are multiples of 1 / resolution (1 for 0/1 scores, 2 for a paired difference
        of them, :func:`difference_score`): with ``population`` the benchmark's mean is then one of the
        population · resolution + 1 candidates, which the grid is, exactly."""
        if not 0 < alpha < 1:
            raise ValueError(f"alpha must be between 0 and 1, not {alpha}")
        if population is not None and population < 1:
            raise ValueError("a benchmark has at least one item")
        self.alpha = alpha
        self.population = population
        self.exact = population is not None and resolution is not None
        if self.exact:
            assert population is not None and resolution is not None
            grid = population * resolution + 1
        self.m = np.linspace(0.0, 1.0, grid)
        self.step = 1.0 / (grid - 1)
        #: the sums' slack: a grid point stands for the means within half a step of it, unless the grid is exact
        self._slack = 1e-9 if self.exact else (population or 0) * self.step / 2
        shape = (grid,) if runs is None else (runs, grid)
        lead = () if runs is None else (runs,)
        self.log_up = np.zeros(shape)
        self.log_down = np.zeros(shape)
        self.alive = np.ones(shape, dtype=bool)
        #: scores taken, their sum, and the numerator of the plug-in variance (1/4 + sum of squared deviations)
        self.t = 0
        self.total = np.zeros(lead)
        self.spread = np.full(lead, 0.25)
        self._threshold = math.log(1 / alpha)
        self._rate = 2 * math.log(2 / alpha)

    def update(self, x: float | np.ndarray) -> None:
        """Take the next score (or one per run), in [0, 1]."""
        x = np.asarray(x, dtype=float)
        if np.any((x < 0) | (x > 1)):
            raise ValueError("scores must lie in [0, 1]")
        t = self.t + 1
        variance = self.spread / t  # sigma_{t-1}^2 = (1/4 + sum_{i<t} (x_i - mu_i)^2) / t
        bet = np.minimum(TRUNCATION, np.sqrt(self._rate / (variance * t * math.log(1 + t))))
        possible: np.ndarray | bool = True
        if self.population is None:
            centre = np.broadcast_to(self.m, self.alive.shape)
        else:
            left = self.population - t + 1  # items not yet drawn, this one included
            if left < 1:
                raise ValueError(f"more scores than the {self.population} items of the benchmark")
            centre = (self.population * self.m - self.total[..., None]) / left
            possible = (centre >= -self._slack / left) & (centre <= 1 + self._slack / left)
        centre = np.clip(centre, 0.0, 1.0)
        xs, bets = x[..., None], bet[..., None]
        with np.errstate(divide="ignore", invalid="ignore"):
            up = np.minimum(bets, np.where(centre > 0, TRUNCATION / centre, np.inf))
            down = np.minimum(bets, np.where(centre < 1, TRUNCATION / (1 - centre), np.inf))
        self.log_up += np.log1p(up * (xs - centre))
        self.log_down += np.log1p(-down * (xs - centre))
        # the hedged wealth: max(K+ / 2, K- / 2), below 1/alpha to stay in
        wealth = np.logaddexp(self.log_up, self.log_down) - math.log(2)
        self.alive &= possible & (wealth < self._threshold)
        self.t = t
        self.total = self.total + x
        estimate = (0.5 + self.total) / (t + 1)
        self.spread = self.spread + (x - estimate) ** 2
        if self.population is not None:  # what the items left could not bring the mean to is out
            rest = self.population - t
            sums = self.population * self.m - self.total[..., None]
            self.alive &= (sums >= -self._slack) & (sums <= rest + self._slack)  # none left: the mean is known

    def interval(self) -> Interval | np.ndarray:
        """The current interval; with ``runs``, an array of (low, high) per run. A run whose candidates all left
        (an event of probability at most alpha) gives (nan, nan)."""
        m, widen = self.m, 0.0 if self.exact else self.step
        if self.alive.ndim == 1:
            where = np.flatnonzero(self.alive)
            if where.size == 0:
                return Interval(math.nan, math.nan)
            return Interval(max(0.0, m[where[0]] - widen), min(1.0, m[where[-1]] + widen))
        any_alive = self.alive.any(axis=1)
        first = np.argmax(self.alive, axis=1)
        last = self.alive.shape[1] - 1 - np.argmax(self.alive[:, ::-1], axis=1)
        low = np.where(any_alive, np.maximum(0.0, m[first] - widen), np.nan)
        high = np.where(any_alive, np.minimum(1.0, m[last] + widen), np.nan)
        return np.stack([low, high], axis=1)


def expected_halfwidths(variance: float, alpha: float, items: int, population: int | None = None) -> np.ndarray:
    """The half-width the sequence is expected to have after each of 1 … ``items`` scores whose variance is
    ``variance``: the theory that the stopping rule ``stop: {halfwidth: h}`` is checked against (bench/sequential.py).

    At a candidate m = mu + d the downward bet's log-wealth grows, in expectation, by lambda_i d_i − lambda_i² sigma²
    / 2 per score (the second-order expansion of log(1 − lambda (x − m))), where d_i is how far the candidate's mean
    of the items left lies from theirs: d N / (N − i + 1) without replacement, d with. The candidate leaves when the
    hedged wealth reaches 2 / alpha, so the expected half-width after t scores is
    (log(2 / alpha) + sigma² / 2 · sum lambda_i²) / sum lambda_i · (N / (N − i + 1)),
    the empirical-Bernstein width of the paper's eq. 13 and, for sampling without replacement, of Waudby-Smith and
    Ramdas (NeurIPS 2020, Theorem 3). The bets are the ones :meth:`BettingSequence.update` makes, with the plug-in
    variance at its expected value (1/4 + (i − 1) sigma²) / i, truncated at c (the truncations at c / m and
    c / (1 − m) are looser near any mean); a run stops earlier or later than this as its answers fall."""
    t = np.arange(1, items + 1, dtype=float)
    plug_in = (0.25 + (t - 1) * variance) / t
    bets = np.minimum(TRUNCATION, np.sqrt(2 * math.log(2 / alpha) / (plug_in * t * np.log1p(t))))
    weights = np.ones_like(t) if population is None else population / (population - t + 1)
    return (math.log(2 / alpha) + variance / 2 * np.cumsum(bets ** 2)) / np.cumsum(bets * weights)


def expected_stop(variance: float, alpha: float, halfwidth: float, population: int | None = None, *,
                  limit: int = 10_000_000) -> int | None:
    """The number of scores after which :func:`expected_halfwidths` first reaches ``halfwidth`` (None: not within
    the population, or within ``limit`` draws from an unlimited source)."""
    if not 0 < halfwidth:
        raise ValueError(f"a half-width is positive, not {halfwidth}")
    items = population if population is not None else limit
    size = 1024
    while True:
        count = min(size, items)
        reached = np.flatnonzero(expected_halfwidths(variance, alpha, count, population) <= halfwidth)
        if reached.size:
            return int(reached[0]) + 1
        if count == items:
            return None
        size *= 4


def difference_score(a: float | np.ndarray, b: float | np.ndarray) -> float | np.ndarray:
    """A paired difference B − A of scores in [0, 1], mapped to [0, 1] for :class:`BettingSequence`: (1 + B − A) / 2
    (0.5: no difference)."""
    return (1 + np.asarray(b, dtype=float) - np.asarray(a, dtype=float)) / 2


def difference_interval(interval: Interval) -> Interval:
    """An interval of :func:`difference_score`'s mean as one of the difference B − A itself."""
    return Interval(2 * interval.low - 1, 2 * interval.high - 1)
