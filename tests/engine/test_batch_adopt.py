"""A batch the provider accepted but the store never recorded is adopted, not submitted again.

`runner submit` runs in its own process with each Batch API client's ``submit`` wrapped so that the process kills
itself (SIGKILL) the moment the provider has answered with the batch's id: the provider has the batch, the store
has not heard of it. `runner resume` then finds the batch by its label (OpenAI's metadata, Gemini's display name)
or its custom ids (Anthropic's results), through each official SDK against the simulated server, and collects it:
every line is submitted once, every task is done, one charge per request. No test hook is in the runner: the kill
is this file's wrapper, loaded before the runner's CLI. A process killed before the provider took the batch leaves
an intent the resume finds nothing for: its lines are submitted once, by the resume. A submit whose answer is lost
(a timeout after the provider took the batch) is looked up before its lines go again."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from runner.engine.run import execute
from runner.errors import TransientError
from runner.providers import openai_batch
from runner.report import summary as report
from runner.spec.job import load_job
from runner.store import open_store
from simserver import SimConfig, SimServer, start_server
from tests.engine.test_batch_runs import ROWS, distinct, write_job
from tests.helpers import killed_after_submit, runner_cmd, sim_configure, sim_stats

CLOUD = {"openai": ("openai:gpt-4o-mini", "OPENAI_API_KEY"),
         "anthropic": ("anthropic:claude-haiku-4-5", "ANTHROPIC_API_KEY"),
         "gemini": ("gemini:gemini-2.0-flash", "GEMINI_API_KEY")}

#: `runner ARGS` whose Batch API clients die right after the provider accepted a batch (before the store records it)
KILLED_AFTER_SUBMIT = killed_after_submit("openai_batch.OpenAIBatches", "anthropic_batch.AnthropicBatches",
                                          "gemini_batch.GeminiBatches")


# OpenAI's in the fast path; the others' (the same adoption through each provider's batch API) with the whole suite
@pytest.mark.parametrize("provider", [pytest.param(name, marks=() if name == "openai" else pytest.mark.slow)
                                      for name in CLOUD])
def test_a_batch_accepted_but_not_recorded_is_adopted_by_the_resume(tmp_path: Path, sim_server: str, provider: str):
    model, variable = CLOUD[provider]
    url = sim_server if provider == "openai" else sim_server.removesuffix("/v1")
    sim_configure(sim_server, batch_delay=1.0)
    env = {**os.environ, variable: "test-key-" + variable.lower()}
    db = tmp_path / "s.sqlite"
    open_store(db).close()
    job = write_job(tmp_path, url, mode="batch", models=[model],
                    providers={provider: {"base_url": url, "timeout": 10}})
    n = distinct(job)

    killed = subprocess.run([sys.executable, "-c", KILLED_AFTER_SUBMIT, "submit", str(job), "--db", str(db)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, killed.stderr
    stats = sim_stats(sim_server)
    assert stats["batches"] == 1 and stats["batch_lines"] == n, "the provider took the batch before the kill"
    store = open_store(db)
    run_id = store.list_runs()[0]["id"]
    assert not store.tasks(run_id) and not any(b["provider_batch_id"] for b in store.batches(run_id)), \
        "the store never heard of the batch's id"
    store.close()

    started = time.monotonic()
    resumed = subprocess.run(runner_cmd("resume", run_id, "--db", str(db)), cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert f"run {run_id}: completed" in resumed.stdout
    assert time.monotonic() - started < 60
    stats = sim_stats(sim_server)
    assert stats["batches"] == 1 and stats["batch_lines"] == n, "no line submitted twice"
    assert all(count == 1 for count in stats["batch_completed_by_digest"].values()), "no request answered twice"
    assert stats["received"] == 0, "nothing sent online"
    store = open_store(db)
    assert len(store.tasks(run_id, status="done")) == ROWS * 2
    charges = store.ledger(run_id, kind="charge")
    assert len(charges) == n and len({c["key"] for c in charges}) == n, "one charge per request"
    assert not store.ledger(run_id, kind="reserved") and not store.ledger(run_id, kind="possibly_billed")
    [batch] = store.batches(run_id)
    assert batch["state"] == "collected" and batch["provider_batch_id"] and batch["by_status"] == {"done": n}
    totals = report.build(store, run_id)["totals"]
    assert totals["batched"] == n and totals["ledger_charged"] == pytest.approx(totals["cost"])


def test_a_batch_the_provider_never_took_is_submitted_by_the_resume(tmp_path: Path, sim_server: str):
    """Killed after the intent was recorded and before the provider was asked: the resume finds no such batch,
    forgets the intent and submits its lines, once."""
    sim_configure(sim_server, batch_delay=0.2)
    db = tmp_path / "s.sqlite"
    open_store(db).close()
    job = write_job(tmp_path, sim_server, mode="batch")
    n = distinct(job)
    killed = subprocess.run([sys.executable, "-c", KILLED_AFTER_SUBMIT, "submit", str(job), "--db", str(db)],
                            cwd=tmp_path, env={**os.environ, "KILL_BEFORE_SUBMIT": "1"}, capture_output=True,
                            text=True, timeout=120)
    assert killed.returncode == -9, killed.stderr
    assert sim_stats(sim_server).get("batches", 0) == 0
    store = open_store(db)
    run_id = store.list_runs()[0]["id"]
    store.close()
    resumed = subprocess.run(runner_cmd("resume", run_id, "--db", str(db)), cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    stats = sim_stats(sim_server)
    assert stats["batches"] == 1 and stats["batch_lines"] == n
    store = open_store(db)
    assert len(store.tasks(run_id, status="done")) == ROWS * 2
    [batch] = store.batches(run_id)  # the intent is gone; the resume's batch is collected
    assert batch["state"] == "collected" and batch["by_status"] == {"done": n}
    assert len(store.ledger(run_id, kind="charge")) == n
    assert not store.ledger(run_id, kind="reserved") and not store.ledger(run_id, kind="possibly_billed")


@pytest.fixture
async def server():
    async with await start_server(SimConfig(batch_delay=0.2)) as srv:
        yield srv


def losing_answers(monkeypatch: pytest.MonkeyPatch, *, taken: list[bool]) -> list[str]:
    """The OpenAI batch client's submits fail with a timeout; ``taken[i]`` says whether the provider took the
    i-th batch all the same (then, past the last, whether it takes the next ones). Returns the ids it took."""
    submit = openai_batch.OpenAIBatches.submit
    made: list[str] = []

    async def timing_out(self, *args, **kwargs):
        took = taken[min(len(made), len(taken) - 1)]
        made.append(await submit(self, *args, **kwargs) if took else "")
        raise TransientError("the request timed out", error_class="timeout")

    monkeypatch.setattr(openai_batch.OpenAIBatches, "submit", timing_out)
    return made


async def test_a_submit_whose_answer_was_lost_is_looked_up_and_adopted(tmp_path: Path, server: SimServer,
                                                                     monkeypatch: pytest.MonkeyPatch):
    made = losing_answers(monkeypatch, taken=[True])
    store = open_store(tmp_path / "s.sqlite")
    path = write_job(tmp_path, server.url, mode="batch")
    outcome = await execute(load_job(path), store)
    assert outcome.status == "completed", outcome.message
    n = distinct(path)
    stats = server.stats()
    assert len(made) == 1 and stats["batches"] == 1 and stats["batch_lines"] == n, "adopted, not submitted again"
    [batch] = store.batches(outcome.run_id)
    assert batch["provider_batch_id"] == made[0] and batch["by_status"] == {"done": n}
    assert len(store.tasks(outcome.run_id, status="done")) == ROWS * 2
    assert len(store.ledger(outcome.run_id, kind="charge")) == n and not store.ledger(kind="reserved")


async def test_a_submit_that_failed_is_sent_again_a_bounded_number_of_times(tmp_path: Path, server: SimServer,
                                                                          monkeypatch: pytest.MonkeyPatch):
    made = losing_answers(monkeypatch, taken=[False, False, True])
    store = open_store(tmp_path / "s.sqlite")
    path = write_job(tmp_path, server.url, mode="batch", batch={"poll_interval": 0.02, "max_resubmits": 2})
    outcome = await execute(load_job(path), store)
    n = distinct(path)
    # not taken twice (looked up, not found, sent again), then taken but its answer lost: found, adopted
    assert len(made) == 3 and server.stats()["batches"] == 1 and server.stats()["batch_lines"] == n
    assert outcome.status == "completed", outcome.message
    assert len(store.tasks(outcome.run_id, status="done")) == ROWS * 2

    never = losing_answers(monkeypatch, taken=[False])
    again = open_store(tmp_path / "t.sqlite")
    outcome = await execute(load_job(write_job(tmp_path, server.url, mode="batch", name="never",
                                               batch={"poll_interval": 0.02, "max_resubmits": 2})), again)
    assert len(never) == 3, "sent 1 + max_resubmits times"
    failed = again.tasks(outcome.run_id, status="failed")
    assert len(failed) == ROWS * 2 and {t["error_class"] for t in failed} == {"timeout"}
    assert {t["attempts"] for t in failed} == {3}
    assert not again.batches(outcome.run_id) and not again.ledger(kind="reserved") and not again.ledger(kind="charge")


def _intents(store: Any) -> dict[str, Any]:
    """A batch's intent through its life in ``store``: what each question answers, without the timestamps."""
    def batches(run_id: str) -> list[dict[str, Any]]:
        return [{k: v for k, v in b.items() if k not in ("run_id", "created", "updated")}
                for b in store.batches(run_id)]

    run_id = store.create_run("j", "j.yaml", "{}", "fp", 2)
    first = store.reserve(run_id, "mc", "sim:m", "k1", 0.5)
    second = store.reserve(run_id, "mc", "sim:m", "k2", 0.25)
    store.record_batch("b1", run_id, "mc", "sim:m", None, 0, [("k1", first)], state="submitting")
    store.record_batch("b2", run_id, "mc", "sim:m", None, 1, [("k2", second)], state="submitting")
    seen: dict[str, Any] = {"intents": [{k: v for k, v in b.items() if k not in ("run_id", "created", "updated")}
                                        for b in store.open_batches(run_id, "mc")]}
    seen["resolved"] = store.resolve_reservations(run_id)  # an intent's reservations are held, as a batch's
    store.update_batch("b1", provider_batch_id="batch_x", state="running", provider_state="submitted")
    store.release(second)
    store.drop_batch("b2")
    seen["after"] = batches(run_id)
    seen["open"] = [b["provider_batch_id"] for b in store.open_batches(run_id, "mc")]
    seen["reserved"] = [row["key"] for row in store.ledger(run_id, kind="reserved")]
    return seen


def test_an_intent_is_an_open_batch_until_adopted_or_dropped_in_both_stores(tmp_path: Path, pg_url: str):
    sqlite, postgres = open_store(tmp_path / "s.sqlite"), open_store(pg_url)
    try:
        seen = _intents(sqlite)
        assert seen == _intents(postgres), "the same answers from SQLite and PostgreSQL"
    finally:
        sqlite.close()
        postgres.close()
    [b1, b2] = seen["intents"]
    assert (b1["provider_batch_id"], b1["state"], b1["provider_state"], b1["lines"]) == (
        None, "submitting", "submitting", {"k1": (1, "pending")})
    assert b2["round"] == 1 and seen["resolved"] == (0, 0)
    assert seen["open"] == ["batch_x"] and seen["reserved"] == ["k1"]
    [adopted] = seen["after"]
    assert (adopted["id"], adopted["state"], adopted["by_status"]) == ("b1", "running", {"pending": 1})
