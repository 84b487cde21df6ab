"""The live view: elapsed time and ETA, the last error per model, a budget that fits a 100-column terminal, and
a resumed run's counts and projection (earlier attempts' tasks and spend included)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from runner.engine.budget import Budgets, Scope
from runner.engine.run import execute
from runner.engine.stats import RunStats
from runner.errors import BadRequest
from runner.report.progress import LiveView, PlainView, budget_line, budget_parts, time_line
from runner.spec.job import load_job
from runner.spec.overrides import set_budget
from runner.store import open_store
from tests.helpers import write_job, write_rows

LONG_MODEL = "openai-compatible:my-vllm-server/meta-llama/Meta-Llama-3.1-70B-Instruct-Turbo-with-a-long-tail"


def rendered(stats: RunStats, width: int = 100) -> list[str]:
    """The live view's lines as a terminal of ``width`` columns shows them."""
    view = LiveView(io.StringIO(), console=Console(record=True, width=width))
    view.stats, view.title = stats, "run 20261123-194502-8ad1 · job a-job-with-a-rather-long-name"
    view.console.print(view.render())
    return view.console.export_text().splitlines()


def busy_stats() -> RunStats:
    stats = RunStats()
    c = stats.counters("evaluate-every-model-on-the-long-stage", LONG_MODEL)
    c.total, c.done, c.cache_hits, c.errors, c.retries = 100_000, 30_000, 1_000, 12, 40
    c.spend, c.saved, c.batch_saved = 1234.5, 55.25, 12.5
    c.cached_in, c.cache_saved = 98_765_432, 321.75
    c.tokens_in, c.tokens_out = 123_456_789, 9_876_543
    stats.counters("mc", "sim:m").total = 10
    budgets = Budgets(Scope("run", "job", usd=5000.0))
    budgets.run.spent_usd, budgets.run.reserved_usd = 1234.5, 12.25
    stats.budgets = budgets
    stats.last_error[LONG_MODEL] = "server_error: " + "the upstream server said something long. " * 20
    return stats


def test_the_view_fits_100_columns_with_a_long_model_name_and_a_budget() -> None:
    lines = rendered(busy_stats())
    too_long = [line for line in lines if len(line.rstrip()) > 100]
    assert not too_long, "\n".join(too_long)
    text = "\n".join(lines)
    assert "budget: spent $1,234.50 + reserved $12.25 of $5,000.00 (25%)" in text
    assert "projected" in text and "by the Batch API's price $12.50" in text
    assert "by the provider's prompt cache $321.75 (98,765,432 input tokens read)" in " ".join(
        line.strip() for line in lines)
    assert "elapsed" in text and "ETA" in text
    # the last error is there, on one line, cut short
    (error,) = [line for line in lines if line.startswith("last error")]
    assert error.startswith(f"last error {LONG_MODEL[:40]}") and "server_error: the upstream server" in error
    assert error.rstrip().endswith("…")
    # the model's name is shown whole (folded, not cut), and so are the figures
    assert LONG_MODEL in "".join(line.strip() for line in lines)
    assert "30000/100000" in text and "$1,234.50" in text


def test_a_wide_terminal_keeps_the_table() -> None:
    stats = RunStats()
    c = stats.counters("mc", "sim:m")
    c.total, c.done = 10, 4
    lines = rendered(stats, width=160)
    assert any("cache hits" in line and "tokens in/out" in line for line in lines)
    assert max(len(line.rstrip()) for line in lines) <= 160


def test_elapsed_and_eta_count_only_requests_this_process_sent() -> None:
    stats = RunStats()
    stats.started = 1000.0
    c = stats.counters("s", "m")
    # 100 tasks: 40 finished by an earlier attempt, 10 cache hits, 10 sent in the 60 s since the start
    c.total, c.prior, c.resumed, c.cache_hits, c.done = 100, 40, 40, 10, 60
    assert c.finished == 60 and c.remaining == 40 and c.fresh == 10
    assert stats.eta(now=1060.0) == pytest.approx(60 / 10 * 40)
    assert time_line(stats, now=1060.0) == "elapsed 1m00s, ETA 4m00s"
    # before the first request sent, there is no pace to go by
    c.done, c.resumed = 50, 40
    assert stats.eta(now=1060.0) is None and time_line(stats, now=1060.0).endswith("ETA --")


def test_a_resumed_run_projects_earlier_spend_plus_this_pace_times_what_is_left() -> None:
    """An earlier attempt finished 50 of 100 tasks for $5.00 (the resumed budgets start with it); this process has
    reached 10 of those again, sent 20 requests for $2.00, and 30 tasks are left."""
    stats = RunStats()
    c = stats.counters("s", "m")
    c.total, c.prior, c.resumed, c.done, c.spend = 100, 50, 10, 30, 2.0
    budgets = Budgets(Scope("run", "job", usd=20.0))
    budgets.spend("s", "m", 5.0, 1000)  # what Dispatcher does on a resume, from the store's ledger
    budgets.run.spent_usd += 2.0  # this process's settled spend
    stats.budgets = budgets
    totals = stats.totals()
    assert (totals.total, totals.finished, totals.remaining) == (100, 70, 30)
    spent, rate = 7.0, 2.0 / 20
    projected = spent + rate * 30
    assert f"projected ${projected:,.2f} at completion" in budget_line(stats)
    # not the fresh-run figure (this process's spend plus its pace times everything not reached yet)
    assert "projected $9.00" not in budget_line(stats)
    # without budgets, the earlier spend comes from the store too (RunStats.prior_spend)
    stats.budgets, stats.prior_spend = None, 5.0
    assert budget_parts(stats) == ["spent $7.00", f"projected ${projected:,.2f} at completion"]


def _priced_job(tmp_path, rows: int, usd: float):
    dataset = write_rows(tmp_path / "rows.jsonl", rows)
    extra = f"prices: {{fake:m1: {{input: 1000, output: 1000}}}}\nbudget: {{usd: {usd}}}"
    return load_job(write_job(tmp_path / "job.yaml", dataset, models=["fake:m1"], extra=extra))


class Capture:
    """A view that keeps what the live view would show when the run starts and when it stops."""

    def __init__(self) -> None:
        self.at_start: dict[str, object] = {}
        self.at_stop: dict[str, object] = {}
        self.stats: RunStats | None = None

    def _snapshot(self) -> dict[str, object]:
        assert self.stats is not None
        totals = self.stats.totals()
        budgets = self.stats.budgets
        return {"finished": totals.finished, "total": totals.total, "prior_spend": self.stats.prior_spend,
                "run_spent": budgets.run.spent_usd if isinstance(budgets, Budgets) else None,
                "line": budget_line(self.stats), "errors": dict(self.stats.last_error)}

    def start(self, stats: RunStats, title: str) -> None:
        self.stats = stats
        self.at_start = self._snapshot()

    def note(self, message: str) -> None:
        pass

    def stop(self) -> None:
        self.at_stop = self._snapshot()


async def test_a_resumed_run_counts_earlier_tasks_and_spend_from_its_start(tmp_path, fake_provider) -> None:
    # the fake provider has no tokenizer: each request reserves the byte bound of its input (~230 tokens, $0.23)
    # and is charged for the 11 tokens it reports, so the budget ends after a dozen or so requests
    job = _priced_job(tmp_path, rows=30, usd=0.4)
    store = open_store(tmp_path / "s.sqlite")
    first = await execute(job, store)
    assert first.status == "budget_exhausted"
    done_before = sum(1 for t in store.tasks(first.run_id) if t["status"] == "done")
    spent_before = sum(row["amount"] for row in store.ledger(first.run_id, kind="charge"))
    assert 0 < done_before < 30 and spent_before > 0

    set_budget(job, 10.0)
    view = Capture()
    second = await execute(job, store, run_id=first.run_id, view=view)
    assert second.status == "completed"
    start = view.at_start
    # from the first frame: the earlier attempt's tasks are finished, its spend is spent, nothing projected yet
    assert start["total"] == 30 and start["finished"] == done_before
    assert start["run_spent"] == pytest.approx(spent_before)
    assert start["prior_spend"] == pytest.approx(spent_before)
    assert str(start["line"]).startswith(f"budget: spent ${spent_before:,.4f}")
    assert view.at_stop["finished"] == 30


async def test_the_last_error_per_model_reaches_the_view(tmp_path, fake_provider) -> None:
    dataset = write_rows(tmp_path / "rows.jsonl", 4)
    job = load_job(write_job(tmp_path / "job.yaml", dataset, models=["fake:m1"]))
    fake_provider.behaviour = lambda m, msgs, p, n: BadRequest("the prompt was refused\nby the filter",
                                                               status=400) if "number 2" in msgs[-1]["content"] \
        else None
    view = Capture()
    outcome = await execute(job, open_store(tmp_path / "s.sqlite"), view=view)
    assert outcome.status == "completed"
    assert view.at_stop["errors"] == {"fake:m1": "bad_request: the prompt was refused\nby the filter"}
    out = io.StringIO()
    plain = PlainView(out, 10)
    plain.stats = outcome.stats
    plain.emit()
    assert "[runner] last error fake:m1: bad_request: the prompt was refused by the filter\n" in out.getvalue()
    assert "[runner] elapsed " in out.getvalue()
