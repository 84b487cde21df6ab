"""What a finished run would have cost otherwise: ``runner costs RUN [--as MODEL ...] [--batch] [--cached]``.

For each stage and model of the run, what was paid (the tasks' costs in the store) beside the same requests priced
on each ``--as`` model (without ``--as``: on the run's own model, at today's prices):

- the requests are the run's distinct done requests (an identical request is sent once), cache hits included:
  another model's memo does not hold them, and the question is what the work costs;
- input tokens: as paid on the run's own model; on another model re-counted with its tokenizer where the runner has
  it (OpenAI models tiktoken knows, ``sim:``), else the paid count, marked as an estimate; output tokens as paid,
  marked as assumed (another model answers at another length);
- ``--batch``: at the Batch API's prices (the standard price, said so, for a model without one);
- ``--cached``: with provider prompt caching planned at its best (:mod:`runner.plan.prefixes`): the tokens an
  earlier request of the group shares past the provider's minimum are read at the cached-input price, those a
  later request will read are written at the cache-write price (the input price where a provider charges none).

Prices are genai-prices' (and the run's own job's ``prices:``) at today's date; a model neither prices is one
sentence. Nothing here sends a request.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from runner.errors import RunnerError, StoreError
from runner.plan.prefixes import cache_rule, prefix_use
from runner.providers.base import provider_class, split_model
from runner.providers.pricing import Pricing, Rates
from runner.providers.tokens import count_input_tokens, exact
from runner.report.tables import Column, Table, csv_text, json_text
from runner.spec.schema import Job
from runner.store import Reads, Store

__all__ = ["FORMATS", "build", "render", "stored_job"]

FORMATS = ("text", "json", "csv", "md")

#: how a target's input tokens were found
AS_PAID, EXACT, ESTIMATE = "as paid", "exact", "estimate"


@dataclass(slots=True)
class _Request:
    key: str
    input_tokens: int
    output_tokens: int
    #: input tokens re-counted per target model whose tokenizer the runner has
    counted: dict[str, int] = field(default_factory=dict)
    #: the stored request's messages, kept for the prefix analysis only (None: not kept, no memo row, or a
    #: log-likelihood call)
    messages: list[dict[str, Any]] | None = None


@dataclass(slots=True)
class _Group:
    stage: str
    model: str
    requests: list[_Request] = field(default_factory=list)
    sent: int = 0
    paid: float = 0.0
    #: target models some of whose requests could not be re-counted (no stored messages)
    uncounted: set[str] = field(default_factory=set)


@dataclass(slots=True)
class Row:
    """One stage and model of the run, priced on one target model."""

    stage: str
    model: str
    #: distinct requests priced, and how many the run sent (the rest were cache hits or repeats)
    requests: int
    sent: int
    paid: float
    target: str
    input_tokens: int
    #: ``as paid``, ``exact`` (re-counted with the target's tokenizer) or ``estimate`` (the paid count)
    input_count: str
    output_tokens: int
    cached_read: int
    cache_written: int
    cost: float
    price: str


def stored_job(store: Store, run_id: str) -> tuple[dict[str, Any], Job]:
    """A run (found by its id or a unique part of it) and the job it was started with."""
    run = store.get_run(run_id)
    try:
        return run, Job.model_validate_json(run["job_json"])
    except ValueError as exc:
        raise StoreError(f"run {run['id']} has a stored job this version cannot read ({exc})") from None


def _check_model(model: str, pricing: Pricing) -> None:
    try:
        provider, _ = split_model(model)
        provider_class(provider)
    except (KeyError, ValueError):
        raise RunnerError(f"--as {model}: not a model of a known provider; write it as PROVIDER:MODEL, e.g. "
                          "openai:gpt-4o-mini") from None
    if pricing.rates(model) is None:
        raise RunnerError(f"--as {model}: no price for it (genai-prices does not list it and the run's job does not "
                          "price it); name a model genai-prices lists, e.g. openai:gpt-4o-mini")


def build(store: Store, run_id: str, *, as_models: list[str] | None = None, batch: bool = False,
          cached: bool = False) -> dict[str, Any]:
    """The run's groups re-priced, as plain data (what ``render`` shows and ``--format json`` prints)."""
    run, job = stored_job(store, run_id)
    pricing = Pricing(job)
    targets = list(dict.fromkeys(as_models or []))
    for model in targets:
        _check_model(model, pricing)
    groups = _groups(store, run["id"], targets, cached)
    rows: list[Row] = []
    notes: list[str] = []
    for group in groups.values():
        for target in targets or [group.model]:
            row = _price(group, target, pricing, batch=batch, cached=cached, notes=notes)
            if row is not None:
                rows.append(row)
    totals: dict[str, dict[str, float]] = {}
    for row in rows:
        sums = totals.setdefault(row.target, {"paid": 0.0, "cost": 0.0})
        sums["paid"] += row.paid
        sums["cost"] += row.cost
    return {"run": run["id"], "job": job.name, "batch": batch, "cached": cached, "targets": targets,
            "rows": [asdict(row) for row in rows],
            "totals": [{"target": t, "paid": round(s["paid"], 10), "cost": round(s["cost"], 10)}
                       for t, s in totals.items()],
            "notes": list(dict.fromkeys(notes))}


def _recounted(model: str, targets: list[str]) -> list[str]:
    """The targets whose tokenizer the runner has (so a request's input is re-counted for them)."""
    return [t for t in targets if t != model and exact(*split_model(t))]


def _groups(store: Store, run_id: str, targets: list[str], cached: bool) -> dict[tuple[str, str], _Group]:
    """The run's done requests per stage and model, each distinct request once, in the run's order (memory: a
    request's messages are kept only for the prefix analysis); what every task cost, failed ones too."""
    groups: dict[tuple[str, str], _Group] = {}
    seen: set[str] = set()
    recount: dict[str, list[str]] = {}
    reads = Reads(store)
    needs_requests = cached or any(exact(*split_model(t)) for t in targets)
    for stage, model, key, status, hit, tin, tout, cost, request_json in reads.run_requests(
            run_id, requests=needs_requests):
        group = groups.get((stage, model))
        if group is None:
            group = groups[stage, model] = _Group(stage, model)
            recount[model] = _recounted(model, targets)
        group.paid += float(cost or 0.0)
        if status != "done":
            continue
        group.sent += 0 if hit else 1
        if key in seen:
            continue
        seen.add(key)
        request = _Request(key, int(tin), int(tout))
        body = json.loads(request_json) if request_json else {}
        messages = body.get("messages") if body.get("kind", "chat") == "chat" else None
        for target in recount[model]:
            if messages is None:
                group.uncounted.add(target)
            else:
                provider, name = split_model(target)
                request.counted[target] = count_input_tokens(provider, name, messages)
        if cached:
            request.messages = messages
        group.requests.append(request)
    return groups


def _input_tokens(group: _Group, target: str) -> tuple[list[int], str]:
    """Each request's input tokens on ``target``, and how they were found."""
    paid = [r.input_tokens for r in group.requests]
    if target == group.model:
        return paid, AS_PAID
    if exact(*split_model(target)) and target not in group.uncounted:
        return [r.counted[target] for r in group.requests], EXACT
    return paid, ESTIMATE


def _price(group: _Group, target: str, pricing: Pricing, *, batch: bool, cached: bool,
           notes: list[str]) -> Row | None:
    rates: Rates | None = pricing.rates(target)
    if rates is None:  # the run's own model, priced neither by genai-prices today nor by its job
        notes.append(f"{target}: no price (genai-prices does not list it and the run's job does not price it); "
                     "its rows are left out")
        return None
    if batch:
        batch_rates = pricing.batch_rates(target)
        if batch_rates is None:
            notes.append(f"{target}: no Batch API price; priced at the standard price")
        else:
            rates = batch_rates
    inputs, how = _input_tokens(group, target)
    reads = writes = [0] * len(inputs)
    if cached:
        if cache_rule(target) is None:
            notes.append(f"{target}: its provider caches no prompts the runner knows of; priced without caching")
        else:
            chat = [r.messages for r in group.requests]
            if any(m is None for m in chat):
                notes.append(f"{group.stage} · {group.model}: requests without stored messages (log-likelihood "
                             "calls, or memo rows removed) are priced without caching")
            uses = prefix_use([(target, m or []) for m in chat])
            reads = [min(u.read, n) for u, n in zip(uses, inputs, strict=True)]
            writes = [min(u.written, n - read) for u, n, read in zip(uses, inputs, reads, strict=True)]
    cost = sum(rates.cost(n, r.output_tokens, read, written)
               for r, n, read, written in zip(group.requests, inputs, reads, writes, strict=True))
    return Row(stage=group.stage, model=group.model, requests=len(group.requests), sent=group.sent,
               paid=round(group.paid, 10), target=target, input_tokens=sum(inputs), input_count=how,
               output_tokens=sum(r.output_tokens for r in group.requests), cached_read=sum(reads),
               cache_written=sum(writes), cost=round(cost, 10), price=rates.source)


# -- display ---------------------------------------------------------------------------------------
COLUMNS = ("stage", "model", "requests", "sent", "paid", "target", "input_tokens", "input_count", "output_tokens",
           "cached_read", "cache_written", "cost", "price")
HEADERS = ("stage", "model", "requests", "sent", "paid", "as", "input tokens", "output tokens (assumed)", "cost",
           "vs paid")


def _usd(value: float) -> str:
    return f"-${-value:,.4f}" if value < 0 else f"${value:,.4f}"


def _cells(r: Mapping[str, Any], cached: bool) -> list[str]:
    tokens = f"{r['input_tokens']:,} ({r['input_count']})"
    if cached:
        tokens += f", {r['cached_read']:,} read / {r['cache_written']:,} written"
    return [r["stage"], r["model"], f"{r['requests']:,}", f"{r['sent']:,}", _usd(r["paid"]), r["target"], tokens,
            f"{r['output_tokens']:,}", _usd(r["cost"]), _usd(r["cost"] - r["paid"])]


def render(data: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json_text(data)
    if fmt == "csv":
        totals = [{"stage": "total", "target": t["target"], "paid": t["paid"], "cost": t["cost"]}
                  for t in data["totals"]]
        return csv_text(COLUMNS, [*data["rows"], *totals])
    how = " at Batch API prices" if data["batch"] else ""
    how += " with provider prompt caching" if data["cached"] else ""
    head = f"Run {data['run']} (job {data['job']}) re-priced{how}"
    if not data["rows"]:
        return "\n".join([head, "no finished request to price", *data["notes"]]) + "\n"
    table = Table([Column(h) for h in HEADERS], [_cells(r, data["cached"]) for r in data["rows"]])
    notes = [f"Total on {t['target']}: {_usd(t['cost'])} against {_usd(t['paid'])} paid" for t in data["totals"]]
    notes += data["notes"]
    notes.append("requests: the run's distinct done requests, cache hits included (another model's memo does not "
                 "hold them); paid: what the run's tasks cost; input tokens as paid on the run's model, re-counted "
                 "where the runner has the target's tokenizer (exact), else the paid count (estimate); output tokens "
                 "as paid (assumed); prices of today")
    if fmt == "md":
        return "\n".join([f"**{head}**", "", *table.markdown(), "", *notes]) + "\n"
    return "\n".join([head, *table.text(), *notes]) + "\n"
