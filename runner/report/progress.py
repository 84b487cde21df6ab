"""The live view: a rich table per stage and model on a terminal, periodic plain log lines elsewhere.

It only reads :class:`runner.stats.RunStats`; the engine does not know it exists.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import IO

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from runner.engine.budget import Budgets
from runner.engine.stats import Counters, RunStats


def make_view(stream: IO[str] | None = None, interval: float | None = None) -> LiveView | PlainView:
    stream = stream or sys.stderr
    if interval is None:
        interval = float(os.environ.get("RUNNER_PROGRESS_INTERVAL", "10"))
    if stream.isatty() and os.environ.get("TERM") != "dumb":
        return LiveView(stream)
    return PlainView(stream, interval)


def _money(value: float) -> str:
    return f"${value:,.4f}" if value < 1 else f"${value:,.2f}"


def budget_line(stats: RunStats) -> str | None:
    """Spent / reserved / budget of the run, the money saved by the cache, and the projected total."""
    budgets = stats.budgets
    totals = stats.totals()
    projected = ""
    fresh = totals.done - totals.resumed - totals.cache_hits
    left = totals.total - totals.done
    if fresh > 0 and left > 0:
        projected = f", projected {_money(totals.spend + totals.spend / fresh * left)} at completion"
    saved = f", saved by the cache {_money(totals.saved)}" if totals.saved else ""
    if totals.batch_saved:
        saved += f", by the Batch API's price {_money(totals.batch_saved)}"
    if not isinstance(budgets, Budgets) or budgets.run.usd is None:
        if not totals.spend and not totals.saved:
            return None
        return f"spent {_money(totals.spend)}{saved}{projected}"
    run = budgets.run
    assert run.usd is not None
    return (f"budget: spent {_money(run.spent_usd)} + reserved {_money(run.reserved_usd)} of {_money(run.usd)} "
            f"({100 * run.spent_usd / run.usd:.0f}%){saved}{projected}")


def batch_view_lines(stats: RunStats) -> list[str]:
    """One line per Batch API batch not yet collected: stage, model, the provider's id and state, progress."""
    return [f"batch {b.provider_batch_id}: {b.stage} {b.model}, {b.lines} requests, {b.provider_state}"
            + (f", {b.succeeded} answered, {b.failed} failed" if b.succeeded or b.failed else "")
            + (f" (resubmission {b.round})" if b.round else "")
            for b in list(stats.batches.values()) if b.state != "collected"]


def _line(c: Counters, now: float) -> str:
    pct = 100.0 * c.done / c.total if c.total else 100.0
    return (
        f"{c.stage} {c.model}: {c.done}/{c.total} ({pct:.0f}%) {c.rate(now):.1f} req/s, "
        f"cache hits {c.cache_hits}, retries {c.retries}, errors {c.errors}, "
        f"tokens {c.tokens_in} in / {c.tokens_out} out, spent {_money(c.spend)}"
    )


class PlainView:
    """For CI and pipes: one line per stage and model every ``interval`` seconds."""

    def __init__(self, stream: IO[str], interval: float) -> None:
        self.stream = stream
        self.interval = interval
        self.stats: RunStats | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self, stats: RunStats, title: str) -> None:
        self.stats = stats
        print(f"[runner] {title}", file=self.stream, flush=True)
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.emit()

    def emit(self) -> None:
        if self.stats is None:
            return
        now = time.monotonic()
        for counters in list(self.stats.by_key.values()):
            print(f"[runner] {_line(counters, now)}", file=self.stream, flush=True)
        for line in batch_view_lines(self.stats):
            print(f"[runner] {line}", file=self.stream, flush=True)
        money = budget_line(self.stats)
        if money:
            print(f"[runner] {money}", file=self.stream, flush=True)
        while self.stats.notes:
            print(f"[runner] {self.stats.notes.pop(0)}", file=self.stream, flush=True)

    def note(self, message: str) -> None:
        print(f"[runner] {message}", file=self.stream, flush=True)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
            self.emit()


class LiveView:
    """A rich Live table refreshed four times a second."""

    def __init__(self, stream: IO[str]) -> None:
        self.console = Console(file=stream)
        self.stats: RunStats | None = None
        self.title = ""
        self.notes: list[str] = []
        self.live: Live | None = None

    def start(self, stats: RunStats, title: str) -> None:
        self.stats = stats
        self.title = title
        self.live = Live(get_renderable=self.render, console=self.console, refresh_per_second=4, transient=False)
        self.live.start()

    def note(self, message: str) -> None:
        self.notes.append(message)

    def stop(self) -> None:
        if self.live is not None:
            self.live.refresh()
            self.live.stop()
            self.live = None

    def render(self) -> Group:
        table = Table(title=self.title, title_justify="left", expand=False)
        for name, justify in (("stage", "left"), ("model", "left"), ("progress", "left"), ("done", "right"),
                              ("req/s", "right"), ("cache hits", "right"), ("retries", "right"),
                              ("errors", "right"), ("tokens in/out", "right"), ("spent", "right")):
            table.add_column(name, justify=justify)  # type: ignore[arg-type]
        now = time.monotonic()
        assert self.stats is not None
        for c in list(self.stats.by_key.values()):
            table.add_row(
                c.stage, c.model, ProgressBar(total=max(c.total, 1), completed=c.done, width=24),
                f"{c.done}/{c.total}", f"{c.rate(now):.1f}", str(c.cache_hits), str(c.retries),
                Text(str(c.errors), style="red" if c.errors else ""), f"{c.tokens_in}/{c.tokens_out}",
                _money(c.spend),
            )
        extra: list[object] = []
        budgets = self.stats.budgets
        if isinstance(budgets, Budgets) and budgets.run.usd is not None:
            run = budgets.run
            extra.append(ProgressBar(total=run.usd, completed=min(run.usd, run.spent_usd + run.reserved_usd),
                                     width=48))
        extra.extend(Text(line, style="cyan") for line in batch_view_lines(self.stats))
        money = budget_line(self.stats)
        if money:
            extra.append(Text(money))
        notes = self.notes + self.stats.notes
        return Group(table, *extra, *(Text(n, style="yellow") for n in notes[-3:]))
