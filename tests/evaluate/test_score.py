"""Aggregates over result rows, each against numbers computed by hand, and the NewTerm reference-compatible
scorer against a fixed set of answers."""

from __future__ import annotations

from typing import Any

import pytest

from runner.evaluate.score import (
    MeanStd,
    PositionRate,
    accuracy,
    balanced_accuracy,
    group_by,
    invalid_rate,
    mean_std,
    newterm_reference_accuracy,
    newterm_reference_score,
    omni_accuracy,
    omni_accuracy_rows,
    over_seeds,
    per_seed,
    per_variant,
    position_bias,
    threshold,
)
from runner.plan.choices import NONE_OF_THEM, append_none_of_them, drop_option, permutation


def row(
    score: float | None, *, seed: int = 0, template: int = 0, gold: Any = 1, valid: bool | None = True, **extra: Any
) -> dict[str, Any]:
    out = {"score": score, "seed": seed, "variant": {"seed": seed, "template": template}, "gold": gold, **extra}
    if valid is not None:
        out["valid"] = valid
    return out


def test_accuracy() -> None:
    rows = [row(1.0), row(0.0), row(1.0), row(None, valid=None)]  # the last one failed: not scored
    assert accuracy(rows) == pytest.approx(2 / 3)
    assert accuracy([row(0.0, valid=False), row(1.0)]) == 0.5  # an invalid answer is a wrong one
    assert accuracy([]) is None
    assert accuracy([row(None)]) is None


def test_balanced_accuracy() -> None:
    # 3 true items (2 right), 1 false item (wrong): plain 2/4, balanced (2/3 + 0/1) / 2
    rows = [row(1.0, gold=True), row(1.0, gold=True), row(0.0, gold=True), row(0.0, gold=False)]
    assert accuracy(rows) == 0.5
    assert balanced_accuracy(rows) == pytest.approx(1 / 3)
    # one class only: its accuracy
    assert balanced_accuracy([row(1.0, gold=True), row(0.0, gold=True)]) == 0.5
    assert balanced_accuracy([]) is None
    # 36 true / 4 false, always answering "true": plain 0.9, balanced 0.5
    skewed = [row(1.0, gold=True)] * 36 + [row(0.0, gold=False)] * 4
    assert accuracy(skewed) == pytest.approx(0.9)
    assert balanced_accuracy(skewed) == pytest.approx(0.5)


def test_invalid_rate() -> None:
    rows = [row(1.0), row(0.0, valid=False), row(0.0, valid=False), row(0.0), row(None, valid=None)]
    assert invalid_rate(rows) == 0.5  # 2 of the 4 rows with an answer
    assert invalid_rate([row(None, valid=None)]) is None


SEEDED = [
    # seed 0: 1/2, seed 1: 3/4, seed 2: 4/4
    row(1.0, seed=0, template=0),
    row(0.0, seed=0, template=1),
    row(1.0, seed=1, template=0),
    row(1.0, seed=1, template=1),
    row(1.0, seed=1, template=2),
    row(0.0, seed=1, template=2),
    row(1.0, seed=2, template=0),
    row(1.0, seed=2, template=1),
    row(1.0, seed=2, template=2),
    row(1.0, seed=2, template=0),
]


def test_per_seed_and_over_seeds() -> None:
    assert per_seed(SEEDED) == {0: 0.5, 1: 0.75, 2: 1.0}
    summary = over_seeds(SEEDED)
    assert summary is not None
    # mean 0.75; sample std sqrt(((-.25)^2 + 0 + .25^2) / 2) = 0.25
    assert summary.mean == pytest.approx(0.75) and summary.std == pytest.approx(0.25) and summary.n == 3
    assert summary.format() == "75.00 ± 25.00"
    assert summary.format(scale=1, digits=3) == "0.750 ± 0.250"
    assert over_seeds(SEEDED, invalid_rate) == MeanStd(0.0, 0.0, 3)


def test_mean_std() -> None:
    assert mean_std([0.5]) == MeanStd(0.5, None, 1)
    assert MeanStd(0.5, None, 1).format() == "50.00"
    assert mean_std([None, None]) is None
    result = mean_std([0.70, 0.72, None, 0.74])
    assert result is not None and result.mean == pytest.approx(0.72) and result.std == pytest.approx(0.02)
    assert result.n == 3


def test_per_variant() -> None:
    # template 0: 4 rows all right; template 1: 2 of 3; template 2: 2 of 3
    assert per_variant(SEEDED, "template") == {0: 1.0, 1: pytest.approx(2 / 3), 2: pytest.approx(2 / 3)}
    assert list(group_by(SEEDED, "template")) == [0, 1, 2]
    by_parity = group_by(SEEDED, lambda r: r["seed"] % 2)
    assert {k: len(v) for k, v in by_parity.items()} == {0: 6, 1: 4}
    # a key that is not in the variant is read from the row
    assert per_variant([row(1.0, model="m1"), row(0.0, model="m2")], "model") == {"m1": 1.0, "m2": 0.0}


def test_position_bias() -> None:
    # four items, 3 options each; the model always answers "A"
    rows = [
        {"valid": True, "permutation": [0, 1, 2], "gold": 0, "answer_letter": "A", "parsed": 0},  # gold at A
        {"valid": True, "permutation": [2, 0, 1], "gold": 0, "answer_letter": "A", "parsed": 2},  # gold at B
        {"valid": True, "permutation": [1, 2, 0], "gold": 0, "answer_letter": "A", "parsed": 1},  # gold at C
        {"valid": True, "permutation": [0, 2, 1], "gold": 0, "answer_letter": "A", "parsed": 0},  # gold at A
        {"valid": False, "permutation": [0, 1, 2], "gold": 0, "parsed": None},  # invalid: left out
        {"valid": True, "permutation": None, "gold": 0, "parsed": 0},  # no permutation: left out
    ]
    bias = position_bias(rows)
    assert bias == {
        "A": PositionRate(chosen=1.0, gold=0.5, n_chosen=4, n_gold=2),
        "B": PositionRate(chosen=0.0, gold=0.25, n_chosen=0, n_gold=1),
        "C": PositionRate(chosen=0.0, gold=0.25, n_chosen=0, n_gold=1),
    }
    assert bias["A"].excess == 0.5
    # without answer_letter, the letter comes from the parsed original index through the permutation
    derived = [{k: v for k, v in r.items() if k != "answer_letter"} for r in rows]
    assert position_bias(derived) == bias
    assert position_bias([]) == {}


def test_position_bias_with_the_none_of_them_slot() -> None:
    # a without-gold row whose expected answer is the none-of-them slot (gold recorded as NONE_OF_THEM)
    shown, perm, _ = drop_option(["a", "b", "c", "d"], 1, "row-1", 0)
    shown, perm = append_none_of_them(shown, perm)
    rows = [
        {"valid": True, "permutation": perm, "gold": NONE_OF_THEM, "answer_letter": "D"},
        {"valid": True, "permutation": perm, "gold": NONE_OF_THEM, "answer_letter": "A"},
        {"valid": True, "permutation": perm[:-1], "gold": 1, "answer_letter": "A"},  # gold not shown: left out
    ]
    bias = position_bias(rows)
    assert bias["D"] == PositionRate(chosen=0.5, gold=1.0, n_chosen=1, n_gold=2)
    assert bias["A"] == PositionRate(chosen=0.5, gold=0.0, n_chosen=1, n_gold=0)


def test_omni_accuracy_matches_know_no_table_3() -> None:
    # GPT-4o on MC-Test: 98.67 with gold; 80.17 / 80.40 / 41.30 without; E = 67.29; OmniAccuracy 82.98
    assert sum([80.17, 80.40, 41.30]) / 3 == pytest.approx(67.29)
    assert omni_accuracy(98.67, [80.17, 80.40, 41.30]) == pytest.approx(82.98)
    assert omni_accuracy(1.0, [0.0]) == 0.5
    with pytest.raises(ValueError):
        omni_accuracy(1.0, [])


def test_omni_accuracy_rows() -> None:
    def styled(score: float, style: str) -> dict[str, Any]:
        return {"score": score, "variant": {"style": style}, "gold": 0}

    rows = (
        [styled(1.0, "with_gold")] * 3
        + [styled(0.0, "with_gold")]  # 0.75
        + [styled(1.0, "hint_option"), styled(0.0, "hint_option")]  # 0.5
        + [styled(1.0, "hint_instruction")]
        + [styled(0.0, "hint_instruction")] * 3  # 0.25
        + [styled(0.0, "no_hint")] * 2  # 0.0
    )
    # ½ (0.75 + (0.5 + 0.25 + 0.0) / 3) = ½ (0.75 + 0.25) = 0.5
    assert omni_accuracy_rows(rows) == pytest.approx(0.5)
    assert omni_accuracy_rows([styled(1.0, "with_gold")]) is None
    assert omni_accuracy_rows(rows, with_gold="nonexistent") is None


def test_threshold() -> None:
    assert threshold(8, at_least=8) and threshold(10, at_least=8) and not threshold(7, at_least=8)
    assert threshold(3, at_most=3) and threshold(0, at_most=3) and not threshold(4, at_most=3)
    assert threshold(5, at_least=2, at_most=5) and not threshold(6, at_least=2, at_most=5)
    assert not threshold(None, at_least=0)
    assert threshold(5)


# -- the NewTerm reference-compatible scorer against hand-checked answers -------------------------------------

COMA_OPTIONS = ["the glass broke", "the cat slept", "it rained", "the sun rose"]
COMA = [  # gold 0 = A
    ("A", True),
    ("B", False),
    ("A good guess would be B", True),  # the article "A" is the first A-D token, and happens to be gold
    ("Answer: C", False),
    ("The glass broke.", True),  # no letter: the gold's text, and no other option's
    ("Not B, it is A", False),  # the first letter is B
]
COST_OPTIONS = ["rizz", "charisma", "charm", "allure"]
COST = [  # gold 0 = A (the term)
    ("A", True),
    ("", False),  # empty: wrong, NOT the previous answer's "A" (the reference's carry-over bug)
    ("rizz", True),
    ("Rizz is the word that fits", True),
    ("charm or allure", False),  # two options' texts
    ("D", False),
    ("a", False),  # lowercase is no letter, and no option text
    ("(A) rizz", True),
    ("I'm sorry, I can't answer.", False),  # "I" is not A-D; no option text
    ("The word charismatic fits", False),  # substring: "charisma" (B) is found
]
CSJ = [
    ("Yes", True, True),
    ("No", False, True),
    ("Not sure, but Yes", True, False),  # "No" inside "Not": negative
    ("Correct", True, True),
    ("Incorrect", False, True),
    ("correct", True, False),  # case-sensitive: no answer word
    ("Unacceptable", True, False),
    ("Acceptable", True, True),
    ("", False, False),  # no answer word: wrong even though the gold is false
    ("None of this is right", False, True),  # "No" inside "None": negative, right by luck
    ("YES", False, False),
    ("It is Acceptable, not Incorrect", True, False),  # negatives first
]


def test_newterm_reference_scorer_per_answer() -> None:
    for response, right in COMA:
        assert newterm_reference_score("COMA", response, 0, COMA_OPTIONS) == float(right), response
    for response, right in COST:
        assert newterm_reference_score("COST", response, 0, COST_OPTIONS) == float(right), response
    for response, gold, right in CSJ:
        assert newterm_reference_score("CSJ", response, gold) == float(right), response
    assert newterm_reference_score("CSJ", None, False) == 0.0
    with pytest.raises(ValueError):
        newterm_reference_score("COMA", "A", 0)


def test_newterm_reference_accuracies_by_hand() -> None:
    coma = newterm_reference_accuracy("COMA", [(r, 0, COMA_OPTIONS) for r, _ in COMA])
    cost = newterm_reference_accuracy("COST", [(r, 0, COST_OPTIONS) for r, _ in COST])
    csj = newterm_reference_accuracy("CSJ", [(r, g, None) for r, g, _ in CSJ])
    csj_balanced = newterm_reference_accuracy("CSJ", [(r, g, None) for r, g, _ in CSJ], balanced=True)
    assert coma == pytest.approx(3 / 6)  # A, "A good guess...", "The glass broke."
    assert cost == pytest.approx(4 / 10)  # A, rizz, "Rizz is...", "(A) rizz"
    assert csj == pytest.approx(6 / 12)  # Yes, No, Correct, Incorrect, Acceptable, "None of this..."
    # true items: 3 right of 7; false items: 3 right of 5
    assert csj_balanced == pytest.approx((3 / 7 + 3 / 5) / 2)
    assert csj_balanced == pytest.approx(18 / 35)
    # the paper's final score: mean of the three tasks
    assert coma is not None and cost is not None and csj is not None
    assert (coma + cost + csj) / 3 == pytest.approx((0.5 + 0.4 + 0.5) / 3)


def test_newterm_reference_scorer_with_shuffled_options() -> None:
    """The runner's addition: options shown in a seeded order; the gold's shown position moves with them and a
    letter answer is scored against that position, a text answer against the text."""
    for seed in (0, 1, 2):
        perm = permutation(4, "coma-1", seed)
        shown = [COMA_OPTIONS[i] for i in perm]
        gold_shown = perm.index(0)
        gold_letter = "ABCD"[gold_shown]
        assert newterm_reference_score("COMA", gold_letter, gold_shown, shown) == 1.0
        assert newterm_reference_score("COMA", "The glass broke.", gold_shown, shown) == 1.0
        wrong = "ABCD"[(gold_shown + 1) % 4]
        assert newterm_reference_score("COMA", f"Answer: {wrong}", gold_shown, shown) == 0.0
