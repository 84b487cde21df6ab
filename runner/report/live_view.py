"""The live view of a run in a terminal: a rich table of each stage and model, refreshed four times a second
(:func:`runner.report.progress.make_view` picks it for a terminal, the plain view otherwise). Its own module so
that rich is imported only when a terminal shows it."""

from __future__ import annotations

import time
from typing import IO

from rich.console import Console, Group
from rich.live import Live
from rich.measure import Measurement
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from runner.engine.budget import Budgets
from runner.engine.stats import RunStats
from runner.report.progress import (
    _errors,
    _figures,
    _money,
    batch_view_lines,
    budget_parts,
    error_lines,
    fit,
    time_line,
)
from runner.report.terminal import clean

__all__ = ["LiveView"]


class LiveView:
    """A rich Live table refreshed four times a second; every line below it fits the terminal's width."""

    def __init__(self, stream: IO[str], console: Console | None = None) -> None:
        self.console = console or Console(file=stream)
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
        now = time.monotonic()
        assert self.stats is not None
        counters = list(self.stats.by_key.values())
        table = Table(title=Text(clean(self.title)), title_justify="left", expand=False)
        for name, justify in (("stage", "left"), ("model", "left"), ("progress", "left"), ("done", "right"),
                              ("req/s", "right"), ("cache hits", "right"), ("retries", "right"),
                              ("errors", "right"), ("tokens in/out", "right"), ("spent", "right")):
            table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
        for c in counters:
            table.add_row(
                Text(clean(c.stage)), Text(clean(c.model)),
                ProgressBar(total=max(c.total, 1), completed=c.finished, width=24),
                f"{c.finished}/{c.total}", f"{c.rate(now):.1f}", str(c.cache_hits), str(c.retries),
                Text(_errors(c), style="red" if c.errors else ""), f"{c.tokens_in}/{c.tokens_out}",
                _money(c.spend),
            )
        width = self.console.width
        body: list[object] = [table]
        if Measurement.get(self.console, self.console.options.update(max_width=10_000), table).maximum > width:
            # a terminal too narrow for the table (a long model name): two lines per stage and model, each
            # wrapped to the width, instead of a table whose cells rich would cut to nothing
            body = [Text(clean(self.title), style="italic", overflow="fold")]
            for c in counters:
                body.append(Text(f"{clean(c.stage)} · {clean(c.model)}", style="bold", overflow="fold"))
                row = Table.grid(padding=(0, 1))
                row.add_column(no_wrap=True)
                row.add_column(overflow="fold")
                row.add_row(ProgressBar(total=max(c.total, 1), completed=c.finished, width=12),
                            Text(_figures(c, now), style="red" if c.errors else ""))
                body.append(row)
        extra: list[object] = []
        width = self.console.width
        budgets = self.stats.budgets
        if isinstance(budgets, Budgets) and budgets.run.usd is not None:
            run = budgets.run
            # in a grid row of its own: a bare ProgressBar ends no line, and the budget text would run on after it
            bar = Table.grid()
            bar.add_row(ProgressBar(total=run.usd, completed=min(run.usd, run.spent_usd + run.reserved_usd),
                                    width=min(48, width)))
            extra.append(bar)
        extra.extend(Text(line, style="cyan") for line in batch_view_lines(self.stats))
        extra.extend(Text(line) for line in fit(budget_parts(self.stats), width))
        extra.append(Text(time_line(self.stats, now)))
        extra.extend(Text(line, style="red") for line in error_lines(self.stats, width))
        notes = self.notes + self.stats.notes
        return Group(*body, *extra, *(Text(clean(n, newlines=True), style="yellow") for n in notes[-3:]))
