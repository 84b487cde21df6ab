"""An estimate as shown (runner/report/estimate.py computes it): the table of ``runner estimate`` in text,
Markdown, CSV or JSON, and the summary lines under it that are also the first screen of ``runner submit``."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from runner.report.estimate import Estimate, Group, usd
from runner.report.pool_estimate import pool_lines
from runner.report.terminal import clean, clean_lines
from runner.report.tiers import estimate_lines

__all__ = ["FORMATS", "render", "summary_lines"]

FORMATS = ("text", "json", "csv", "md")

CSV_COLUMNS = (
    "stage", "model", "requests", "cached", "repeats", "to_send", "input_tokens", "input_exact", "input_tokens_bound",
    "input_counted", "max_tokens",
    "output_tokens_max", "output_tokens_expected", "history", "history_source", "price", "cost_low", "cost_high",
    "batch_low", "batch_high", "batch_price", "cache_read_tokens", "cost_low_cached",
)


def _range(low: float | None, high: float | None, *, bounded: bool, bound_only: bool = False) -> str:
    if low is None and bound_only and high is not None:
        return f"at most {usd(high)}"
    if low is None:
        return "unknown price"
    return f"{usd(low)} – {usd(high) if bounded and high is not None else 'unbounded'}"


def _tokens(value: float | int | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if isinstance(value, float) else f"{value:,}"


def _input(g: Group) -> str:
    """Input tokens as shown: "N (exact)" (the tokenizer is here, or the provider's count endpoint counted every
    request), or "N expected, ≤ M (bound)", with how many requests were counted exactly when some were."""
    tokens, bound = g.input_tokens, g.input_tokens_bound
    if g.input_bound_only:
        return f"≤ {bound or 0:,} (bound; counted once the run sends)"
    if tokens is None:
        return "not counted (free)"
    if g.input_exact or bound is None:
        return f"{tokens:,} (exact)" if g.input_exact else f"{tokens:,} (expected)"
    some = f"; {g.input_counted:,} of {g.to_send:,} requests exact" if g.input_counted else ""
    return f"{tokens:,} expected, ≤ {bound:,} (bound{some})"


def _row(g: Group) -> list[str]:
    tokens = _input(g)
    expected = "no history" if not g.history else f"{_tokens(g.output_tokens_expected)} (n={g.history})"
    bounded = g.max_tokens is not None
    batch = _range(g.batch_low, g.batch_high, bounded=bounded, bound_only=g.input_bound_only) if g.batch_price else "-"
    cached = "-" if g.cost_low_cached is None else f"{usd(g.cost_low_cached)} ({_tokens(g.cache_read_tokens)} read)"
    return [g.stage, g.model, f"{g.requests:,}", f"{g.cached:,}", f"{g.to_send:,}", tokens,
            _tokens(g.output_tokens_max) if bounded else "unbounded", expected,
            _range(g.cost_low, g.cost_high, bounded=bounded, bound_only=g.input_bound_only), batch, cached]


HEADERS = ["stage", "model", "requests", "in cache", "to send", "input tokens", "output max", "output expected",
           "cost (expected – worst)", "batch API", "with prompt cache"]


def summary_lines(est: Estimate) -> list[str]:
    """The totals in one or two lines (the footer of ``runner estimate`` and the first screen of ``submit``)."""
    t = est.totals
    repeats = f", {t['repeats']:,} repeated" if t["repeats"] else ""
    head = (f"estimate: {t['requests']:,} requests, {t['cached']:,} in the cache{repeats}, {t['to_send']:,} to send; "
            f"cost {_total_range(t)}")
    if t["batch_low"] is not None or (t.get("input_bound_only") and t["batch_high"] is not None):
        batch = _range(t["batch_low"], t["batch_high"], bounded=t["batch_high"] is not None,
                       bound_only=bool(t.get("input_bound_only")))
        head += f" (Batch API {batch})"
    head += f"; estimated in {est.elapsed:.2f} s"
    lines = [head]
    if t.get("input_bound_only") and t["cost_high"] is not None:
        lines.append("input tokens bounded by their bytes, not counted, to start sooner (the worst case holds): "
                     "`runner estimate JOB` gives the expected cost")
    if t.get("cost_low_cached") is not None and t["cost_low"] is not None:
        lines.append(f"with provider prompt caching (prompt_cache: auto): expected {usd(t['cost_low_cached'])}, "
                     f"{usd(t['cost_low'] - t['cost_low_cached'])} less, {t['cache_read_tokens']:,} of the "
                     f"{t['input_tokens']:,} input tokens read from the providers' caches")
    lines += t.get("warnings", []) + estimate_lines(est.groups) + pool_lines(t.get("pools", []), usd) \
        + t.get("deadline", [])
    for model in t["unknown_prices"]:
        lines.append(f"unknown price for {model}: add prices: {{{model}: {{input: USD, output: USD}}}} "
                     "(per million tokens) to the job to price it")
    if t.get("unplanned_stages"):
        lines.append(f"not estimated: stage(s) {', '.join(t['unplanned_stages'])} read earlier stages' rows, known "
                     "only once those ran; the cost above is theirs at least, and a budget: still caps the run")
    if t["unbounded_stages"]:
        lines.append(f"no worst case for stage(s) {', '.join(t['unbounded_stages'])}: set params.max_tokens to "
                     "bound the output")
    return lines


def _total_range(t: dict[str, Any]) -> str:
    low, high = t["cost_low"], t["cost_high"]
    if low is None and t.get("input_bound_only") and high is not None:
        return f"at most {usd(high)}"
    if low is None:
        return "unknown (a model has no price)"
    return f"{usd(low)} – {usd(high) if high is not None else 'unbounded'}"


def render(est: Estimate, fmt: str) -> str:
    from runner.report.tables import Column, Table, csv_text, json_text  # `runner estimate`'s: a submit shows lines

    if fmt == "json":
        return json_text(est.as_dict())
    if fmt == "csv":
        total = {"stage": "total", "model": "", **{k: v for k, v in est.totals.items() if k in CSV_COLUMNS}}
        return csv_text(CSV_COLUMNS, [*(asdict(g) for g in est.groups), total])
    table = Table([Column(h) for h in HEADERS], [[clean(cell) for cell in _row(g)] for g in est.groups])
    head = clean(f"Estimate · job {est.job} · {est.path}")
    notes = summary_lines(est)
    notes.append("in cache: answered before, free; to send: the rest, less repeats of an identical request (sent "
                 "once); input tokens: exact where the provider's tokenizer is here (OpenAI models tiktoken knows, "
                 "sim:) or its token-counting endpoint counted the prompt in an earlier run (Claude, Gemini), else "
                 "the expected count and the upper bound a budget reserves (UTF-8 bytes plus framing); "
                 "output expected: mean output tokens of similar stored responses × requests to send; worst: every "
                 "input token (exact or bound) at the dearest input price and max_tokens output tokens per request")
    if fmt == "md":
        return "\n".join(clean_lines([f"**{head}**", "", *table.markdown(), "", *notes])) + "\n"
    return "\n".join(clean_lines([head, *table.text(), *notes])) + "\n"
