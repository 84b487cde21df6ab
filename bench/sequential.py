"""Early stopping by simulation (issue 36's acceptance): the betting confidence sequence of
runner/evaluate/sequential.py over synthetic benchmarks whose items share cluster effects.

    python bench/sequential.py                      # 2,000 runs of 1,000 items, intra-cluster correlation 0.3
    python bench/sequential.py --runs 200 --items 300 --seed 7

Prints, with the seed:
- validity: the share of runs whose sequence held the benchmark's mean at every look (one look per answer), beside
  a normal (Wald) interval recomputed at every look, run the same way;
- a stop at ``halfwidth: 0.03``: the items it took (median and quartiles) against where theory says the sequence
  stops (runner/evaluate/sequential.py's expected_stop, at the scores' variance) and against the fixed-sample count
  z² p(1 − p) / h² (with the finite-population correction), and whether the stopped interval held the mean;
- two models 10 points apart and 2 points apart (``decide:``): the share decided, decided the wrong way, and the
  items it took.

Each benchmark is drawn anew per run: clusters of 10 items whose success probability is Beta-distributed with the
given intra-cluster correlation. Two targets, each printed: the benchmark's own mean (what running it all would
report: items asked in a random order without replacement, the sequence for a finite set), and the mean of the
population its clusters come from (clusters asked in a random order, each cluster's mean one independent draw: the
sequence for an unlimited source; items of one cluster are not independent draws, so the cluster is the unit).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runner.evaluate.sequential import BettingSequence, difference_score, expected_stop  # noqa: E402

Z95 = 1.959963984540054
CLUSTER = 10


def benchmark(rng: np.random.Generator, runs: int, items: int, accuracy: float, icc: float, lift: float = 0.0, *,
              ordered_by_cluster: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Scores of models A and B, (runs, items) each, in a random order (of clusters, their items together, with
    ``ordered_by_cluster``; clusters are drawn in random order anyway): B's success probability is A's plus
    ``lift`` (clipped), the two share each item's draw on 60 % of the items (models agree on most questions)."""
    total = 1 / icc - 1
    base = rng.beta(accuracy * total, (1 - accuracy) * total, size=(runs, items // CLUSTER, 1))
    shape = (runs, items // CLUSTER, CLUSTER)
    u = rng.random(shape)
    v = np.where(rng.random(shape) < 0.6, u, rng.random(shape))
    a = (u < base).astype(float).reshape(runs, items)
    b = (v < np.clip(base + lift, 0, 1)).astype(float).reshape(runs, items)
    if ordered_by_cluster:
        return a, b
    order = np.argsort(rng.random((runs, items)), axis=1)
    return np.take_along_axis(a, order, axis=1), np.take_along_axis(b, order, axis=1)


def _units(a: np.ndarray, target: str) -> np.ndarray:
    """What the sequence takes, one per look: items (the benchmark: without replacement, its mean) or cluster means
    in a random order of clusters (the population the clusters are drawn from: independent draws)."""
    if target == "benchmark":
        return a
    runs, items = a.shape
    return a.reshape(runs, items // CLUSTER, CLUSTER).mean(axis=2)


def _sequence(alpha: float, units: np.ndarray, target: str, resolution: int) -> BettingSequence:
    runs, count = units.shape
    if target == "benchmark":
        return BettingSequence(alpha, count, runs=runs, resolution=resolution)
    return BettingSequence(alpha, runs=runs)


def validity_and_halfwidth(rng: np.random.Generator, runs: int, items: int, icc: float, alpha: float,
                           halfwidth: float, target: str) -> None:
    scores, _ = benchmark(rng, runs, items, 0.6, icc, ordered_by_cluster=target == "population")
    units = _units(scores, target)
    count = units.shape[1]
    # the benchmark's own mean, or the population's (the Beta's mean, 0.6)
    truth = scores.mean(axis=1) if target == "benchmark" else np.full(runs, 0.6)
    sequence = _sequence(alpha, units, target, 1)
    covered = np.ones(runs, dtype=bool)
    wald = np.ones(runs, dtype=bool)
    stopped = np.full(runs, -1)
    held_at_stop = np.zeros(runs, dtype=bool)
    sums = np.zeros(runs)
    squares = np.zeros(runs)
    for t in range(count):
        sequence.update(units[:, t])
        low, high = sequence.interval().T
        inside = (low <= truth + 1e-12) & (truth - 1e-12 <= high)
        covered &= inside
        sums += units[:, t]
        squares += units[:, t] ** 2
        if t >= 9:  # a normal interval over the units so far, from the 10th on
            centre = sums / (t + 1)
            spread = np.maximum(squares / (t + 1) - centre ** 2, 1e-12) * (t + 1) / t
            half = Z95 * np.sqrt(spread / (t + 1))
            wald &= (centre - half <= truth) & (truth <= centre + half)
        now = (stopped < 0) & ((high - low) / 2 <= halfwidth)
        stopped[now] = t + 1
        held_at_stop[now] = inside[now]
    unit = "items" if target == "benchmark" else "clusters"
    print(f"[{target}] validity: the sequence held the mean at every one of {count} looks in {covered.mean():.4f} of "
          f"{runs} runs (alpha {alpha}: at least {1 - alpha:.2f} promised); a normal interval recomputed at every "
          f"look from the 10th: {wald.mean():.4f}")
    done = stopped[stopped > 0]
    q1, median, q3 = np.percentile(done, [25, 50, 75]) if done.size else (np.nan,) * 3
    line = (f"[{target}] halfwidth {halfwidth}: stopped in {done.size / runs:.3f} of runs, after {median:.0f} {unit} "
            f"at the median (quartiles {q1:.0f}-{q3:.0f})")
    if done.size:
        line += f"; the stopped interval held the mean in {held_at_stop[stopped > 0].mean():.4f}"
    # theory: where the expected half-width reaches the target, at the units' variance (each benchmark's p (1 − p)
    # averaged; the cluster means' spread over all runs)
    variance = float((truth * (1 - truth)).mean()) if target == "benchmark" else float(units.var())
    theory = expected_stop(variance, alpha, halfwidth, count if target == "benchmark" else None)
    if theory is None:
        line += f"; theory: not within {count} {unit} (variance {variance:.4f})"
    elif theory > count:
        line += f"; theory: after {theory:,} {unit}, more than the {count:,} there are (variance {variance:.4f})"
    else:
        line += f"; theory: {theory} {unit} (variance {variance:.4f}), median / theory = {median / theory:.3f}"
    if target == "benchmark":
        p = truth.mean()
        fixed = Z95 ** 2 * p * (1 - p) / halfwidth ** 2
        fixed_fpc = fixed / (1 + (fixed - 1) / items)
        line += (f"; a fixed-sample normal interval would need {fixed:.0f} items ({fixed_fpc:.0f} with the "
                 f"finite-population correction): median / that = {median / fixed_fpc:.2f}")
    print(line)


def decisions(rng: np.random.Generator, runs: int, items: int, icc: float, alpha: float, lift: float,
              target: str) -> None:
    a, b = benchmark(rng, runs, items, 0.6, icc, lift, ordered_by_cluster=target == "population")
    ua, ub = _units(a, target), _units(b, target)
    if target == "benchmark":
        truth = (b - a).mean(axis=1)
    else:  # the population's difference, from one large draw of clusters
        big_a, big_b = benchmark(np.random.default_rng(12345), 1, 1_000_000, 0.6, icc, lift)
        truth = np.full(runs, (big_b - big_a).mean())
    sequence = _sequence(alpha, ua, target, 2)
    count = ua.shape[1]
    decided = np.full(runs, -1)
    sign = np.zeros(runs)
    for t in range(count):
        sequence.update(difference_score(ua[:, t], ub[:, t]))
        low, high = (2 * sequence.interval() - 1).T
        now = (decided < 0) & ((low > 0) | (high < 0))
        decided[now] = t + 1
        sign[now] = np.where(low[now] > 0, 1.0, -1.0)
    right = decided > 0
    wrong = right & (sign != np.sign(truth)) & (truth != 0)
    # theory: where the difference's sequence is expected to be narrower than the difference (on its [0, 1] scale,
    # (1 + B − A) / 2: the spread and the distance to 0.5 halve)
    spread = float((ub - ua).var(axis=1).mean()) if target == "benchmark" else float((ub - ua).var())
    theory = expected_stop(spread / 4, alpha, abs(float(truth.mean())) / 2, count if target == "benchmark" else None)
    unit = "items" if target == "benchmark" else "clusters"
    if theory is None:
        said = f"theory: not within {count} {unit}"
    elif theory > count:
        said = f"theory: after {theory:,} {unit}, more than the {count:,} there are"
    else:
        said = f"theory: {theory / count:.3f} of the benchmark"
    fractions = decided[right] / count
    median = np.median(fractions) if fractions.size else np.nan
    quartiles = (f" (quartiles {np.percentile(fractions, 25):.3f}-{np.percentile(fractions, 75):.3f})"
                 if fractions.size else "")
    print(f"[{target}] B {lift:+.2f} over A (difference {truth.mean():+.4f}): decided in {right.mean():.4f} of runs, "
          f"the wrong way in {wrong.mean():.4f} (alpha {alpha}); asked when decided: median {median:.3f} of the "
          f"benchmark{quartiles}; {said}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--icc", type=float, default=0.3)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"seed {args.seed}: {args.runs} runs of {args.items} items in clusters of {CLUSTER}, intra-cluster "
          f"correlation {args.icc}, alpha {args.alpha}")
    started = time.monotonic()
    rng = np.random.default_rng(args.seed)
    for target in ("benchmark", "population"):
        validity_and_halfwidth(rng, args.runs, args.items, args.icc, args.alpha, 0.03, target)
        for lift in (0.10, 0.02):
            decisions(rng, args.runs, args.items, args.icc, args.alpha, lift, target)
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
