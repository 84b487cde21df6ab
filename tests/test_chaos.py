"""The seeded fault simulation (scripts/chaos.py, faultsim/): a seed's draw is its own and replays exactly, the
guarantee checks catch what they are for, the first 20 seeds break no guarantee, and with fencing switched off (a
launcher patch in the runner's processes, devservers/launchers.py) the same seeds catch it."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from faultsim.checks import State, answered_once, billed_once, budget, charged_once
from faultsim.draw import KINDS, draw
from faultsim.jobfile import MAX_ATTEMPTS
from faultsim.run import Record
from scripts import chaos

#: the seeds CI runs (the issue asks at least 20)
CI_SEEDS = 20


def test_a_seed_draws_the_same_run_and_faults_every_time_and_seeds_differ():
    assert all(draw(seed) == draw(seed) and draw(seed).describe() == draw(seed).describe() for seed in range(50))
    assert len({draw(seed).to_json() for seed in range(50)}) == 50
    kinds = Counter(fault.kind for seed in range(200) for fault in draw(seed).faults)
    assert set(kinds) == set(KINDS), "every kind of fault is drawn"


def _state(log: list[dict], ledger: list[dict], budget_usd: float | None = None) -> State:
    asked = {"k1": ("m", "d1"), "k2": ("m", "d2")}
    scenario = draw(0)
    scenario = type(scenario)(**{**scenario.__dict__, "budget": budget_usd})
    return State(scenario, Record("r", "db", Path("."), log=log), {"status": "completed"}, [], ledger, asked, [], [])


def test_an_extra_billing_is_a_violation_unless_the_store_keeps_it_as_possibly_billed():
    log = [{"kind": "request", "model": "m", "digest": d, "billed": True} for d in ("d1", "d1", "d2")]
    log.append({"kind": "request", "model": "m", "digest": "d2", "billed": False})  # a 500: not billed
    charges = [{"key": "k1", "kind": "charge", "amount": 1.0}, {"key": "k2", "kind": "charge", "amount": 1.0}]
    assert billed_once(_state(log, charges)) == ["request d1 (m) billed 2 times, 0 kept as possibly billed",
                                                 "1 extra billing(s), 0 possibly billed"]
    kept = [*charges, {"key": "k1", "kind": "possibly_billed", "amount": 2.0}]
    assert billed_once(_state(log, kept)) == []
    assert charged_once(_state(log, kept)) == []
    assert charged_once(_state(log, [*kept, {"key": "k2", "kind": "charge", "amount": 1.0}])) == [
        "1 request(s) charged more than once, e.g. k2 x2"]


def test_spend_past_the_budget_and_one_reservation_is_a_violation():
    ledger = [{"key": "k1", "kind": "charge", "amount": 1.0}, {"key": "k2", "kind": "possibly_billed", "amount": 0.5}]
    assert budget(_state([], ledger, budget_usd=1.0)) == []  # within the budget plus one reservation
    assert budget(_state([], ledger, budget_usd=0.4)) == [
        "spent $1.5000 of a $0.4 budget (one reservation: $0.5000)"]


def _failures(answers_500: int, attempts: int, *, storm: bool = True) -> list[str]:
    """What answered_once says of a task that failed with a server error after ``attempts`` attempts, and of the task
    that waited on the same request, when the server answered that request 500 ``answers_500`` times."""
    log = [{"kind": "request", "model": "m", "digest": "d1", "status": 500, "billed": False}] * answers_500
    failed = {"status": "failed", "key": "k1"}
    tasks = [{**failed, "error_class": "server_error", "attempts": attempts},
             {**failed, "error_class": "provider_error", "attempts": 0}]
    record = Record("r", "db", Path("."), log=log)
    record.injected["http_500"] = int(storm)
    state = State(draw(0), record, {"status": "completed"}, tasks, [], {}, [], [])
    return [line for line in answered_once(state) if line.startswith("task(s) failed")]


def test_a_task_given_up_on_after_every_attempt_was_answered_500_is_the_retry_policy_not_a_violation():
    assert _failures(MAX_ATTEMPTS, MAX_ATTEMPTS) == []
    broken = ["task(s) failed: 1 server_error, 1 provider_error"]
    assert _failures(MAX_ATTEMPTS - 1, MAX_ATTEMPTS) == broken  # the server did not answer 500 that often
    assert _failures(MAX_ATTEMPTS, 3) == broken  # given up before its attempts were spent
    assert _failures(MAX_ATTEMPTS, MAX_ATTEMPTS, storm=False) == broken  # no storm of 500s was injected


def _chaos(tmp_path: Path, *args: str) -> tuple[int, dict]:
    out = tmp_path / "totals.json"
    code = chaos.main([*args, "--workdir", str(tmp_path / "seeds"), "--json", str(out)])
    return code, json.loads(out.read_text())


#: the CI seeds in blocks, each a test of its own, so that the suite's test processes share them
BLOCK = 5


@pytest.mark.slow  # five seeds, each several runner processes with their faults and resumes: about a minute
@pytest.mark.parametrize("first", range(0, CI_SEEDS, BLOCK), ids=lambda first: f"seeds-{first}-{first + BLOCK - 1}")
def test_the_ci_seeds_break_no_guarantee(tmp_path, first):
    code, totals = _chaos(tmp_path, "--seeds", str(BLOCK), "--first", str(first))
    assert {name: seeds for name, seeds in totals["violations"].items() if seeds} == {}
    assert code == 0
    assert totals["run"] + sum(totals["passed_over"].values()) == BLOCK
    # every seed draws at least one fault; one may come too late for its run, not most of them
    assert sum(totals["injected"].values()) >= BLOCK // 2, totals["injected"]


#: passes over the CI seeds that stop a worker, with fencing off, before the test gives up
FENCING_PASSES = 3


@pytest.mark.slow  # the CI seeds whose draw stops a worker, with fencing off, until one is caught: 15 s to a minute
def test_fencing_switched_off_is_caught_within_the_ci_seeds(tmp_path):
    """With fencing off, a worker stopped past its lease and continued records what the worker that took its lease
    over sends again: charged or billed twice, which the table catches. A pass can miss it when every stop lands
    while the stopped worker has nothing in flight (then fencing has nothing to guard: seen once in a loop of
    whole-suite runs, seed 0's worker stopped between its chunks), so up to FENCING_PASSES passes."""
    for attempt in range(FENCING_PASSES):
        (tmp_path / f"pass-{attempt}").mkdir()
        code, totals = _chaos(tmp_path / f"pass-{attempt}", "--seeds", str(CI_SEEDS), "--only", "stop_worker",
                              "--break", "fencing", "--stop-at-first")
        caught = {name for name, seeds in totals["violations"].items() if seeds}
        if code == 1:
            break
    assert code == 1, f"fencing switched off was not caught in {FENCING_PASSES} passes: {totals}"
    assert caught & {"charged_once", "billed_once"}, totals
