"""The seed papers' prompt templates, rendered through runner.plan.prompts with the real data rows.

NewTerm (prompts/newterm/{coma,cost,csj}.yaml) must reproduce, character for character, the prompts of the
released evaluation code (github.com/hexuandeng/NewTerm, newterm/utils.py build_prompt, Gold prefix from
newterm/evaluation.py); ``_reference`` below restates those prompt strings as data. Know-No
(prompts/knowno/{mctest,bank77}.yaml) must show the appendix A.2 wording, every option, "none-of-them" only in
the two hint styles and "Your answer:" last. The Know-No data files must be the released bytes.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import jinja2
import pytest

from runner.plan.choices import LETTERS, options_block, permutation
from runner.plan.prompts import Prompt, load_prompt
from runner.spec.job import Job
from tests.helpers import ROOT

NEWTERM = ROOT / "data" / "newterm"
KNOWNO = ROOT / "data" / "knowno"
SEED_KNOWNO = ROOT.parent / "shared" / "seed-data" / "Know-No" / "data"
TEMPLATES = (0, 1, 2)
SETTINGS = ("base", "gold")
STYLES = ("with_gold", "hint_option", "hint_instruction", "no_hint")
NONE = "none-of-them"
SEEDS = (0, 1, 2)


@pytest.fixture
def load(monkeypatch: pytest.MonkeyPatch):
    """Load a template by name as a job in jobs/ would, from the project root."""
    monkeypatch.chdir(ROOT)
    job = Job.model_construct(name="paper-prompts", stages=[], base_dir=str(ROOT / "jobs"))

    def _load(name: str) -> Prompt:
        return load_prompt(job, name)

    return _load


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _context(row: dict[str, Any], variant: dict[str, Any], options: list[str] | None = None) -> dict[str, Any]:
    """The render context the engine builds (runner/plan/stage.py): row fields, ``row``, variant values, options."""
    context = dict(row)
    context["row"] = row
    context.update(variant)
    if options is not None:
        context.update(options=options, letters=LETTERS[: len(options)])
        if len(options) <= len(LETTERS):  # options_block letters only A-Z; Bank-77's template uses neither
            context["options_block"] = options_block(options)
    return context


def _render(prompt: Prompt, context: dict[str, Any]) -> tuple[str | None, str]:
    messages = prompt.render(context)
    for message in messages:
        for marker in ("{{", "}}", "{%", "%}", "{#", "must_be"):
            assert marker not in message["content"], (marker, message["content"])
    if messages[0]["role"] == "system":
        return messages[0]["content"], messages[1]["content"]
    return None, messages[0]["content"]


# ---------------------------------------------------------------------------------------------------- NewTerm

MC_SYSTEM = (
    'Please answer the following question by printing exactly one option from "A", "B", "C", "D", without explanation.'
)
CSJ_SYSTEM = [
    'Please answer the following question by printing "YES" or "NO", without explanation.',
    'Please answer the following question by printing "Correct" or "Incorrect", without explanation.',
    'Please answer the following question by printing "Acceptable" or "Unacceptable", without explanation.',
]
CSJ_ASK = [
    'Does the following sentence coherent and align with general understanding? Please answer "YES" or "NO".',
    "Is this example in line with commonsense and grammatically correct?",
    'The following sentence is either "Acceptable", meaning it fits the commonsense, or "Unacceptable". Which is it?',
]


def _reference(task: str, row: dict[str, Any], template: int, setting: str, options: list[str]) -> tuple[str, str]:
    """The released code's (system, user) prompt for one row, with ``options`` in shown order."""
    q = row["question"]
    listed = "".join(f"\n{LETTERS[i]}. {o}" for i, o in enumerate(options))
    if task == "COMA":
        system = MC_SYSTEM
        cause = row["split"] == "cause"
        head = [
            f"Exercise: choose the most plausible alternative.\n\n{q} {'because' if cause else 'so'}...",
            f"{q}\n\nI am hesitating among these options. Help me choose the more likely {row['split']}:",
            f"{q} {'This happened because' if cause else 'As a consequence'}...\n"
            "Help me pick the more plausible option:",
        ][template]
        user = head + listed + "\nAnswer: "
    elif task == "COST":
        system = MC_SYSTEM
        a, b, c, d = options
        user = [
            f"{q}\nReplace the _ in the above sentence with the correct option:{listed}\nAnswer: ",
            f"{q}In the previous sentence, does _ refer to A. {a}, B. {b}, C. {c}, or D. {d}?\nAnswer: ",
            f"Fill in the _ in the below sentence:\n{q}\nChoices:{listed}\nAnswer: ",
        ][template]
    else:
        system = CSJ_SYSTEM[template]
        user = [
            f"{CSJ_ASK[0]}\n{q}\nAnswer: ",
            f"{q}\n{CSJ_ASK[1]}\nAnswer: ",
            f"{CSJ_ASK[2]}\n{q}\nAnswer: ",
        ][template]
    if setting == "gold":
        system = f'Given that "{row["term"]}" means "{row["meaning"]}". ' + system
    return system, user


@pytest.mark.parametrize("year", ["2022", "2023"])
@pytest.mark.parametrize("task", ["COMA", "COST", "CSJ"])
def test_newterm_templates_reproduce_the_released_code_for_every_clean_row(load, task, year):
    prompt = load(f"newterm/{task.lower()}")
    rows = _rows(NEWTERM / f"benchmark_{year}" / f"{task}_clean.jsonl")
    assert rows
    for line_no, row in enumerate(rows, 1):
        for template in TEMPLATES:
            for setting in SETTINGS:
                variant = {"seed": 0, "template": template, "setting": setting}
                options = None if task == "CSJ" else [row["choices"][i] for i in permutation(4, str(line_no), 0)]
                got = _render(prompt, _context(row, variant, options))
                assert got == _reference(task, row, template, setting, options or []), (line_no, template, setting)


def _first(task: str, **match: Any) -> dict[str, Any]:
    return next(r for r in _rows(NEWTERM / "benchmark_2023" / f"{task}_clean.jsonl") if match.items() <= r.items())


KEY_PHRASES = {
    ("COMA", 0): ["Exercise: choose the most plausible alternative.\n\n"],
    ("COMA", 1): ["\n\nI am hesitating among these options. Help me choose the more likely "],
    ("COMA", 2): ["Help me pick the more plausible option:\n"],
    ("COST", 0): ["\nReplace the _ in the above sentence with the correct option:\n"],
    ("COST", 1): ["In the previous sentence, does _ refer to A. "],
    ("COST", 2): ["Fill in the _ in the below sentence:\n", "\nChoices:\n"],
    ("CSJ", 0): [CSJ_ASK[0] + "\n"],
    ("CSJ", 1): [f"\n{CSJ_ASK[1]}\n"],
    ("CSJ", 2): [CSJ_ASK[2] + "\n"],
}


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("template", TEMPLATES)
@pytest.mark.parametrize(
    "task, match",
    [
        ("COMA", {"split": "cause"}),
        ("COMA", {"split": "effect"}),
        ("COST", {}),
        ("CSJ", {"gold": True}),
        ("CSJ", {"gold": False}),
    ],
)
@pytest.mark.parametrize("seed", SEEDS)
def test_newterm_key_phrases_options_and_gold_prefix(load, task, match, template, setting, seed):
    row = _first(task, **match)
    options = None if task == "CSJ" else [row["choices"][i] for i in permutation(4, "7", seed)]
    system, user = _render(
        load(f"newterm/{task.lower()}"),
        _context(row, {"seed": seed, "template": template, "setting": setting}, options),
    )

    assert row["question"] in user
    for phrase in KEY_PHRASES[task, template]:
        assert phrase in user
    assert user.endswith("\nAnswer: ")
    assert system.endswith(CSJ_SYSTEM[template] if task == "CSJ" else MC_SYSTEM)
    assert system.startswith('Given that "') == (setting == "gold")
    if setting == "gold":
        assert system.startswith(f'Given that "{row["term"]}" means "{row["meaning"]}". Please answer')
    if task == "COMA":
        cause = row["split"] == "cause"
        if template == 0:
            assert f"{row['question']} {'because' if cause else 'so'}...\n" in user
        if template == 1:
            assert user.count(f"Help me choose the more likely {row['split']}:\n") == 1
        if template == 2:
            assert f"{row['question']} {'This happened because' if cause else 'As a consequence'}...\n" in user
    if options is not None:
        for letter, option in zip("ABCD", options, strict=True):
            if (task, template) == ("COST", 1):  # inline: "A. x, B. y, C. z, or D. w?"
                assert f"{'or ' if letter == 'D' else ''}{letter}. {option}{'?' if letter == 'D' else ','}" in user
            else:
                assert f"\n{letter}. {option}\n" in user


def test_coma_template_0_base_is_the_quickstart_template(load):
    combined, quickstart = load("newterm/coma"), load("newterm/coma-exercise")
    for line_no, row in enumerate(_rows(NEWTERM / "benchmark_2023" / "COMA_clean.jsonl"), 1):
        options = [row["choices"][i] for i in permutation(4, str(line_no), 1)]
        assert combined.render(_context(row, {"seed": 1, "template": 0, "setting": "base"}, options)) == (
            quickstart.render(_context(row, {"seed": 1}, options))
        )


@pytest.mark.parametrize("task", ["COMA", "COST", "CSJ"])
def test_newterm_refuses_unknown_variant_values_and_missing_variables(load, task):
    prompt = load(f"newterm/{task.lower()}")
    row = _first(task)
    options = None if task == "CSJ" else row["choices"]
    for variant, name in [
        ({"template": 3, "setting": "base"}, "template_must_be_0_1_or_2"),
        ({"template": "0", "setting": "base"}, "template_must_be_0_1_or_2"),
        ({"template": 0, "setting": "Gold"}, "setting_must_be_base_or_gold"),
        ({"template": 0}, "setting"),
        ({"setting": "gold"}, "template"),
    ]:
        with pytest.raises(jinja2.UndefinedError, match=name):
            prompt.render(_context(row, {"seed": 0, **variant}, options))


# ---------------------------------------------------------------------------------------------------- Know-No

MCTEST_TASK = (
    "Task: Given the story and an associated question, please return the correct option for the question "
    "without explanation"
)
BANK77_TASK = (
    "Task: You are going to perform an intent classification task. Given an utterance and multiple intent class "
    "options, return the correct intent class name only"
)
HINT = ', or return "none-of-them" if you believe none of the options is correct'


def _knowno_options(original: list[str], gold: str, row_id: str, seed: int, style: str) -> list[str]:
    """What the engine shows: a seeded shuffle, the gold removed unless with_gold, "none-of-them" appended last
    for hint_option."""
    shown = [original[i] for i in permutation(len(original), row_id, seed)]
    if style != "with_gold":
        shown = [o for o in shown if o != gold]
    return [*shown, NONE] if style == "hint_option" else shown


def _mctest_rows(stories: int) -> list[dict[str, Any]]:
    """MC-Test rows as the engine explodes them: one per question, {id, story, question, options, gold_option}."""
    rows = []
    for story in _rows(KNOWNO / "MCTest_1000.jsonl")[:stories]:
        for q in story["question_list"]:
            rows.append({"id": story["id"], "story": story["story"], **q})
    return rows


def _bank77_labels() -> list[str]:
    return json.loads((KNOWNO / "bank77_labels.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("style", STYLES)
def test_knowno_mctest_styles(load, style, seed):
    prompt = load("knowno/mctest")
    for n, row in enumerate(_mctest_rows(5)):
        options = _knowno_options(row["options"], row["gold_option"], f"{row['id']}#{n}", seed, style)
        system, user = _render(prompt, _context(row, {"seed": seed, "style": style}, options))
        assert system is None
        task, story, rest = user.split("\n", 2)
        assert task == MCTEST_TASK + (HINT if style == "hint_instruction" else "") + "."
        assert story == f"Story: {row['story']}"
        assert rest.startswith(f"\nQuestion:\n{row['question']}\nOptions:\n")
        shown = rest.split("\nOptions:\n", 1)[1].split("\n")
        assert shown[-1] == "Your answer:" and user.endswith("\nYour answer:")
        assert shown[:-1] == [f"{letter}: {option}" for letter, option in zip(LETTERS, options, strict=False)]
        assert len(shown) - 1 == {"with_gold": 4, "hint_option": 4}.get(style, 3)
        assert (row["gold_option"] in [line.split(": ", 1)[1] for line in shown[:-1]]) == (style == "with_gold")
        assert (NONE in user) == (style in ("hint_option", "hint_instruction"))
        if style == "hint_option":
            assert shown[-2] == f"D: {NONE}"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("style", STYLES)
def test_knowno_bank77_styles_list_every_intent(load, style, seed):
    prompt = load("knowno/bank77")
    labels = _bank77_labels()
    for line_no, row in enumerate(_rows(KNOWNO / "Bank77_1000.jsonl")[:25], 1):
        options = _knowno_options(labels, row["label_text"], str(line_no), seed, style)
        system, user = _render(prompt, _context(row, {"seed": seed, "style": style}, options))
        assert system is None
        lines = user.split("\n")
        assert lines[0] == BANK77_TASK + (HINT if style == "hint_instruction" else "") + "."
        assert lines[1] == f"Utterance: {row['text']}"
        assert lines[2].startswith("Intent Class Options: ")
        shown = lines[2].removeprefix("Intent Class Options: ").split(", ")
        assert shown == options
        assert lines[3:] == ["Your answer:"]
        assert len(shown) == (77 if style in ("with_gold", "hint_option") else 76)
        assert (row["label_text"] in shown) == (style == "with_gold")
        assert set(shown) - {NONE} <= set(labels)
        assert (NONE in user) == (style in ("hint_option", "hint_instruction"))
        if style == "hint_option":
            assert shown[-1] == NONE


@pytest.mark.parametrize("name", ["knowno/mctest", "knowno/bank77"])
def test_knowno_refuses_unknown_style(load, name):
    row = _mctest_rows(1)[0] if name == "knowno/mctest" else _rows(KNOWNO / "Bank77_1000.jsonl")[0]
    options = row["options"] if name == "knowno/mctest" else _bank77_labels()
    for variant, match in [({"style": "hint"}, "style_must_be"), ({}, "style")]:
        with pytest.raises(jinja2.UndefinedError, match=match):
            load(name).render(_context(row, {"seed": 0, **variant}, options))


@pytest.mark.parametrize("name", ["newterm/coma", "newterm/cost", "newterm/csj", "knowno/mctest", "knowno/bank77"])
def test_every_template_names_its_paper_and_table(load, name):
    source = load(name).source
    assert source and ("Table 1" in source if name.startswith("newterm") else "Table 2" in source)
    assert ("build_prompt" in source) == name.startswith("newterm")
    assert "appendix A.2" in source or name.startswith("newterm")


# ---------------------------------------------------------------------------------------------------- data


def _recorded_sha1() -> dict[str, str]:
    text = (KNOWNO / "SOURCES.md").read_text(encoding="utf-8")
    return {m[1]: m[2] for m in re.finditer(r"^\| ([\w.]+)(?: \(derived\))? \|.*?\| ([0-9a-f]{40}) \|", text, re.M)}


@pytest.mark.parametrize(
    "name, seed_path, lines",
    [("MCTest_1000.jsonl", "MCTest/MCTest_1000.jsonl", 250), ("Bank77_1000.jsonl", "Bank77/Bank77_1000.jsonl", 1000)],
)
def test_knowno_data_is_the_released_bytes(name, seed_path, lines):
    data = (KNOWNO / name).read_bytes()
    assert data.count(b"\n") == lines
    # Always against the sha1 recorded in SOURCES.md, and byte for byte against the seed data when this
    # checkout sits next to ../shared (a user's clone does not).
    assert hashlib.sha1(data).hexdigest() == _recorded_sha1()[name]
    if SEED_KNOWNO.is_dir():
        assert data == (SEED_KNOWNO / seed_path).read_bytes()


def test_bank77_labels_are_derived_from_the_data():
    rows = _rows(KNOWNO / "Bank77_1000.jsonl")
    names: dict[int, set[str]] = {}
    for row in rows:
        names.setdefault(row["label"], set()).add(row["label_text"])
    assert sorted(names) == list(range(77)) and all(len(v) == 1 for v in names.values())
    derived = [next(iter(names[i])) for i in range(77)]
    raw = (KNOWNO / "bank77_labels.json").read_bytes()
    assert raw == (json.dumps(derived, indent=1, ensure_ascii=False) + "\n").encode()
    assert hashlib.sha1(raw).hexdigest() == _recorded_sha1()["bank77_labels.json"]
