"""Answers in the styles real models write, read as a careful human grader reads them.

The cases are data, in tests/data/answers/*.jsonl, one answer a line, each with the grader's reading:
``expected`` is the value (a letter for letters, a label's name for labels, ``true``/``false`` for yes/no and
none-of-them, an integer for ratings, a list of letters for letter sets) or ``{"invalid": "<reason>"}``.
``mode`` is ``lenient`` (the default), ``strict`` or ``both``; ``options``/``labels`` (``"bank77"``: the bundled
Bank-77 intents), ``family``, ``low``/``high`` are what the parser is given. A case with ``misreading`` is one of
the misreadings a new user found (issue 21): each has a named test below.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runner.evaluate.parse import Parsed, Reason, parse_answer
from runner.plan.choices import LETTERS

HERE = Path(__file__).resolve().parents[1]
ANSWERS = HERE / "data" / "answers"
BANK77 = json.loads((HERE.parent / "runner" / "bundled" / "data" / "knowno" / "bank77_labels.json").read_text("utf-8"))
KIND = {
    "letters.jsonl": "letter",
    "letter_sets.jsonl": "letters",
    "yes_no.jsonl": "yes_no",
    "scale.jsonl": "scale",
    "labels.jsonl": "label",
    "none_of_them.jsonl": "none_of_them",
}
FIELDS = {"name", "answer", "expected", "options", "labels", "mode", "family", "low", "high", "misreading", "note"}
REASONS = {value for name, value in vars(Reason).items() if name.isupper()}
MISREADINGS = {
    "letter-negation", "letter-weighing", "letter-article", "letter-chain-of-thought", "letter-json", "letter-thinking",
    "letter-chinese", "yes-no-hedge", "yes-no-no-issues", "yes-no-yes-and-no", "scale-range-statement",
    "label-spelling", "label-reasoning",
}


@dataclass(frozen=True)
class Case:
    file: str
    line: int
    data: dict[str, Any]

    @property
    def id(self) -> str:
        return f"{self.file.removesuffix('.jsonl')}:{self.data['name']}"

    @property
    def modes(self) -> list[str]:
        mode = self.data.get("mode", "lenient")
        return ["lenient", "strict"] if mode == "both" else [mode]

    @property
    def options(self) -> list[str]:
        names = self.data.get("options", self.data.get("labels", []))
        return BANK77 if names == "bank77" else names

    def read(self, mode: str) -> Parsed:
        kind = KIND[self.file]
        extra = {k: self.data[k] for k in ("low", "high", "family") if k in self.data}
        return parse_answer(self.data["answer"], kind, options=self.options, mode=mode, **extra)  # type: ignore[arg-type]

    def wanted(self) -> Parsed:
        expected = self.data["expected"]
        if isinstance(expected, dict):
            return Parsed(None, expected["invalid"])
        kind = KIND[self.file]
        if kind == "letter":
            return Parsed(LETTERS.index(expected))
        if kind == "letters":
            return Parsed(tuple(sorted(LETTERS.index(letter) for letter in expected)))
        if kind == "label":
            return Parsed(self.options.index(expected))
        return Parsed(expected)


def load() -> list[Case]:
    cases = []
    for path in sorted(ANSWERS.glob("*.jsonl")):
        for number, line in enumerate(path.read_text("utf-8").splitlines(), 1):
            if line.strip():
                cases.append(Case(path.name, number, json.loads(line)))
    return cases


CASES = load()
RUNS = [(case, mode) for case in CASES for mode in case.modes]


def test_the_case_files_are_well_formed() -> None:
    assert set(KIND) == {path.name for path in ANSWERS.glob("*.jsonl")}
    assert len(CASES) >= 150
    assert len({case.id for case in CASES}) == len(CASES), "case names repeat within a file"
    for case in CASES:
        where = f"{case.file}:{case.line}"
        assert set(case.data) <= FIELDS and {"name", "answer", "expected"} <= set(case.data), where
        assert case.data.get("mode", "lenient") in ("lenient", "strict", "both"), where
        assert case.data.get("misreading", "letter-negation") in MISREADINGS, where
        if isinstance(case.data["expected"], dict):
            assert case.data["expected"]["invalid"] in REASONS, where
    assert {case.data["misreading"] for case in CASES if "misreading" in case.data} == MISREADINGS


@pytest.mark.parametrize(("case", "mode"), RUNS, ids=[f"{case.id}[{mode}]" for case, mode in RUNS])
def test_answer_is_read_as_the_grader_read_it(case: Case, mode: str) -> None:
    assert case.read(mode) == case.wanted(), case.data["answer"]


def test_the_set_covers_both_modes_and_every_kind() -> None:
    assert {KIND[case.file] for case in CASES} == set(KIND.values())
    strict = [case for case, mode in RUNS if mode == "strict"]
    assert len(strict) >= 30
    assert any(case.wanted().valid for case in strict) and any(not case.wanted().valid for case in strict)


# -- one named test per misreading found (issue 21); each also runs above, with the rest of its file ---------------


def check(misreading: str) -> None:
    tagged = [case for case in CASES if case.data.get("misreading") == misreading]
    assert tagged, misreading
    wrong = [(case.data["answer"], case.read(mode), case.wanted()) for case in tagged for mode in case.modes
             if case.read(mode) != case.wanted()]
    assert not wrong


def test_a_negated_letter_is_not_the_answer() -> None:
    check("letter-negation")  # "not A, it is C" -> C


def test_letters_only_weighed_are_not_the_answer() -> None:
    check("letter-weighing")  # "A or C? ... I'd go with C" -> C; "between B and D, D" -> D


def test_the_article_a_is_no_letter() -> None:
    check("letter-article")  # "A careful reading shows the answer is C" -> C


def test_chain_of_thought_is_read_to_its_final_letter() -> None:
    check("letter-chain-of-thought")  # "Option A is wrong... B is too narrow... Therefore the answer is D" -> D


def test_json_reasoning_before_the_answer_field() -> None:
    check("letter-json")  # {"reasoning": "A seems...", "answer": "C"} -> C


def test_thinking_is_removed_before_reading() -> None:
    check("letter-thinking")  # <think>I think B... wait, actually C</think> Answer: C -> C


def test_a_letter_right_after_chinese_text() -> None:
    check("letter-chinese")  # 答案是C -> C, 正确答案：B -> B


def test_a_yes_no_hedge_is_ambiguous() -> None:
    check("yes-no-hedge")  # "it could be yes or no, hard to say" -> invalid (ambiguous)


def test_no_issues_is_not_a_no() -> None:
    check("yes-no-no-issues")  # "no issues, it is acceptable" -> acceptable


def test_yes_and_no_is_ambiguous() -> None:
    check("yes-no-yes-and-no")  # "yes and no" -> invalid (ambiguous)


def test_the_scale_is_not_the_rating() -> None:
    check("scale-range-statement")  # "on a scale of 0 to 10, I'd give it 6" -> 6


def test_labels_match_across_british_and_american_spelling() -> None:
    check("label-spelling")  # card_payment_not_recognized -> card_payment_not_recognised


def test_a_label_named_in_reasoning_before_the_final_one() -> None:
    check("label-reasoning")  # "It's not card_linking; the intent is card_arrival" -> card_arrival
