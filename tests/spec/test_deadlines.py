"""``deadline:`` (job or stage) and ``--deadline``: a duration or an ISO 8601 time, and every way it can be wrong
said in one sentence by ``runner validate`` and ``runner submit`` with a non-zero exit, before anything is sent:
unparseable, passed, or one no mode can meet (with the fastest mode's estimate)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.spec.job import load_job
from tests.helpers import one_error, only_error, run_cli

ROWS = [{"question": f"q{i}", "choices": ["a", "b"], "gold": i % 2} for i in range(4)]


def job_file(tmp_path: Path, head: str = "", stage: str = "") -> Path:
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in ROWS), encoding="utf-8")
    lines = ["name: deadlines", "models: [openai:gpt-4o-mini]", "params: {max_tokens: 8}", head, "stages:",
             "  - name: mc", f"    dataset: {{path: {json.dumps(str(dataset))}}}",
             '    prompt: {user: "{{ question }} {{ options_block }}"}', "    choices: {gold: gold}",
             "    parse: letter", stage]
    path = tmp_path / "job.yaml"
    path.write_text("\n".join(line for line in lines if line) + "\n", encoding="utf-8")
    return path


def test_a_deadline_is_a_duration_or_a_time_with_its_zone_and_a_stages_wins(tmp_path: Path) -> None:
    job = load_job(job_file(tmp_path, "deadline: 6h", "    deadline: 2030-01-01T00:00Z"))
    stage = job.stages[0]
    assert job.deadline_seconds(0.0) == 6 * 3600.0
    assert job.stage_deadline(stage) == "2030-01-01T00:00Z"
    assert job.stage_deadline_seconds(stage, now=1893456000.0 - 60) == pytest.approx(60.0)
    # a deadline and no mode said: the planner chooses (auto); a mode said is kept
    assert job.stage_mode(stage) == "auto"
    assert load_job(job_file(tmp_path, "deadline: 6h\nmode: online")).stage_mode(stage) == "online"


@pytest.mark.parametrize(("head", "stage", "said"), [
    ("deadline: tomorrow", "", "deadline: 'tomorrow' is not a deadline: write a duration"),
    ("", "    deadline: 2030-01-01T00:00", "has no time zone: add one"),
])
def test_an_unparseable_deadline_is_one_sentence_at_its_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str], head: str, stage: str,
                                                           said: str) -> None:
    code, _, err = run_cli(monkeypatch, capsys, "validate", str(job_file(tmp_path, head, stage)))
    assert code == 2
    assert said in err and "job.yaml:" in err and "Traceback" not in err


def test_a_deadline_that_passed_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = job_file(tmp_path, "deadline: 2020-01-01T00:00Z")
    code, _, err = run_cli(monkeypatch, capsys, "validate", str(path))
    assert code == 2 and "stage mc: deadline 2020-01-01T00:00Z has passed" in err and "Traceback" not in err
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(monkeypatch, capsys, "submit", str(job_file(tmp_path)), "--db", str(tmp_path / "s.db"),
                           "--deadline", "2020-01-01T00:00Z")
    assert code == 2 and "has passed" in one_error(err)


def test_a_deadline_no_mode_meets_is_refused_before_sending_with_the_fastest_estimate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # 7 distinct requests (4 rows, 3 orders of their options) at one a minute take 7 min online, plus an answer's
    # 60 s; a batch's 95th percentile is hours
    path = job_file(tmp_path, "deadline: 90s\nproviders: {openai: {rpm: 1}}")
    code, _, err = run_cli(monkeypatch, capsys, "validate", str(path))
    assert code == 2 and "Traceback" not in err
    assert "no mode can finish the 7 requests of mc (openai:gpt-4o-mini) by the deadline (90 s from now)" in err
    assert "the fastest, online at 1 requests a minute (providers: openai: rpm), needs about 8 min" in err
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(monkeypatch, capsys, "submit", str(path), "--db", str(tmp_path / "s.db"))
    assert code == 2 and "no mode can finish" in one_error(err)


def test_a_bad_deadline_option_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(monkeypatch, capsys, "estimate", str(job_file(tmp_path)), "--db", str(tmp_path / "s.db"),
                           "--deadline", "soon")
    assert code != 0
    assert only_error(err).startswith("Error: --deadline: 'soon' is not a deadline")


def test_the_run_and_the_estimate_take_each_endpoints_figures_from_one_place(tmp_path: Path) -> None:
    from runner.plan.deadline_inputs import endpoint_inputs

    job = load_job(job_file(tmp_path, "deadline: 6h\nproviders: {openai: {rpm: 900}}\n"
                                      "planner: {batch_median: 2h, flex_latency: 5m}"))
    online, turnaround = endpoint_inputs(job, ["openai:gpt-4o-mini", "openai:gpt-4o-mini"], {})
    assert set(online) == set(turnaround) == {"openai:gpt-4o-mini"}
    assert online["openai:gpt-4o-mini"].rpm == 900 and online["openai:gpt-4o-mini"].flex_latency == 300
    assert turnaround["openai:gpt-4o-mini"].median == 7200
