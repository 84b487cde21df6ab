"""Errors a user can cause end in one ``Error:`` line through the real ``runner`` command: never a traceback, an
"unexpected … please report it" line or click's boxed usage error. The cases that used to be unexpected run in a
subprocess, since ``main()`` re-raises unexpected exceptions when pytest is imported."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from runner.spec.job import load_job
from runner.store import open_store
from tests.helpers import ROOT, one_error, run_cli, runner_cmd, write_job, write_rows


def runner(*args: str) -> subprocess.CompletedProcess[str]:
    """``runner ARGS`` in a process of its own (RUNNER_DB comes from the test's environment)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
    env.pop("RUNNER_RAISE_ERRORS", None)
    return subprocess.run(runner_cmd(*args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def sim_job(tmp_path: Path, dataset: Path, user: str | None = None) -> Path:
    """A one-stage job on ``sim:`` (nothing is sent in these tests: each stops or ends before a request)."""
    path = write_job(tmp_path / "job.yaml", dataset, models=["sim:m"])
    if user is not None:
        text = path.read_text(encoding="utf-8").splitlines()
        text = [f"      user: {json.dumps(user)}" if line.startswith("      user:") else line for line in text]
        path.write_text("\n".join(text) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("suffix", ["jsonl", "csv"])
def test_a_dataset_that_is_not_utf8_is_one_sentence_naming_file_and_line(tmp_path: Path, suffix: str) -> None:
    dataset = write_rows(tmp_path / f"rows.{suffix}", 3)
    with open(dataset, "ab") as out:  # a fourth row written as latin-1: "café"
        out.write(b'{"question": "caf\xe9?", "choices": ["a", "b", "c", "d"], "gold": 0}\n')
    job = sim_job(tmp_path, dataset)
    # the first rows are fine: the error names the line that is not
    done = runner("submit", str(job))
    line = one_error(done.stderr)
    assert done.returncode == 1
    assert f"{dataset}:4:" in line and "must be UTF-8" in line


def test_a_dataset_not_utf8_on_its_first_line(tmp_path: Path) -> None:
    dataset = tmp_path / "rows.jsonl"
    dataset.write_bytes(b'{"question": "caf\xe9?", "choices": ["a", "b", "c", "d"], "gold": 0}\n')
    done = runner("estimate", str(sim_job(tmp_path, dataset)))
    line = one_error(done.stderr)
    assert done.returncode == 1 and f"{dataset}:1:" in line and "UTF-8" in line


def test_a_blocked_template_expression_names_the_prompt_and_the_expression(tmp_path: Path) -> None:
    job = sim_job(tmp_path, write_rows(tmp_path / "rows.jsonl", 2), user="Pick one. {{ ''.__class__ }}")
    for command in ("submit", "validate"):
        done = runner(command, str(job))
        line = one_error(done.stderr)
        assert done.returncode == 2, done.stderr
        assert "stages[0].prompt" in line and "prompt 'inline'" in line
        assert "{{ ''.__class__ }}" in line and "sandbox" in line


def test_a_blocked_expression_on_a_row_names_the_prompt_the_row_and_the_expression(tmp_path: Path) -> None:
    dataset = write_rows(tmp_path / "rows.jsonl", 2)
    done = runner("submit", str(sim_job(tmp_path, dataset, user="{{ question.__class__.__mro__ }}")))
    line = one_error(done.stderr)
    assert done.returncode == 1
    assert f"{dataset}:1:" in line and "prompt 'inline'" in line and "{{ question.__class__.__mro__ }}" in line


def test_a_negative_budget_is_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    job = sim_job(tmp_path, write_rows(tmp_path / "rows.jsonl", 2))
    code, _, err = run_cli(monkeypatch, capsys, "submit", str(job), "--budget", "-1")
    assert code == 1 and one_error(err) == "Error: --budget must be more than 0 USD (got -1)"
    code, _, err = run_cli(monkeypatch, capsys, "submit", str(job), "--budget", "0")
    assert code == 1 and "--budget must be more than 0 USD" in one_error(err)


def test_resume_with_a_negative_budget_is_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    path = sim_job(tmp_path, write_rows(tmp_path / "rows.jsonl", 2))
    job = load_job(path)
    store = open_store(tmp_path / "cache.sqlite")
    run_id = store.create_run(job.name, job.path, job.model_dump_json(), job.fingerprint(), 2)
    store.set_run(run_id, status="interrupted", pid=None)
    code, _, err = run_cli(monkeypatch, capsys, "resume", run_id, "--budget", "-1")
    assert code == 1 and one_error(err) == "Error: --budget must be more than 0 USD (got -1)"


@pytest.mark.parametrize("args", [["submit", "JOB", "--limit", "0"], ["estimate", "JOB", "--limit", "-2"],
                                  ["runs", "--limit", "0"]])
def test_a_count_option_below_one_is_one_line(tmp_path: Path, monkeypatch, capsys, args: list[str]) -> None:
    job = sim_job(tmp_path, write_rows(tmp_path / "rows.jsonl", 2))
    code, _, err = run_cli(monkeypatch, capsys, *[str(job) if a == "JOB" else a for a in args])
    assert code == 1 and "--limit must be 1 or more" in one_error(err)


@pytest.mark.parametrize("args", [["submit", "JOB", "--budget", "lots"], ["submit"], ["submit", "JOB", "--bogus"],
                                  ["no-such-command"]])
def test_usage_errors_are_one_line_not_a_box(tmp_path: Path, monkeypatch, capsys, args: list[str]) -> None:
    job = sim_job(tmp_path, write_rows(tmp_path / "rows.jsonl", 2))
    code, out, err = run_cli(monkeypatch, capsys, *[str(job) if a == "JOB" else a for a in args])
    assert code == 2 and "--help" in one_error(err) and not out


def test_an_empty_dataset_warns_and_the_run_ends_cleanly(tmp_path: Path, monkeypatch, capsys) -> None:
    dataset = tmp_path / "empty.jsonl"
    dataset.write_text("", encoding="utf-8")
    code, out, err = run_cli(monkeypatch, capsys, "submit", str(sim_job(tmp_path, dataset)))
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: stage mc: the dataset {dataset} has no rows, so the stage has nothing to send"]
    assert "Error:" not in err and "Traceback" not in err
    assert out.rstrip().splitlines()[-1].endswith(": completed")
