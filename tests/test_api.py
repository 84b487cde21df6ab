"""The Python API: ``run_job`` / ``arun_job`` on a dict job against the simulated server, from plain code, from
inside a running event loop (a notebook) and awaited; ``load_results`` as a DataFrame of the store's tasks."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import runner
from runner import RunFailed, RunResult, arun_job, load_results, run_job
from runner.errors import JobFileError, RunnerError, StoreError
from runner.store import open_store
from simserver import SimServer
from tests.helpers import ROOT, fresh, run_cli, write_rows


def _job(url: str, *, name: str = "apijob", dataset: str = "rows.jsonl", **stage: Any) -> dict[str, Any]:
    """A multiple-choice job as a dict, its dataset named relative to the working directory."""
    return {
        "name": name,
        "models": ["sim:gpt-api"],
        "params": {"temperature": 0, "max_tokens": 5},
        "providers": {"sim": {"base_url": url, "concurrency": 8, "timeout": 5}},
        "retry": {"max_attempts": 5, "backoff_initial": 0.01, "backoff_max": 0.05},
        "output_dir": "results",
        "stages": [{
            "name": "mc",
            "dataset": {"path": dataset},
            "prompt": {"system": "Answer with one letter.", "user": "{{ question }}\n{{ options_block }}\nAnswer:"},
            "choices": {"seeds": [0, 1], "gold": "gold"},
            "parse": "letter",
            **stage,
        }],
    }


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's working directory, holding rows.jsonl (6 multiple-choice rows)."""
    monkeypatch.chdir(tmp_path)
    write_rows(tmp_path / "rows.jsonl", 6)
    return tmp_path


def _check_frame_equals_store(result: RunResult) -> None:
    """The DataFrame has one row per stored task, with the task's values and its result line's."""
    frame = result.results()
    tasks = open_store(result.db).tasks(result.run_id)
    assert len(frame) == len(tasks) == 12
    by_item = {task["item"]: task for task in tasks}
    assert sorted(frame["item"]) == sorted(by_item)
    for row in frame.to_dict("records"):
        task = by_item[row["item"]]
        line = json.loads(task["result_json"])
        assert (row["stage"], row["model"], row["row_id"], row["status"]) == ("mc", "sim:gpt-api", line["id"], "done")
        assert row["seed"] == line["seed"] == line["variant"]["seed"]
        assert row["response"] == line["response"] and row["parsed"] == line["parsed"]
        assert row["gold"] == line["gold"] and row["score"] == task["score"] == line["score"]
        assert row["valid"] is bool(task["valid"]) and row["cache_hit"] is bool(task["cache_hit"])
        assert row["cost"] == task["cost"] and row["input_tokens"] == task["input_tokens"]
        assert row["permutation"] == line["permutation"] and row["cache_key"] == line["cache_key"]
    # the results file holds the same tasks
    lines = [json.loads(x) for x in result.paths["mc"].read_text().splitlines()]
    assert sorted((x["id"], x["seed"]) for x in lines) == sorted(zip(frame["row_id"], frame["seed"], strict=True))
    # load_results by id, and by stage, gives the same frame
    assert load_results(result.run_id, db=result.db).equals(frame)
    assert load_results(result.run_id, db=result.db, stage="mc").equals(frame)


def test_a_dict_job_runs_and_its_dataframe_is_the_stores_tasks(workdir: Path, sim_server: str) -> None:
    result = run_job(_job(sim_server), db=workdir / "api.sqlite")
    assert isinstance(result, RunResult)
    assert (result.status, result.message, result.ok) == ("completed", None, True)
    assert result.raise_for_status() is result
    assert result.paths["mc"].is_file() and not result.paths["mc"].is_absolute()  # output_dir from the cwd
    assert repr(result) == f"<RunResult {result.run_id} completed (mc)>"
    _check_frame_equals_store(result)
    frame = result.results()
    for column in ("stage", "model", "item", "row_id", "seed", "response", "parsed", "gold", "score", "valid",
                   "cache_hit", "cost", "input_tokens", "output_tokens", "latency", "error"):
        assert column in frame.columns, column
    assert set(frame["seed"]) == {0, 1} and frame["cache_hit"].dtype == bool
    assert "accuracy: mc sim:gpt-api:" in result.summary()

    again = run_job(_job(sim_server), db=workdir / "api.sqlite", limit=2, replan=True)
    assert again.ok and again.run_id != result.run_id
    frame = again.results()
    assert len(frame) == 4 and frame["cache_hit"].all() and (frame["cost"] == 0).all()


def test_vars_budget_and_the_default_store(workdir: Path, sim_server: str) -> None:
    job = _job(sim_server, dataset="${rows}")
    job["vars"] = {"rows": "missing.jsonl"}
    with pytest.raises(JobFileError, match="dataset file 'missing.jsonl' does not exist"):
        run_job(job)
    result = run_job(job, vars={"rows": "rows.jsonl"}, budget=1.0)  # db: RUNNER_DB (conftest's tmp store)
    assert result.ok and result.db is None
    assert len(load_results(result.run_id)) == 12
    assert open_store().get_run(result.run_id)["status"] == "completed"


async def test_run_job_inside_a_running_event_loop(workdir: Path, sim_server: str) -> None:
    """A notebook cell: the caller's thread runs a loop, so run_job runs the job on its own loop in a worker
    thread and blocks until it ends."""
    caller = asyncio.get_running_loop()
    threads: list[threading.Thread] = []
    from runner.engine import run as engine

    real = engine.execute

    async def spy(*args: Any, **kwargs: Any) -> Any:
        assert asyncio.get_running_loop() is not caller
        threads.append(threading.current_thread())
        return await real(*args, **kwargs)

    engine.execute = spy
    try:
        result = run_job(_job(sim_server), db=workdir / "nb.sqlite")
    finally:
        engine.execute = real
    assert result.ok
    assert threads and threads[0] is not threading.current_thread()
    _check_frame_equals_store(result)
    # a job that does not validate raises in the caller's thread, as outside a loop
    with pytest.raises(JobFileError):
        run_job({"name": "x"}, db=workdir / "nb.sqlite")


@pytest.mark.asyncio(loop_scope="module")
async def test_arun_job_runs_on_the_callers_loop(workdir: Path, srv: SimServer) -> None:
    result = await arun_job(_job(srv.url), db=workdir / "a.sqlite")
    assert result.ok
    frame = result.results()
    assert len(frame) == 12 and set(frame["stage"]) == {"mc"}
    # two seeds may show a row's options in the same order: one request, sent once
    assert srv.stats()["received"] == (~frame["cache_hit"]).sum() >= 10
    # a completed run cannot be resumed; the message names the report command
    with pytest.raises(StoreError, match="already completed"):
        await arun_job(resume=result.run_id, db=workdir / "a.sqlite")


@pytest.mark.asyncio(loop_scope="module")
async def test_a_failed_run_is_returned_and_raise_for_status_raises(workdir: Path, srv: SimServer) -> None:
    fresh(srv, fault_401=1.0)
    result = await arun_job(_job(srv.url), db=workdir / "f.sqlite")
    assert result.status == "failed" and not result.ok and result.message
    with pytest.raises(RunFailed, match=f"run {result.run_id} failed: ") as info:
        result.raise_for_status()
    assert info.value.result is result and isinstance(info.value, RunnerError)
    frame = result.results()
    assert len(frame) == 12 and (frame["status"] == "failed").all() and frame["error_class"].notna().all()


@pytest.mark.parametrize("change, message", [
    (lambda job: job.update(modles=job.pop("models")),
     "job dict: modles: unknown key 'modles' (did you mean 'models'?)"),
    (lambda job: job["stages"][0]["dataset"].update(path="nope.jsonl"),
     "job dict: stages[0].dataset.path: dataset file 'nope.jsonl' does not exist"),
    (lambda job: job["stages"][0].update(prompt="nosuch/template"),
     "job dict: stages[0].prompt: no prompt template 'nosuch/template'"),
    (lambda job: job.update(models=["nosuch:model"]), "job dict: models[0]: unknown provider 'nosuch'"),
    (lambda job: job["params"].update(temperature=5), "job dict: params.temperature: "),
    (lambda job: job.pop("stages"), "job dict: stages: required key 'stages' is missing"),
])
def test_a_bad_dict_raises_a_runner_error_naming_the_key(workdir: Path, change: Any, message: str) -> None:
    job = _job("http://127.0.0.1:9/v1")
    change(job)
    before = json.dumps(job, sort_keys=True)
    with pytest.raises(JobFileError) as info:
        run_job(job)
    assert str(info.value).startswith(message), str(info.value)
    assert json.dumps(job, sort_keys=True) == before  # the caller's dict is not changed


@pytest.mark.parametrize("job, message", [
    ([1, 2], "a job is a dict, a job file's path or a Job, not list"),
    (42, "a job is a dict, a job file's path or a Job, not int"),
    (None, "give a job to run, or resume=RUN_ID"),
    ("no-such-job.yaml", "no-such-job.yaml: no such job file"),
])
def test_what_is_not_a_job(workdir: Path, job: Any, message: str) -> None:
    with pytest.raises(RunnerError, match=message):
        run_job(job)


def test_load_results_of_an_unknown_run_or_stage(workdir: Path, sim_server: str) -> None:
    with pytest.raises(StoreError, match="no run 'no-such-run'"):
        load_results("no-such-run", db=workdir / "empty.sqlite")
    result = run_job(_job(sim_server), limit=1)
    with pytest.raises(StoreError, match=r"has no stage 'other' \(its stages: mc\)"):
        load_results(result.run_id, stage="other")
    assert len(load_results(result.run_id[-4:])) == 2  # a unique part of the id is enough, as on the command line


def test_importing_runner_is_cheap() -> None:
    """``import runner`` loads neither the engine nor pandas; the API's names resolve on first use."""
    code = ("import sys, runner; heavy = [m for m in ('runner.api', 'runner.engine', 'pandas') if m in sys.modules]; "
            "assert not heavy, heavy; from runner import run_job; assert 'runner.api' in sys.modules")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
    assert sorted(runner.__all__) == sorted(name for name in dir(runner.api) if name in runner.api.__all__)
    with pytest.raises(AttributeError):
        runner.no_such_name  # noqa: B018


def _comparable(line: str) -> dict[str, Any]:
    """A result line without what differs between two runs of one job: the run it was made in, the latency."""
    data = json.loads(line)
    data.pop("latency", None)
    data.get("provenance", {}).pop("run_id", None)
    return data


def _by_row(line: dict[str, Any]) -> tuple[str, int]:
    return line["id"], line["seed"]


def test_the_cli_and_the_api_give_the_same_run_and_the_same_warnings(workdir: Path, sim_server: str, monkeypatch,
                                                                      capsys) -> None:
    """One job file through ``runner submit`` and through ``run_job``, each on a store of its own: the same result
    lines, the same summary, and the dataset's warning (its rows have a gold the stage does not name) reaches the
    API's caller, in ``RunResult.warnings`` and as a RuntimeWarning, as the CLI prints it."""
    job = _job(sim_server)
    job["stages"][0]["choices"].pop("gold")  # the rows have "gold": the stage is not scored, and both say so
    path = workdir / "job.yaml"
    path.write_text(json.dumps(job), encoding="utf-8")  # JSON is YAML

    code, out, err = run_cli(monkeypatch, capsys, "submit", str(path), "--db", str(workdir / "cli.sqlite"))
    assert code == 0, err
    printed = [line.removeprefix("warning: ") for line in err.splitlines() if line.startswith("warning: ")]
    assert any("stage mc is not scored" in line for line in printed), err
    cli_run = out.rstrip().splitlines()[-1].split(":")[0].removeprefix("run ")

    with pytest.warns(RuntimeWarning) as caught:
        result = run_job(path, db=workdir / "api.sqlite")
    assert result.ok and result.warnings
    assert list(result.warnings) == printed
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == printed

    cli_lines = (workdir / "results" / "apijob" / cli_run / "mc.jsonl").read_text().splitlines()
    api_lines = result.paths["mc"].read_text().splitlines()
    assert len(cli_lines) == len(api_lines) == 12
    assert sorted(map(_comparable, cli_lines), key=_by_row) == sorted(map(_comparable, api_lines), key=_by_row)
    summary = result.summary().splitlines()  # the lines `runner submit` prints at the end, for this run
    assert summary and all(line.replace(result.run_id, cli_run) in out.splitlines() for line in summary), out


def test_the_api_names_its_own_settings_when_it_refuses(workdir: Path, sim_server: str) -> None:
    """The run service says what the CLI says before a run, in the API's words: a worst case over the budget, a
    limit below one; with allow_partial=True the run starts and stops when the budget is spent."""
    job = _job(sim_server)
    job["prices"] = {"sim:gpt-api": {"input": 1000, "output": 1000}}
    with pytest.raises(RunnerError, match=r"exceeds the run's budget \$0\.0100: pass allow_partial=True .* "
                                          r"give a larger budget= \(at least") as info:
        run_job(job, db=workdir / "b.sqlite", budget=0.01)
    assert info.value.exit_code == 2 and "--" not in str(info.value)
    with pytest.raises(RunnerError, match=r"^limit= must be 1 or more \(got 0\)$"):
        run_job(job, db=workdir / "b.sqlite", limit=0)
    assert not (workdir / "results").exists()  # refused before a run was made
    result = run_job(job, db=workdir / "b.sqlite", budget=0.01, allow_partial=True)
    assert result.status == "budget_exhausted" and "budget" in (result.message or "")
