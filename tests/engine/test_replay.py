"""Whole-stage replay (runner/engine/replay.py): an evaluation stage unchanged since a run that finished it is copied
from that run's tasks, as cache hits, instead of being planned request by request."""

from __future__ import annotations

import json
import subprocess

import pytest

from runner.engine.replay import stage_address
from runner.engine.run import execute
from runner.report import summary as report
from runner.spec.job import load_job
from runner.spec.settings import Price
from runner.store import Store, open_store
from simserver import SimConfig, start_server
from tests.helpers import runner_cmd, sim_stats, write_job, write_rows


def _job(tmp_path, url: str, rows: int = 12, *, name: str = "replayjob", seeds: str = "[0, 1]"):
    dataset = tmp_path / f"{name}.jsonl"
    if not dataset.exists():
        write_rows(dataset, rows)
    extra = f"providers: {{sim: {{base_url: {json.dumps(url)}, concurrency: 4, timeout: 5}}}}"
    job = load_job(write_job(tmp_path / f"{name}.yaml", dataset, models=["sim:gpt-sim"], extra=extra, seeds=seeds,
                             name=name))
    job.prices["sim:gpt-sim"] = Price(input=1.0, output=2.0)
    return job


def _lines(path) -> dict[str, dict]:
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    return {f"{r['id']}|{r['model']}|{r['seed']}": r for r in rows}


def _tasks(store: Store, run_id: str) -> list[tuple]:
    """(item, key, status, cache_hit, cost, score, valid) of a run's tasks, by item."""
    columns = ("item", "key", "status", "cache_hit", "cost", "score", "valid")
    return sorted((tuple(t[c] for c in columns) for t in store.tasks(run_id)), key=lambda t: t[0])


async def test_an_unchanged_stage_is_replayed_as_cache_hits(tmp_path):
    notes: list[str] = []

    class Notes:
        def start(self, stats, title):
            pass

        def note(self, message):
            notes.append(message)

        def stop(self):
            pass

    async with await start_server() as srv:
        job = _job(tmp_path, srv.url)
        store = open_store(tmp_path / "s.sqlite")
        first = await execute(job, store)
        sent = srv.stats()["received"]
        second = await execute(job, store, view=Notes())
        assert srv.stats()["received"] == sent  # 24 tasks; two seeds may share a permutation, hence a request
    assert first.status == second.status == "completed"
    assert any(f"unchanged since run {first.run_id}" in note for note in notes), notes
    one, two = report.build(store, first.run_id), report.build(store, second.run_id)
    assert two["totals"]["requests"] == 24 and two["totals"]["cache_hits"] == 24
    assert two["totals"]["cost"] == 0 and two["totals"]["sent"] == 0
    # what the answers cost the first time (or saved, for a request that shared another's answer)
    assert one["totals"]["cost"] > 0
    assert two["totals"]["saved"] == pytest.approx(one["totals"]["cost"] + one["totals"]["saved"])
    assert two["rows"][0]["accuracy"] == one["rows"][0]["accuracy"]
    counters = second.stats.totals()
    assert (counters.done, counters.cache_hits, counters.sent) == (24, 24, 0)
    # the same result lines as the first run's, now marked as cache hits
    first_lines, second_lines = _lines(first.results["mc"]), _lines(second.results["mc"])
    assert first_lines.keys() == second_lines.keys() and len(second_lines) == 24
    assert sum(not line["cache_hit"] for line in first_lines.values()) == sent
    for item, line in first_lines.items():
        assert second_lines[item] == {**line, "cache_hit": True}
    assert [t[:2] for t in _tasks(store, first.run_id)] == [t[:2] for t in _tasks(store, second.run_id)]


def _without_run(line: dict) -> dict:
    return {**line, "provenance": {k: v for k, v in line["provenance"].items() if k != "run_id"}}


async def test_replay_matches_a_request_by_request_rerun(tmp_path):
    async with await start_server() as srv:
        job = _job(tmp_path, srv.url)
        store = open_store(tmp_path / "s.sqlite")
        await execute(job, store)
        replayed = await execute(job, store)
        sent = srv.stats()["received"]
        planned = await execute(job, store, reuse=False)
        assert srv.stats()["received"] == sent
    assert _tasks(store, replayed.run_id) == _tasks(store, planned.run_id)
    # the same lines, but for the run they were made in: a replayed stage copies the first run's lines
    replayed_lines, planned_lines = _lines(replayed.results["mc"]), _lines(planned.results["mc"])
    assert {k: _without_run(v) for k, v in replayed_lines.items()} == \
        {k: _without_run(v) for k, v in planned_lines.items()}
    assert {line["provenance"]["run_id"] for line in planned_lines.values()} == {planned.run_id}
    a, b = report.build(store, replayed.run_id), report.build(store, planned.run_id)
    assert a["totals"] == b["totals"] and a["rows"][0]["accuracy"] == b["rows"][0]["accuracy"]


async def test_a_changed_dataset_prompt_or_model_is_planned_again(tmp_path):
    async with await start_server() as srv:
        job = _job(tmp_path, srv.url)
        store = open_store(tmp_path / "s.sqlite")
        await execute(job, store)
        sent = srv.stats()["received"]
        address = stage_address(job, job.stages[0], _plan(job))
        # one more row: only its two requests are sent, the rest are hits planned one by one
        write_rows(tmp_path / "extra.jsonl", 1, start=100)
        dataset = tmp_path / "replayjob.jsonl"
        dataset.write_text(dataset.read_text() + (tmp_path / "extra.jsonl").read_text())
        grown = await execute(job, store)
        assert srv.stats()["received"] == sent + 2
        assert stage_address(job, job.stages[0], _plan(job)) != address
        assert report.build(store, grown.run_id)["totals"]["cache_hits"] == 24
        # a new prompt: every request is new
        job.stages[0].prompt.system = "Answer with one letter only."
        await execute(job, store)
        assert srv.stats()["received"] == 2 * (sent + 2)  # as many distinct requests as before
        # a limit is part of the address too
        job.limit = 5
        limited = await execute(job, store)
        assert report.build(store, limited.run_id)["totals"]["requests"] == 10
        assert srv.stats()["received"] == 2 * (sent + 2)


async def test_a_stage_with_failed_requests_is_not_replayed(tmp_path):
    async with await start_server(SimConfig(fault_500=0.4, seed=3)) as srv:
        job = _job(tmp_path, srv.url)
        job.retry.max_attempts = 1
        store = open_store(tmp_path / "s.sqlite")
        first = await execute(job, store)
        failed = report.build(store, first.run_id)["totals"]["failed"]
        assert failed > 0
        # the job's one stage was not recorded as replayable
        assert store.replayable(stage_address(job, job.stages[0], _plan(job))) is None
        received = srv.stats()["received"]
        second = await execute(job, store)  # planned again: the failed ones are sent, the others are hits
        # two tasks whose shuffles coincide are one request (sent once, failed together): count requests, not tasks
        failed_requests = {t["key"] for t in store.tasks(first.run_id) if t["status"] != "done"}
        assert srv.stats()["received"] - received >= len(failed_requests)
    # the answered ones are hits, and so is a task whose twin was sent again and answered this time
    hits = report.build(store, second.run_id)["totals"]["cache_hits"]
    assert 24 - failed <= hits <= 24 - len(failed_requests)


async def test_a_replay_needs_the_earlier_tasks_still_there(tmp_path):
    async with await start_server() as srv:
        job = _job(tmp_path, srv.url)
        store = open_store(tmp_path / "s.sqlite")
        first = await execute(job, store)
        sent = srv.stats()["received"]
        store.conn.execute("DELETE FROM tasks WHERE run_id = ? AND rowid IN (SELECT rowid FROM tasks"
                           " WHERE run_id = ? LIMIT 3)", (first.run_id, first.run_id))
        second = await execute(job, store)  # planned one by one: all hits from the memo
        assert srv.stats()["received"] == sent
    totals = report.build(store, second.run_id)["totals"]
    assert totals["cache_hits"] == 24 and totals["done"] == 24


def _plan(job):
    from runner.plan.stage import StagePlan

    return StagePlan(job, job.stages[0])


@pytest.mark.parametrize("sim_server", [0.0], indirect=True)
def test_submit_replays_and_replan_plans_again(tmp_path, sim_server):
    """Through the CLI: the second submit says the stage was reused and estimates it as all cache hits;
    ``--replan`` plans every request (the answers still come from the cache)."""
    dataset = write_rows(tmp_path / "rows.jsonl", 10)
    extra = f"providers: {{sim: {{base_url: {json.dumps(sim_server)}, concurrency: 4}}}}"
    job = write_job(tmp_path / "job.yaml", dataset, models=["sim:gpt-sim"], extra=extra)

    def submit(*flags: str) -> str:
        done = subprocess.run(runner_cmd("submit", str(job), *flags), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout + done.stderr

    first = submit()
    assert "unchanged since run" not in first
    second = submit()
    assert "unchanged since run" in second and "--replan" in second
    assert "10 cache hits" in second or "cache hits = 100.0%" in second
    third = submit("--replan")
    assert "unchanged since run" not in third and "cache hits = 100.0%" in third
    assert sim_stats(sim_server)["received"] == 10


async def test_the_estimate_of_a_replayable_stage_is_all_cache_hits_without_planning(tmp_path, monkeypatch):
    from runner.report.estimate import estimate

    async with await start_server() as srv:
        job = _job(tmp_path, srv.url)
        store = open_store(tmp_path / "s.sqlite")
        await execute(job, store)
    replayed = estimate(job, store)
    monkeypatch.setattr(store, "replayable", lambda digest: None)  # as if no stage had been recorded
    planned = estimate(job, store)
    fields = ("requests", "cached", "to_send", "history", "output_tokens_expected", "cost_low", "cost_high")
    (a,), (b,) = replayed.groups, planned.groups
    assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields]
    assert (a.requests, a.cached, a.to_send) == (24, 24, 0)


async def test_copied_tasks_take_the_new_stage_name(tmp_path):
    """A pipeline stage renamed keeps its content address; its copied result lines name the new stage."""
    import io

    from runner.engine.replay import copy_tasks
    from runner.engine.stats import RunStats

    async with await start_server() as srv:
        job = _job(tmp_path, srv.url)
        store = open_store(tmp_path / "s.sqlite")
        first = await execute(job, store)
    run_id = store.create_run("copy", "", "{}", "x", 24)
    stats, out = RunStats(), io.StringIO()
    copy_tasks(store, first.run_id, "mc", run_id, "renamed", stats, out, add_total=True)
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert len(lines) == 24 and all(x["stage"] == "renamed" and x["cache_hit"] for x in lines)
    counters = stats.counters("renamed", "sim:gpt-sim")
    assert counters.total == counters.done == counters.cache_hits == 24
    assert len(store.tasks(run_id, stage="renamed")) == 24


def test_the_code_digest_is_every_module_of_the_package_in_path_order() -> None:
    # what a stage's address holds of the code: each .py file's path (from the package's folder) and bytes
    import hashlib
    from pathlib import Path

    import runner
    from runner.engine.address import code_digest

    root = Path(runner.__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    assert code_digest() == digest.hexdigest()
