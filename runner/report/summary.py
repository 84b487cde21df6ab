"""The report of a run (``runner report``): :func:`build` reads its figures from the store, per stage and model
(requests, cache hits, tokens with the reasoning tokens among the output ones, cost, errors by class, refusals,
latency percentiles, the stage's score per seed and mean ± std over seeds, and over items with its standard error,
95 % interval and breakdowns by recorded field from :mod:`runner.report.item_scores`); :func:`render` writes them
as text, json, csv or markdown, each cell as :mod:`runner.report.cells` writes it; :func:`summary_lines` are the
lines ``submit`` and ``resume`` end with.

A refusal (a task failed with error class ``refused``: the model declined to answer) is counted apart and never
scored: accuracy is over the answered items only (failed tasks have no score), and the refusals are shown beside
it. Its cost, when the provider billed it, is in the stage and model's cost."""

from __future__ import annotations

import csv
import io
import json
import statistics
from collections.abc import Iterator
from typing import Any

from runner.plan.choices import LETTERS
from runner.processes import pid_alive
from runner.report import funnel, item_scores, layouts, modes, stops
from runner.report.cells import (
    CI_NOTE,
    ITEM_HEADERS,
    REFUSED,
    accuracy_text,
    batch_lines,
    breakdown_tables,
    ci_text,
    clusters_text,
    details_lines,
    errors_text,
    item_cells,
    left_out_lines,
    pct,
    refused_text,
    seconds,
    sent_with_lines,
    tokens_out_header,
    tokens_out_text,
)
from runner.report.terminal import clean, clean_lines
from runner.report.tiers import report_lines
from runner.store import Reads, Store

FORMATS = ("text", "json", "csv", "md")
#: the footnote of the tokens out column
REASONING_NOTE = "tokens out include reasoning tokens (shown apart), priced as output"

COLUMNS = (
    "stage", "model", "requests", "done", "failed", "cache_hits", "cache_hit_rate", "sent", "input_tokens",
    "cached_input_tokens", "output_tokens", "reasoning_tokens", "cost", "saved", "batched", "batch_saved",
    "cache_saved", "stored_prompts",
    "possibly_billed", "errors", "refused", "latency_p50",
    "latency_p95", "scored", "invalid", "accuracy",
    "accuracy_by_seed", "accuracy_mean", "accuracy_std",
    "items", "item_accuracy", "item_se", "ci_low", "ci_high", "ci_method", "clusters", "design_effect",
)
#: the CSV's columns of a breakdown row (one per stage, model, recorded field and value)
BREAKDOWN_COLUMNS = ("by_field", "by_value")


def _percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def build(store: Store, run_id: str, judged: str | None = None, by: str | None = None) -> dict[str, Any]:
    """``judged``: a judge run of this (Know-No) run's no-hint answers: its verdicts fill the layout's no-hint
    column and the no-hint stage's accuracy, labelled with the judge model (``judged_by``). ``by``: break the
    scores down by this recorded field only (by default: by every recorded field with at most
    :data:`runner.report.item_scores.MAX_BREAKDOWN_VALUES` values)."""
    run = store.get_run(run_id)
    run_id = run["id"]
    # Reservations left by requests in flight when a run was killed or abandoned: possibly billed, counted as
    # spent at their worst case until a resume settles them. While the run is live they are just in flight.
    live = run["status"] == "running" and pid_alive(run.get("pid"))
    possibly = Reads(store).unsettled(run_id, include_reserved=not live)
    stored = Reads(store).stored_prompt_costs(run_id)
    charged = store.charged(run_id)
    rows = []
    for g in Reads(store).group_summaries(run_id):
        stage, model, requests, done, failed, hits = g.stage, g.model, g.requests, g.done, g.failed, g.cache_hits
        tin, tout, cost, scored, invalid, accuracy = (g.input_tokens, g.output_tokens, g.cost, g.scored, g.invalid,
                                                       g.accuracy)
        cached, saved = g.cached_input_tokens, g.saved
        errors = Reads(store).error_counts(run_id, stage, model)
        latencies = Reads(store).latencies(run_id, stage, model)
        # tasks without a seed (no choices) have no per-seed figure
        by_seed = {k: v for k, v in Reads(store).accuracy_by_variant(run_id, stage, model, "seed").items()
                   if k != "None"}
        extra = _aggregates(store, run_id, stage, model)
        seed_means = list(by_seed.values())
        rows.append({
            "stage": stage,
            "model": model,
            "requests": requests,
            "done": done,
            "failed": failed,
            "cache_hits": hits,
            "cache_hit_rate": hits / requests if requests else 0.0,
            "sent": done - hits,
            "input_tokens": tin,
            "cached_input_tokens": cached,
            "output_tokens": tout,
            # thinking tokens of the requests sent: in output_tokens too, and priced as output
            "reasoning_tokens": g.reasoning_tokens,
            # the answers' cost, and what storing prompt prefixes at the provider cost (Gemini's explicit cache)
            "cost": round(cost + stored.get((stage, model), 0.0), 10),
            "stored_prompts": round(stored.get((stage, model), 0.0), 10),
            "saved": round(saved, 10),
            "batched": g.batched,
            "batch_saved": round(g.batch_saved, 10),
            # what the provider's prompt cache saved on the requests sent, net of its write premium and storage
            "cache_saved": round(g.cache_saved - stored.get((stage, model), 0.0), 10),
            "possibly_billed": round(possibly.get((stage, model), (0.0, 0))[0], 10),
            "possibly_billed_requests": possibly.get((stage, model), (0.0, 0))[1],
            "errors": errors,
            # the model declined: failed, never scored (also in errors, by its class)
            "refused": errors.get(REFUSED, 0),
            "latency_p50": _percentile(latencies, 0.50),
            "latency_p95": _percentile(latencies, 0.95),
            "scored": scored,
            "invalid": invalid,
            "accuracy": accuracy,
            "accuracy_by_seed": by_seed,
            "accuracy_mean": statistics.fmean(seed_means) if seed_means else accuracy,
            "accuracy_std": statistics.stdev(seed_means) if len(seed_means) > 1 else None,
            **extra,
        })
    item_scores.add_item_figures(store, run_id, rows, by)
    totals = {
        "requests": sum(r["requests"] for r in rows),
        "done": sum(r["done"] for r in rows),
        "failed": sum(r["failed"] for r in rows),
        "refused": sum(r["refused"] for r in rows),
        "cache_hits": sum(r["cache_hits"] for r in rows),
        "sent": sum(r["sent"] for r in rows),
        "input_tokens": sum(r["input_tokens"] for r in rows),
        "cached_input_tokens": sum(r["cached_input_tokens"] for r in rows),
        "output_tokens": sum(r["output_tokens"] for r in rows),
        "reasoning_tokens": sum(r["reasoning_tokens"] for r in rows),
        "cost": round(sum(r["cost"] for r in rows), 10),
        "saved": round(sum(r["saved"] for r in rows), 10),
        "batched": sum(r["batched"] for r in rows),
        "batch_saved": round(sum(r["batch_saved"] for r in rows), 10),
        "cache_saved": round(sum(r["cache_saved"] for r in rows), 10),
        "stored_prompts": round(sum(r["stored_prompts"] for r in rows), 10),
        "possibly_billed": round(sum(usd for usd, _ in possibly.values()), 10),
        "possibly_billed_requests": sum(n for _, n in possibly.values()),
        "ledger_charged": round(charged, 10),
    }
    totals["cache_hit_rate"] = totals["cache_hits"] / totals["requests"] if totals["requests"] else 0.0
    layout = layouts.build(store, run_id, run["job_json"], judged)
    if judged is not None and layout is not None:
        _judged_rows(rows, layout)
    data = {
        "run": {k: run[k] for k in ("id", "job_name", "job_path", "status", "total", "created", "finished",
                                    "message")},
        "shuffled_options": _shuffle_note(run),
        # the API and SDK versions the requests went out with, and what drop_unsupported left out
        "sent_with": json.loads(run["job_json"]).get("sent_with") or {},
        # the charges by the service tier that served them (stage, model, tier, charges, USD)
        "tiers": Reads(store).served_tiers(run_id),
        "rows": rows,
        "ci_method": item_scores.CI_METHOD,
        "breakdown": {"by": by, "max_values": item_scores.MAX_BREAKDOWN_VALUES},
        "totals": totals,
        "layout": layout,
        "pipeline": funnel.build(store, run_id),
    }
    if totals["batched"] or data["tiers"]:  # the modes used against all at standard, where not all standard
        data["modes"] = modes.build(store, run)
    stopped = stops.build(store, run_id)
    if stopped:  # the stages with a stop: rule: what it decided, items and dollars against all, its sequences
        data["stops"] = stopped
    batches = store.batches(run_id)
    if batches:  # the Batch API batches the run submitted: provider id, state, lines by status
        data["batches"] = [{k: b[k] for k in ("id", "stage", "model", "provider_batch_id", "round", "state",
                                              "provider_state", "lines", "by_status")} for b in batches]
    return data


def _judged_rows(rows: list[dict[str, Any]], layout: dict[str, Any]) -> None:
    """The judged no-hint stage's rows get the judge's figures as their accuracy (per seed, mean ± std over
    seeds, and over all answers) and ``judged_by``, the judge model; ``scored`` stays 0: the run itself scored
    none of them."""
    judged = layout["judged"]
    figures = {r["model"]: r["no_hint"] for r in layout["rows"]}
    for row in rows:
        by_seed = judged["by_seed"].get(row["model"]) if row["stage"] == judged["stage"] else None
        figure = figures.get(row["model"])
        if not by_seed or figure is None:
            continue
        answers = sum(s["n"] for s in by_seed.values())
        row.update(judged_by=judged["model"], judged_run=judged["run"], judged=answers,
                   accuracy=sum(s["accuracy"] * s["n"] for s in by_seed.values()) / answers,
                   accuracy_by_seed={seed: s["accuracy"] for seed, s in by_seed.items()},
                   accuracy_mean=figure["mean"], accuracy_std=figure["std"])


def _aggregates(store: Store, run_id: str, stage: str, model: str) -> dict[str, Any]:
    """Balanced accuracy (true/false golds), accuracy per value of each variant other than the seed (prompt
    template, setting), and answer-position bias of one stage and model. Computed in SQLite and in one streamed
    pass, so a report's memory does not grow with the run."""
    keys = [k for k in Reads(store).variant_axes(run_id, stage, model) if k not in ("seed", "sample")]
    by_variant = {}
    for key in keys:
        values = Reads(store).accuracy_by_variant(run_id, stage, model, key)
        if len(values) > 1:
            by_variant[key] = values
    # Balanced accuracy: the mean of the per-class accuracies, when every gold is true or false.
    classes = Reads(store).accuracy_by_gold_type(run_id, stage, model)
    balanced = (statistics.fmean(acc for _, acc in classes)
                if classes and all(t in ("true", "false") for t, _ in classes) else None)
    # Position bias: per shown letter, the share of valid answers choosing it against the share of items whose
    # gold was shown there (items whose gold was not shown are left out).
    chosen: dict[str, int] = {}
    gold_at: dict[str, int] = {}
    width = 0
    for shown, letter, options in letter_positions(store, run_id, stage, model):
        width = max(width, options)
        chosen[letter] = chosen.get(letter, 0) + 1
        gold_at[shown] = gold_at.get(shown, 0) + 1
    n = sum(chosen.values())
    bias = {letter: {"chosen": chosen.get(letter, 0) / n, "gold": gold_at.get(letter, 0) / n}
            for letter in LETTERS[:width]} if n else {}
    return {"balanced_accuracy": balanced, "accuracy_by_variant": by_variant, "position_bias": bias}


def letter_positions(store: Store, run_id: str, stage: str, model: str) -> Iterator[tuple[str, str, int]]:
    """(gold's shown letter, answer letter, options shown) of a stage and model's valid letter answers whose gold
    was shown (what position bias counts)."""
    for letter, perm_json, gold in Reads(store).letter_answers(run_id, stage, model):
        perm = json.loads(perm_json) if perm_json else None
        if perm and gold in perm and len(perm) <= len(LETTERS):
            yield LETTERS[perm.index(gold)], letter, len(perm)


def _shuffle_note(run: dict[str, Any]) -> dict[str, Any]:
    """Which stages shuffled their options and under which seeds: the report must say so."""
    job = json.loads(run["job_json"])
    out = {}
    for stage in job.get("stages", []):
        choices = stage.get("choices")
        if choices:
            out[stage["name"]] = {"shuffle": choices.get("shuffle", True), "seeds": choices.get("seeds")}
        if stage.get("scoring") == "newterm-reference" and stage["name"] in out:
            out[stage["name"]]["scoring"] = "newterm-reference"
        elif stage.get("scoring") == "newterm-reference":
            out[stage["name"]] = {"shuffle": False, "seeds": None, "scoring": "newterm-reference"}
    return out


def _flat(row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    out["errors"] = ";".join(f"{k}={v}" for k, v in row["errors"].items())
    out["accuracy_by_seed"] = ";".join(f"{k}={v:.4f}" for k, v in row["accuracy_by_seed"].items())
    out.update(_item_columns(row.get("items")), by_field="", by_value="")  # the breakdowns have rows of their own
    return out


def _item_columns(figures: dict[str, Any] | None) -> dict[str, Any]:
    """The CSV's columns of an estimate over items."""
    if not figures:
        return {"items": 0}
    return {"items": figures["n"], "item_accuracy": figures["mean"], "item_se": figures["se"],
            "ci_low": figures["low"], "ci_high": figures["high"], "ci_method": figures["ci_method"],
            "clusters": figures.get("clusters"), "design_effect": figures.get("design_effect")}


def breakdown_rows(data: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """One CSV row per stage, model, recorded field and value."""
    for row in data["rows"]:
        for name, values in (row.get("by_field") or {}).items():
            for value, figures in values.items():
                yield {"stage": row["stage"], "model": row["model"], "by_field": name, "by_value": value,
                       **_item_columns(figures)}


def _aligned(headers: list[str], table: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(row[i]) for row in table)) if table else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    return lines + ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in table]


def _markdown(headers: list[str], table: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers),
            *("| " + " | ".join(row) + " |" for row in table)]


def breakdown_lines(data: dict[str, Any], markdown: bool = False) -> list[str]:
    """The breakdown tables, and the fields left out, as text or markdown."""
    lines: list[str] = []
    for title, headers, rows in breakdown_tables(data):
        table = [[clean(cell) for cell in row] for row in rows]
        if markdown:  # a recorded value is data: a | in it must not open a cell
            table = [[cell.replace("|", "\\|") for cell in row] for row in table]
            lines += ["", f"**{clean(title)}**", "", *_markdown(headers, table)]
        else:
            lines += ["", clean(title), *_aligned(headers, table)]
    left_out = left_out_lines(data)
    if left_out:
        lines += ["", *left_out]
    return lines


def render(data: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(data, indent=2, ensure_ascii=False)
    if fmt == "csv":
        buffer = io.StringIO()
        # a judged run (--judged) names its judge on the judged rows; other reports keep their columns
        judged = any(row.get("judged_by") for row in data["rows"])
        columns = (*COLUMNS, "judged_by", "judged_run", "judged") if judged else COLUMNS
        # the breakdowns by recorded fields follow the rows, as rows naming their field and value; then the paper's
        # table, one row per model and column
        breakdowns = list(breakdown_rows(data))
        table = list(layouts.csv_rows(data["layout"])) if data.get("layout") else []
        fields = (*columns, *(BREAKDOWN_COLUMNS if breakdowns else ()), *(layouts.CSV_COLUMNS if table else ()))
        writer = csv.DictWriter(buffer, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        for row in data["rows"]:
            writer.writerow(_flat(row))
        writer.writerows(breakdowns)
        writer.writerows(table)
        return buffer.getvalue()
    headers = ["stage", "model", "requests", "cache hits", "sent", "tokens in (cached)", tokens_out_header(data),
               "cost", "saved", "errors", "refused", "p50", "p95", "invalid", *ITEM_HEADERS,
               "score (mean ± std over seeds)"]
    table = [
        [r["stage"], r["model"], str(r["requests"]), f"{r['cache_hits']} ({pct(r['cache_hit_rate'])})",
         str(r["sent"]), f"{r['input_tokens']} ({r['cached_input_tokens']})", tokens_out_text(r),
         f"${r['cost']:.4f}" + (f" + ${r['possibly_billed']:.4f}?" if r["possibly_billed"] else ""),
         f"${r['saved']:.4f}", errors_text(r), str(r["refused"]), seconds(r["latency_p50"]),
         seconds(r["latency_p95"]), str(r["invalid"]), *item_cells(r), accuracy_text(r)]
        for r in data["rows"]
    ]
    # the text and md forms are read on a terminal: names, batch states and variant values lose control sequences
    table = [[clean(cell) for cell in row] for row in table]
    run = data["run"]
    head = clean(f"Run {run['id']} · job {run['job_name']} · {run['status']}")
    shuffles = "; ".join(
        f"{stage}: " + ("" if s["seeds"] is None else
                        f"options {'shuffled under seeds ' + str(s['seeds']) if s['shuffle'] else 'in original order'}")
        + (", scored with the NewTerm reference's rules" if s.get("scoring") else "")
        for stage, s in data["shuffled_options"].items()
    )
    if data["shuffled_options"]:
        shuffles += "; answers read by the runner's parsers unless said otherwise"
    t = data["totals"]
    foot = (f"Total: {t['requests']} requests, {t['cache_hits']} cache hits ({pct(t['cache_hit_rate'])}), "
            f"{t['sent']} sent, {t['failed']} failed{refused_text(t)}, cost ${t['cost']:.4f}, saved by the cache "
            f"${t['saved']:.4f}")
    if t["refused"]:
        foot += "; refused items are not scored: scores are over the answered items"
    if t["reasoning_tokens"]:
        foot += f"; {REASONING_NOTE}"
    if t["batched"]:
        foot += (f"; {t['batched']} answered through a Batch API, which saved ${t['batch_saved']:.4f} against the "
                 "standard price")
    if t["cached_input_tokens"]:
        foot += "; " + prompt_cache_text(t)
    if t["possibly_billed"]:
        foot += (f"; possibly billed: ${t['possibly_billed']:.4f} more, the worst case of "
                 f"{t['possibly_billed_requests']} requests that may have been billed with no answer: in flight when "
                 f"the run stopped (until `runner resume {run['id']}` settles them) or timed out; counted as spent")
    notes = [CI_NOTE] if any(r.get("items") for r in data["rows"]) else []
    if run.get("message") and run["status"] == "completed":  # what a completed run says: a stage that stopped early
        foot += f"; {clean(run['message'])}"
    if fmt == "md":
        lines = [f"**{head}**", ""]
        lines += _markdown(headers, table)
        lines += ["", foot, *notes] + ([shuffles] if shuffles else []) + sent_with_lines(data) + report_lines(data)
        lines += modes.text_lines(data.get("modes") or [])
        lines += breakdown_lines(data, markdown=True)
        if data.get("layout"):
            lines += ["", *layouts.render_text(data["layout"], markdown=True)]
        if data.get("pipeline"):
            lines += ["", *funnel.render(data["pipeline"], markdown=True)]
        lines += stops.text_lines(data.get("stops") or [])
        return "\n".join(clean_lines(lines)) + "\n"
    lines = [head, *_aligned(headers, table)]
    lines += [foot, *notes] + ([shuffles] if shuffles else []) + sent_with_lines(data) + report_lines(data)
    lines += modes.text_lines(data.get("modes") or [])
    lines += batch_lines(data)
    lines += details_lines(data)
    lines += breakdown_lines(data)
    if data.get("layout"):
        lines += ["", *layouts.render_text(data["layout"])]
    if data.get("pipeline"):
        lines += ["", *funnel.render(data["pipeline"])]
    lines += stops.text_lines(data.get("stops") or [])
    return "\n".join(clean_lines(lines)) + "\n"


def prompt_cache_text(t: dict[str, Any]) -> str:
    """The provider prompt cache's part of a run's totals, in words."""
    share = t["cached_input_tokens"] / t["input_tokens"] if t["input_tokens"] else 0.0
    stored = t.get("stored_prompts") or 0.0
    kept = f"; net of ${stored:.4f} for the prompt prefixes it stored" if stored else ""
    return (f"by the provider's prompt cache ${t['cache_saved']:.4f} ({t['cached_input_tokens']} input tokens read "
            f"from it, {pct(share)} of those sent{kept})")


def summary_lines(data: dict[str, Any]) -> list[str]:
    """The accuracy and cost lines printed at the end of ``submit`` and ``resume``."""
    lines = []
    for r in data["rows"]:
        if r["scored"]:
            seeds = data["shuffled_options"].get(r["stage"], {}).get("seeds")
            over = f" over seeds {seeds}" if seeds and len(r["accuracy_by_seed"]) > 1 else ""
            refused = f", refused {r['refused']} (not scored)" if r["refused"] else ""
            figures = r.get("items")
            interval = (f", 95% CI {ci_text(figures)} over {figures['n']} items"
                        + (f" in {clusters_text(figures)}" if figures.get("clusters") is not None else "")
                        if figures and figures["low"] is not None else "")
            lines.append(f"accuracy: {r['stage']} {r['model']}: {accuracy_text(r)}{over} "
                         f"(n={r['scored']}, invalid {r['invalid']}{refused}){interval}")
    t = data["totals"]
    hits = f"{t['cache_hits']} cache hit{'' if t['cache_hits'] == 1 else 's'}"
    lines.append(f"cost: ${t['cost']:.4f} for {t['requests']} requests ({t['sent']} sent, {hits} = "
                 f"{pct(t['cache_hit_rate'])}, {t['failed']} failed{refused_text(t)}); tokens "
                 f"{t['input_tokens']} in / {t['output_tokens']} out"
                 + (f" ({t['reasoning_tokens']} reasoning, priced as output)" if t["reasoning_tokens"] else "")
                 + f"; saved by the cache ${t['saved']:.4f}"
                 + (f", by the Batch API's price ${t['batch_saved']:.4f} ({t['batched']} batched)" if t["batched"]
                    else "")
                 + (f", {prompt_cache_text(t)}" if t["cached_input_tokens"] else ""))
    lines += [line for line in sent_with_lines(data) if line.startswith("left out")] + report_lines(data)
    lines += batch_lines(data)
    if data.get("pipeline"):
        lines.append(funnel.summary(data["pipeline"]))
    return lines
