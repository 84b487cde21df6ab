"""Seeded option permutations (stable across processes) and the letter parser.

The full parser tables are in test_parsers.py; the property tests of the permutations in test_parsers.py too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner.evaluate.parse import Parsed, Reason, parse_letter
from runner.plan.choices import LETTERS, inverse, options_block, permutation

REPO = Path(__file__).resolve().parents[2]
ROW_IDS = [str(i) for i in range(1, 51)] + ["row-a", "row-b", "ünïcode"]

# -- permutations --------------------------------------------------------------------------------------------


def table() -> list[list[int]]:
    return [permutation(n, row, seed) for n in (2, 4, 7) for row in ROW_IDS for seed in (0, 1, 2)]


def test_permutation_is_a_permutation() -> None:
    for n in (1, 2, 4, 5, 26):
        for row in ROW_IDS[:10]:
            for seed in (0, 1, 2, 12345):
                assert sorted(permutation(n, row, seed)) == list(range(n))


def test_permutation_is_deterministic_in_process() -> None:
    assert table() == table()


def test_permutation_is_stable_across_processes_and_hash_seeds() -> None:
    code = (
        "import json, sys\n"
        "from runner.plan.choices import permutation\n"
        "rows = json.loads(sys.argv[1])\n"
        "print(json.dumps([permutation(n, r, s) for n in (2, 4, 7) for r in rows for s in (0, 1, 2)]))\n"
    )
    here = table()
    for hash_seed in ("1", "987654"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run([sys.executable, "-c", code, json.dumps(ROW_IDS)], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=60, check=True)
        assert json.loads(done.stdout) == here


def test_seeds_give_different_orders_for_most_rows() -> None:
    rows = ROW_IDS[:50]
    differ_0_1 = sum(permutation(4, row, 0) != permutation(4, row, 1) for row in rows)
    differ_1_2 = sum(permutation(4, row, 1) != permutation(4, row, 2) for row in rows)
    assert differ_0_1 >= 40 and differ_1_2 >= 40
    # and the rows of one seed are not all shown in the same order
    assert len({tuple(permutation(4, row, 0)) for row in rows}) > 10


def test_many_options_are_shuffled_in_every_position() -> None:
    """Bank-77's 77 options need more than 256 random bits: every shown position must still be able to hold
    any option (with only 256 bits, the last ~20 swaps of the shuffle were all with position 0, and position 1
    ever held only 46 of the 77 options)."""
    for position in (0, 1, 2, 10, 40, 76):
        seen = {permutation(77, str(row), 0)[position] for row in range(3000)}
        assert len(seen) == 77, (position, len(seen))
    assert sorted(permutation(200, "r", 1)) == list(range(200))
    # up to 57 options, the orders are those of the 256-bit shuffle: stored answers keep their cache keys
    assert permutation(4, "x", 0) == [1, 2, 3, 0] and permutation(57, "x", 1)[:5] == [27, 2, 46, 11, 36]


def test_row_id_matters() -> None:
    assert sum(permutation(4, "1", s) != permutation(4, "2", s) for s in range(20)) >= 15


def test_no_shuffle_is_identity() -> None:
    for row in ROW_IDS[:5]:
        for seed in (0, 1, 2):
            assert permutation(5, row, seed, shuffle=False) == [0, 1, 2, 3, 4]


def test_inverse_inverts() -> None:
    for row in ROW_IDS[:20]:
        perm = permutation(6, row, 3)
        inv = inverse(perm)
        assert [inv[original] for original in perm] == list(range(6))
        assert [perm[shown] for shown in inv] == list(range(6))
    assert inverse([2, 0, 3, 1]) == [1, 3, 0, 2]


def test_shown_options_map_back_to_gold() -> None:
    original = ["carrot", "apple", "potato", "onion"]
    gold = 1
    for row in ROW_IDS[:20]:
        perm = permutation(4, row, 0)
        shown = [original[i] for i in perm]
        assert shown[inverse(perm)[gold]] == "apple"


def test_options_block() -> None:
    assert options_block(["carrot", "apple", "potato"]) == "A. carrot\nB. apple\nC. potato"
    assert options_block([]) == ""
    assert options_block([str(i) for i in range(26)]).splitlines()[-1] == "Z. 25"


# -- the letter parser ---------------------------------------------------------------------------------------

OPTIONS = ["carrot", "apple", "potato", "onion"]


def parse(text: str, options: list[str] = OPTIONS, letters: str = LETTERS) -> Parsed:
    return parse_letter(text, options, letters)


@pytest.mark.parametrize(
    ("text", "position"),
    [
        ("B", 1),
        ("The answer is C.", 2),
        ("(D)", 3),
        ("A", 0),
        ("Answer: B) apple", 1),
        ("**C**", 2),
        ("answer_D", 3),
        ("C, not A", 2),
        ("A good choice is B", 1),  # the article "A" before a lowercase word is no letter
        ("E or B", 1),  # E is not offered with four options
        ("\n\nB\n", 1),
    ],
)
def test_letter_answers(text: str, position: int) -> None:
    parsed = parse(text)
    assert parsed == Parsed(position)
    assert parsed.valid


def test_lowercase_letter_counts_only_as_the_whole_answer() -> None:
    assert [parse(text).value for text in ("a", "b)", "the answer is c", "(d)")] == [0, 1, 2, 3]
    for text in ("i think b", "b is my guess", "maybe c or so"):
        parsed = parse(text)
        assert not parsed.valid and parsed.value is None


def test_letter_outside_offered_ones_is_ignored() -> None:
    parsed = parse("E")
    assert parsed.value is None and not parsed.valid
    assert parse("B", options=OPTIONS[:2], letters="AB") == Parsed(1)
    assert not parse("C", options=OPTIONS[:2], letters="ABCD").valid


def test_letters_follow_the_given_alphabet() -> None:
    assert parse("2", letters="1234") == Parsed(1)
    assert not parse("B", letters="1234").valid


@pytest.mark.parametrize(
    ("text", "position"),
    [("it must be the apple", 1), ("POTATO!", 2), ("onion.", 3), ("I'd say carrot", 0)],
)
def test_option_text_without_letter(text: str, position: int) -> None:
    assert parse(text) == Parsed(position)


def test_letter_takes_precedence_over_option_text() -> None:
    assert parse("B: carrot") == Parsed(1)


def test_two_option_texts_are_invalid() -> None:
    parsed = parse("either apple or carrot")
    assert parsed.value is None
    assert not parsed.valid
    assert parsed.reason == Reason.AMBIGUOUS


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_empty_answer(text: str) -> None:
    assert parse(text) == Parsed(None, Reason.EMPTY)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("I'm sorry, but I cannot help with that request.", Reason.REFUSAL),
        ("As an AI language model, I don't have personal preferences.", Reason.REFUSAL),
        ("None of the options is correct.", Reason.NONE_OF_THEM),  # no none-of-them option was offered
        ("It depends on the context.", Reason.NOT_FOUND),
    ],
)
def test_refusals_and_non_answers_are_invalid(text: str, reason: str) -> None:
    parsed = parse(text)
    assert parsed.value is None
    assert parsed.reason == reason
