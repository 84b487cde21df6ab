"""A stage is scored only when its job names its gold (issue 21): a row field that happens to be called ``gold``
does not make a judge's verdicts or a rater's numbers right or wrong; validate and submit say so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.engine.run import execute
from runner.errors import JobFileError
from runner.providers.base import Completion
from runner.report import summary
from runner.spec.job import load_job
from runner.store import open_store
from tests.helpers import run_cli, write_rows


def _judge_job(tmp_path: Path, gold_line: str = "") -> Path:
    rows = tmp_path / "answers.jsonl"
    # what a judge reads: earlier answers whose own gold (an option index) is no verdict's gold
    rows.write_text("".join(json.dumps({"answer": f"answer {i}", "gold": i % 3}) + "\n" for i in range(6)))
    path = tmp_path / "judge.yaml"
    path.write_text("\n".join(line for line in [
        "name: judge", 'models: ["fake:m1"]', f"output_dir: {json.dumps(str(tmp_path / 'out'))}", "stages:",
        "  - name: judge", f"    dataset: {{path: {json.dumps(str(rows))}}}",
        "    prompt: {user: \"Is this answer right? {{ answer }}\"}", "    parse: yes_no", gold_line] if line) + "\n")
    return path


async def test_a_judge_stage_over_rows_with_a_gold_field_reports_no_accuracy(tmp_path, fake_provider):
    fake_provider.behaviour = lambda *a: Completion(text="YES", input_tokens=5, output_tokens=1)
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(load_job(_judge_job(tmp_path)), store)
    lines = [json.loads(line) for line in outcome.results["judge"].read_text().splitlines()]
    assert len(lines) == 6
    assert all(line["parsed"] is True and line["gold"] is None and line["score"] is None for line in lines)
    (row,) = summary.build(store, outcome.run_id)["rows"]
    assert row["accuracy"] is None and row["scored"] == 0
    printed = summary.summary_lines(summary.build(store, outcome.run_id))
    assert not [line for line in printed if line.startswith("accuracy")], printed


async def test_naming_the_gold_scores_the_stage(tmp_path, fake_provider):
    rows = tmp_path / "csj.jsonl"
    rows.write_text("".join(json.dumps({"question": f"s{i}", "label": i % 2 == 0}) + "\n" for i in range(4)))
    path = tmp_path / "csj.yaml"
    path.write_text("\n".join([
        "name: csj", 'models: ["fake:m1"]', f"output_dir: {json.dumps(str(tmp_path / 'out'))}", "stages:",
        "  - name: csj", f"    dataset: {{path: {json.dumps(str(rows))}}}", "    prompt: {user: \"{{ question }}\"}",
        "    parse: yes_no", "    gold: label"]) + "\n")
    fake_provider.behaviour = lambda *a: Completion(text="Yes.", input_tokens=5, output_tokens=1)
    outcome = await execute(load_job(path), open_store(tmp_path / "s.sqlite"))
    scores = sorted(json.loads(line)["score"] for line in outcome.results["csj"].read_text().splitlines())
    assert scores == [0.0, 0.0, 1.0, 1.0]


async def test_a_multiple_choice_stage_without_a_named_gold_is_not_scored(tmp_path, fake_provider):
    dataset = write_rows(tmp_path / "rows.jsonl", 4)  # rows with a "gold" field
    path = tmp_path / "mc.yaml"
    path.write_text("\n".join([
        "name: mc", 'models: ["fake:m1"]', f"output_dir: {json.dumps(str(tmp_path / 'out'))}", "stages:",
        "  - name: mc", f"    dataset: {{path: {json.dumps(str(dataset))}}}",
        "    prompt: {user: \"{{ question }}\\n{{ options_block }}\"}", "    choices: {seeds: [0]}",
        "    parse: letter"]) + "\n")
    outcome = await execute(load_job(path), open_store(tmp_path / "s.sqlite"))
    lines = [json.loads(line) for line in outcome.results["mc"].read_text().splitlines()]
    assert len(lines) == 4 and all(line["valid"] and line["score"] is None for line in lines)


@pytest.mark.parametrize(("gold_line", "warned"), [("", True), ("    gold: gold", False)])
def test_validate_warns_of_a_gold_field_the_stage_does_not_name(tmp_path, monkeypatch, capsys, fake_provider,
                                                                gold_line, warned):
    code, out, err = run_cli(monkeypatch, capsys, "validate", str(_judge_job(tmp_path, gold_line)))
    assert code == 0, err
    warning = "warning: stage judge is not scored: its rows have a 'gold' field but the stage names no gold; " \
              "add gold: gold to score it"
    assert (warning in err) is warned, err


def test_drop_gold_needs_a_named_gold(tmp_path):
    dataset = write_rows(tmp_path / "rows.jsonl", 2)
    path = tmp_path / "knowno.yaml"
    path.write_text("\n".join([
        "name: kn", 'models: ["fake:m1"]', "stages:", "  - name: no-gold",
        f"    dataset: {{path: {json.dumps(str(dataset))}}}", "    prompt: {user: \"{{ question }}\"}",
        "    choices: {seeds: [0], drop_gold: true}", "    parse: none_of_them"]) + "\n")
    with pytest.raises(JobFileError, match=r"knowno.yaml:7: stages\[0\]\.choices: drop_gold: true needs gold:"):
        load_job(path)
