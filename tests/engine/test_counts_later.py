"""Counting without waiting for a tokenizer (runner/providers/tokens.py, "Counting without waiting"): until the
encoding a count needs is built, the engine takes a request's byte bound, which is never below the count, so the
budget invariant (ARCHITECTURE.md invariant 3) holds with no tokenizer on the path to the first request; a budget
the bound does not fit makes the reserver count at once, so the bound never refuses what the count would hold.
The estimate ``runner submit`` prints bounds the same requests, and counts before refusing a run."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.engine import reserver as reserver_module
from runner.engine.budget import Reservation
from runner.engine.control import RunControl
from runner.engine.leases import ChunkLeases
from runner.engine.reserver import Reserver
from runner.engine.stats import RunStats
from runner.plan.request import Task
from runner.plan.stage import StagePlan
from runner.providers import tokens
from runner.report.estimate import estimate
from runner.service import prepare_submit
from runner.spec.job import load_job
from runner.store import Store, open_store
from tests.helpers import write_job, write_rows

MODEL = "openai:gpt-4o-mini"  # counted exactly with o200k_base (tokens_exact)
PRICES = f"prices: {{{MODEL}: {{input: 1000.0, output: 3000.0}}}}"


@pytest.fixture
def unbuilt(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """No encoding built yet in this process, as at a run's start, and the builds asked for noted instead of
    started (a thread building meanwhile would make the test's outcome depend on timing)."""
    asked: list[tuple[str, str]] = []
    monkeypatch.setattr(tokens, "_built", set())
    monkeypatch.setattr(reserver_module, "build_soon", lambda provider, model, pairs=None: asked.append(
        (provider, model)))
    return asked


class Parts:
    """A reserver over a fresh store and run of a four-row job of :data:`MODEL`, and the stage's tasks."""

    def __init__(self, tmp_path: Path, extra: str = PRICES) -> None:
        path = write_job(tmp_path / "job.yaml", write_rows(tmp_path / "rows.jsonl", 4), models=[MODEL], extra=extra)
        self.job = load_job(path)
        self.store: Store = open_store(tmp_path / "store.sqlite")
        self.run_id = self.store.create_run(self.job.name, self.job.path, self.job.model_dump_json(),
                                            self.job.fingerprint(), 4)
        self.stats, self.control = RunStats(), RunControl()
        self.reserver = Reserver(run_id=self.run_id, job=self.job, store=self.store, stats=self.stats,
                                 control=self.control, leases=ChunkLeases(self.stats))
        self.tasks: list[Task] = list(StagePlan(self.job, self.job.stages[0]))


def counted(task: Task) -> int:
    return tokens.count_call_tokens(task.provider, task.model_name, task.messages, task.call.pairs)


def bound(task: Task) -> int:
    return tokens.byte_bound(task.messages, task.call.pairs)


def usd(tokens_in: int, max_tokens: int = 5) -> float:
    """The worst case of a request of ``tokens_in`` input tokens at :data:`PRICES` (``max_tokens`` 5, the job's)."""
    return (tokens_in * 1000.0 + max_tokens * 3000.0) / 1e6


def folder(tmp_path: Path, name: str) -> Path:
    (tmp_path / name).mkdir()
    return tmp_path / name


def test_the_byte_bound_is_above_the_count_and_asking_whether_a_count_is_exact_builds_nothing(
        tmp_path: Path, unbuilt) -> None:
    parts = Parts(tmp_path)
    assert tokens.exact("openai", "gpt-4o-mini") and not tokens.counts_now("openai", "gpt-4o-mini")
    assert tokens.counts_now("sim", "gpt-4o-mini")  # the simulated server's rule needs no tokenizer
    assert tokens._built == set()
    for task in parts.tasks:
        assert bound(task) > counted(task) > 0


async def test_until_the_tokenizer_is_built_a_request_reserves_its_byte_bound(tmp_path: Path, unbuilt) -> None:
    parts = Parts(tmp_path)
    task = parts.tasks[0]
    reserved, held_tokens = parts.reserver.worst_case(task)
    assert held_tokens == bound(task) + 5 and reserved == pytest.approx(usd(bound(task)))
    assert unbuilt == [("openai", "gpt-4o-mini")]  # the build was asked for, not done on the way
    assert task.call.input_tokens is None  # the bound is not kept: the count replaces it once it can be made
    tokens.encoding("o200k_base")  # built (as the thread would)
    assert parts.reserver.worst_case(task) == (pytest.approx(usd(counted(task))), counted(task) + 5)


async def test_a_budget_the_bound_does_not_fit_but_the_count_does_holds_the_request(tmp_path: Path, unbuilt) -> None:
    probe = Parts(folder(tmp_path, "probe"))
    task = probe.tasks[0]
    exact_usd, bound_usd = usd(counted(task)), usd(bound(task))
    assert exact_usd < bound_usd
    parts = Parts(tmp_path, f"{PRICES}\nbudget: {{usd: {(exact_usd + bound_usd) / 2}}}")
    held = await parts.reserver.reserve(parts.tasks[0])
    assert isinstance(held, Reservation) and held.usd == pytest.approx(exact_usd)
    assert parts.tasks[0].call.input_tokens == counted(task) and not parts.control.stopping
    assert parts.store.ledger(parts.run_id, kind="reserved")[0]["amount"] == pytest.approx(exact_usd)


async def test_a_budget_neither_fits_still_stops_the_run(tmp_path: Path, unbuilt) -> None:
    probe = Parts(folder(tmp_path, "probe"))
    exact_usd = usd(counted(probe.tasks[0]))
    parts = Parts(tmp_path, f"{PRICES}\nbudget: {{usd: {exact_usd / 2}}}")
    assert await parts.reserver.reserve(parts.tasks[0]) is None
    assert parts.control.stopping and parts.reserver.exhausted is not None
    assert parts.tasks[0].call.input_tokens == counted(probe.tasks[0])  # counted before giving up


def test_the_submit_estimate_bounds_what_it_would_have_to_build_a_tokenizer_to_count(tmp_path: Path, unbuilt) -> None:
    parts = Parts(tmp_path)
    bounded = estimate(parts.job, parts.store, count_free=False, bound_only=True)
    (group,) = bounded.groups
    assert group.input_bound_only and group.input_tokens is None and group.cost_low is None
    assert group.input_tokens_bound == sum(bound(task) for task in parts.tasks)
    assert group.cost_high == pytest.approx(sum(usd(bound(task)) for task in parts.tasks))
    assert tokens._built == set()  # nothing built on the way
    full = estimate(parts.job, parts.store, count_free=False)
    (whole,) = full.groups
    assert not whole.input_bound_only and whole.input_tokens == sum(counted(task) for task in parts.tasks)
    assert whole.cost_low is not None and whole.cost_high < group.cost_high


def test_a_submit_whose_budget_only_the_count_fits_is_not_refused(tmp_path: Path, unbuilt) -> None:
    probe = Parts(folder(tmp_path, "probe"))
    exact = sum(usd(counted(task)) for task in probe.tasks)
    bounded = sum(usd(bound(task)) for task in probe.tasks)
    parts = Parts(tmp_path, f"{PRICES}\nbudget: {{usd: {(exact + bounded) / 2}}}")
    submission = prepare_submit(parts.job, parts.store)
    assert submission.refusal is None and not submission.estimate.totals["input_bound_only"]
    assert submission.estimate.high == pytest.approx(exact)  # counted, then decided
    tight = Parts(folder(tmp_path, "tight"), f"{PRICES}\nbudget: {{usd: {exact / 2}}}")
    assert prepare_submit(tight.job, tight.store).refusal is not None
    roomy = Parts(folder(tmp_path, "roomy"), f"{PRICES}\nbudget: {{usd: {bounded * 2}}}")
    tokens._built.clear()  # as in a new process: the counts above built the encoding
    started = prepare_submit(roomy.job, roomy.store)
    assert started.refusal is None and started.estimate.totals["input_bound_only"]  # decided by the bound alone
