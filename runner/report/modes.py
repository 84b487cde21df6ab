"""The mix of modes a run used (its Batch API, and the flex, standard and priority tiers) and what it saved against
sending everything at standard, per stage and model: ``runner report`` (text, Markdown, JSON), the HTML report and
``runner view``'s run page.

A request counts once, at the way it was answered: ``batch`` when a Batch API answered it (a line cut over and sent
online counts at the tier it was then served at), else the tier its charge was served at (standard where no tier was
asked). Its all-standard cost is its own tokens (input, cached input, output) priced at the model's standard rates,
from the job's ``prices:`` or genai-prices at the run's start, as the run paid; a model with no price adds nothing.
Shown for runs that sent something other than standard; cache hits cost nothing either way and are left out.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from runner.providers.pricing import Pricing
from runner.report.plots import esc
from runner.spec.schema import Job
from runner.store import Reads, Store

__all__ = ["MODES", "build", "html_section", "text_lines"]

MODES = ("batch", "flex", "standard", "priority")


def build(store: Store, run: dict[str, Any]) -> list[dict[str, Any]]:
    """Per stage and model of ``run`` (a runs row): requests by mode, cost, all-standard cost and the saving; empty
    when everything went at standard."""
    usage = Reads(store).mode_usage(run["id"])
    if all(mode == "standard" for _, _, mode, *_ in usage):
        return []
    pricing = _pricing(run)
    when = _when(run.get("created"))
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for stage, model, mode, tokens, n, usd, cached, output in usage:
        row = rows.setdefault((stage, model), {"stage": stage, "model": model, "requests": dict.fromkeys(MODES, 0),
                                               "cost": 0.0, "standard_cost": 0.0})
        row["requests"][mode] = row["requests"].get(mode, 0) + n
        row["cost"] += usd
        rates = pricing.rates(model, when) if pricing is not None else None
        if rates is None:
            row["standard_cost"] += usd
        else:  # n requests of ``tokens`` input tokens each, at the rates for that many (a price may step up)
            row["standard_cost"] += rates.at(tokens).cost(n * tokens, output, cached)
    found = []
    for row in rows.values():
        row["cost"], row["standard_cost"] = round(row["cost"], 10), round(row["standard_cost"], 10)
        row["saved"] = round(row["standard_cost"] - row["cost"], 10)
        row["saved_share"] = row["saved"] / row["standard_cost"] if row["standard_cost"] else 0.0
        found.append(row)
    return found


def _pricing(run: dict[str, Any]) -> Pricing | None:
    try:
        return Pricing(Job.model_validate_json(run["job_json"]))
    except (ValueError, TypeError, KeyError):
        return None


def _when(created: Any) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(str(created)) if created else None
    except ValueError:
        return None


def _mix(row: dict[str, Any]) -> str:
    return ", ".join(f"{mode} {n:,}" for mode, n in row["requests"].items() if n) or "none"


def text_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The text report's lines: one per stage and model, and the run's total."""
    if not rows:
        return []
    lines = ["", "Modes used (Batch API, flex, standard, priority) against all at standard:"]
    for r in rows:
        lines.append(f"  {r['stage']} {r['model']}: {_mix(r)}; cost ${r['cost']:.4f} against ${r['standard_cost']:.4f}"
                     f" all at standard: saved ${r['saved']:.4f} ({r['saved_share']:.1%})")
    cost, standard = sum(r["cost"] for r in rows), sum(r["standard_cost"] for r in rows)
    share = (standard - cost) / standard if standard else 0.0
    lines.append(f"  total: cost ${cost:.4f} against ${standard:.4f} all at standard: saved ${standard - cost:.4f} "
                 f"({share:.1%})")
    return lines


def html_section(rows: list[dict[str, Any]]) -> str:
    """The HTML report's and the viewer's table (every cell escaped)."""
    if not rows:
        return ""
    head = "".join(f"<th>{esc(h)}</th>" for h in ("stage", "model", *MODES, "cost", "all standard", "saved",
                                                   "saved %"))
    body = "".join(
        "<tr>" + "".join(f"<td>{esc(cell)}</td>" for cell in (
            r["stage"], r["model"], *(f"{r['requests'].get(m, 0):,}" for m in MODES), f"${r['cost']:.4f}",
            f"${r['standard_cost']:.4f}", f"${r['saved']:.4f}", f"{r['saved_share']:.1%}")) + "</tr>"
        for r in rows)
    return ('<section id="modes"><h2>Modes used against all at standard</h2><p class="note">Requests answered by '
            "each way (a Batch API, or the service tier that served them), their cost, and the same requests' tokens "
            'priced at standard.</p><table class="modes"><thead><tr>' + head + "</tr></thead><tbody>" + body
            + "</tbody></table></section>")
