"""The live view: a rich table per stage and model on a terminal, periodic plain log lines elsewhere.

It only reads :class:`runner.engine.stats.RunStats`; the engine does not know it exists. Every text in it that comes
from outside (provider errors, batch states, notes, names from the job) is passed through
:func:`runner.report.terminal.clean` first: an error body's escape sequences must not reach the terminal.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import IO, TYPE_CHECKING, Any

from runner.engine.budget import Budgets
from runner.engine.stats import Counters, RunStats
from runner.report.terminal import clean

if TYPE_CHECKING:
    from runner.report.live_view import LiveView


def make_view(stream: IO[str] | None = None, interval: float | None = None) -> LiveView | PlainView:
    stream = stream or sys.stderr
    if interval is None:
        interval = float(os.environ.get("RUNNER_PROGRESS_INTERVAL", "10"))
    if stream.isatty() and os.environ.get("TERM") != "dumb":
        from runner.report.live_view import LiveView  # rich is imported only for a terminal

        return LiveView(stream)
    return PlainView(stream, interval)


def _money(value: float) -> str:
    return f"${value:,.4f}" if value < 1 else f"${value:,.2f}"


def _duration(seconds: float) -> str:
    """1h02m, 3m05s, 42s."""
    seconds = int(seconds + 0.5)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def budget_parts(stats: RunStats) -> list[str]:
    """Spent / reserved / budget of the run, the money saved by the cache, and the projected total, as phrases.

    On a resume, spent counts what earlier attempts of the run spent (the run's budget starts with it), the
    finished tasks count theirs, and the projection is that spend plus this process's spend per request sent
    times the tasks left."""
    budgets = stats.budgets
    totals = stats.totals()
    limited = isinstance(budgets, Budgets) and budgets.run.usd is not None
    spent = budgets.run.spent_usd if isinstance(budgets, Budgets) else totals.spend + stats.prior_spend
    parts = []
    if limited:
        run = budgets.run  # type: ignore[union-attr]
        assert run.usd is not None
        parts.append(f"budget: spent {_money(run.spent_usd)} + reserved {_money(run.reserved_usd)} of "
                     f"{_money(run.usd)} ({100 * run.spent_usd / run.usd:.0f}%)")
    elif spent or totals.saved:
        parts.append(f"spent {_money(spent)}")
    else:
        return []
    if totals.saved:
        parts.append(f"saved by the cache {_money(totals.saved)}")
    if totals.batch_saved:
        parts.append(f"by the Batch API's price {_money(totals.batch_saved)}")
    if totals.cached_in:
        parts.append(f"by the provider's prompt cache {_money(totals.cache_saved)} ({totals.cached_in:,} input "
                     "tokens read)")
    if totals.fresh > 0 and totals.remaining > 0:
        parts.append(f"projected {_money(spent + totals.spend / totals.fresh * totals.remaining)} at completion")
    return parts


def budget_line(stats: RunStats) -> str | None:
    """:func:`budget_parts` as one line."""
    return ", ".join(budget_parts(stats)) or None


def fit(parts: list[str], width: int, sep: str = ", ") -> list[str]:
    """Phrases packed into as few lines as fit ``width`` columns (a phrase longer than a line gets its own)."""
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + len(sep) + len(part) <= width:
            lines[-1] += sep + part
        else:
            lines.append(part)
    return lines


def time_line(stats: RunStats, now: float | None = None) -> str:
    """Elapsed time and the ETA (from the pace of the requests this process sent)."""
    eta = stats.eta(now)
    left = "ETA --" if eta is None else "done" if stats.totals().remaining == 0 else f"ETA {_duration(eta)}"
    return f"elapsed {_duration(stats.elapsed(now))}, {left}"


def error_lines(stats: RunStats, width: int) -> list[str]:
    """The last error of each model that had one, on one line each, cut to ``width`` columns."""
    out = []
    for model, message in list(stats.last_error.items()):
        model = clean(model)
        name = model if len(model) <= width // 2 else model[: width // 2 - 1] + "…"  # leave room for the message
        line = f"last error {name}: {' '.join(clean(message).split())}"
        out.append(line if len(line) <= width else line[: width - 1] + "…")
    return out


def batch_view_lines(stats: RunStats) -> list[str]:
    """One line per Batch API batch not yet collected: stage, model, the provider's id and state, progress."""
    return [clean(f"batch {b.provider_batch_id}: {b.stage} {b.model}, {b.lines} requests, {b.provider_state}"
                  + (f", {b.succeeded} answered, {b.failed} failed" if b.succeeded or b.failed else "")
                  + (f" (resubmission {b.round})" if b.round else ""))
            for b in list(stats.batches.values()) if b.state != "collected"]


def _figures(c: Counters, now: float) -> str:
    pct = 100.0 * c.finished / c.total if c.total else 100.0
    return (
        f"{c.finished}/{c.total} ({pct:.0f}%) {c.rate(now):.1f} req/s, "
        f"cache hits {c.cache_hits}, retries {c.retries}, errors {_errors(c)}, "
        f"tokens {c.tokens_in} in / {c.tokens_out} out, spent {_money(c.spend)}"
    )


def _errors(c: Counters) -> str:
    """Failed tasks, with how many of them the model refused (never scored as wrong)."""
    return f"{c.errors} ({c.refused} refused)" if c.refused else str(c.errors)


def _line(c: Counters, now: float) -> str:
    return f"{clean(c.stage)} {clean(c.model)}: {_figures(c, now)}"


class PlainView:
    """For CI and pipes: one line per stage and model every ``interval`` seconds."""

    def __init__(self, stream: IO[str], interval: float) -> None:
        self.stream = stream
        self.interval = interval
        self.stats: RunStats | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self, stats: RunStats, title: str) -> None:
        self.stats = stats
        self._print(title)
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
            self._print(_line(counters, now))
        for line in batch_view_lines(self.stats):
            self._print(line)
        money = budget_line(self.stats)
        if money:
            self._print(money)
        self._print(time_line(self.stats, now))
        for line in error_lines(self.stats, ERROR_WIDTH):
            self._print(line)
        while self.stats.notes:
            self._print(self.stats.notes.pop(0))

    def note(self, message: str) -> None:
        self._print(message)

    def _print(self, line: str) -> None:
        """One log line, cleaned of control sequences whatever its source (a multi-line note keeps its lines)."""
        print(f"[runner] {clean(line, newlines=True)}", file=self.stream, flush=True)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
            self.emit()


#: columns of a last-error line in the plain view
ERROR_WIDTH = 120


def __getattr__(name: str) -> Any:
    """``LiveView`` from its own module (``live_view.py``), imported when first asked for: rich costs a start."""
    if name == "LiveView":
        from runner.report.live_view import LiveView

        return LiveView
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
