"""Rows that would give silently wrong results are refused, naming the dataset's file and line: two rows with one
id (paid for twice, kept as one task) and a gold index that is not one of the row's options (scored wrong without
a word). ``runner validate`` reads the rows (streamed); ``estimate`` and ``submit`` find the same while planning,
before anything is sent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.errors import RunnerError
from runner.plan.stage import StagePlan, check_datasets
from runner.spec.job import load_job
from tests.helpers import only_error, run_cli, write_job


def rows_file(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def mc(i: int, **extra: object) -> dict:
    return {"question": f"q{i}", "choices": ["a", "b", "c", "d"], "gold": i % 4, **extra}


def job_with(tmp_path: Path, rows: list[dict], dataset_extra: str = "") -> tuple[Path, Path]:
    dataset = rows_file(tmp_path / "rows.jsonl", rows)
    job = write_job(tmp_path / "job.yaml", dataset, models=["sim:m"])
    if dataset_extra:
        text = job.read_text(encoding="utf-8")
        text = text.replace(f"dataset: {{path: {json.dumps(str(dataset))}}}",
                            f"dataset: {{path: {json.dumps(str(dataset))}, {dataset_extra}}}")
        job.write_text(text, encoding="utf-8")
    return job, dataset


# -- repeated ids ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["validate", "estimate", "submit"])
def test_a_repeated_id_is_refused_naming_both_lines(tmp_path: Path, monkeypatch, capsys, command: str) -> None:
    rows = [mc(0, id="a"), mc(1, id="b"), mc(2, id="c"), mc(3, id="b"), mc(4, id="d")]
    job, dataset = job_with(tmp_path, rows, "id: id")
    monkeypatch.setenv("RUNNER_DB", str(tmp_path / "db.sqlite"))
    code, out, err = run_cli(monkeypatch, capsys, command, str(job))
    assert code == (2 if command == "validate" else 1)  # validate: the job does not validate; a run: its plan fails
    assert only_error(err) == (f"Error: {dataset}:4: id 'b' (field 'id') was already used on line 2 ({dataset}:2); "
                              "each row's id must be unique: fix the rows, name another id field, or leave out "
                              "dataset.id to number rows by line")
    assert "started" not in out  # submit refused before a run began


def test_ids_equal_as_text_are_one_id(tmp_path: Path) -> None:
    """A row id is text: 7 and "7" name one row."""
    job, dataset = job_with(tmp_path, [mc(0, id=7), mc(1, id=8), mc(2, id="7")], "id: id")
    with pytest.raises(RunnerError, match=rf"^{dataset}:3: id '7' \(field 'id'\) was already used on line 1 "
                                          rf"\({dataset}:1\);"):
        check_datasets(load_job(job))


def test_a_repeated_parent_id_of_exploded_rows(tmp_path: Path) -> None:
    parent = {"story": "s", "question_list": [{"question": "q", "choices": ["a", "b"], "gold": 0}]}
    job, dataset = job_with(tmp_path, [{**parent, "id": "x"}, {**parent, "id": "y"}, {**parent, "id": "x"}],
                            "id: id, explode: question_list")
    with pytest.raises(RunnerError, match=rf"^{dataset}:3: id 'x' .* already used on line 1 \({dataset}:1\);"):
        list(StagePlan(load_job(job), load_job(job).stages[0]))


def test_rows_numbered_by_line_may_repeat_content(tmp_path: Path, monkeypatch, capsys) -> None:
    job, _ = job_with(tmp_path, [mc(0, id="a"), mc(0, id="a")])  # no id: field: ids are line numbers
    code, out, err = run_cli(monkeypatch, capsys, "validate", str(job))
    assert code == 0 and "valid job" in out, err


def test_unique_ids_over_many_rows_pass(tmp_path: Path) -> None:
    job, _ = job_with(tmp_path, [mc(i, id=f"row-{i}") for i in range(20_000)], "id: id")
    check_datasets(load_job(job))
    plan = StagePlan(load_job(job), load_job(job).stages[0])
    assert plan.total() == 20_000 and sum(1 for _ in plan) == 20_000


def test_a_repeat_beyond_the_limit_is_not_read(tmp_path: Path) -> None:
    job, _ = job_with(tmp_path, [mc(0, id="a"), mc(1, id="b"), mc(2, id="a")], "id: id, limit: 2")
    check_datasets(load_job(job))


# -- gold indices ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("gold", [7, 4, -1])
@pytest.mark.parametrize("command", ["validate", "estimate"])
def test_a_gold_index_out_of_range_is_refused(tmp_path: Path, monkeypatch, capsys, command: str, gold: int) -> None:
    rows = [mc(0), mc(1), {**mc(2), "gold": gold}]
    job, dataset = job_with(tmp_path, rows)
    monkeypatch.setenv("RUNNER_DB", str(tmp_path / "db.sqlite"))
    code, _, err = run_cli(monkeypatch, capsys, command, str(job))
    assert code == (2 if command == "validate" else 1)
    assert only_error(err) == (f"Error: {dataset}:3: gold {gold} (field 'gold') is not an option's index: the row has "
                              "4 options, numbered 0 to 3")


def test_a_gold_index_beyond_a_shared_options_file(tmp_path: Path) -> None:
    options = tmp_path / "labels.json"
    options.write_text(json.dumps(["x", "y", "z"]), encoding="utf-8")
    rows = [{"question": "q", "gold": 1}, {"question": "q", "gold": 3}]
    job, dataset = job_with(tmp_path, rows)
    shared = f"choices: {{seeds: [0], gold: gold, options_file: {json.dumps(str(options))}}}"
    text = job.read_text(encoding="utf-8").replace("choices: {seeds: [0], gold: gold}", shared)
    job.write_text(text, encoding="utf-8")
    with pytest.raises(RunnerError, match=rf"^{dataset}:2: gold 3 .* has 3 options, numbered 0 to 2$"):
        check_datasets(load_job(job))


def test_gold_in_range_or_as_text_passes(tmp_path: Path, monkeypatch, capsys) -> None:
    rows = [mc(0), mc(3), {**mc(1), "gold": "c"}]
    job, _ = job_with(tmp_path, rows)
    code, out, err = run_cli(monkeypatch, capsys, "validate", str(job))
    assert code == 0 and "valid job" in out, err
    tasks = list(StagePlan(load_job(job), load_job(job).stages[0]))
    assert [task.gold for task in tasks] == [0, 3, 2]


def test_validate_names_a_row_that_is_not_an_object(tmp_path: Path, monkeypatch, capsys) -> None:
    job, dataset = job_with(tmp_path, [mc(0)])
    with open(dataset, "a", encoding="utf-8") as out:
        out.write("[1, 2]\n")
    code, _, err = run_cli(monkeypatch, capsys, "validate", str(job))
    assert code == 2 and only_error(err) == f"Error: {dataset}:2: each line must be a JSON object"
