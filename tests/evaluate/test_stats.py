"""runner/evaluate/stats.py against hand computations and published reference values: item clustering, the SE
and normal interval of a mean over items, Wilson's interval where that degenerates, McNemar's exact test, the
sign-flip permutation test (exact and Monte Carlo under a fixed seed) and the paired comparison."""

from __future__ import annotations

import itertools
import math

import pytest

from runner.evaluate import stats


def _items(table: dict[str, list[float]]) -> dict:
    scores = stats.ItemScores()
    for item, values in table.items():
        for value in values:
            scores.add(item, value)
    return scores.means()


def test_an_items_seeds_are_averaged_first_and_the_se_is_over_item_means():
    # four items, two seeds each: item means 1, ½, 0, 1
    means = _items({"q1": [1, 1], "q2": [1, 0], "q3": [0, 0], "q4": [1, 1]})
    assert means == {"q1": 1.0, "q2": 0.5, "q3": 0.0, "q4": 1.0}
    estimate = stats.mean_interval(means.values(), clip=(0.0, 1.0))
    # by hand: mean 0.625; squared deviations 0.140625 + 0.015625 + 0.390625 + 0.140625 = 0.6875; sd² = 0.6875/3
    se = math.sqrt(0.6875 / 3) / 2
    assert (estimate.n, estimate.mean, estimate.ci_method) == (4, 0.625, "normal")
    assert estimate.se == pytest.approx(se)
    assert estimate.low == pytest.approx(0.625 - 1.959964 * se)
    assert estimate.high == 1.0  # 0.625 + 1.96·0.239 = 1.094, clipped to the scores' range
    unclipped = stats.mean_interval(means.values())
    assert unclipped.high == pytest.approx(0.625 + 1.959964 * se)


def test_one_seed_of_0_1_scores_gives_the_binomial_se_with_the_n_minus_1_correction():
    scores = [1.0] * 13 + [0.0] * 7
    estimate = stats.mean_interval(scores)
    p, n = 13 / 20, 20
    assert estimate.se == pytest.approx(math.sqrt(p * (1 - p) / (n - 1)))
    assert estimate.se == pytest.approx(math.sqrt(p * (1 - p) / n) * math.sqrt(n / (n - 1)))
    assert stats.Z95 == pytest.approx(1.959963985)


def test_a_degenerate_se_falls_back_to_wilson_for_0_1_scores_and_to_no_interval_otherwise():
    # Reference values: scipy.stats.binomtest(k, n).proportion_ci(method="wilson")
    all_right = stats.mean_interval([1.0] * 10)
    assert (all_right.se, all_right.ci_method, all_right.high) == (0.0, "wilson", 1.0)
    assert all_right.low == pytest.approx(0.7224672001371109)
    one_wrong = stats.mean_interval([0.0])
    assert one_wrong.se is None and one_wrong.ci_method == "wilson"
    assert (one_wrong.low, one_wrong.high) == (0.0, pytest.approx(0.7934506856227626))
    assert stats.wilson(3, 7) == (pytest.approx(0.1582198552514697), pytest.approx(0.7495416354723428))
    # all items at ½: no spread and no proportion, so no interval (and no division by zero)
    halves = stats.mean_interval([0.5, 0.5, 0.5])
    assert (halves.mean, halves.se, halves.low, halves.high, halves.ci_method) == (0.5, 0.0, None, None, None)
    assert stats.mean_interval([0.5]).as_dict() == {"n": 1, "mean": 0.5, "se": None, "low": None, "high": None,
                                                     "ci_method": None}
    assert stats.mean_interval([]).n == 0


def test_mcnemar_exact_matches_the_binomial_reference():
    # b = 10, c = 2: 2·(C(12,0) + C(12,1) + C(12,2))/2¹² = 2·79/4096 = 0.0386 (scipy.stats.binomtest(2, 12))
    assert stats.mcnemar_exact(10, 2) == pytest.approx(0.03857421875)
    assert stats.mcnemar_exact(2, 10) == stats.mcnemar_exact(10, 2)
    assert stats.mcnemar_exact(17, 3) == pytest.approx(0.0025768280029296875)
    assert stats.mcnemar_exact(5, 5) == 1.0 and stats.mcnemar_exact(0, 0) == 1.0
    assert stats.mcnemar_exact(0, 1) == 1.0  # 2·½ capped at 1


def test_the_sign_flip_test_enumerates_small_samples_exactly():
    # non-zero differences 1, 1, 1, ½, −½, ½ (the 0 drops out): sum 3.5 of 4.5. A sign pattern is as extreme
    # when the magnitudes it flips sum to ≤ ½ (4 patterns) or ≥ 4 (4 patterns): 8/64.
    p, drawn = stats.sign_flip_test([1, 1, 1, 0.5, -0.5, 0.5, 0])
    assert (p, drawn) == (0.125, 0)
    assert stats.sign_flip_test([0, 0]) == (1.0, 0)
    assert stats.sign_flip_test([1]) == (1.0, 0)


def test_the_monte_carlo_sign_flip_test_is_reproducible_and_near_the_exact_p():
    differences = [1, 1, 1, 1, 0.5, -0.5, 0.5, 1, -1, 0.5, 1, 0.5, 1, 1, -0.5, 0.5]  # 16 > EXACT_FLIPS
    assert len(differences) > stats.EXACT_FLIPS
    observed = abs(sum(differences))
    exact = sum(abs(sum(s * d for s, d in zip(signs, differences, strict=True))) >= observed - 1e-9
                for signs in itertools.product((1, -1), repeat=len(differences))) / 2 ** len(differences)
    assert exact == pytest.approx(0.0120849609375)  # scipy.stats.permutation_test(..., n_resamples=inf)
    p, drawn = stats.sign_flip_test(differences, seed=3)
    assert drawn == stats.RESAMPLES and abs(p - exact) < 0.004  # about 3.5 Monte Carlo SDs
    assert stats.sign_flip_test(differences, seed=3) == (p, drawn)  # same seed, same p
    assert stats.sign_flip_test(differences, seed=4)[0] != p  # another seed draws other patterns


def test_paired_0_1_items_use_mcnemar_on_the_discordant_items():
    a = {f"q{i}": 1.0 for i in range(20)}
    b = dict(a)
    for i in range(10):  # right in A only
        b[f"q{i}"] = 0.0
    for i in range(10, 12):  # right in B only
        a[f"q{i}"] = 0.0
    a["only-a"] = 1.0
    b["only-b1"] = b["only-b2"] = 0.0
    result = stats.paired(a, b)
    assert (result.n, result.only_a, result.only_b) == (20, 1, 2)
    assert (result.a_only_right, result.b_only_right, result.test) == (10, 2, "mcnemar-exact")
    assert result.p_value == pytest.approx(0.03857421875)
    assert result.mean_a == pytest.approx(18 / 20) and result.mean_b == pytest.approx(10 / 20)
    # differences: ten −1, two +1, eight 0 → mean −0.4, sd² = (10·0.36 + 2·1.96 + 8·0.16)/19
    assert result.difference == pytest.approx(-0.4)
    se = math.sqrt((10 * 0.36 + 2 * 1.96 + 8 * 0.16) / 19) / math.sqrt(20)
    assert result.se == pytest.approx(se)
    assert (result.low, result.high) == (pytest.approx(-0.4 - stats.Z95 * se), pytest.approx(-0.4 + stats.Z95 * se))
    assert result.ci_method == "normal" and result.resamples is None


def test_paired_fractional_items_use_the_sign_flip_test():
    a = _items({"q1": [1, 0], "q2": [0, 0], "q3": [1, 1], "q4": [0, 1]})
    b = _items({"q1": [1, 1], "q2": [1, 0], "q3": [1, 1], "q4": [1, 1]})
    result = stats.paired(a, b)
    # differences ½, ½, 0, ½: 3 non-zero, sum 1.5; only the all-plus and all-minus patterns reach |1.5|
    assert result.test == "sign-flip" and result.p_value == 0.25 and result.resamples == 0 and result.seed is None
    assert result.a_only_right is None and result.difference == pytest.approx(0.375)


def test_paired_edge_cases_do_not_divide_by_zero():
    same = {"q1": 1.0, "q2": 0.0}
    result = stats.paired(same, same)
    assert (result.difference, result.se, result.low, result.ci_method, result.p_value) == (0.0, 0.0, None, None,
                                                                                           1.0)
    none = stats.paired({"q1": 1.0}, {"q2": 1.0})
    assert (none.n, none.only_a, none.only_b, none.difference, none.test) == (0, 1, 1, None, None)
    one = stats.paired({"q1": 1.0}, {"q1": 0.0})
    assert (one.n, one.se, one.low, one.p_value) == (1, None, None, 1.0)
