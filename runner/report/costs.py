"""Spend across runs: ``runner costs [--since DATE] [--by model|job|day|endpoint]``.

Money comes from the ledger, one row per request that cost something: ``charge`` (settled to the response's
cost), ``possibly_billed`` (in flight when a run was killed, kept at its worst case after a resume could not
settle it; or an attempt that timed out after it was sent) and ``reserved`` (in flight). A reservation of a run
that is no longer alive is possibly billed too, as ``runner report`` counts it; one of a live run is only in
flight and shown apart. Money saved comes from the tasks answered by the cache (``tasks.saved``: what the cached
response cost when it was bought).

Days are UTC, as the store's time stamps: a ledger row's ``created``, a task's ``updated``. ``--since`` keeps the
rows of that day and later.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from runner.errors import RunnerError
from runner.processes import pid_alive
from runner.report.tables import Column, Table, csv_text, json_text
from runner.store import Reads, Store
from runner.store.reads import UNKNOWN_JOB

__all__ = ["BY", "FORMATS", "UNKNOWN_JOB", "build", "parse_since", "render", "whatif_run"]

FORMATS = ("text", "json", "csv", "md")
BY = ("model", "job", "day", "endpoint")


@dataclass(slots=True)
class Row:
    group: str
    runs: int = 0
    requests_charged: int = 0
    charged: float = 0.0
    possibly_billed: float = 0.0
    #: requests that are possibly billed (their worst case counted as spent)
    possibly_billed_requests: int = 0
    saved: float = 0.0
    #: cache hits that saved money
    cache_hits: int = 0
    #: reservations of runs still running: neither charged nor possibly billed yet
    in_flight: float = 0.0
    run_ids: set[str] = field(default_factory=set)


def parse_since(since: str | None) -> str | None:
    """``YYYY-MM-DD`` → the same string, checked; a RunnerError sentence otherwise."""
    if since is None:
        return None
    text = since.strip()
    try:
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
            raise ValueError
        dt.date.fromisoformat(text)
    except ValueError:
        raise RunnerError(f"--since must be a date written YYYY-MM-DD (e.g. 2025-01-31), not {since!r}") from None
    return text


def build(store: Store, *, by: str = "model", since: str | None = None) -> dict[str, Any]:
    """Sums per group, and totals, as plain data (what ``render`` shows and ``--format json`` prints)."""
    if by not in BY:
        raise RunnerError(f"--by must be one of {', '.join(BY)}, not {by!r}")
    since = parse_since(since)
    live = {run_id for run_id, pid in Reads(store).running_runs() if pid_alive(pid)}
    rows: dict[str, Row] = {}

    def row(group: str | None) -> Row:
        key = group if group is not None else "-"
        found = rows.get(key)
        if found is None:
            found = rows[key] = Row(key)
        return found

    for group, run_id, kind, count, amount in Reads(store).ledger_sums(by, since):
        r = row(group)
        r.run_ids.add(run_id)
        if kind == "charge":
            r.requests_charged += count
            r.charged += amount
        elif kind == "possibly_billed" or (kind == "reserved" and run_id not in live):
            r.possibly_billed += amount
            r.possibly_billed_requests += count
        elif kind == "reserved":
            r.in_flight += amount
    for group, run_id, hits, saved in Reads(store).saved_sums(by, since):
        r = row(group)
        r.run_ids.add(run_id)
        r.cache_hits += hits
        r.saved += saved
    ordered = [rows[key] for key in sorted(rows)]
    for r in ordered:
        r.runs = len(r.run_ids)
    totals = Row("total", runs=len(set[str]().union(*(r.run_ids for r in ordered))))
    for r in ordered:
        totals.requests_charged += r.requests_charged
        totals.possibly_billed_requests += r.possibly_billed_requests
        totals.cache_hits += r.cache_hits
        for name in ("charged", "possibly_billed", "saved", "in_flight"):
            setattr(totals, name, getattr(totals, name) + getattr(r, name))
    return {"by": by, "since": since, "db": store.path, "rows": [_plain(r, by) for r in ordered],
            "totals": _plain(totals, by)}


def _plain(r: Row, by: str) -> dict[str, Any]:
    data = asdict(r)
    del data["run_ids"]
    data[by] = data.pop("group")
    for name in ("charged", "possibly_billed", "saved", "in_flight"):
        data[name] = round(data[name], 10)
    return {by: data.pop(by), **data}


COLUMNS = ("runs", "requests_charged", "charged", "possibly_billed", "saved")
HEADERS = ("runs", "requests charged", "charged", "possibly billed", "saved by the cache")


def _cells(r: dict[str, Any], by: str) -> list[str]:
    possibly = f"${r['possibly_billed']:,.4f}"
    if r["possibly_billed_requests"]:
        possibly += f" ({r['possibly_billed_requests']:,})"
    return [str(r[by]), f"{r['runs']:,}", f"{r['requests_charged']:,}", f"${r['charged']:,.4f}", possibly,
            f"${r['saved']:,.4f}"]


def render(data: dict[str, Any], fmt: str) -> str:
    by = data["by"]
    if fmt == "json":
        return json_text(data)
    if fmt == "csv":
        return csv_text((by, *COLUMNS, "possibly_billed_requests", "cache_hits", "in_flight"),
                        [*data["rows"], data["totals"]])
    since = f" since {data['since']}" if data["since"] else ""
    head = f"Costs by {by}{since} · {data['db']}"
    if not data["rows"]:
        return f"{head}\nno spend recorded{since}\n"
    table = Table([Column(h) for h in (by, *HEADERS)],
                  [_cells(r, by) for r in data["rows"]] + [_cells(data["totals"], by)])
    t = data["totals"]
    notes = [f"Total: ${t['charged']:,.4f} charged for {t['requests_charged']:,} requests in {t['runs']:,} runs"
             + (f", ${t['possibly_billed']:,.4f} possibly billed (the worst case of {t['possibly_billed_requests']:,} "
                "requests in flight when a run stopped or timed out)" if t["possibly_billed_requests"] else "")
             + f"; ${t['saved']:,.4f} saved by {t['cache_hits']:,} cache hits"]
    if t["in_flight"]:
        notes.append(f"In flight now: ${t['in_flight']:,.4f} reserved by running runs (not counted above)")
    if fmt == "md":
        return "\n".join([f"**{head}**", "", *table.markdown(), "", *notes]) + "\n"
    return "\n".join([head, *table.text(), *notes]) + "\n"


def whatif_run(run: str | None, since: str | None, by: str = "model") -> str:
    """The run ``runner costs RUN --as/--batch/--cached`` re-prices (runner/report/whatif.py), or the sentence
    saying what is missing or does not apply to one run."""
    if run is None:
        raise RunnerError("--as, --batch and --cached re-price one finished run: give its id, e.g. "
                          "runner costs RUN_ID --as openai:gpt-4o-mini (`runner runs` lists the runs)")
    if since is not None:
        raise RunnerError("--since applies to the sums across runs, not to one run: leave it out with RUN")
    if by != "model":
        raise RunnerError("--by applies to the sums across runs, not to one run (re-priced per stage and model): "
                          "leave it out with RUN")
    return run
