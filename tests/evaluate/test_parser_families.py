"""Families of answers a careful grader reads one way (issue 37, item 1), each in lenient and strict mode where both
apply: an option ruled out before the one affirmed, an echoed option list, an adverb after "the answer is",
negation over a list or a clause, none-of-the-above in other words, colloquial yes/no, and Chinese and Japanese
answers. Each case names the value read, or the reason class (and where it matters the why) of an unreadable
answer: when in doubt, unreadable, never a guessed choice. Last, the why of an unreadable answer in its result line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runner.engine.run import execute
from runner.evaluate.parse import Parsed, Reason, parse_label, parse_letter, parse_letters, parse_yes_no
from runner.plan.choices import LETTERS, NONE_OF_THEM_MARKER
from runner.providers.base import Completion
from runner.spec.job import load_job
from runner.store import open_store
from tests.helpers import write_job, write_rows

FOOD = ["carrot", "apple", "potato", "onion"]
FOOD_NOTA = ["carrot", "apple", "potato", NONE_OF_THEM_MARKER]
RICK = ["Bob", "James", "Stephanie"]
INTENTS = ["card_arrival", "card_linking", "lost_or_stolen_card", "exchange_rate"]
INTENTS_NOTA = ["card_arrival", "card_linking", "lost_or_stolen_card", NONE_OF_THEM_MARKER]
MODES = ("lenient", "strict")
NS = Reason.NOT_STRICT


def expect(parsed: Parsed, expected: Any) -> None:
    """``expected``: a letter ("B"), a value, a reason class, or (reason class, why)."""
    if isinstance(expected, tuple):
        assert (parsed.value, parsed.reason, parsed.detail) == (None, *expected)
    elif isinstance(expected, str) and expected in vars(Reason).values():
        assert parsed == Parsed(None, expected), parsed
    elif isinstance(expected, str) and len(expected) == 1:
        assert parsed == Parsed(LETTERS.index(expected)), parsed
    else:
        assert parsed == Parsed(expected), parsed


def in_both_modes(cases: list[tuple[str, Any, Any]]) -> list[Any]:
    """(text, lenient, strict) cases -> one parameter set per mode."""
    return [pytest.param(text, mode, lenient if mode == "lenient" else strict, id=f"{mode}:{text[:60]}")
            for text, lenient, strict in cases for mode in MODES]


# -- an option ruled out, then the one affirmed ------------------------------------------------------------------

RULED_OUT_THEN_AFFIRMED = [
    ("(C) and (D) are wrong, so B", "B", NS),
    ("(B) is incorrect; A is right", "A", NS),
    ("(C) and (D) are wrong, so the answer is B.", "B", "B"),
    ("A is wrong, B is right.", "B", NS),
    ("(A) is not it; (C) is.", "C", NS),
    ("B is incorrect. The answer is D.", "D", "D"),
    ("C is wrong - the answer must be A", "A", "A"),
    ("Options A and C are incorrect, which leaves D.", "D", NS),
    ("B is not correct; D is.", "D", NS),
    ("B is false. D is true.", "D", NS),
    ("D can't be right, so A.", "A", NS),
    ("A is wrong and C is right.", "C", NS),
    ("A and B are both wrong, so it must be C.", "C", NS),
    ("(A) is eliminated, (B) is eliminated, so (C).", "C", NS),
    ("A, B and C are wrong, so D.", "D", NS),
    ("A, B, and C are all incorrect; D.", "D", NS),
    ("(B) and (C) can be ruled out. Final answer: A", "A", "A"),
    ("D is a distractor; B is correct.", "B", NS),
    ("B and D are distractors, leaving A.", "A", NS),
    ("C is implausible, so I'd go with A.", "A", NS),
    ("(D) is not right. (B) is.", "B", NS),
    ("A is irrelevant, C is the answer.", "C", NS),
    ("B isn't it. C isn't either. So A.", "A", NS),
    ("Not B, and not D: C.", "C", NS),
    ("A is incorrect, as is B; the correct answer is C.", "C", "C"),
    ("(A) wrong, (B) wrong, (C) correct", "C", NS),
    ("A: wrong. B: wrong. C: right.", "C", NS),
    ("C, D are invalid; B.", "B", NS),
    ("A and D can be eliminated; between B and C, C fits better.", "C", NS),
    ("A would be wrong since carrots are roots, so B.", "B", NS),
    ("(A) and (C) are incorrect because both are vegetables. Answer: (B)", "B", "B"),
    ("B is not the answer; D is.", "D", NS),
    ("**C** is wrong, **A** is correct.", "A", NS),
    ("Options C and D are unlikely; I choose B.", "B", NS),
    ("A, C, and D are all wrong, therefore the correct option is B.", "B", "B"),
    ("Option B is inaccurate and option D is inaccurate too; option A it is.", "A", NS),
    ("D is impossible. B is impossible. A is impossible. C.", "C", NS),
    ("(A), (B) and (D) are excluded, so (C)", "C", NS),
    # two left standing, or none: unreadable
    ("A is wrong; B and C are both right.", Reason.AMBIGUOUS, NS),
    ("A and B are wrong, C and D are wrong.", Reason.NOT_FOUND, NS),
]


@pytest.mark.parametrize(("text", "mode", "expected"), in_both_modes(RULED_OUT_THEN_AFFIRMED))
def test_an_option_ruled_out_before_the_one_affirmed_is_not_the_answer(text: str, mode: str, expected: Any) -> None:
    expect(parse_letter(text, FOOD, mode=mode), expected)  # type: ignore[arg-type]


LABELS_RULED_OUT = [
    ("card_linking and card_arrival are wrong, so lost_or_stolen_card", "lost_or_stolen_card"),
    ("card_linking is incorrect; card_arrival is right.", "card_arrival"),
    ("exchange_rate is not it. card_linking is.", "card_linking"),
    ("Not card_linking or exchange_rate - it's card_arrival.", "card_arrival"),
]


@pytest.mark.parametrize(("text", "expected"), LABELS_RULED_OUT)
def test_a_label_ruled_out_before_the_one_affirmed_is_not_the_answer(text: str, expected: str) -> None:
    assert parse_label(text, INTENTS) == Parsed(INTENTS.index(expected))


# -- an answer that states no choice: the options echoed ---------------------------------------------------------

ECHOED = (Reason.NOT_FOUND, "options echoed")
ECHOES = [
    ("A. carrot\nB. apple\nC. potato\nD. onion", ECHOED, NS),
    ("(A) carrot\n(B) apple\n(C) potato\n(D) onion", ECHOED, NS),
    ("A) carrot\nB) apple\nC) potato\nD) onion", ECHOED, NS),
    ("- A. carrot\n- B. apple\n- C. potato\n- D. onion", ECHOED, NS),
    ("**A.** carrot\n**B.** apple\n**C.** potato\n**D.** onion", ECHOED, NS),
    ("A: carrot\nB: apple\nC: potato\nD: onion", ECHOED, NS),
    ("[A] carrot\n[B] apple\n[C] potato\n[D] onion", ECHOED, NS),
    ("| Option | Text |\n|---|---|\n| A | carrot |\n| B | apple |\n| C | potato |\n| D | onion |", ECHOED, NS),
    ("| Letter | Answer |\n| --- | --- |\n| (A) | carrot |\n| (B) | apple |\n| (C) | potato |\n| (D) | onion |",
     ECHOED, NS),
    ("| **A** | carrot |\n| **B** | apple |\n| **C** | potato |\n| **D** | onion |", ECHOED, NS),
    ("The options are A) carrot, B) apple, C) potato, D) onion.", ECHOED, NS),
    ("Options: (A) carrot (B) apple (C) potato (D) onion", ECHOED, NS),
    ("A. carrot B. apple C. potato D. onion", ECHOED, NS),
    ("The choices: A) carrot; B) apple; C) potato; D) onion", ECHOED, NS),
    ("Which of these is a fruit?\nA. carrot\nB. apple\nC. potato\nD. onion", ECHOED, NS),
    ("Question: Which is a fruit?\nA. carrot\nB. apple\nC. potato\nD. onion\nAnswer:", ECHOED, NS),
    ("A. carrot\nB. apple", ECHOED, NS),
    ("C. potato\nD. onion", ECHOED, NS),
    ("B. apple\nA. carrot", ECHOED, NS),
    ("A. carrot\n\nB. apple\n\nC. potato\n\nD. onion", ECHOED, NS),
    ("Let me look at each option:\nA. carrot - a root.\nB. apple - grows on trees.\nC. potato - a tuber.\n"
     "D. onion - a bulb.", ECHOED, NS),
    ("| Option | Notes |\n|---|---|\n| A | a root |\n| B | grows on trees |\n| C | a tuber |\n| D | a bulb |",
     ECHOED, NS),
    # the list echoed, then a choice stated
    ("A. carrot\nB. apple\nC. potato\nD. onion\n\nAnswer: B", "B", "B"),
    ("A. carrot\nB. apple\nC. potato\nD. onion\n\nB", "B", NS),
    ("A. carrot\nB. apple\nC. potato\nD. onion\n\nThe answer is (B).", "B", "B"),
    ("A. carrot\nB. apple\nC. potato\nD. onion\n\nB. apple", "B", NS),
    ("A. carrot\nB. apple\nC. potato\nD. onion\n\nI'd pick the apple.", "B", NS),
    ("The options are A) carrot, B) apple, C) potato, D) onion. The fruit is B.", "B", NS),
    ("Let me look at each option:\nA. carrot\nB. apple\nC. potato\nD. onion\nFinal answer: B", "B", "B"),
    # each line with its verdict: the line that says it is right is the answer
    ("A: wrong\nB: correct\nC: wrong\nD: wrong", "B", NS),
    ("A. carrot - incorrect\nB. apple - correct\nC. potato - incorrect\nD. onion - incorrect", "B", NS),
    ("| Option | Verdict |\n|---|---|\n| A | wrong |\n| B | right |\n| C | wrong |\n| D | wrong |", "B", NS),
    ("A) carrot: not correct\nB) apple: correct\nC) potato: not correct\nD) onion: not correct", "B", NS),
    ("A: correct\nB: correct\nC: wrong\nD: wrong", (Reason.AMBIGUOUS, "two choices affirmed"), NS),
    # one labelled line is an answer, not an echo
    ("B. apple", "B", NS),
    ("(B) apple is right, not (A) carrot", "B", NS),
    ("**B. apple**\n\nApples develop from the flower, unlike A, C and D.", "B", NS),
]


@pytest.mark.parametrize(("text", "mode", "expected"), in_both_modes(ECHOES))
def test_an_echoed_option_list_states_no_choice(text: str, mode: str, expected: Any) -> None:
    expect(parse_letter(text, FOOD, mode=mode), expected)  # type: ignore[arg-type]


def test_an_echo_with_three_options_and_the_reason_in_strict_mode() -> None:
    expect(parse_letter("A. Bob\nB. James\nC. Stephanie", RICK), ECHOED)
    expect(parse_letter("A. carrot\nB. apple\nC. potato\nD. onion", FOOD, mode="strict"), (NS, "options echoed"))


# -- an adverb between "the answer is" and the letter -------------------------------------------------------------

ADVERBS = [
    ("The answer is actually B.", "B"),
    ("The answer is clearly C", "C"),
    ("The answer is definitely D.", "D"),
    ("The correct answer is obviously A.", "A"),
    ("The answer is, of course, C.", "C"),
    ("The answer is certainly (B).", "B"),
    ("The answer is undoubtedly D.", "D"),
    ("The answer is indeed A.", "A"),
    ("The answer is really C.", "C"),
    ("The answer is still B.", "B"),
    ("The answer is therefore D.", "D"),
    ("The answer is thus C.", "C"),
    ("The answer is hence A", "A"),
    ("So the answer is simply B.", "B"),
    ("The answer is just C.", "C"),
    ("Answer: definitely B", "B"),
    ("**Answer:** clearly **B**", "B"),
    ("The answer is, without a doubt, (A).", "A"),
    ("The answer is without doubt C.", "C"),
    ("The answer is in fact B.", "B"),
    ("My answer is now D.", "D"),
    ("The answer is evidently A.", "A"),
    ("The correct option is plainly D.", "D"),
    ("After checking again, the answer is truly C.", "C"),
    # a hedge on one option still chooses it: the model names one letter
    ("The answer is most likely B.", "B"),
    ("The answer is probably D.", "D"),
    ("The answer is likely A", "A"),
    ("The answer is very likely C.", "C"),
    ("The answer is almost certainly B.", "B"),
    ("The correct option is presumably D.", "D"),
    ("Final answer: most likely (C)", "C"),
    ("The answer is perhaps A.", "A"),
    ("The answer is possibly D.", "D"),
    # ... a hedge across two options names two, and an adverb before "not" names none
    ("The answer is maybe B, maybe C.", (Reason.AMBIGUOUS, "two choices stated")),
    ("The answer is B, or possibly C.", (Reason.AMBIGUOUS, "two choices stated")),
    ("The answer is probably B or C.", (Reason.AMBIGUOUS, "two choices stated")),
    ("The answer is B/C.", (Reason.AMBIGUOUS, "two choices stated")),
    ("The answer is probably not A.", (Reason.NOT_FOUND, "negated every option")),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("text", "expected"), ADVERBS)
def test_an_adverb_after_the_answer_is_does_not_block_the_letter(text: str, expected: Any, mode: str) -> None:
    if mode == "strict" and isinstance(expected, tuple):  # unreadable in strict mode too
        expected = (NS, expected[1]) if expected[0] == Reason.AMBIGUOUS else NS
    expect(parse_letter(text, FOOD, mode=mode), expected)  # type: ignore[arg-type]


def test_the_answer_is_definitely_not_d_it_is_b() -> None:
    text = "The answer is definitely not D; it is B."
    expect(parse_letter(text, FOOD), "B")
    expect(parse_letter(text, FOOD, mode="strict"), NS)


YES_NO_ADVERBS = [
    ("The answer is definitely yes.", "yes/no", True),
    ("The answer is clearly no.", "yes/no", False),
    ("The answer is probably correct.", "correct/incorrect", True),
    ("The answer is obviously incorrect.", "correct/incorrect", False),
    ("Answer: certainly acceptable", "acceptable/unacceptable", True),
    ("The answer is most likely false.", "true/false", False),
    ("The answer is clearly not correct.", "correct/incorrect", False),
    ("The answer is, of course, yes.", None, True),
    ("My answer is actually no.", None, False),
    ("The answer is maybe yes, maybe no.", "yes/no", Reason.AMBIGUOUS),
]


@pytest.mark.parametrize(("text", "family", "expected"), YES_NO_ADVERBS)
def test_an_adverb_after_the_answer_is_does_not_block_yes_or_no(text: str, family: str | None, expected: Any) -> None:
    expect(parse_yes_no(text, family), expected)


@pytest.mark.parametrize(("text", "expected"), [
    ("The intent is clearly card_arrival.", "card_arrival"),
    ("The label is most likely lost_or_stolen_card.", "lost_or_stolen_card"),
    ("The intent is, of course, exchange_rate", "exchange_rate"),
])
def test_an_adverb_after_the_intent_is_does_not_block_the_label(text: str, expected: str) -> None:
    assert parse_label(text, INTENTS) == Parsed(INTENTS.index(expected))


def test_two_labels_after_the_intent_is_are_two_answers() -> None:
    expect(parse_label("The intent is card_arrival or card_linking.", INTENTS),
           (Reason.AMBIGUOUS, "two labels stated"))


# -- negation scope: over a list, within a clause ----------------------------------------------------------------

NEGATED_LISTS = [
    ("The answer isn't A, B or C, so D", "D", NS),
    ("It isn't A, B or C, so D.", "D", NS),
    ("Not A, B or C, so D.", "D", NS),
    ("Not A, B, or C. D.", "D", NS),
    ("It can't be A, B or C, so the answer is D.", "D", "D"),
    ("Neither A nor B, so C.", "C", NS),
    ("Neither A, B nor C - D.", "D", NS),
    ("It's none of A, B or C, so D.", "D", NS),
    ("Excluding A, B and C leaves D.", "D", NS),
    ("I'd rule out A, B and C. D.", "D", NS),
    ("Definitely not A, B, or D - C.", "C", NS),
    ("Unlike A, B and D, C is a fruit.", "C", NS),
    ("It's not A, it's not B, it's not C: D.", "D", NS),
    ("I wouldn't say A, B, or D, so C.", "C", NS),
    ("not (A), (B) or (C), therefore (D)", "D", NS),
    ("Options A, B and C are wrong, so D.", "D", NS),
    ("It's not A or B; it's C.", "C", NS),
    ("The answer is D, not A, B or C.", "D", "D"),
    ("Rule out A, C and D: B.", "B", NS),
    # a comma alone makes no list: "Not A, B is correct" rules out A only
    ("Not A, B is correct.", "B", NS),
    ("Not A; B.", "B", NS),
    # clauses joined by " - "
    ("Not B - C", "C", NS),
    ("It's not A - it's D", "D", NS),
    ("It is not B - D is the one.", "D", NS),
    ("Not A - not B - so C", "C", NS),
    ("A is wrong - C is right", "C", NS),
    ("B - not A", "B", NS),
    ("C - A is wrong", "C", NS),
    ("Answer: C - not A", "C", "C"),
    ("Not D -- B.", "B", NS),
    # a list left standing, or only weighed: unreadable
    ("A, B or C - hard to say", (Reason.AMBIGUOUS, "several choices named"), NS),
    ("Neither A nor D; it's between B and C.", (Reason.AMBIGUOUS, "choices only weighed"), NS),
    ("Not A, B, C or D.", (Reason.NOT_FOUND, "negated every option"), NS),
]


@pytest.mark.parametrize(("text", "mode", "expected"), in_both_modes(NEGATED_LISTS))
def test_negation_reaches_over_a_list_and_stops_at_its_clause(text: str, mode: str, expected: Any) -> None:
    expect(parse_letter(text, FOOD, mode=mode), expected)  # type: ignore[arg-type]


def test_a_negated_list_in_a_set_of_letters() -> None:
    assert parse_letter("A, C and D are wrong.", FOOD) == Parsed(None, Reason.NOT_FOUND)
    assert parse_letters("B and D, not A or C", FOOD) == Parsed((1, 3))
    assert parse_letters("**B. apple**\n\nApples develop from the flower, unlike A, C and D.", FOOD) == Parsed((1,))


YES_NO_NEGATIONS = [
    ("neither correct nor acceptable", None, False),
    ("neither correct nor acceptable", "correct/incorrect", False),
    ("It is neither correct nor acceptable.", "acceptable/unacceptable", False),
    ("It is neither acceptable nor appropriate.", "acceptable/unacceptable", False),
    ("Neither yes nor no", None, (Reason.AMBIGUOUS, "neither answer affirmed")),
    ("Neither yes nor no.", "yes/no", (Reason.AMBIGUOUS, "neither answer affirmed")),
    ("The answer is neither yes nor no.", "yes/no", (Reason.AMBIGUOUS, "neither answer affirmed")),
    ("Neither correct nor incorrect.", "correct/incorrect", (Reason.AMBIGUOUS, "neither answer affirmed")),
    ("It's neither true nor false.", "true/false", (Reason.AMBIGUOUS, "neither answer affirmed")),
    ("Not bad - correct", "correct/incorrect", True),
    ("It isn't wrong - it's correct.", "correct/incorrect", True),
    ("It's not incorrect - it's correct", "correct/incorrect", True),
    ("Not acceptable - the verb is wrong.", "acceptable/unacceptable", False),
    ("Not correct - incorrect.", "correct/incorrect", False),
    ("It is never acceptable.", "acceptable/unacceptable", False),
    ("I don't think it's correct - incorrect.", "correct/incorrect", False),
    ("No - it isn't acceptable.", None, False),
    ("Yes - it is acceptable.", None, True),
    ("Definitely not correct.", "correct/incorrect", False),
    ("Hardly acceptable.", "acceptable/unacceptable", False),
    ("It's not really acceptable.", "acceptable/unacceptable", False),
    ("This usage is not unacceptable - it is fine.", "acceptable/unacceptable", True),
]


@pytest.mark.parametrize(("text", "family", "expected"), YES_NO_NEGATIONS)
def test_neither_nor_and_dashes_in_yes_no(text: str, family: str | None, expected: Any) -> None:
    expect(parse_yes_no(text, family), expected)


# -- none of the above, in other words ---------------------------------------------------------------------------

NONE_IN_OTHER_WORDS = [
    "The answer is not listed.",
    "The correct answer isn't listed.",
    "Not listed.",
    "The answer isn't among the choices.",
    "The correct answer is not among the options.",
    "The correct one is not among the options given.",
    "It is not among the choices.",
    "It's not one of the options.",
    "The right answer is not one of these options.",
    "Neither option is correct.",
    "Neither choice fits.",
    "Neither of the options is right.",
    "None of the options.",
    "None of the answer choices is correct.",
    "None of the given choices apply.",
    "No option is correct.",
    "No option fits the question.",
    "There is no correct option.",
    "All of the options are wrong.",
    "All the choices are incorrect.",
    "Every option is wrong.",
    "Not any of the options.",
    "The correct answer is missing from the options.",
    "The answer is not in the list.",
    "Answer: not listed",
    "It's not there.",
    "The answer is not given.",
    "That is not among the options.",
    "Honestly, the answer is not here.",
    "The right answer isn't among those choices.",
]


@pytest.mark.parametrize("text", NONE_IN_OTHER_WORDS)
def test_none_of_them_in_other_words_for_letters(text: str) -> None:
    expect(parse_letter(text, FOOD), (Reason.NONE_OF_THEM, "no option offered for it"))  # no such option
    expect(parse_letter(text, FOOD_NOTA), "D")  # the none-of-them option, last
    expect(parse_letter(text, FOOD_NOTA, mode="strict"), NS)  # not an explicit letter
    expect(parse_yes_no(text), (Reason.NONE_OF_THEM, "says no option fits"))  # no yes, no no


@pytest.mark.parametrize("text", [
    "None of the intents fit.",
    "The correct label is not listed.",
    "It's not among the labels.",
    "Neither label applies.",
    "No intent matches.",
    "The intent is not in the list.",
    "None of the categories.",
    "None of these labels apply.",
    "All of the labels are wrong.",
    "The right intent is missing from the list.",
])
def test_none_of_them_in_other_words_for_labels(text: str) -> None:
    expect(parse_label(text, INTENTS), (Reason.NONE_OF_THEM, "no label offered for it"))
    expect(parse_label(text, INTENTS_NOTA), 3)


@pytest.mark.parametrize(("text", "expected"), [
    ("None of the options except B", "B"),
    ("B isn't listed under fruits, but it is one: B.", "B"),
    ("A is not among the options I would pick; C.", "C"),
    ("Option C: incorrect, it is not in the list of fruits. B.", "B"),
])
def test_what_is_not_none_of_them(text: str, expected: str) -> None:
    expect(parse_letter(text, FOOD_NOTA), expected)


@pytest.mark.parametrize(("text", "family", "expected"), [
    ("Yes, none of these words is misused.", None, True),
    ("The sentence is acceptable since none of them clash.", None, True),
    ("No, none of them is correct.", "yes/no", False),
    ("None.", "yes/no", Reason.NONE_OF_THEM),
    ("Neither.", None, Reason.NONE_OF_THEM),
    ("None of the options is correct.", "correct/incorrect", Reason.NONE_OF_THEM),
])
def test_none_of_them_in_yes_no(text: str, family: str | None, expected: Any) -> None:
    expect(parse_yes_no(text, family), expected)


# -- colloquial yes and no; Chinese and Japanese ------------------------------------------------------------------

COLLOQUIAL = [
    ("Yep", True), ("Yep.", True), ("Yup!", True), ("Yeah", True), ("Yeah, it's fine.", True), ("Yea", True),
    ("Uh-huh", True), ("Uh-huh.", True), ("Mm-hmm", True), ("Mhm", True), ("**Yep**", True),
    ("Answer: yep", True), ("The answer is: yup.", True), ("yep, the sentence reads naturally", True),
    ("Nope", False), ("Nope.", False), ("Nah", False), ("Nah, that's wrong.", False), ("Uh-uh", False),
    ("Nuh-uh.", False), ("NOPE", False), ("Answer: nope", False), ("The answer is: nope.", False),
    ("Nope, not correct.", False), ("nah - it doesn't fit", False),
]


@pytest.mark.parametrize("family", [None, "yes/no"])
@pytest.mark.parametrize(("text", "expected"), COLLOQUIAL)
def test_colloquial_yes_and_no(text: str, expected: bool, family: str | None) -> None:
    expect(parse_yes_no(text, family), expected)


def test_colloquial_words_are_not_another_family() -> None:
    expect(parse_yes_no("Yep", "correct/incorrect"), Reason.NOT_FOUND)
    expect(parse_yes_no("Nope", "acceptable/unacceptable"), Reason.NOT_FOUND)


CJK_YES_NO = [
    ("不", "yes/no", False), ("不。", "yes/no", False), ("不是", "yes/no", False), ("不是的", "yes/no", False),
    ("是的", "yes/no", True), ("是", "yes/no", True), ("对", "yes/no", True), ("对的", "yes/no", True),
    ("没错", "yes/no", True), ("不对", "yes/no", False), ("没有", "yes/no", False), ("否", "yes/no", False),
    ("不，这句话不对。", "yes/no", False), ("是的，这个用法是正确的。", "yes/no", True),
    ("答案：否", "yes/no", False), ("答案是：是", "yes/no", True), ("答案是 否", None, False),
    ("いいえ", "yes/no", False), ("はい", "yes/no", True), ("いいえ、違います。", "yes/no", False),
    ("はい、正しいです。", "yes/no", True), ("ええ", "yes/no", True), ("ううん", "yes/no", False),
    ("うん", "yes/no", True), ("違います", "yes/no", False), ("そうです", "yes/no", True),
    ("回答：いいえ", "yes/no", False), ("不", None, False), ("はい", None, True),
    ("正确", "correct/incorrect", True), ("错误", "correct/incorrect", False), ("错", "correct/incorrect", False),
    ("对", "correct/incorrect", True), ("不对", "correct/incorrect", False), ("正しい", "correct/incorrect", True),
    ("間違い", "correct/incorrect", False), ("不正确", "correct/incorrect", False),
    ("这句话是对的吗？不好说", "yes/no", Reason.NOT_FOUND),
]


@pytest.mark.parametrize(("text", "family", "expected"), CJK_YES_NO)
def test_chinese_and_japanese_yes_and_no(text: str, family: str | None, expected: Any) -> None:
    expect(parse_yes_no(text, family), expected)


CJK_LETTERS = [
    ("所以选B", "B", "B"),
    ("答案是C", "C", "C"),
    ("正解はB", "B", "B"),
    ("所以答案选B。", "B", "B"),
    ("故选：B", "B", "B"),
    ("故选B", "B", "B"),
    ("因此选D。", "D", "D"),
    ("综上所述，选A。", "A", "A"),
    ("答案应该是B。", "B", "B"),
    ("正确答案：C", "C", "C"),
    ("答えはDです。", "D", "D"),
    ("答えはおそらくBです。", "B", "B"),
    ("最终答案：A", "A", "A"),
    ("正解は C です。", "C", "C"),
    ("A和B都不对，所以选C。", "C", "C"),
    ("选项A是错误的，答案是D。", "D", "D"),
    ("Aは間違いです。正解はC。", "C", "C"),
    ("排除A和B，答案是C。", "C", "C"),
    ("A、B、C都不对，所以选D", "D", "D"),
    ("不是A、B或C，所以选D", "D", "D"),
    ("A是错的，B也是错的，所以选C", "C", "C"),
    ("不是A，是C。", "C", NS),
    ("Aではなく、Bが正解です。", "B", NS),
    ("我不选A，选B。", "B", NS),
    ("我选B", "B", NS),
    ("B是正确的", "B", NS),
    ("选项C正确。", "C", NS),
    ("答案不是A，而是D。", "D", NS),
    ("AとCは間違いで、Bが正しい。", "B", NS),
    ("A还是C？不确定。", (Reason.AMBIGUOUS, "choices only weighed"), NS),
]


@pytest.mark.parametrize(("text", "mode", "expected"), in_both_modes(CJK_LETTERS))
def test_chinese_and_japanese_choices(text: str, mode: str, expected: Any) -> None:
    expect(parse_letter(text, FOOD, mode=mode), expected)  # type: ignore[arg-type]


# -- never another choice ------------------------------------------------------------------------------------------

LETTER_FAMILIES = RULED_OUT_THEN_AFFIRMED + ECHOES + NEGATED_LISTS + CJK_LETTERS


def test_strict_mode_reads_no_other_letter_than_lenient_mode() -> None:
    """Where strict mode reads a letter, lenient mode reads the same one: strict is lenient with less guessing."""
    for text, _, _ in LETTER_FAMILIES:
        strict = parse_letter(text, FOOD, mode="strict")
        if strict.valid:
            assert parse_letter(text, FOOD) == strict, text


def test_the_families_hold_enough_cases() -> None:
    sizes = {
        "ruled out, then affirmed": len(RULED_OUT_THEN_AFFIRMED) + len(LABELS_RULED_OUT),
        "options echoed": len(ECHOES),
        "adverbs": len(ADVERBS) + len(YES_NO_ADVERBS),
        "negation scope": len(NEGATED_LISTS) + len(YES_NO_NEGATIONS),
        "none of them in other words": len(NONE_IN_OTHER_WORDS),
        "colloquial, Chinese and Japanese": len(COLLOQUIAL) + len(CJK_YES_NO) + len(CJK_LETTERS),
    }
    assert min(sizes.values()) >= 25 and sum(sizes.values()) >= 200, sizes


# -- the why of an unreadable answer, in its result line -----------------------------------------------------------

def test_parsed_says_why_without_changing_the_verdict() -> None:
    echoed = parse_letter("A. carrot\nB. apple\nC. potato\nD. onion", FOOD)
    assert echoed == Parsed(None, Reason.NOT_FOUND)  # the why is no part of the verdict
    assert echoed.why == "not_found: options echoed"
    assert Parsed(None, Reason.REFUSAL).why == "refusal" and Parsed(2).why is None


async def test_the_result_line_says_why_an_answer_is_unreadable(tmp_path: Path, fake_provider: Any) -> None:
    rows = write_rows(tmp_path / "rows.jsonl", 5)
    job = load_job(write_job(tmp_path / "job.yaml", rows, models=["fake:m1"]))

    answers = ["", "(C) and (D) are wrong, so B", "The answer is B or maybe C.", "The correct answer is not listed.",
               "A, B, C and D are all wrong."]

    def reply(model: str, messages: list[dict[str, str]], params: dict[str, Any], n: int) -> Completion:
        prompt = messages[-1]["content"]
        number = int(prompt.split("Question number ")[1].split(":")[0])
        echo = "\n".join(line for line in prompt.splitlines() if line[:3] in ("A. ", "B. ", "C. ", "D. "))
        return Completion(text=answers[number] or echo, input_tokens=20, output_tokens=5)

    fake_provider.behaviour = reply
    outcome = await execute(job, open_store(tmp_path / "s.sqlite"))
    lines = [json.loads(line) for line in outcome.results["mc"].read_text().splitlines()]
    by_answer = {answers.index(line["response"]) if line["response"] in answers else 0: line for line in lines}
    assert len(lines) == 5 and by_answer[1]["valid"] is True and by_answer[1]["answer_letter"] == "B"
    assert {n: (line["valid"], line["invalid_reason"], line["score"]) for n, line in by_answer.items() if n != 1} == {
        0: (False, "not_found: options echoed", 0.0),
        2: (False, "ambiguous: two choices stated", 0.0),
        3: (False, "none_of_them: no option offered for it", 0.0),
        4: (False, "not_found: negated every option", 0.0),
    }
