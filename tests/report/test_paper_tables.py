"""The papers' tables as the report lays them out (runner/report/layouts.py), checked against the papers' own figures
and settings: Know-No's E[A w/o] and OmniAccuracy (Table 3) and WinoDict's Original columns (Tables 2 and 3)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runner.plan.stage import StagePlan
from runner.recipes import Context
from runner.recipes import winodict as wd
from runner.report import layouts
from runner.spec.job import load_job
from tests.helpers import ROOT

# -- Know-No Table 3 ------------------------------------------------------------------------------------------------

#: Know-No (Xu et al., 2024) Table 3, MC-Test, in percent: A w/ gold; hint as option, hint in instruction, no hint;
#: then the paper's E[A w/o] and OmniAccuracy. Its "GPT-4" is gpt-4o-2024-05-13 (appendix: model versions).
MCTEST = {
    "GPT-4": ((98.67, 80.17, 80.40, 41.30), (67.29, 82.98)),
    "Claude3": ((98.26, 49.83, 62.17, 60.30), (57.43, 77.85)),
    "Llama3": ((94.23, 43.10, 3.83, 50.10), (32.34, 63.29)),
    "Gemma": ((39.0, 4.33, 15.26, 15.90), (11.83, 25.41)),
    "Mistral": ((87.53, 39.97, 30.27, 33.60), (34.61, 61.07)),
    "Human": ((100.00, 96.00, 97.00, 93.00), (95.33, 97.67)),
}


def figures(values: tuple[float, ...], styles: tuple[str, ...] = layouts.KNOWNO_STYLES) -> dict[str, Any]:
    return {style: {"mean": value / 100, "std": None, "seeds": 3, "n": 300}
            for style, value in zip(styles, values, strict=True)}


@pytest.mark.parametrize("model", list(MCTEST))
def test_the_formula_gives_table_3_from_its_own_inputs(model: str) -> None:
    inputs, (expected, omni) = MCTEST[model]
    row = layouts.knowno_row(model, figures(inputs), {})
    # the paper prints two decimals (Gemma's OmniAccuracy 25.415 as 25.41): within half a hundredth and a bit
    assert 100 * row["E[A w/o]"]["mean"] == pytest.approx(expected, abs=0.006)
    assert 100 * row["OmniAccuracy"]["mean"] == pytest.approx(omni, abs=0.006)
    assert "scored_no_gold_mean" not in row


def test_without_the_no_hint_style_neither_cell_is_the_papers_figure() -> None:
    """GPT-4's two hint styles alone average 80.285 and give an "OmniAccuracy" of 89.48: printed under the paper's
    names they would read as Table 3's 67.29 / 82.98. The cells say n/a and why; the two-style mean is kept under
    its own key."""
    (with_gold, option, instruction, _), _ = MCTEST["GPT-4"]
    cells = figures((with_gold, option, instruction), layouts.KNOWNO_STYLES[:3])
    why = {"no_hint": "no-hint not judged (runner report RUN --judged JUDGE_RUN)"}
    row = layouts.knowno_row("GPT-4", cells, why)
    text = "n/a: no-hint not judged (runner report RUN --judged JUDGE_RUN)"
    assert row["E[A w/o]"] == row["OmniAccuracy"] == {"not_comparable": text}
    assert layouts.cell(row["E[A w/o]"]) == layouts.cell(row["OmniAccuracy"]) == text
    kept = row["scored_no_gold_mean"]
    assert kept["styles"] == ["hint_option", "hint_instruction"]
    assert 100 * kept["mean"] == pytest.approx((80.17 + 80.40) / 2)  # what the report used to print as E[A w/o]
    # a style the job does not have is named as such
    row = layouts.knowno_row("GPT-4", figures((with_gold, option), layouts.KNOWNO_STYLES[:2]), why)
    assert row["E[A w/o]"]["not_comparable"] == ("n/a: hint_instruction not scored; no-hint not judged (runner "
                                                 "report RUN --judged JUDGE_RUN)")


def test_every_text_format_prints_the_reason() -> None:
    (with_gold, option, instruction, _), _ = MCTEST["GPT-4"]
    row = layouts.knowno_row("GPT-4", figures((with_gold, option, instruction), layouts.KNOWNO_STYLES[:3]),
                             {"no_hint": "no-hint not judged (runner report R --judged JUDGE_RUN)"})
    data = {"columns": [*layouts.KNOWNO_STYLES, "E[A w/o]", "OmniAccuracy"], "rows": [row], "note": "n"}
    text = "n/a: no-hint not judged (runner report R --judged JUDGE_RUN)"
    assert layouts.render_text(data)[1].count(text) == 2
    assert layouts.render_text(data, markdown=True)[2].count(text) == 2
    assert "98.67" in layouts.render_text(data)[1] and "80.2" not in layouts.render_text(data)[1]


# -- WinoDict Tables 2 and 3 ------------------------------------------------------------------------------------------

#: the strings each of the paper's definition sentences holds (appendix B), by part of speech
DEFINITION_MARKS = ("The verb to ", "The word ", "The meaning of ")


def test_the_papers_setting_names() -> None:
    """WinoDict Table 3's rows: word type (Synthetic, Original) × prompt (Def Prefix, Def Suffix, Syn Prefix, Syn
    Suffix, Empty); Table 2's columns are Synthetic / Def Suffix ("WinoDict") and Original / Empty ("Original")."""
    assert layouts.winodict_setting("prob3_of_5", "definition_last") == (0, "WinoDict")
    assert layouts.winodict_setting("unchanged", "none") == (2, "Original")
    assert layouts.winodict_setting("unchanged", "definition_last") == (3, "Original Def Suffix")
    assert layouts.winodict_setting("unchanged", "definition_first")[1] == "Original Def Prefix"
    assert layouts.winodict_setting("prob1_of_5", "none")[1] == "WinoDict Empty"
    assert layouts.winodict_setting("prob1_of_5", "synonym_last")[1] == "WinoDict Syn Suffix"
    assert layouts.winodict_setting("unchanged", None)[1] == "Original (prompt not recorded)"
    assert set(layouts.WINODICT_PROMPTS) == set(wd.STRATEGIES)


@pytest.fixture
def eval_plans(tmp_path: Path) -> dict[str, list[Any]]:
    """The requests jobs/winodict-eval.yaml plans for the items the build recipe makes of four concept rows (two
    schemas), by stage."""
    with open(ROOT / "data" / "winodict" / "concepts.jsonl", encoding="utf-8") as lines:
        rows = [{**json.loads(line), "_id": json.loads(line)["id"]} for line in list(lines)[:4]]
    items = wd.items(rows, {}, Context(similarity=None, seed=0)).rows
    path = tmp_path / "winodict.jsonl"
    path.write_text("".join(json.dumps({k: v for k, v in item.items() if not k.startswith("_")}) + "\n"
                            for item in items), encoding="utf-8")
    job = load_job(ROOT / "jobs" / "winodict-eval.yaml", {"items": str(path), "model": "sim:lm",
                                                            "chat_model": "sim:chat"})
    return {"items": items, **{stage.name: list(StagePlan(job, stage)) for stage in job.stages}}


def test_the_original_without_a_definition_is_sent_without_one(eval_plans: dict[str, list[Any]]) -> None:
    items = {item["id"]: item for item in eval_plans["items"]}
    plain = [task for task in eval_plans["loglikelihood"] if task.row_id.endswith("-unchanged-none")]
    defined = [task for task in eval_plans["loglikelihood"] if task.row_id.endswith("-unchanged")]
    assert len(plain) == len(defined) == 4 * 3  # 4 twins x 0, 1 and 5 shots
    for task in plain:
        item = items[task.row_id]
        text = "".join(context + continuation for context, continuation in task.call.pairs or [])
        assert item["definition_sentence"] not in text
        assert not any(mark in text for mark in DEFINITION_MARKS), text
    for task in defined:  # the same twin, its definition scored after the sentence (Def Suffix)
        item = items[task.row_id]
        assert all(continuation.endswith(" " + item["definition_sentence"])
                   for _, continuation in task.call.pairs or [])
    chat = {task.row_id: task.call.messages[-1]["content"] for task in eval_plans["prompt_form"]}
    for row_id, prompt in chat.items():
        item = items[row_id]
        assert (item["definition_sentence"] in prompt) is (item["strategy"] != "none"), prompt
        assert item["sentence"] in prompt
