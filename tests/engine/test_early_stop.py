"""A stage's ``stop:`` rule end to end on the simulated server, whose models named ``...-accNN`` are right NN % of
the time on options marked ``(right)`` (simserver/answers.py): a clear difference is decided early with the right
verdict and fewer requests sent, a half-width stops where the sequence says, a resume after a budget ran out picks
the rule up where it was without paying twice, and bad rules are refused by `runner validate` in one sentence."""

from __future__ import annotations

import asyncio
import json

import pytest

from runner.engine.run import execute
from runner.spec.job import load_job
from runner.store import open_store
from simserver import start_server
from tests.helpers import run_cli, write_job

STRONG, WEAK = "sim:gpt-sim-acc90", "sim:gpt-sim-acc40"


def marked_rows(path, count: int):
    """Four-option rows whose gold option's text carries the simulated server's ``(right)`` marker."""
    with open(path, "w", encoding="utf-8") as out:
        for i in range(count):
            choices = [f"option {k} of question {i}" for k in range(4)]
            choices[i % 4] += " (right)"
            out.write(json.dumps({"question": f"Question number {i}: which is right?", "choices": choices,
                                  "gold": i % 4}) + "\n")
    return path


#: Know-No MC-Test's with-gold stage as it ships: its items, and two simulated models 20 points apart
MCTEST_ITEMS = 1000
STRONG_MC, WEAKER = "sim:gpt-sim-acc90", "sim:gpt-sim-acc70"


def mctest_job(tmp_path, url: str, rule: dict, *, models: tuple[str, str] = (STRONG_MC, WEAKER),
               extra: dict | None = None):
    """The bundled Know-No MC-Test job's with-gold stage with ``stop: rule``, its gold options marked ``(right)``
    for the simulated server's ``-accNN`` models, priced, on the server at ``url`` (``extra``: further job keys)."""
    import yaml

    from tests.helpers import ROOT

    marked = tmp_path / "mctest.jsonl"
    with open(ROOT / "data" / "knowno" / "MCTest_1000.jsonl", encoding="utf-8") as rows, \
            open(marked, "w", encoding="utf-8") as out:
        for line in rows:
            story = json.loads(line)
            for question in story["question_list"]:
                gold = question["gold_option"]
                question["options"] = [f"{o} (right)" if o == gold else o for o in question["options"]]
                question["gold_option"] = f"{gold} (right)"
            out.write(json.dumps(story) + "\n")
    job = yaml.safe_load((ROOT / "jobs" / "knowno-mctest.yaml").read_text(encoding="utf-8"))
    [stage] = [s for s in job["stages"] if s["name"] == "with-gold"]
    stage["dataset"]["path"] = str(marked)
    stage["stop"] = rule
    job.update(stages=[stage], models=list(models), report=None, output_dir=str(tmp_path / "results"),
               providers={"sim": {"base_url": url, "concurrency": 4}},
               prices={model: {"input": 1000, "output": 1000} for model in models}, **(extra or {}))
    path = tmp_path / "knowno-mctest.yaml"
    path.write_text(yaml.safe_dump(job), encoding="utf-8")
    return path


def _submit(tmp_path, path, db: str):
    """`runner submit` of the job at ``path`` in its own process: (the process, the run id it printed)."""
    from tests.helpers import printed_run_id, start_runner

    process = start_runner(["submit", str(path), "--db", db], tmp_path)
    return process, printed_run_id(process)


@pytest.fixture
async def server():
    async with await start_server() as srv:
        yield srv


def _job(tmp_path, url: str, rule: str, *, rows: int = 400, models=(STRONG, WEAK), extra: str = "",
         name: str = "early"):
    providers = f"providers: {{sim: {{base_url: {json.dumps(url)}, concurrency: 4}}}}"
    return write_job(tmp_path / f"{name}.yaml", marked_rows(tmp_path / "rows.jsonl", rows), models=list(models),
                     extra=f"{providers}\n{extra}", stage_extra=f"    stop: {rule}", name=name)


async def test_a_clear_difference_is_decided_early_the_right_way_and_the_rest_is_not_sent(tmp_path, server):
    job = load_job(_job(tmp_path, server.url, f"{{decide: [{WEAK}, {STRONG}], seed: 3}}"))
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    assert outcome.status == "completed"
    assert "stage mc stopped after" in outcome.message and f"{STRONG} better than {WEAK}" in outcome.message
    asked = int(outcome.message.split("stopped after ")[1].split(" of")[0].replace(",", ""))
    assert asked < 200, outcome.message  # 90 % against 40 % right: decided well before the 400 items
    sent = server.stats()["received"]
    # what was sent: the items fed to the rule, and the few in flight when it held (4 at a time per model)
    assert 2 * asked <= sent <= 2 * asked + 2 * 4 + 2 * 64
    tasks = store.tasks(outcome.run_id)
    assert len(tasks) == sent and {t["status"] for t in tasks} == {"done"}
    # items were asked in the rule's shuffled order, not the file's first ones
    asked_ids = {t["row_id"] for t in tasks}
    assert asked_ids != {str(i) for i in range(1, len(asked_ids) + 1)} and max(map(int, asked_ids)) > 300


async def test_the_same_rule_and_seed_ask_the_same_items(tmp_path, server):
    rule = f"{{decide: [{WEAK}, {STRONG}], seed: 5}}"
    runs = []
    for folder in ("one", "two"):
        (tmp_path / folder).mkdir()
        job = load_job(_job(tmp_path / folder, server.url, rule))
        store = open_store(tmp_path / folder / "s.sqlite")
        outcome = await execute(job, store)
        runs.append(({t["row_id"] for t in store.tasks(outcome.run_id)}, outcome.message))
    assert runs[0] == runs[1]


async def test_a_halfwidth_stops_once_every_model_is_known_to_within_it(tmp_path, server):
    job = load_job(_job(tmp_path, server.url, "{halfwidth: 0.15}", models=(STRONG,)))
    outcome = await execute(job, open_store(tmp_path / "s.sqlite"))
    assert outcome.status == "completed" and "stage mc stopped after" in outcome.message
    accuracy, width = outcome.message.split(f"{STRONG} ")[1].split("% ± ")
    assert float(width) <= 15.0 and abs(float(accuracy) - 90.0) <= float(width) + 1


async def test_a_resume_picks_the_rule_up_where_it_was_and_pays_nothing_twice(tmp_path, server):
    prices = f"prices: {{{STRONG}: {{input: 1000, output: 1000}}, {WEAK}: {{input: 1000, output: 1000}}}}"
    # each request's worst case is about $0.07 (60-odd input tokens, 5 output, at $1,000 a million): $2 pays ~28
    path = _job(tmp_path, server.url, f"{{decide: [{WEAK}, {STRONG}], seed: 7}}", extra=f"{prices}\nbudget: {{usd: 2}}")
    store = open_store(tmp_path / "s.sqlite")
    first = await execute(load_job(path), store)
    assert first.status == "budget_exhausted"
    answered = {t["row_id"] for t in store.tasks(first.run_id, status="done")}
    assert answered
    again = load_job(path)
    assert again.budget is not None
    again.budget.usd = 1000.0
    second = await execute(again, store, run_id=first.run_id)
    assert second.status == "completed" and "stopped after" in second.message, second.message
    # (the server keys its counts by messages, which the two models share: count requests against tasks instead)
    tasks = store.tasks(first.run_id)
    assert server.stats()["received"] == len(tasks) and not any(t["cache_hit"] for t in tasks), "sent twice"
    # the same order: what the first attempt answered is among what the whole run asked, and the rule counted it
    every = {t["row_id"] for t in tasks}
    assert answered <= every
    asked = int(second.message.split("stopped after ")[1].split(" of")[0].replace(",", ""))
    assert asked >= len(answered) - 8


@pytest.mark.parametrize(("rule", "sentence"), [
    ("{decide: [sim:nobody, sim:gpt-sim-acc40]}", "decide: names 'sim:nobody', which stage 'mc' does not run"),
    ("{halfwidth: 0.6}", "Input should be less than 0.5"),
    ("{halfwidth: 0.1, alpha: 0.7}", "Input should be less than 0.5"),
    ("{alpha: 0.1}", "stop: needs halfwidth: (each model's accuracy to within it) or decide:"),
])
def test_bad_rules_are_refused_by_validate(tmp_path, monkeypatch, capsys, rule, sentence):
    job = _job(tmp_path, "http://127.0.0.1:9/v1", rule, rows=10)
    code, out, err = run_cli(monkeypatch, capsys, "validate", str(job))
    assert code == 2 and sentence in err, err


def test_stop_on_a_stage_that_scores_nothing_is_refused(tmp_path, monkeypatch, capsys):
    job = _job(tmp_path, "http://127.0.0.1:9/v1", "{halfwidth: 0.1}", rows=10)
    job.write_text(job.read_text().replace("    parse: letter\n", "    parse: letter\n    review: true\n"))
    code, out, err = run_cli(monkeypatch, capsys, "validate", str(job))
    assert code == 2 and "scores nothing (review: true): stop: needs scores to decide on" in err, err


async def test_the_reports_and_the_viewer_show_the_sequence_the_reason_and_the_saving(tmp_path, server):
    from aiohttp import web

    from runner.report import html, summary
    from runner.view.app import make_app
    from tests.view.conftest import fetch

    prices = f"prices: {{{STRONG}: {{input: 1000, output: 1000}}, {WEAK}: {{input: 1000, output: 1000}}}}"
    job = load_job(_job(tmp_path, server.url, f"{{decide: [{WEAK}, {STRONG}], seed: 3}}", extra=prices))
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    asked = int(outcome.message.split("stopped after ")[1].split(" of")[0].replace(",", ""))
    data = summary.build(store, outcome.run_id)
    [stop] = data["stops"]
    assert stop["stopped"] and stop["items_asked"] == asked and stop["items_total"] == 400
    assert stop["summary"] == outcome.message and stop["sequences"] == [
        {"name": f"{STRONG} − {WEAK}", "of": "difference"}]
    # every look's interval of the difference, the last one on the strong model's side of zero
    looks = stop["looks"]
    assert looks[-1][0] == asked and [fed for fed, _ in looks] == sorted(fed for fed, _ in looks)
    assert looks[-1][1][0][0] > 0 and all(low <= high for _, [[low, high]] in looks)
    spent = sum(t["cost"] or 0 for t in store.tasks(outcome.run_id))
    assert stop["spent"] == pytest.approx(spent) and stop["full_cost"] == pytest.approx(spent * 400 / asked)
    assert stop["saved"] == pytest.approx(stop["full_cost"] - spent) and stop["saved"] > spent

    text = summary.render(data, "text")
    assert outcome.message in text and f"Early stopping, stage mc: {outcome.message}" in text
    assert f"asked {asked:,} of 400 items" in text and f"spent ${stop['spent']:.4f} of the " in text
    assert f"{STRONG} − {WEAK} (points)" in text
    page = html.render(html.build(store, outcome.run_id))
    assert 'data-plot="stop"' in page and f"Asked {asked:,} of 400 items" in page
    assert json.loads(summary.render(data, "json"))["stops"][0]["items_asked"] == asked

    runner = web.AppRunner(make_app(open_store(tmp_path / "s.sqlite")), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        viewed = await fetch(f"http://127.0.0.1:{runner.addresses[0][1]}/runs/{outcome.run_id}")
    finally:
        await runner.cleanup()
    assert 'data-plot="stop"' in viewed and "Early stopping" in viewed and f"saved ${stop['saved']:.4f}" in viewed


async def test_the_population_target_takes_whole_clusters_and_does_not_settle_a_small_difference(tmp_path, server):
    # 40 clusters of 10 items; two models whose accuracies differ by 5 points: the benchmark's 400 items cannot
    # settle the population's difference (clusters are the draws), so the stage runs to its end, not decided
    path = tmp_path / "clusters.jsonl"
    with open(path, "w", encoding="utf-8") as out:
        for i in range(400):
            choices = [f"option {k} of question {i}" for k in range(4)]
            choices[i % 4] += " (right)"
            out.write(json.dumps({"question": f"Question {i}?", "choices": choices, "gold": i % 4,
                                  "topic": f"t{i // 10}"}) + "\n")
    providers = f"providers: {{sim: {{base_url: {json.dumps(server.url)}, concurrency: 4}}}}"
    job = write_job(tmp_path / "pop.yaml", path, models=["sim:gpt-sim-acc60", "sim:gpt-sim-acc65"], extra=providers,
                    stage_extra="    cluster: topic\n    stop: {decide: all, target: population, seed: 2}", name="pop")
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(load_job(job), store)
    assert outcome.status == "completed"
    assert "asked all 400 items: its stop: rule on the population did not hold" in outcome.message
    # asked cluster by cluster: the first 10 tasks of each model share one topic
    from runner.plan.stage import StagePlan

    loaded = load_job(job)
    order = StagePlan(loaded, loaded.stages[0]).cluster_order()
    assert len(order) == 40 and all(len(items) == 10 for _, items in order)
    assert [cluster for cluster, _ in order] != [f"t{i}" for i in range(40)]  # shuffled


async def test_the_population_target_decides_a_clear_difference_too(tmp_path, server):
    job = load_job(_job(tmp_path, server.url, f"{{decide: [{WEAK}, {STRONG}], target: population, seed: 3}}"))
    outcome = await execute(job, open_store(tmp_path / "s.sqlite"))
    assert "stopped after" in outcome.message and f"{STRONG} better than {WEAK}" in outcome.message
    assert int(outcome.message.split("stopped after ")[1].split(" of")[0]) < 300


@pytest.mark.slow  # two runner processes sharing a run
@pytest.mark.parametrize("sim_server", [0.1], indirect=True)
def test_two_workers_on_know_no_mctest_stop_together_once_decided_and_pay_nothing_twice(tmp_path, sim_server, db):
    """Know-No MC-Test's with-gold stage for two models 20 points apart, `stop: {decide: ...}`: the owner and a
    `runner work` process split it; each feeds its rule every worker's answers from the store, the first to see it
    hold writes the decision there and the other reads it. Both end the stage early with the same verdict, and no
    request is charged twice. (A stage with stop: keeps its endpoints' lines a lease deep even in a lone worker, so
    the worker joining a second later finds chunks to take.)"""
    from tests.helpers import start_runner

    path = mctest_job(tmp_path, sim_server, {"decide": [WEAKER, STRONG], "seed": 5})
    owner, run_id = _submit(tmp_path, path, db)
    worker = start_runner(["work", run_id, "--db", db], tmp_path)
    outs = [process.communicate(timeout=180) for process in (owner, worker)]
    said = []
    for process, (out, err) in zip((owner, worker), outs, strict=True):
        assert process.returncode == 0, err[-3000:]
        assert "Traceback" not in err and "stage with-gold stopped after" in out, (out + err)[-3000:]
        said.append(out.split("stage with-gold stopped after ")[1].split(")")[0])
    assert said[0] == said[1], said  # one decision, the same in both
    assert f"{STRONG_MC} better than {WEAKER}" in said[0]
    store = open_store(db)
    try:
        run = store.get_run(run_id)
        assert run["status"] == "completed" and "stage with-gold stopped after" in run["message"], run
        asked = int(run["message"].split("stopped after ")[1].split(" of")[0].replace(",", ""))
        assert asked < MCTEST_ITEMS // 2, asked
        assert len({t["row_id"] for t in store.tasks(run_id)}) < MCTEST_ITEMS // 2
        charges = store.ledger(run_id, kind="charge")
        assert len({row["key"] for row in charges}) == len(charges), "a request was charged twice"
        assert not store.ledger(run_id, kind="reserved")
        leased = store.rows("SELECT DISTINCT worker FROM leases WHERE run_id = ?", (run_id,))
        assert len(leased) == 2, "both workers took some of the stage"
        [record] = store.stops(run_id)
        assert record["stopped"] and record["found"] and record["items_total"] == MCTEST_ITEMS
    finally:
        store.close()


async def test_through_a_batch_api_the_stage_goes_in_growing_waves_and_stops_between_them(tmp_path, server):
    """Know-No MC-Test's with-gold stage with `mode: batch`: the first wave is 256 tasks (128 of each model), each
    next twice the last, and each is waited for and read by the rule before the next goes: a 10-point difference is
    decided after a few waves, with far fewer requests sent than the stage has."""
    from runner.plan.stage import StagePlan

    middle = "sim:gpt-sim-acc80"
    path = mctest_job(tmp_path, server.url, {"decide": [middle, STRONG_MC], "seed": 4}, models=(STRONG_MC, middle),
                      extra={"mode": "batch", "batch": {"poll_interval": 0.02, "max_requests": 50000}})
    job = load_job(path)
    per_item = len(StagePlan(job, job.stages[0]).variants)  # its choice seeds
    store = open_store(tmp_path / "s.sqlite")
    outcome = await execute(job, store)
    assert outcome.status == "completed" and "stage with-gold stopped after" in outcome.message, outcome.message
    assert f"{STRONG_MC} better than {middle}" in outcome.message
    batches = store.batches(outcome.run_id)
    waves: dict[str, list[int]] = {}
    for found in batches:
        waves.setdefault(found["model"], []).append(found["lines"])
    assert set(waves) == {STRONG_MC, middle} and waves[STRONG_MC] == waves[middle], waves
    # each wave's tasks per model: 128, 256, 512, ...; its batch holds fewer lines when some of its requests repeat
    # one already sent (MC-Test has questions asked twice: sent once, the answer shared)
    sizes = waves[STRONG_MC]
    planned = [128 * 2 ** n for n in range(len(sizes))]
    assert len(sizes) >= 2 and all(0.9 * plan <= size <= plan for size, plan in zip(sizes, planned, strict=True)), \
        sizes
    tasks = store.tasks(outcome.run_id)
    assert 2 * sum(sizes) <= len(tasks) == 2 * sum(planned) < 2 * MCTEST_ITEMS * per_item
    assert all(t["status"] == "done" for t in tasks)
    asked = int(outcome.message.split("stopped after ")[1].split(" of")[0].replace(",", ""))
    # decided within the last wave sent, not before it (an item's tasks are its choice seeds)
    assert sum(planned[:-1]) // per_item < asked <= -(-sum(planned) // per_item), (asked, sizes, per_item)


@pytest.mark.slow  # a runner process killed with SIGKILL, then resumed
@pytest.mark.parametrize("sim_server", [0.05], indirect=True)
def test_know_no_mctest_killed_mid_run_resumes_the_same_order_and_decides_paying_nothing_twice(tmp_path, sim_server):
    """The bundled Know-No MC-Test job's with-gold stage, its gold options marked for the simulated server's
    ``-accNN`` models (90 % and 70 % right), with `stop: {decide: ...}`: killed with kill -9 mid-run, then resumed.
    The resume continues the same seeded order, the run ends early with the right verdict, and no request is
    charged twice (those in flight at the kill are kept as possibly billed)."""
    import signal
    import subprocess
    import time

    from runner.plan.stage import StagePlan
    from tests.helpers import done_tasks, runner_cmd

    strong, weaker = STRONG_MC, WEAKER
    path = mctest_job(tmp_path, sim_server, {"decide": [weaker, strong], "seed": 11})
    db = str(tmp_path / "s.sqlite")

    first, run_id = _submit(tmp_path, path, db)
    deadline = time.monotonic() + 60
    while done_tasks(db) < 120 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.poll() is None, "the run ended before it could be killed"
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    store = open_store(db)
    before = {t["row_id"] for t in store.tasks(run_id, status="done")}
    store.close()

    resumed = subprocess.run(runner_cmd("resume", run_id, "--db", db), cwd=tmp_path, capture_output=True, text=True,
                             timeout=180)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "stage with-gold stopped after" in resumed.stdout and f"{strong} better than {weaker}" in resumed.stdout
    store = open_store(db)
    try:
        tasks = store.tasks(run_id)
        asked = {t["row_id"] for t in tasks}
        assert before <= asked and len(asked) < MCTEST_ITEMS
        # the same seeded order: what both attempts asked is the order's beginning (a wave in flight beyond it)
        order = StagePlan(load_job(path), load_job(path).stages[0]).item_order()
        assert asked <= set(order[:len(asked) + 64]), "an item far from the order's beginning was asked"
        charges = store.ledger(run_id, kind="charge")
        assert len({row["key"] for row in charges}) == len(charges), "a request was charged twice"
        assert not store.ledger(run_id, kind="reserved")
        assert store.get_run(run_id)["status"] == "completed"
    finally:
        store.close()


def _asked_in_order(path, tasks) -> None:
    """What the run asked is the seeded order's beginning (a wave or a lease in flight may reach past it)."""
    from runner.plan.stage import StagePlan

    job = load_job(path)
    asked = {t["row_id"] for t in tasks}
    order = StagePlan(job, job.stages[0]).item_order()
    assert len(asked) < MCTEST_ITEMS and asked <= set(order[:len(asked) + 64]), \
        "an item far from the order's beginning was asked"


def _charged_once(store, run_id: str) -> None:
    charges = store.ledger(run_id, kind="charge")
    assert charges and len({row["key"] for row in charges}) == len(charges), "a request was charged twice"
    assert not store.ledger(run_id, kind="reserved")


@pytest.mark.slow  # a runner process killed with SIGKILL while a wave's batch is out, then resumed
@pytest.mark.parametrize("sim_server", [0.0], indirect=True)
def test_know_no_mctest_in_batch_mode_killed_between_waves_resumes_them_and_submits_nothing_twice(tmp_path,
                                                                                                   sim_server):
    """Know-No MC-Test's with-gold stage with `mode: batch` and `stop: {decide: ...}` for two models 10 points
    apart, each batch taking a second at the simulated server: killed with kill -9 while its second wave's batch
    is out, then resumed. The resume reads the rule's answers so far from the store, polls the batch the dead process
    submitted instead of submitting it again, goes on in growing waves and decides the right way; every batch was
    submitted once and no request charged twice."""
    import signal
    import subprocess
    import time
    import urllib.request

    from tests.helpers import runner_cmd, sim_stats

    root = sim_server.removesuffix("/v1")
    urllib.request.urlopen(urllib.request.Request(
        root + "/sim/config", data=json.dumps({"batch_delay": 1.0}).encode(),
        headers={"Content-Type": "application/json"}, method="POST"), timeout=5).read()
    middle = "sim:gpt-sim-acc80"
    path = mctest_job(tmp_path, sim_server, {"decide": [middle, STRONG_MC], "seed": 4}, models=(STRONG_MC, middle),
                      extra={"mode": "batch", "batch": {"poll_interval": 0.05, "max_requests": 50000}})
    db = str(tmp_path / "s.sqlite")
    open_store(db).close()  # migrated before the runner starts, so the polls below only read

    def recorded() -> int:
        store = open_store(db)
        try:
            return sum(len(store.batches(run["id"])) for run in store.list_runs())
        finally:
            store.close()

    first, run_id = _submit(tmp_path, path, db)
    # the first wave is one batch per model; the second wave's two batches submitted: kill while they are out
    deadline = time.monotonic() + 90
    while recorded() < 4 or sim_stats(sim_server).get("batches", 0) < 4:
        assert first.poll() is None, "the run ended before its second wave was out"
        assert time.monotonic() < deadline, "the second wave was never submitted"
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    submitted = sim_stats(sim_server)["batches"]

    resumed = subprocess.run(runner_cmd("resume", run_id, "--db", db), cwd=tmp_path, capture_output=True, text=True,
                             timeout=180)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "stage with-gold stopped after" in resumed.stdout, (resumed.stdout + resumed.stderr)[-3000:]
    assert f"{STRONG_MC} better than {middle}" in resumed.stdout
    store = open_store(db)
    try:
        assert store.get_run(run_id)["status"] == "completed"
        batches = store.batches(run_id)
        # every batch the store knows was submitted once: the resume submitted only waves after the kill
        assert sim_stats(sim_server)["batches"] == len(batches) >= submitted
        assert len({b["provider_batch_id"] for b in batches}) == len(batches)
        tasks = store.tasks(run_id)
        assert all(t["status"] == "done" for t in tasks)
        _asked_in_order(path, tasks)
        _charged_once(store, run_id)
    finally:
        store.close()


@pytest.mark.slow  # two runner processes on one PostgreSQL store, one killed with SIGKILL
@pytest.mark.parametrize("sim_server", [0.1], indirect=True)
def test_two_workers_on_postgresql_one_killed_the_other_takes_over_and_decides_paying_nothing_twice(
        tmp_path, sim_server, pg_url, monkeypatch):
    """Know-No MC-Test's with-gold stage, `stop: {decide: ...}`, split between `runner submit` and `runner work` on
    PostgreSQL; the joiner is killed with kill -9 while it holds a lease. The owner declares it dead once its lease
    runs out, takes its chunks over in the same seeded order, decides the right way, and no request is charged
    twice (what the dead worker had in flight is kept as possibly billed, by it alone)."""
    import signal
    import time

    from tests.helpers import done_tasks, start_runner

    monkeypatch.setenv("RUNNER_LEASE_TTL", "8")  # the dead worker's chunks are taken over within seconds
    path = mctest_job(tmp_path, sim_server, {"decide": [WEAKER, STRONG_MC], "seed": 5})
    owner, run_id = _submit(tmp_path, path, pg_url)
    victim = start_runner(["work", run_id, "--db", pg_url], tmp_path)

    def victim_leases() -> int:
        store = open_store(pg_url)
        try:
            rows = store.rows("SELECT worker FROM leases WHERE run_id = ? AND done = 0", (run_id,))
            return sum(1 for (worker,) in rows if worker.split(":")[-2] == str(victim.pid))
        finally:
            store.close()

    deadline = time.monotonic() + 60
    while done_tasks(pg_url) < 60 or not victim_leases():
        assert owner.poll() is None and victim.poll() is None, "the stage ended before the joiner could be killed"
        assert time.monotonic() < deadline, "the joiner never held a lease with 60 tasks done"
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    out, err = owner.communicate(timeout=180)
    assert owner.returncode == 0, err[-3000:]
    assert "Traceback" not in err and "stage with-gold stopped after" in out, (out + err)[-3000:]
    assert f"{STRONG_MC} better than {WEAKER}" in out
    store = open_store(pg_url)
    try:
        assert store.get_run(run_id)["status"] == "completed"
        states = {w["id"]: w["state"] for w in store.workers(run_id)}
        dead = [worker for worker, state in states.items() if state == "dead"]
        assert len(dead) == 1 and dead[0].split(":")[-2] == str(victim.pid), states
        assert {row["worker"] for row in store.ledger(run_id, kind="possibly_billed")} <= set(dead)
        tasks = store.tasks(run_id)
        _asked_in_order(path, tasks)
        # the owner waited for the dead worker's lease near the rule, instead of asking on past it until the
        # stage's end (which, before it did, asked all 1,000 items for a decision after about 100)
        assert len({t["row_id"] for t in tasks}) < MCTEST_ITEMS // 2
        _charged_once(store, run_id)
        [record] = store.stops(run_id)
        assert record["stopped"] and record["found"]
    finally:
        store.close()


async def test_a_worker_left_alone_still_takes_the_decision_the_other_wrote_before_it_left():
    """The other worker decided, wrote its decision and left before this one read the store: alone on the run, this
    worker no longer reads the answers there, but still reads the decisions, so it stops too instead of asking the
    rest of the stage (a clean-clone run of the suite caught a worker asking on for minutes)."""
    from runner.engine import early_stop

    class Stopper:  # what watch() reads and calls of a StageStopper
        stage, adopted, decision = "with-gold", False, None
        fed: list = []

        @property
        def stopped(self) -> bool:
            return self.decision is not None

        def feed(self, rows) -> None:
            self.fed.extend(rows)

        def adopt(self, record) -> None:
            if record.get("stopped"):
                self.decision, self.adopted = record["found"], True

    class Store:
        scores_read = 0

        async def stage_scores(self, run_id, stage, position):
            self.scores_read += 1
            return position, []

        async def stops(self, run_id):
            return [{"stage": "with-gold", "stopped": True, "found": ["a better"], "items_asked": 40}]

        async def record_stop(self, run_id, stage, record):  # only a decision of this worker's own is written
            raise AssertionError("an adopted decision is not written again")

    stopper, store = Stopper(), Store()
    await asyncio.wait_for(early_stop.watch(stopper, store, "RUN", 0, alone=lambda: True), timeout=5)
    assert stopper.adopted and stopper.decision == ["a better"]
    assert store.scores_read == 0, "alone, the answers in the store are not read"
