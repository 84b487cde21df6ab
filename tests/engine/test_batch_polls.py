"""A batch whose looks keep failing with errors that pass (its status, or its lookup by label) is not asked for for
ever: the first failure is said in the run's notes, and after ``batch.poll_timeout`` seconds of failures in a row
the run stops with one sentence naming the batch and the setting, the batch kept; ``runner resume`` collects it,
nothing submitted or paid twice. Failures that end before the timeout only delay the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.engine.run import execute
from runner.errors import TransientError
from runner.providers import openai_batch
from runner.spec.job import load_job
from runner.store import open_store
from simserver import SimServer
from tests.engine.test_batch_runs import ROWS, distinct, server, write_job  # noqa: F401  (the fixture)


def failing_status(monkeypatch: pytest.MonkeyPatch, failures: int | None) -> list[str]:
    """OpenAI's batch status fails with a timeout ``failures`` times (None: every time); returns the ids asked."""
    asked: list[str] = []
    status = openai_batch.OpenAIBatches.status

    async def flaky(self, batch_id: str):  # type: ignore[no-untyped-def]
        asked.append(batch_id)
        if failures is None or len(asked) <= failures:
            raise TransientError("the request timed out", error_class="timeout")
        return await status(self, batch_id)

    monkeypatch.setattr(openai_batch.OpenAIBatches, "status", flaky)
    return asked


async def test_a_status_that_keeps_failing_stops_the_run_and_the_resume_collects_the_batch(
        tmp_path: Path, server: SimServer, monkeypatch: pytest.MonkeyPatch):  # noqa: F811
    asked = failing_status(monkeypatch, None)
    store = open_store(tmp_path / "s.sqlite")
    path = write_job(tmp_path, server.url, mode="batch", batch={"poll_interval": 0.02, "poll_timeout": 0.4})
    outcome = await execute(load_job(path), store)
    assert outcome.status == "failed"
    assert "could not be looked at for" in (outcome.message or "") and "batch.poll_timeout" in outcome.message
    assert len(asked) >= 10, "looked at again every poll until the timeout"
    notes = [n for n in outcome.stats.notes if "a look at it failed" in n]
    assert len(notes) == 1 and "poll_timeout" in notes[0], outcome.stats.notes
    [batch] = store.batches(outcome.run_id)
    assert batch["state"] != "collected" and batch["provider_batch_id"] == asked[0], "the batch is kept"
    assert not store.ledger(outcome.run_id, kind="charge")

    monkeypatch.undo()
    resumed = await execute(load_job(path), store, run_id=outcome.run_id)
    assert resumed.status == "completed", resumed.message
    stats, n = server.stats(), distinct(path)
    assert stats["batches"] == 1 and stats["batch_lines"] == n, "collected, not submitted again"
    assert len(store.tasks(outcome.run_id, status="done")) == ROWS * 2
    assert len(store.ledger(outcome.run_id, kind="charge")) == n and not store.ledger(kind="reserved")


async def test_failures_that_end_before_the_timeout_only_delay_the_run(tmp_path: Path, server: SimServer,  # noqa: F811
                                                                       monkeypatch: pytest.MonkeyPatch):
    asked = failing_status(monkeypatch, 3)
    store = open_store(tmp_path / "s.sqlite")
    path = write_job(tmp_path, server.url, mode="batch", batch={"poll_interval": 0.02, "poll_timeout": 30})
    outcome = await execute(load_job(path), store)
    assert outcome.status == "completed", outcome.message
    assert len(asked) > 3
    assert len([n for n in outcome.stats.notes if "a look at it failed" in n]) == 1
    assert len(store.ledger(outcome.run_id, kind="charge")) == distinct(path)
