"""Every answer parser against tables of real-looking answers, and property tests of the option permutations.

Each case names the exact value, or the exact reason class (``Reason.*``) of an invalid answer.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runner.evaluate.parse import (
    Parsed,
    Reason,
    is_none_of_them,
    is_refusal,
    newterm_reference_letter,
    newterm_reference_yes_no,
    parse_answer,
    parse_label,
    parse_letter,
    parse_letters,
    parse_scale,
    parse_yes_no,
)
from runner.plan.choices import (
    LETTERS,
    NONE_OF_THEM,
    NONE_OF_THEM_MARKER,
    append_none_of_them,
    drop_option,
    inverse,
    inverse_partial,
    permutation,
    shown_position,
)

REPO = Path(__file__).resolve().parents[2]

FOOD = ["carrot", "apple", "potato", "onion"]
# Know-No's appendix A.5 example: the gold "Rick" was removed from the options
RICK = ["Bob", "James", "Stephanie"]
RICK_NOTA = [*RICK, NONE_OF_THEM_MARKER]
MCTEST = ["A car", "A cake", "New clothes", "A baseball"]
TEN = [f"option {i}" for i in range(10)]
OPTION_SETS = {"food": FOOD, "rick": RICK, "rick+nota": RICK_NOTA, "mctest": MCTEST, "ten": TEN}


def expect(parsed: Parsed, expected: Any) -> None:
    """``expected`` is the value, or a ``Reason`` string for an invalid answer."""
    if isinstance(expected, str) and expected in vars(Reason).values():
        assert parsed == Parsed(None, expected)
        assert not parsed.valid
    else:
        assert parsed == Parsed(expected)
        assert parsed.valid


# -- single letter, lenient ------------------------------------------------------------------------------------

LENIENT = [
    ("B", "food", 1),
    ("b", "food", 1),  # a lowercase letter counts when it is the whole answer
    ("b)", "food", 1),
    ("(d)", "food", 3),
    ("the answer is c", "food", 2),
    ("i think b", "food", Reason.NOT_FOUND),  # ... and only then
    ("(B)", "food", 1),
    ("Answer: C", "food", 2),
    ("The answer is (B).", "food", 1),
    ("The answer is B", "food", 1),
    ("Final answer: D", "food", 3),
    ("My answer is A.", "food", 0),
    ("The correct option is C.", "food", 2),
    ("Choice: A", "food", 0),
    ("Option C", "food", 2),
    ("**D**", "food", 3),
    ("**Answer: B**", "food", 1),
    ("[C]", "food", 2),
    ("'A'", "food", 0),
    ("C.", "food", 2),
    ("Answer:\nB", "food", 1),
    ("B. apple", "food", 1),
    ("B) apple", "food", 1),
    ("Answer: B) apple", "food", 1),
    ("C, not A", "food", 2),
    ("C\n\nExplanation: potatoes grow underground.", "food", 2),
    ("Let me think. Carrots and onions are roots... The answer is B.", "food", 1),
    ("A good choice is B", "food", 1),  # the article "A" before a lowercase word is no letter
    ("B and C", "food", Reason.AMBIGUOUS),  # two letters for one answer
    ("E or B", "food", 1),
    ("answer_D", "food", 3),
    ("I'm not sure, but I think B.", "food", 1),
    ("I'm sorry, but the answer is B.", "food", 1),  # an explicit answer beats the apology
    ("apple", "food", 1),
    ("I'd say the apple.", "food", 1),
    ("POTATO!", "food", 2),
    ("apple pie", "food", 1),
    ("either apple or carrot", "food", Reason.AMBIGUOUS),
    ("E", "food", Reason.OUT_OF_RANGE),
    ("It depends on the recipe.", "food", Reason.NOT_FOUND),
    ("", "food", Reason.EMPTY),
    ("   \n", "food", Reason.EMPTY),
    ("As an AI, I cannot choose.", "food", Reason.REFUSAL),
    ("I cannot answer this question.", "food", Reason.REFUSAL),
    ("None of the above", "food", Reason.NONE_OF_THEM),
    # Know-No, gold removed, no none-of-them option (appendix A.5's response types)
    ("D. Rick", "rick", Reason.OUT_OF_RANGE),  # D is not offered: never picked
    ("Rick", "rick", Reason.NOT_FOUND),
    ("C. Rick", "rick", 2),  # known limit: an offered letter with invented text counts as that letter
    ("James", "rick", 1),
    ("None of the above", "rick", Reason.NONE_OF_THEM),
    ("None of the options provided are correct. The correct answer is Rick.", "rick", Reason.NONE_OF_THEM),
    ("None of the options (A, B, C) is correct.", "rick", Reason.NONE_OF_THEM),
    # ... with the none-of-them option last (hint as option)
    ("None of the above", "rick+nota", 3),
    ("D", "rick+nota", 3),
    ("d", "rick+nota", 3),
    ("none-of-them", "rick+nota", 3),
    ("D. none-of-them", "rick+nota", 3),
    ("None of them fits, so none-of-them.", "rick+nota", 3),
    ("None of the options (A, B, C) is correct.", "rick+nota", 3),
    ("None of the options provided are correct. The correct answer is Rick.", "rick+nota", 3),
    ("I'm sorry, none of the options fits.", "rick+nota", 3),
    ("Neither", "rick+nota", 3),
    ("None of the others fit, so B.", "rick+nota", 1),
    ("None of them except B", "rick+nota", 1),
    ("D. Rick", "rick+nota", 3),  # D is offered now (the none-of-them slot)
    # MC-Test options that start with the article "A"
    ("A cake", "mctest", 1),  # the whole answer is option B's text
    ("B: A cake", "mctest", 1),
    ("A", "mctest", 0),
    ("a baseball", "mctest", 3),
    # ten options: "I" is a letter, the pronoun is not
    ("I think J", "ten", 9),
    ("I", "ten", 8),
    ("I'm going with H.", "ten", 7),
    ("K", "ten", Reason.OUT_OF_RANGE),
]


@pytest.mark.parametrize(("text", "options", "expected"), LENIENT)
def test_letter_lenient(text: str, options: str, expected: Any) -> None:
    expect(parse_letter(text, OPTION_SETS[options], LETTERS), expected)
    expect(parse_letter(text, OPTION_SETS[options]), expected)  # letters default to A-Z


STRICT = [
    ("B", "food", 1),
    ("b", "food", 1),
    ("(B)", "food", 1),
    ("(b)", "food", 1),
    ("B.", "food", 1),
    ("c.", "food", 2),
    ("B)", "food", 1),
    ("A)", "food", 0),
    ("[A]", "food", 0),
    ("'C'", "food", 2),
    ("**A**", "food", 0),
    ("  D  ", "food", 3),
    ("\nC\n", "food", 2),
    ("Answer: C", "food", 2),
    ("answer: a", "food", 0),
    ("Answer: (A)", "food", 0),
    ("Answer - B", "food", 1),
    ("The answer is (B).", "food", 1),
    ("The answer is C", "food", 2),
    ("The answer is: D", "food", 3),
    ("Final answer: B", "food", 1),
    ("My answer is D.", "food", 3),
    ("Option B", "food", 1),
    ("B. apple", "food", Reason.NOT_STRICT),
    ("apple", "food", Reason.NOT_STRICT),
    ("B because apples are fruit", "food", Reason.NOT_STRICT),
    ("B or C", "food", Reason.NOT_STRICT),
    ("A, C", "food", Reason.NOT_STRICT),
    ("BC", "food", Reason.NOT_STRICT),
    ("The answer is apple", "food", Reason.NOT_STRICT),
    ("Answer:", "food", Reason.NOT_STRICT),
    ("I think B", "food", Reason.NOT_STRICT),
    ("E", "food", Reason.OUT_OF_RANGE),
    ("The answer is (E).", "food", Reason.OUT_OF_RANGE),
    ("1", "food", Reason.OUT_OF_RANGE),
    ("D", "rick", Reason.OUT_OF_RANGE),
    ("D. Rick", "rick", Reason.NOT_STRICT),
    ("", "food", Reason.EMPTY),
    ("I'm sorry, I can't answer.", "food", Reason.REFUSAL),
    ("As an AI language model, I cannot choose an option.", "food", Reason.REFUSAL),
    ("none-of-them", "rick+nota", 3),  # the none-of-them option's own text
    ("D", "rick+nota", 3),
    ("None of the above", "rick+nota", Reason.NOT_STRICT),
]


@pytest.mark.parametrize(("text", "options", "expected"), STRICT)
def test_letter_strict(text: str, options: str, expected: Any) -> None:
    expect(parse_letter(text, OPTION_SETS[options], LETTERS, mode="strict"), expected)


def test_none_of_the_above_as_a_native_option() -> None:
    options = ["Tom", "Ann", "Sue", "None of the above"]
    assert parse_letter("None of the above.", options, LETTERS, mode="strict") == Parsed(3)
    assert parse_letter("none of them", options) == Parsed(3)


def test_custom_alphabet() -> None:
    assert parse_letter("2", FOOD, "1234") == Parsed(1)
    assert parse_letter("Answer: 4", FOOD, "1234", mode="strict") == Parsed(3)
    assert parse_letter("B", FOOD, "1234") == Parsed(None, Reason.OUT_OF_RANGE)


# -- several letters -------------------------------------------------------------------------------------------

LETTER_SETS = [
    ("A, C", "food", (0, 2)),
    ("A and C", "food", (0, 2)),
    ("A C", "food", (0, 2)),
    ("C, A", "food", (0, 2)),
    ("A,B,C,D", "food", (0, 1, 2, 3)),
    ("A, B, and C", "food", (0, 1, 2)),
    ("A, C and D.", "food", (0, 2, 3)),
    ("B", "food", (1,)),
    ("(A), (C)", "food", (0, 2)),
    ("[A, C]", "food", (0, 2)),
    ("**B, D**", "food", (1, 3)),
    ("B\nD", "food", (1, 3)),
    ("a, c", "food", (0, 2)),
    ("b and d", "food", (1, 3)),
    ("Answer: A, C", "food", (0, 2)),
    ("The answer is B and D", "food", (1, 3)),
    ("A & D", "food", (0, 3)),
    ("A; B", "food", (0, 1)),
    ("A/C", "food", (0, 2)),
    ("A or C", "food", (0, 2)),
    ("Options A and C", "food", (0, 2)),
    ("Both A and B", "food", (0, 1)),
    ("A, A, C", "food", (0, 2)),
    ("The plausible options are A, C and D.", "food", (0, 2, 3)),
    ("A plausible set is B and D", "food", (1, 3)),  # the article
    ("A is plausible, and so is C", "food", (0, 2)),  # the letter
    ("I think A and C", "food", (0, 2)),
    ("Only C is plausible.", "food", (2,)),
    ("All of them: A, B, C, D", "food", (0, 1, 2, 3)),
    ("A. carrot, C. potato", "food", (0, 2)),
    ("C is plausible because potatoes grow underground; E too.", "food", (2,)),
    ("A, E", "food", Reason.OUT_OF_RANGE),
    ("carrot and apple", "food", Reason.NOT_FOUND),  # option texts do not count for sets
    ("It depends.", "food", Reason.NOT_FOUND),
    ("None", "food", Reason.NONE_OF_THEM),
    ("None of them", "food", Reason.NONE_OF_THEM),
    ("None of the options are plausible.", "food", Reason.NONE_OF_THEM),
    ("", "food", Reason.EMPTY),
    ("I cannot determine which are plausible.", "food", Reason.REFUSAL),
    ("As an AI, I can't pick options.", "food", Reason.REFUSAL),
    ("None of them", "rick+nota", (3,)),
    ("D", "rick+nota", (3,)),
    ("A, B", "rick", (0, 1)),
    ("A, D", "rick", Reason.OUT_OF_RANGE),
]


@pytest.mark.parametrize(("text", "options", "expected"), LETTER_SETS)
def test_letters(text: str, options: str, expected: Any) -> None:
    expect(parse_letters(text, OPTION_SETS[options], LETTERS), expected)


# -- yes / no --------------------------------------------------------------------------------------------------

YES_NO: list[tuple[str, str | tuple[str, str] | None, Any]] = [
    ("Yes", None, True),
    ("YES", None, True),
    ("yes.", None, True),
    ("(Yes)", None, True),
    ("No", None, False),
    ("NO.", None, False),
    ("no", None, False),
    ("No, the sentence is illogical.", None, False),
    ("No it isn't", None, False),
    ("Yes, there is no error.", None, True),
    ("Yes - this is a natural usage.", None, True),
    ("Answer: YES", None, True),
    ("Answer: No, it doesn't.", None, False),
    ("The answer is no.", None, False),
    ("I would say no.", None, False),
    ("Correct", None, True),
    ("Correct. The usage matches the meaning.", None, True),
    ("The sentence is correct.", None, True),
    ("The usage is correct and natural.", None, True),
    ("Incorrect", None, False),
    ("It is not correct.", None, False),
    ("Not correct: 'rizz' does not mean that.", None, False),
    ("It is not incorrect.", None, True),  # a negated negative is positive
    ("There is no error, so the answer is Correct.", None, True),
    ("There is no problem with this sentence.", None, Reason.NOT_FOUND),  # "no" + noun is a determiner
    ("Acceptable", None, True),
    ("**Acceptable**", None, True),
    ("It is acceptable.", None, True),
    ("Unacceptable.", None, False),
    ("Unacceptable, because the term is misused.", None, False),
    ("Not acceptable", None, False),
    ("This isn't acceptable because the term is misused.", None, False),
    ("It is not acceptable, so Unacceptable.", None, False),
    ("TRUE", None, True),
    ("False", None, False),
    ("The sentence is true to the meaning of the term.", None, True),
    ("This is not true.", None, False),
    # the negative words are whole words: never inside "Not", "None", "Nobody", "Notably", "Incorrectly"
    ("Notably, the sentence works. Yes.", None, True),
    ("None of this makes sense.", None, Reason.NOT_FOUND),
    ("Nobody would say that.", None, Reason.NOT_FOUND),
    ("The term is used incorrectly.", None, Reason.NOT_FOUND),
    ("The term is used correctly.", None, Reason.NOT_FOUND),
    # both polarities, no leading answer word: the negative wins, as the reference checks negatives first
    ("The example is grammatically correct but not in line with commonsense, so Incorrect.", None, False),
    ("It is correct. No.", None, False),
    ("Maybe.", None, Reason.NOT_FOUND),
    ("", None, Reason.EMPTY),
    ("I'm sorry, I cannot judge this.", None, Reason.REFUSAL),
    ("As an AI, I don't have opinions, but I think it is correct.", None, Reason.REFUSAL),
    ("As an AI, I cannot be sure. The answer is Yes.", None, True),
    # a family given: only its words count
    ("Correct", "correct/incorrect", True),
    ("Incorrect - 'rizz' is not a verb.", "correct/incorrect", False),
    ("The sentence is correct, no issues.", "correct/incorrect", True),
    ("The sentence is correct, no issues.", None, True),
    ("Yes", "correct/incorrect", Reason.NOT_FOUND),
    ("Acceptable", "Acceptable/Unacceptable", True),
    ("Not acceptable", "acceptable/unacceptable", False),
    ("YES", "YES/NO", True),
    ("Yes, it's correct.", "yes/no", True),
    ("true", "true/false", True),
    ("Grammatical", ("grammatical", "ungrammatical"), True),
    ("Ungrammatical.", ("grammatical", "ungrammatical"), False),
]


@pytest.mark.parametrize(("text", "family", "expected"), YES_NO)
def test_yes_no(text: str, family: str | tuple[str, str] | None, expected: Any) -> None:
    expect(parse_yes_no(text, family), expected)


def test_yes_no_conflict_rule() -> None:
    text = "It is correct. No."
    assert parse_yes_no(text) == Parsed(False)
    assert parse_yes_no(text, conflict="first") == Parsed(True)
    assert parse_yes_no(text, conflict="invalid") == Parsed(None, Reason.CONFLICT)
    # a leading answer word decides before any conflict
    assert parse_yes_no("Yes. It is not incorrect, no.", conflict="invalid") == Parsed(True)


def test_yes_no_unknown_family() -> None:
    with pytest.raises(ValueError, match="unknown yes/no family"):
        parse_yes_no("Yes", "maybe/perhaps")


# -- integer scale ---------------------------------------------------------------------------------------------

SCALE = [
    ("8", 8),
    ("10", 10),
    ("0", 0),
    ("(5)", 5),
    ("5.", 5),
    ("**6**", 6),
    ("Rating: 9", 9),
    ("Score: 0", 0),
    ("Final rating: 4", 4),
    ("Rating: 8.\nReason: the sentence follows from the meaning.", 8),
    ("The sentence rating: 6 (somewhat logical)", 6),
    ("I'd rate it 7 out of 10.", 7),
    ("2 out of 10", 2),
    ("Score: 10/10", 10),
    ("9/10", 9),
    ("10 / 10", 10),
    ("8/10 - mostly logical", 8),
    ("Score: 3/10. The sentence is illogical.", 3),
    ("Out of 10, I'd give it 8.", 8),  # the denominator is no rating
    ("I would give this sentence a 9 since it is logical.", 9),
    ("The sentence deserves a score of 2 because it is illogical.", 2),
    ("This is a 10.", 10),
    ("A solid 8!", 8),
    ("between 7 and 8", Reason.AMBIGUOUS),  # a hedge between two ratings
    ("3-4", Reason.AMBIGUOUS),
    ("Rating - 1", 1),
    ("Sentence 1 gets a 3.", 3),  # the rating given, not the sentence's number
    ("Sentence 12 gets a 3.", 3),  # out-of-range integers are skipped
    ("eight", 8),
    ("The score is seven.", 7),
    ("11", Reason.OUT_OF_RANGE),
    ("-2", Reason.OUT_OF_RANGE),
    ("Rating: -3", Reason.OUT_OF_RANGE),
    ("Rating: 12", Reason.OUT_OF_RANGE),
    ("Rating: 15/20", Reason.OUT_OF_RANGE),
    ("7.5", Reason.NOT_FOUND),  # not an integer
    ("N/A", Reason.NOT_FOUND),
    ("Quite logical.", Reason.NOT_FOUND),
    ("", Reason.EMPTY),
    ("I'm sorry, I can't rate this.", Reason.REFUSAL),
    ("As an AI, I do not rate sentences.", Reason.REFUSAL),
]


@pytest.mark.parametrize(("text", "expected"), SCALE)
def test_scale(text: str, expected: Any) -> None:
    expect(parse_scale(text), expected)


def test_scale_custom_range() -> None:
    assert parse_scale("4", 1, 5) == Parsed(4)
    assert parse_scale("0", 1, 5) == Parsed(None, Reason.OUT_OF_RANGE)
    assert parse_scale("Rating: 5/5", 1, 5) == Parsed(5)
    assert parse_scale("I give it 9", 1, 5) == Parsed(None, Reason.OUT_OF_RANGE)


# -- labels (Bank-77 intents) ----------------------------------------------------------------------------------

BANK77 = (
    "activate_my_card age_limit apple_pay_or_google_pay atm_support automatic_top_up "
    "balance_not_updated_after_bank_transfer balance_not_updated_after_cheque_or_cash_deposit beneficiary_not_allowed "
    "cancel_transfer card_about_to_expire card_acceptance card_arrival card_delivery_estimate card_linking "
    "card_not_working card_payment_fee_charged card_payment_not_recognised card_payment_wrong_exchange_rate "
    "card_swallowed cash_withdrawal_charge cash_withdrawal_not_recognised change_pin compromised_card "
    "contactless_not_working country_support declined_card_payment declined_cash_withdrawal declined_transfer "
    "direct_debit_payment_not_recognised disposable_card_limits edit_personal_details exchange_charge exchange_rate "
    "exchange_via_app extra_charge_on_statement failed_transfer fiat_currency_support get_disposable_virtual_card "
    "get_physical_card getting_spare_card getting_virtual_card lost_or_stolen_card lost_or_stolen_phone "
    "order_physical_card passcode_forgotten pending_card_payment pending_cash_withdrawal pending_top_up "
    "pending_transfer pin_blocked receiving_money Refund_not_showing_up request_refund reverted_card_payment? "
    "supported_cards_and_currencies terminate_account top_up_by_bank_transfer_charge top_up_by_card_charge "
    "top_up_by_cash_or_cheque top_up_failed top_up_limits top_up_reverted topping_up_by_card "
    "transaction_charged_twice transfer_fee_charged transfer_into_account transfer_not_received_by_recipient "
    "transfer_timing unable_to_verify_identity verify_my_identity verify_source_of_funds verify_top_up "
    "virtual_card_not_working visa_or_mastercard why_verify_identity wrong_amount_of_cash_received "
    "wrong_exchange_rate_for_cash_withdrawal"
).split()

LABELS = [
    ("lost_or_stolen_card", "lost_or_stolen_card"),
    ("Lost or stolen card", "lost_or_stolen_card"),
    ("lost-or-stolen-card", "lost_or_stolen_card"),
    ("LOST_OR_STOLEN_CARD", "lost_or_stolen_card"),
    ("lost_or_stolen_card.", "lost_or_stolen_card"),
    ("'activate_my_card'", "activate_my_card"),
    ('"age_limit"', "age_limit"),
    ("Intent: `pin_blocked`", "pin_blocked"),
    ("Answer: atm_support", "atm_support"),
    ("Your answer: compromised_card", "compromised_card"),
    ("The correct intent class is: cancel_transfer", "cancel_transfer"),
    ("The intent is card_payment_wrong_exchange_rate.", "card_payment_wrong_exchange_rate"),
    ("This is about a declined_card_payment", "declined_card_payment"),
    ("The utterance belongs to lost_or_stolen_phone.", "lost_or_stolen_phone"),
    ("transfer_timing - the user asks how long a transfer takes", "transfer_timing"),
    ("exchange_rate", "exchange_rate"),
    ("wrong_exchange_rate_for_cash_withdrawal", "wrong_exchange_rate_for_cash_withdrawal"),
    ("reverted_card_payment", "reverted_card_payment?"),
    ("reverted_card_payment?", "reverted_card_payment?"),
    ("refund not showing up", "Refund_not_showing_up"),
    ("Refund_not_showing_up", "Refund_not_showing_up"),
    ("apple pay or google pay", "apple_pay_or_google_pay"),
    ("Visa or Mastercard", "visa_or_mastercard"),
    ("verify_my_identity.", "verify_my_identity"),
    ("why verify identity", "why_verify_identity"),
    ("card payment fee charged", "card_payment_fee_charged"),
    ("pending top up", "pending_top_up"),
    ("top-up-limits", "top_up_limits"),
    ("Top up limits", "top_up_limits"),
    ("terminate account", "terminate_account"),
    ("get_physical_card", "get_physical_card"),
    ("order physical card", "order_physical_card"),
    ("getting_spare_card", "getting_spare_card"),
    ("contactless not working", "contactless_not_working"),
    ("beneficiary_not_allowed", "beneficiary_not_allowed"),
    ("card_swallowed", "card_swallowed"),
    ("change pin", "change_pin"),
    ("top_up", Reason.NOT_FOUND),
    ("My card was stolen", Reason.NOT_FOUND),
    ("card_arrival or card_delivery_estimate", Reason.AMBIGUOUS),
    ("exchange_rate and exchange_charge", Reason.AMBIGUOUS),
    ("None of the intent classes match.", Reason.NONE_OF_THEM),
    ("I'm sorry, I cannot classify this.", Reason.REFUSAL),
    ("", Reason.EMPTY),
]


@pytest.mark.parametrize(("text", "expected"), LABELS)
def test_label(text: str, expected: str) -> None:
    want = expected if expected in vars(Reason).values() else BANK77.index(expected)
    expect(parse_label(text, BANK77), want)


def test_label_with_none_of_them_last() -> None:
    labels = [*BANK77, NONE_OF_THEM_MARKER]
    assert parse_label("none-of-them", labels) == Parsed(77)
    assert parse_label("None of the above.", labels) == Parsed(77)
    assert parse_label("pin_blocked", labels) == Parsed(BANK77.index("pin_blocked"))


# -- none of them ----------------------------------------------------------------------------------------------

NONE_YES = [
    "none-of-them",
    "None-of-them",
    "none_of_them",
    "NONE OF THEM",
    "none of them",
    "None of them.",
    "None of the above",
    "None of the above.",
    "**None of the above**",
    "Answer: none of the above",
    "The answer is none-of-them.",
    "E. none-of-them",
    "none of the options",
    "None of the options is correct.",
    "None of the given options are correct",
    "None of the provided choices fit.",
    "None of these",
    "None of those answers",
    "none of the listed labels",
    "None of the intent classes match.",
    "None of the options provided are correct. The correct answer is Rick.",
    "I believe none of the options is correct, so none-of-them.",
    "None",
    "None.",
    "Neither",
    "Neither of them",
    "There is no correct option.",
    "There is no correct answer among the options.",
    "No option fits.",
    "No option is correct.",
    "No correct answer",
    "None is correct.",
    "None fits.",
]
NONE_NO = [
    "B",
    "None of the others fit, so B.",
    "None of the other options is as good as C.",
    "None of them except B",
    "None of the options but C",
    "Nonetheless, B.",
    "Nobody knows; A.",
    "It is noon.",
    "The answer is A, none other.",
    "I know none of this, but C.",
    "No.",
    "No, B is correct.",
    "A cake",
    "",
]


@pytest.mark.parametrize("text", NONE_YES)
def test_none_of_them_detected(text: str) -> None:
    assert is_none_of_them(text)
    assert parse_letter(text, RICK_NOTA) == Parsed(3)


@pytest.mark.parametrize("text", NONE_NO)
def test_not_none_of_them(text: str) -> None:
    assert not is_none_of_them(text)


def test_custom_marker() -> None:
    assert is_none_of_them("N/A", marker="N/A")
    assert parse_letter("n/a", ["x", "y", "N/A"], marker="N/A") == Parsed(2)


# -- refusals --------------------------------------------------------------------------------------------------

REFUSALS = [
    "I cannot answer this question.",
    "I can't answer that.",
    "I can\u2019t answer that.",
    "I can not determine the answer.",
    "I cannot decide between these.",
    "I cannot make a judgement on this.",
    "I cannot rate this sentence.",
    "I cannot evaluate this.",
    "As an AI language model, I don't have personal opinions.",
    "As an AI, I cannot choose.",
    "As a language model, I cannot judge.",
    "As an AI assistant, I must stay neutral.",
    "As a large language model, I have no preferences.",
    "I'm sorry, but I can't help with that.",
    "I am sorry, I cannot provide an answer.",
    "I\u2019m sorry, but I can\u2019t comply.",
    "I apologize, but I cannot comply.",
    "I apologise, this is beyond me.",
    "Sorry, I don't know.",
    "I don't know.",
    "I do not know the answer.",
    "I'm unable to determine the correct option.",
    "I am unable to help.",
    "I am not able to answer.",
    "I'm not able to pick one.",
    "I'm afraid I can't do that.",
    "I won't answer this.",
    "I will not choose.",
    "I do not have enough information to answer.",
    "I don't have enough context.",
    "I don't feel comfortable answering.",
    "I can't say.",
]
NOT_REFUSALS = [
    "B",
    "I think B",
    "I'm not sure, but B.",
    "I can see why A is tempting, but C.",
    "I believe the answer is C.",
    "Correct.",
    "The AI chose A.",
    "A sorry state of affairs.",
    "I would say no.",
    "I know it is D.",
    "I'm confident: B",
]


@pytest.mark.parametrize("text", REFUSALS)
def test_refusals(text: str) -> None:
    assert is_refusal(text)
    refused = Parsed(None, Reason.REFUSAL)
    assert parse_letter(text, FOOD) == refused
    assert parse_letter(text, FOOD, mode="strict") == refused
    assert parse_letters(text, FOOD) == refused
    assert parse_yes_no(text) == refused
    assert parse_scale(text) == refused
    assert parse_label(text, BANK77) == refused


@pytest.mark.parametrize("text", NOT_REFUSALS)
def test_not_refusals(text: str) -> None:
    assert not is_refusal(text)


# -- the NewTerm reference rules -------------------------------------------------------------------------------

REFERENCE_LETTER = [
    ("B", 1),
    ("The answer is B.", 1),
    ("Answer: C", 2),
    ("(D)", 3),
    ("answer_D", 3),  # "_" is a separator
    ("A good guess would be B", 0),  # the article counts
    ("Not B, it is A", 1),  # the first letter, right or wrong
    ("b", Reason.NOT_FOUND),  # case-sensitive, and "b" is no option's text
    ("potato", 2),  # no letter: the one option text found
    ("I'd pick the POTATO", 2),
    ("Carrot or onion", Reason.AMBIGUOUS),
    ("E", Reason.NOT_FOUND),  # E is not a reference letter
    ("", Reason.EMPTY),  # no carry-over from the previous answer
    ("...", Reason.NOT_FOUND),
]


@pytest.mark.parametrize(("text", "expected"), REFERENCE_LETTER)
def test_newterm_reference_letter(text: str, expected: Any) -> None:
    expect(newterm_reference_letter(text, ["carrot", "apple", "potato", "onion"]), expected)


def test_newterm_reference_letter_matches_option_text_as_a_substring() -> None:
    # as the reference does: "cat" is found inside "category", where our lenient parser wants whole words
    assert newterm_reference_letter("the category is wrong", ["cat", "dog", "cow", "hen"]) == Parsed(0)
    assert parse_letter("the category is wrong", ["cat", "dog", "cow", "hen"]) == Parsed(None, Reason.NOT_FOUND)


def test_newterm_reference_letter_beyond_the_options() -> None:
    assert newterm_reference_letter("D", ["x", "y", "z"]) == Parsed(None, Reason.OUT_OF_RANGE)


REFERENCE_YES_NO = [
    ("Yes", True),
    ("YES", True),
    ("Correct", True),
    ("Acceptable", True),
    ("No", False),
    ("NO", False),
    ("Incorrect", False),
    ("Unacceptable", False),
    ("Not sure, but Yes", False),  # "No" inside "Not": the reference's substring rule
    ("None of this is wrong. Yes.", False),
    ("yes", Reason.NOT_FOUND),  # case-sensitive
    ("it is not correct", Reason.NOT_FOUND),
    ("Yes, Incorrect usage", False),  # negatives first
    ("", Reason.EMPTY),
]


@pytest.mark.parametrize(("text", "expected"), REFERENCE_YES_NO)
def test_newterm_reference_yes_no(text: str, expected: Any) -> None:
    expect(newterm_reference_yes_no(text), expected)


def test_parse_answer_dispatches() -> None:
    assert parse_answer("B", "letter", options=FOOD) == Parsed(1)
    assert parse_answer("b", "letter", options=FOOD, scoring="newterm-reference") == Parsed(None, Reason.NOT_FOUND)
    assert parse_answer("A good guess: B", "letter", options=FOOD, mode="strict").reason == Reason.NOT_STRICT
    assert parse_answer("A, C", "letters", options=FOOD) == Parsed((0, 2))
    assert parse_answer("Not sure. Yes", "yes_no") == Parsed(True)
    assert parse_answer("Not sure. Yes", "yes_no", scoring="newterm-reference") == Parsed(False)
    assert parse_answer("Correct", "yes_no", family="correct/incorrect") == Parsed(True)
    assert parse_answer("9", "scale") == Parsed(9)
    assert parse_answer("4", "scale", low=1, high=5) == Parsed(4)
    assert parse_answer("pin blocked", "label", options=BANK77) == Parsed(BANK77.index("pin_blocked"))
    assert parse_answer("none-of-them", "none_of_them") == Parsed(True)
    assert parse_answer("B", "none_of_them") == Parsed(False)
    assert parse_answer("I can't answer.", "none_of_them") == Parsed(None, Reason.REFUSAL)
    with pytest.raises(ValueError):
        parse_answer("B", "essay")  # type: ignore[arg-type]


# -- permutations: properties ----------------------------------------------------------------------------------


def test_letter_round_trip_through_the_permutation_is_identity() -> None:
    """1,000 random (option count, row, seed): the shown letter of every option parses back to its position, and
    the permutation maps that position to the original option; the inverse maps it back again."""
    rng = random.Random(20240605)
    for _ in range(1000):
        n = rng.randint(1, 26)
        row_id = f"row-{rng.randrange(10**9)}"
        seed = rng.randrange(10**6)
        original = [f"option text {i}" for i in range(n)]
        perm = permutation(n, row_id, seed)
        inv = inverse(perm)
        shown = [original[i] for i in perm]
        for position in range(n):
            parsed = parse_letter(LETTERS[position], shown, LETTERS, mode="strict")
            assert parsed == Parsed(position)
            assert shown[parsed.value] == original[perm[parsed.value]]
            assert inv[perm[position]] == position
        assert sorted(perm) == list(range(n))


def test_without_gold_and_none_of_them_round_trip() -> None:
    """1,000 random items with the gold dropped and the none-of-them slot appended: every shown letter maps to an
    original option other than the gold, or to the sentinel for the last slot, and back."""
    rng = random.Random(7)
    for _ in range(1000):
        n = rng.randint(2, 25)
        gold = rng.randrange(n)
        row_id, seed = str(rng.randrange(10**9)), rng.randrange(3)
        original = [f"text {i}" for i in range(n)]
        shown, perm, inv = drop_option(original, gold, row_id, seed)
        assert len(shown) == n - 1 and gold not in perm and inv[gold] is None and len(inv) == n
        shown, perm = append_none_of_them(shown, perm)
        assert shown[-1] == NONE_OF_THEM_MARKER and perm[-1] == NONE_OF_THEM
        assert inverse_partial(perm, n) == inv
        for position in range(n):
            back = perm[parse_letter(LETTERS[position], shown, LETTERS, mode="strict").value]
            if position == n - 1:
                assert back == NONE_OF_THEM
            else:
                assert back != gold and shown[position] == original[back] and inv[back] == position
            assert shown_position(perm, back) == position
        assert parse_letter("None of the above", shown).value == n - 1


def test_seeds_give_different_orders() -> None:
    """Over 1,000 items with 4 options, seed 0 and seed 1 order at least 90 % of them differently (chance of the
    same order: 1/24, so about 96 % are expected)."""
    differ = sum(permutation(4, f"item-{i}", 0) != permutation(4, f"item-{i}", 1) for i in range(1000))
    assert differ >= 900
    differ_12 = sum(permutation(4, f"item-{i}", 1) != permutation(4, f"item-{i}", 2) for i in range(1000))
    assert differ_12 >= 900


def test_shuffle_spreads_the_gold_evenly() -> None:
    """Each shown position holds original option 0 for about a quarter of 4,000 items (no position bias built
    in by the shuffle)."""
    counts = [0, 0, 0, 0]
    for i in range(4000):
        counts[inverse(permutation(4, str(i), 0))[0]] += 1
    assert all(900 <= c <= 1100 for c in counts), counts


def test_same_seed_same_order_in_a_fresh_process() -> None:
    code = (
        "import json\n"
        "from runner.plan.choices import drop_option, permutation\n"
        "print(json.dumps([[permutation(n, f'item-{i}', s) for n in (3, 4, 10) for s in (0, 1, 2)]"
        " + [drop_option([str(k) for k in range(5)], i % 5, f'item-{i}', 1)[1]] for i in range(300)]))\n"
    )
    here = [
        [permutation(n, f"item-{i}", s) for n in (3, 4, 10) for s in (0, 1, 2)]
        + [drop_option([str(k) for k in range(5)], i % 5, f"item-{i}", 1)[1]]
        for i in range(300)
    ]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(done.stdout) == here


def test_inverse_refuses_a_partial_permutation() -> None:
    with pytest.raises(ValueError, match="inverse_partial"):
        inverse([3, 0, 1, NONE_OF_THEM])
    with pytest.raises(ValueError):
        inverse([0, 0, 1])
    assert inverse_partial([3, 0, 1, NONE_OF_THEM]) == [1, 2, None, 0]
    assert inverse_partial([1, 0], 3) == [1, 0, None]
    with pytest.raises(ValueError):
        drop_option(["a", "b"], 2, "row", 0)
    with pytest.raises(ValueError):
        append_none_of_them(["a", "b"], [0])
