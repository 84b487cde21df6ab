"""Batch mode through the whole runner against the simulated server's Batch APIs (through the official SDKs):
answers identical to an online run at the batch price, a run killed while it polls and resumed without
submitting anything twice, expired and failed lines submitted again alone and bounded, budgets reserved before a
batch is submitted, and ``mode: auto`` sending online what no batch answered by the deadline."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
import urllib.request
from importlib.metadata import version as installed
from pathlib import Path

import pytest

from runner.engine.run import execute
from runner.plan.stage import StagePlan
from runner.providers.pricing import Pricing
from runner.providers.tokens import count_input_tokens
from runner.report import summary as report
from runner.spec.job import load_job
from runner.spec.settings import JobBudget
from runner.store import open_store
from simserver import SimConfig, SimServer, start_server
from tests.helpers import run_cli, runner_cmd, sim_stats, write_rows

MODEL = "sim:batchy"
#: USD per million tokens: the batch price is half, as OpenAI's, Anthropic's and Gemini's
PRICES = {"input": 2000.0, "output": 8000.0, "batch_input": 1000.0, "batch_output": 4000.0}
ROWS = 24


def write_job(folder: Path, url: str, *, mode: str, name: str = "batchjob", rows: int = ROWS,
              models: list[str] | None = None, providers: dict | None = None, **extra: object) -> Path:
    dataset = write_rows(folder / f"{name}.jsonl", rows)
    job = {
        "name": name, "output_dir": str(folder / "results"), "models": models or [MODEL],
        "providers": providers or {"sim": {"base_url": url, "timeout": 10}},
        "params": {"temperature": 0, "max_tokens": 5},
        "retry": {"max_attempts": 4, "backoff_initial": 0.01, "backoff_max": 0.05, "max_elapsed": 60},
        "prices": {MODEL: PRICES}, "mode": mode,
        "batch": {"poll_interval": 0.05, "max_requests": 1000},
        "stages": [{"name": "mc", "dataset": {"path": str(dataset)},
                    "prompt": {"system": "Answer with one letter.",
                               "user": "{{ question }}\n{{ options_block }}\nAnswer:"},
                    "choices": {"seeds": [0, 1], "gold": "gold"}, "parse": "letter"}],
        **extra,
    }
    path = folder / f"{name}.yaml"
    path.write_text(json.dumps(job), encoding="utf-8")
    return path


def distinct(job_path: Path) -> int:
    """How many distinct requests the job's stage makes (two seeds may show a row's options in one order)."""
    job = load_job(job_path)
    return len({task.key for task in StagePlan(job, job.stages[0])})


def lines(path: Path) -> list[dict]:
    """A results file's lines without what differs between two runs of the same answers."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        kept = {k: v for k, v in row.items() if k not in ("cache_hit",)}
        # the run and its job (a batch job and an online one differ in mode) are not the answers', nor the client
        # that sent them (a Batch API goes through its SDK, an online request may go over the lean wire)
        kept["provenance"] = {k: v for k, v in row["provenance"].items()
                              if k not in ("run_id", "job_hash", "sent_with")}
        out.append(kept)
    return sorted(out, key=lambda r: (r["id"], r["seed"]))


@pytest.fixture
async def server():
    async with await start_server(SimConfig(batch_delay=0.3)) as srv:
        yield srv


async def online_reference(tmp_path: Path, url: str) -> tuple[list[dict], float]:
    """The same job run online, in a store of its own: its result lines and its cost."""
    folder = tmp_path / "online"
    folder.mkdir()
    store = open_store(folder / "s.sqlite")
    outcome = await execute(load_job(write_job(folder, url, mode="online")), store)
    assert outcome.status == "completed"
    return lines(outcome.results["mc"]), report.build(store, outcome.run_id)["totals"]["cost"]


async def test_a_batch_run_answers_as_an_online_run_at_half_the_price(tmp_path, server: SimServer):
    store = open_store(tmp_path / "s.sqlite")
    path = write_job(tmp_path, server.url, mode="batch")
    outcome = await execute(load_job(path), store)
    assert outcome.status == "completed", outcome.message
    stats, n = server.stats(), distinct(path)
    assert stats["batches"] == 1 and stats["batch_lines"] == n, "one line per distinct request"
    assert stats["received"] == 0, "nothing went online"
    expected, online_cost = await online_reference(tmp_path, server.url)
    assert lines(outcome.results["mc"]) == expected
    data = report.build(store, outcome.run_id)
    totals = data["totals"]
    assert totals["batched"] == n and totals["sent"] == n and totals["failed"] == 0
    assert totals["cache_hits"] == ROWS * 2 - n, "an identical request shares its line's answer"
    assert totals["cost"] == pytest.approx(online_cost / 2)
    assert totals["batch_saved"] == pytest.approx(online_cost / 2)
    assert totals["ledger_charged"] == pytest.approx(totals["cost"])
    assert not open_store(tmp_path / "s.sqlite").ledger(kind="reserved"), "every reservation settled"
    [batch] = data["batches"]
    assert batch["state"] == "collected" and batch["by_status"] == {"done": n}
    text = report.render(data, "text")
    assert "answered through a Batch API" in text and f"batch: mc {MODEL}" in text


async def test_expired_lines_are_submitted_again_alone(tmp_path, server: SimServer):
    # The first batch cannot end by itself while the test waits (however long a loaded machine makes that); it is
    # expired as if halfway through its minute, and the batch of its expired lines ends at the first look.
    server.configure(batch_delay=60.0)

    async def expire_the_first_batch_halfway() -> None:
        while not server.batches.batches:
            await asyncio.sleep(0.02)
        server.configure(batch_delay=0.0)
        [first] = list(server.batches.batches)
        assert server.expire_batch(first, at=30.0)

    store = open_store(tmp_path / "s.sqlite")
    expiring = asyncio.ensure_future(expire_the_first_batch_halfway())
    path = write_job(tmp_path, server.url, mode="batch")
    outcome = await execute(load_job(path), store)
    await expiring
    assert outcome.status == "completed", outcome.message
    stats, n = server.stats(), distinct(path)
    expired = stats["batch_results"].get("expired", 0)
    assert 0 < expired < n
    assert stats["batches"] == 2 and stats["batch_lines"] == n + expired, "only the expired lines again"
    assert all(count == 1 for count in stats["batch_completed_by_digest"].values()), "no request answered twice"
    first, second = store.batches(outcome.run_id)
    assert first["by_status"] == {"done": n - expired, "retry": expired}
    assert second["round"] == 1 and second["lines"] == expired and second["by_status"] == {"done": expired}
    expected, _ = await online_reference(tmp_path, server.url)
    assert lines(outcome.results["mc"]) == expected


async def test_lines_failing_every_time_are_retried_a_bounded_number_of_times(tmp_path, server: SimServer):
    server.configure(batch_line_errors=0.25, batch_delay=0.0)
    store = open_store(tmp_path / "s.sqlite")
    job = write_job(tmp_path, server.url, mode="batch", batch={"poll_interval": 0.02, "max_resubmits": 2})
    outcome = await execute(load_job(job), store)
    stats, n = server.stats(), distinct(job)
    failed = store.tasks(outcome.run_id, status="failed")
    failing = len({t["key"] for t in failed})
    assert 0 < failing < n
    # the same lines fail every time (chosen by their custom id): sent 1 + 2 times, then failed
    assert stats["batches"] == 3 and stats["batch_lines"] == n + 2 * failing
    assert {t["error_class"] for t in failed} == {"server_error"} and {t["attempts"] for t in failed} == {3}
    assert len(store.tasks(outcome.run_id, status="done")) == ROWS * 2 - len(failed)
    assert not store.ledger(kind="reserved")


async def test_a_budget_is_reserved_before_a_batch_is_submitted_and_never_overshot(tmp_path, server: SimServer):
    store = open_store(tmp_path / "s.sqlite")
    job = load_job(write_job(tmp_path, server.url, mode="batch"))
    # room for about a third of the lines' worst case at the batch price
    rates = Pricing(job).batch_rates(MODEL)
    assert rates is not None
    worst = [rates.worst_case(count_input_tokens("sim", t.model_name, t.messages), 5)
             for t in StagePlan(job, job.stages[0])]
    budget = sum(worst[: len(worst) // 3])
    job.budget = JobBudget(usd=budget)
    outcome = await execute(job, store)
    data = report.build(store, outcome.run_id)
    assert data["totals"]["cost"] <= budget + 1e-12
    submitted = server.stats()["batch_lines"]
    assert 0 < submitted < distinct(job.path)
    # the lines answered settled below their worst case, so later batches used the room they gave back
    assert data["totals"]["sent"] == submitted
    assert outcome.status == "budget_exhausted"


async def test_auto_sends_online_what_no_batch_answered_by_the_deadline(tmp_path, server: SimServer):
    server.configure(batch_delay=30.0)  # far beyond the deadline: the batch is cancelled with few lines done
    store = open_store(tmp_path / "s.sqlite")
    # the deadline planner expects a batch within a second, so it batches, and cuts over before the deadline
    job = write_job(tmp_path, server.url, mode="auto", deadline="2",
                    providers={"sim": {"base_url": server.url, "timeout": 10, "rpm": 6000}},
                    planner={"batch_median": "0.5s", "batch_p95": "1s", "latency": "0.2s"},
                    batch={"poll_interval": 0.05, "min_window": 0})
    started = time.monotonic()
    outcome = await execute(load_job(job), store)
    assert outcome.status == "completed", outcome.message
    assert time.monotonic() - started < 20
    stats, n = server.stats(), distinct(job)
    in_batch = stats["batch_results"].get("succeeded", 0)
    assert stats["batches"] == 1
    assert stats["received"] == n - in_batch, "online: exactly what the batch did not answer"
    expected, _ = await online_reference(tmp_path, server.url)
    got = lines(outcome.results["mc"])
    assert {line["provenance"]["tier"]["asked"] for line in got} == {"deadline planner"}
    assert [_untiered(line) for line in got] == [_untiered(line) for line in expected]
    [batch] = store.batches(outcome.run_id)
    assert batch["by_status"].get("online", 0) == n - in_batch


def _untiered(line: dict) -> dict:
    """A result line without its provenance's tier (the deadline planner's, which an online run has not)."""
    return {**line, "provenance": {k: v for k, v in line["provenance"].items() if k != "tier"}}


async def test_auto_with_no_time_left_for_a_batch_goes_online(tmp_path, server: SimServer):
    store = open_store(tmp_path / "s.sqlite")
    # the deadline planner: a batch's median is an hour, so in 3 s it would almost surely be cut over unanswered
    job = write_job(tmp_path, server.url, mode="auto", deadline="3s",
                    providers={"sim": {"base_url": server.url, "timeout": 10, "rpm": 6000}},
                    planner={"batch_median": "1h", "latency": "0.2s"})
    outcome = await execute(load_job(job), store)
    assert outcome.status == "completed"
    assert server.stats().get("batches", 0) == 0 and server.stats()["received"] == distinct(job)


async def test_a_group_smaller_than_the_batch_api_takes_goes_online_and_a_larger_one_in_a_batch(
        tmp_path, server: SimServer, monkeypatch):
    from runner.providers.openai_servers import SimProvider

    path = write_job(tmp_path, server.url, mode="batch")
    n = distinct(path)
    monkeypatch.setattr(SimProvider, "batch_min_lines", n + 1)  # as Bedrock's floor of 100 records a job
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(load_job(path), store)
    assert outcome.status == "completed", outcome.message
    assert server.stats().get("batches", 0) == 0 and server.stats()["received"] == n
    expected, online_cost = await online_reference(tmp_path, server.url)
    assert lines(outcome.results["mc"]) == expected
    assert report.build(store, outcome.run_id)["totals"]["cost"] == pytest.approx(online_cost)
    assert any(f"{n} requests of {MODEL} sent online" in note for note in outcome.stats.notes)

    monkeypatch.setattr(SimProvider, "batch_min_lines", n)  # exactly the floor: one batch
    server.reset()
    again = tmp_path / "again"
    again.mkdir()
    outcome = await execute(load_job(write_job(again, server.url, mode="batch")), open_store(again / "s.sqlite"))
    assert outcome.status == "completed", outcome.message
    assert server.stats()["batches"] == 1 and server.stats()["received"] == 0


async def test_a_budget_and_a_batch_floor_together_end_the_run_within_the_budget(
        tmp_path, server: SimServer, monkeypatch):
    """A budget lets 150 of about 190 lines into a batch (each line's worst case $0.01 of $1.50): the other ones, too
    few for the floor of 100, wait for that batch (which holds the room) instead of waiting online for room it
    holds while it waits to be collected; then they go online, within what is left."""
    from runner.providers.openai_servers import SimProvider

    monkeypatch.setattr(SimProvider, "batch_min_lines", 100)
    path = write_job(tmp_path, server.url, mode="batch", rows=100, budget={"usd": 1.5},
                     **{"prices": {MODEL: {"input": 0.0, "output": 4000.0, "batch_input": 0.0,
                                           "batch_output": 2000.0}}})
    store = open_store(tmp_path / "s.sqlite")
    outcome = await asyncio.wait_for(execute(load_job(path), store), timeout=60)
    assert outcome.status in ("completed", "budget_exhausted"), outcome.message
    stats = server.stats()
    assert stats["batches"] == 1 and 100 <= stats["batch_lines"] <= 150
    assert stats["received"] > 0, "the rest went online"
    assert store.charged(outcome.run_id) <= 1.5 + 1e-9
    assert any("sent online: its Batch API takes at least 100" in note for note in outcome.stats.notes)


def test_batch_mode_with_a_model_that_has_no_batch_api_is_one_sentence(tmp_path, monkeypatch, capsys):
    job = write_job(tmp_path, "http://127.0.0.1:9/v1", mode="batch", models=["local:smollm2"])
    code, out, err = run_cli(monkeypatch, capsys, "submit", str(job), "--db", str(tmp_path / "s.sqlite"))
    assert code == 2
    assert err.startswith("Error: ") and err.count("\n") == 1, err
    assert "stage mc has mode: batch, but local:smollm2 has no Batch API" in err
    assert "Traceback" not in err


def _count_batches(db: Path) -> int:
    store = open_store(db)
    try:
        return sum(len(store.batches(run["id"])) for run in store.list_runs())
    finally:
        store.close()


def test_a_run_killed_while_polling_resumes_without_submitting_twice(tmp_path, sim_server):
    """`runner submit` in its own process, killed (SIGKILL) while it waits for its batch; `runner resume` polls
    the batch the dead process submitted: nothing is submitted or sent twice, the answers are the online ones."""
    root = sim_server.removesuffix("/v1")
    request = urllib.request.Request(root + "/sim/config", data=json.dumps({"batch_delay": 3.0}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    urllib.request.urlopen(request, timeout=5).read()
    db = tmp_path / "s.sqlite"
    open_store(db).close()  # migrated before the runner starts, so the polls below only read
    job = write_job(tmp_path, sim_server, mode="batch")
    proc = subprocess.Popen(runner_cmd("submit", str(job), "--db", str(db)), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while _count_batches(db) < 1 or not sim_stats(sim_server).get("batches"):
            assert time.monotonic() < deadline and proc.poll() is None, "the batch was never recorded and submitted"
            time.sleep(0.02)
        time.sleep(0.3)  # polling now
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert sim_stats(sim_server)["batches"] == 1
    store = open_store(db)
    run_id = store.list_runs()[0]["id"]
    assert not store.tasks(run_id), "killed before the batch ended"
    assert store.ledger(run_id, kind="reserved"), "the batch's reservations are kept"

    resumed = subprocess.run(runner_cmd("resume", run_id, "--db", str(db)), cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert f"run {run_id}: completed" in resumed.stdout
    stats = sim_stats(sim_server)
    assert stats["batches"] == 1 and stats["batch_lines"] == distinct(job), "nothing submitted twice"
    assert stats["received"] == 0, "nothing sent online"
    store = open_store(db)
    assert len(store.tasks(run_id, status="done")) == ROWS * 2
    assert not store.ledger(run_id, kind="reserved") and not store.ledger(run_id, kind="possibly_billed")
    totals = report.build(store, run_id)["totals"]
    assert totals["batched"] == distinct(job) and totals["ledger_charged"] == pytest.approx(totals["cost"])
    results = tmp_path / "results" / "batchjob" / run_id / "mc.jsonl"
    online = asyncio.run(online_reference(tmp_path, sim_server))
    assert lines(results) == online[0]
    assert totals["cost"] == pytest.approx(online[1] / 2)


async def test_every_stage_is_submitted_before_any_batch_is_waited_for(tmp_path, server: SimServer):
    """Two batch stages: the second stage's batch goes in while the first's is still running (a day's wait each
    would otherwise add up), and both are collected."""
    server.configure(batch_delay=0.5)
    path = write_job(tmp_path, server.url, mode="batch")
    job = json.loads(path.read_text())
    second = json.loads(json.dumps(job["stages"][0]))
    second["name"], second["prompt"]["system"] = "mc2", "Reply with one letter only."
    job["stages"].append(second)
    path.write_text(json.dumps(job), encoding="utf-8")
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(load_job(path), store)
    assert outcome.status == "completed", outcome.message
    first, later = store.batches(outcome.run_id)
    assert (first["stage"], later["stage"]) == ("mc", "mc2")
    assert later["created"] < first["updated"], "the second stage was submitted before the first was collected"
    assert {b["state"] for b in (first, later)} == {"collected"}
    assert len(store.tasks(outcome.run_id, status="done")) == ROWS * 2 * 2


CLOUD = {"openai": ("openai:gpt-4o-mini", "OPENAI_API_KEY"),
         "anthropic": ("anthropic:claude-haiku-4-5", "ANTHROPIC_API_KEY"),
         "gemini": ("gemini:gemini-2.0-flash", "GEMINI_API_KEY")}


@pytest.mark.parametrize("provider", list(CLOUD))
async def test_each_cloud_providers_batch_api_answers_as_its_online_api(tmp_path, server: SimServer, monkeypatch,
                                                                        provider: str):
    """OpenAI's Batch API, Anthropic's Message Batches and Gemini's batch mode, each through its SDK against the
    simulated server: a batch run's results equal an online run's, priced at genai-prices' batch price."""
    model, variable = CLOUD[provider]
    monkeypatch.setenv(variable, "test-key-" + variable.lower())
    url = server.url if provider == "openai" else server.root_url

    async def run(mode: str) -> tuple[list[dict], dict]:
        folder = tmp_path / mode
        folder.mkdir()
        store = open_store(folder / "s.sqlite")
        path = write_job(folder, url, mode=mode, models=[model], providers={provider: {"base_url": url, "timeout": 10}},
                         rows=8)
        outcome = await execute(load_job(path), store)
        assert outcome.status == "completed", outcome.message
        return lines(outcome.results["mc"]), report.build(store, outcome.run_id)

    online, online_report = await run("online")
    before = server.stats().get("batches", 0)
    batched, batch_report = await run("batch")
    assert server.stats()["batches"] == before + 1
    assert batched == online
    sdk = {"openai": "openai", "anthropic": "anthropic", "gemini": "google-genai"}[provider]
    folder = tmp_path / "batch"
    results = next(folder.rglob("mc.jsonl"))
    assert {json.loads(x)["provenance"]["sent_with"] for x in results.read_text(encoding="utf-8").splitlines()} == \
        {f"{sdk} {installed(sdk)}"}  # each batch line says the SDK that sent it
    totals = batch_report["totals"]
    assert totals["batched"] == totals["sent"] > 0
    rates = Pricing(load_job(write_job(tmp_path, url, mode="batch", models=[model], name="p"))).batch_rates(model)
    if rates is not None:  # genai-prices' batch price for gpt-4o-mini and claude-haiku-4-5: half the standard one
        assert totals["cost"] == pytest.approx(online_report["totals"]["cost"] / 2)
        assert totals["batch_saved"] == pytest.approx(online_report["totals"]["cost"] / 2)
    else:  # gemini-2.0-flash: genai-prices lists no batch price, so the standard one is charged, not a guess
        assert totals["cost"] == pytest.approx(online_report["totals"]["cost"]) and totals["batch_saved"] == 0


def test_the_estimate_holds_a_batch_stage_to_its_budget_at_the_batch_price(tmp_path):
    from runner.report import estimate as estimates

    store = open_store(tmp_path / "s.sqlite")
    batch = estimates.estimate(load_job(write_job(tmp_path, "http://127.0.0.1:9/v1", mode="batch")), store)
    online = estimates.estimate(load_job(write_job(tmp_path, "http://127.0.0.1:9/v1", mode="online", name="o")),
                                store)
    assert batch.totals["cost_high"] == pytest.approx(online.high)
    assert batch.high == pytest.approx(batch.totals["batch_high"]) == pytest.approx(online.high / 2)
    # a budget between the two worst cases: enough for the batch job, not for the online one
    budget = online.high * 0.75
    assert estimates.over_budget(batch, budget) is None and estimates.over_budget(online, budget) is not None


async def test_a_batch_run_stopped_by_its_budget_resumes_with_new_batches(tmp_path, server: SimServer):
    """The run spends its budget in a first batch; `runner resume --budget` submits the rest as a new batch of
    the same run beside the collected one (ids stay unique across processes), and nothing is answered twice."""
    store = open_store(tmp_path / "s.sqlite")
    path = write_job(tmp_path, server.url, mode="batch")
    job = load_job(path)
    rates = Pricing(job).batch_rates(MODEL)
    assert rates is not None
    worst = [rates.worst_case(count_input_tokens("sim", t.model_name, t.messages), 5)
             for t in StagePlan(job, job.stages[0])]
    job.budget = JobBudget(usd=sum(worst[: len(worst) // 4]))
    first = await execute(job, store)
    assert first.status == "budget_exhausted"
    again = load_job(path)
    again.budget = JobBudget(usd=sum(worst) * 2)
    resumed = await execute(again, store, run_id=first.run_id)
    assert resumed.status == "completed", resumed.message
    batches = store.batches(first.run_id)
    assert len(batches) >= 2 and len({b["id"] for b in batches}) == len(batches)
    assert all(b["state"] == "collected" for b in batches)
    stats, n = server.stats(), distinct(path)
    assert stats["batch_lines"] == n and all(c == 1 for c in stats["batch_completed_by_digest"].values())
    assert len(store.tasks(first.run_id, status="done")) == ROWS * 2
    assert not store.ledger(first.run_id, kind="reserved")


# -- what a failed line says, a refused input file, Gemini's 20 MB --------------------------------------------


def _patch_input_file(monkeypatch, change) -> list[int]:
    """Make the OpenAI batch client's input files go through ``change(lines, submission)`` (the JSONL lines as
    dicts, the submission's number from 0); returns the list of submissions made."""
    from runner.providers.openai_batch import OpenAIBatches

    original = OpenAIBatches.input_file
    made: list[int] = []

    def input_file(self, model, lines):
        items = [json.loads(raw) for raw in original(self, model, lines).decode().splitlines()]
        change(items, len(made))
        made.append(len(items))
        return "".join(json.dumps(item) + "\n" for item in items).encode()

    monkeypatch.setattr(OpenAIBatches, "input_file", input_file)
    return made


async def test_a_failed_lines_message_and_parameter_reach_the_task_the_results_and_the_report(
        tmp_path, server: SimServer, monkeypatch):
    def bad_stop(items: list[dict], submission: int) -> None:
        items[0]["body"]["stop"] = 5  # the online endpoint refuses it: a 400 line naming the parameter

    _patch_input_file(monkeypatch, bad_stop)
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(load_job(write_job(tmp_path, server.url, mode="batch")), store)
    said = "400 invalid_request_error (param stop): Invalid 'stop': expected a string or a list of strings."
    failed = store.tasks(outcome.run_id, status="failed")
    assert failed and all(t["error_class"] == "bad_request" and t["error"].endswith(said) for t in failed)
    results = [json.loads(line) for line in outcome.results["mc"].read_text().splitlines()]
    errors = [r for r in results if r.get("error")]
    assert len(errors) == len(failed) and all(r["error"].endswith(said) for r in errors)
    [row] = report.build(store, outcome.run_id)["rows"]
    assert row["errors"] == {"bad_request": len(failed)}


async def test_a_refused_input_file_fails_the_named_lines_and_resubmits_the_others_once(
        tmp_path, server: SimServer, monkeypatch):
    def wrong_model_first_time(items: list[dict], submission: int) -> None:
        if submission == 0:
            items[-1]["body"]["model"] = "another-model"  # OpenAI: one model per input file

    made = _patch_input_file(monkeypatch, wrong_model_first_time)
    store = open_store(tmp_path / "s.sqlite")
    path = write_job(tmp_path, server.url, mode="batch", batch={"poll_interval": 0.02, "max_resubmits": 0})
    outcome = await execute(load_job(path), store)
    n = distinct(path)
    assert made == [n, n - 1], "the valid lines went again, in a batch of their own, even with max_resubmits 0"
    stats = server.stats()
    assert stats["batches"] == 2 and stats["batch_lines"] == n - 1, "the refused file ran nothing"
    assert all(c == 1 for c in stats["batch_completed_by_digest"].values()), "each answered once"
    failed = store.tasks(outcome.run_id, status="failed")
    assert {t["key"] for t in failed} and len({t["key"] for t in failed}) == 1
    assert all(t["error_class"] == "bad_request" and f"refused its input file at line {n}: mismatched_model "
               "(param body.model): The model 'another-model'" in t["error"] for t in failed)
    assert len(store.tasks(outcome.run_id, status="done")) == ROWS * 2 - len(failed)
    totals = report.build(store, outcome.run_id)["totals"]
    assert totals["ledger_charged"] == pytest.approx(totals["cost"]) and totals["batched"] == n - 1
    assert not store.ledger(kind="reserved")
    first, second = store.batches(outcome.run_id)
    assert first["by_status"] == {"failed": 1, "retry": n - 1} and second["by_status"] == {"done": n - 1}


async def test_lines_refused_a_second_time_fail(tmp_path, server: SimServer, monkeypatch):
    def wrong_model_every_time(items: list[dict], submission: int) -> None:
        items[-1]["body"]["model"] = "another-model"

    made = _patch_input_file(monkeypatch, wrong_model_every_time)
    store = open_store(tmp_path / "s.sqlite")
    path = write_job(tmp_path, server.url, mode="batch")
    outcome = await execute(load_job(path), store)
    n = distinct(path)
    assert made == [n, n - 1], "submitted again once only"
    assert server.stats()["batch_lines"] == 0 and server.stats()["received"] == 0
    failed = store.tasks(outcome.run_id, status="failed")
    assert len(failed) == ROWS * 2
    classes = {t["key"]: t["error_class"] for t in failed}
    assert sorted(classes.values()).count("bad_request") == 2, "one line named by each refusal"
    assert {c for c in classes.values() if c != "bad_request"} == {"batch_refused"}
    assert not store.ledger(kind="reserved") and not store.ledger(kind="charge")


async def test_a_gemini_stage_is_sent_as_several_inline_batches_each_under_the_size_limit(
        tmp_path, server: SimServer, monkeypatch):
    from runner.providers import gemini_batch

    monkeypatch.setenv("GEMINI_API_KEY", "test-key")
    monkeypatch.setattr(gemini_batch, "INLINE_BUDGET", 3000)  # a few lines a batch, to see the engine cut
    model = "gemini:gemini-2.0-flash"
    store = open_store(tmp_path / "s.sqlite")
    path = write_job(tmp_path, server.root_url, mode="batch", models=[model],
                     providers={"gemini": {"base_url": server.root_url, "timeout": 10}})
    outcome = await execute(load_job(path), store)
    assert outcome.status == "completed", outcome.message
    n = distinct(path)
    batches = list(server.batches.batches.values())
    assert len(batches) > 2 and sum(len(b.lines) for b in batches) == n
    for batch in batches:
        size = sum(len(json.dumps({"request": line.body, "metadata": line.metadata})) for line in batch.lines)
        assert size <= 3000 * 1.2, "each batch within the budget (its JSON measured on the server)"
    assert len(store.tasks(outcome.run_id, status="done")) == ROWS * 2
    assert {b["state"] for b in store.batches(outcome.run_id)} == {"collected"}
