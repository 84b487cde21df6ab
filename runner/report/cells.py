"""How a run's report writes its figures as text: the cells of its tables (percentages, seconds, the SE and
interval over items, tokens, errors, accuracy) and its note lines (breakdowns, fields left out, what the requests
were sent with, batches, per-variant details). The text and markdown report (:mod:`runner.report.summary`), the HTML
page (:mod:`runner.report.html`) and its plots (:mod:`runner.report.plots`) write a figure the same way through
them."""

from __future__ import annotations

from typing import Any

from runner.errors import Refused
from runner.report import item_scores

#: the error class of a refusal (runner.errors.Refused)
REFUSED = Refused.error_class
#: how the SE and interval are made, as the reports' footnote says it
CI_NOTE = ("SE and 95% CI over items: each item's (row's) scores are averaged over its seeds, samples and variants "
           "first; SE = sd(item means, n-1)/sqrt(n items); CI = mean ± 1.96·SE (normal approximation), clipped to "
           "0-100% for scores in that range; where SE is 0 (one item, or every item alike) a Wilson score interval "
           "when item scores are 0 or 1 (marked Wilson), else no interval")
#: the main table's columns of the estimate over items
ITEM_HEADERS = ("items", "SE (items)", "95% CI (items)")
#: the breakdown tables' columns
BREAKDOWN_HEADERS = ("items", "accuracy", "SE", "95% CI")


def pct(value: float | None) -> str:
    """A fraction as a percentage with one decimal, "-" for none."""
    return "-" if value is None else f"{100 * value:.1f}%"


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}s"


def se_text(figures: dict[str, Any] | None) -> str:
    """The SE over items, in percentage points."""
    return "-" if not figures or figures["se"] is None else f"{100 * figures['se']:.1f}"


def ci_text(figures: dict[str, Any] | None) -> str:
    """The 95% interval over items, marked when it is Wilson's."""
    if not figures or figures["low"] is None:
        return "-"
    return f"[{pct(figures['low'])}, {pct(figures['high'])}]" + (" Wilson" if figures["ci_method"] == "wilson"
                                                                     else "")


def items_text(figures: dict[str, Any] | None) -> str:
    """Items, and with a stage's clusters how many and their design effect."""
    if not figures:
        return "-"
    if figures.get("clusters") is None:
        return str(figures["n"])
    return f"{figures['n']} in {clusters_text(figures)}"


def clusters_text(figures: dict[str, Any]) -> str:
    """``K clusters, design effect D`` of a cluster-robust estimate."""
    design = figures.get("design_effect")
    return f"{figures['clusters']} clusters" + (f", design effect {design:.2f}" if design is not None else "")


def item_cells(row: dict[str, Any]) -> list[str]:
    figures = row.get("items")
    return [items_text(figures), se_text(figures), ci_text(figures)]


def tokens_out_header(data: dict[str, Any]) -> str:
    return "tokens out (reasoning)" if data["totals"].get("reasoning_tokens") else "tokens out"


def tokens_out_text(row: dict[str, Any]) -> str:
    """Output tokens, with the reasoning tokens among them when there are any."""
    reasoning = row.get("reasoning_tokens") or 0
    return f"{row['output_tokens']} ({reasoning})" if reasoning else str(row["output_tokens"])


def errors_text(row: dict[str, Any]) -> str:
    """Failed tasks by error class, refusals left to their own column."""
    return ", ".join(f"{k} {v}" for k, v in row["errors"].items() if k != REFUSED) or "0"


def refused_text(counts: dict[str, Any]) -> str:
    return f" ({counts['refused']} refused)" if counts.get("refused") else ""


def accuracy_text(row: dict[str, Any]) -> str:
    if not row["scored"] and not row.get("judged_by"):
        return "-"
    text = pct(row["accuracy_mean"])
    if row["accuracy_std"] is not None:
        text += f" ± {100 * row['accuracy_std']:.1f}"
    if row.get("judged_by"):
        text += f" (judged by {row['judged_by']})"
    return text


def breakdown_tables(data: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, headers, rows) per stage and recorded field broken down: a row per model and value."""
    tables: dict[tuple[str, str], list[list[str]]] = {}
    for row in data["rows"]:
        for name, values in (row.get("by_field") or {}).items():
            tables.setdefault((row["stage"], name), []).extend(
                [row["model"], value, items_text(f), pct(f["mean"]), se_text(f), ci_text(f)]
                for value, f in values.items())
    return [(f"{stage} by {name} (accuracy over items, SE in points, 95% CI)", ["model", name, *BREAKDOWN_HEADERS],
             rows) for (stage, name), rows in tables.items()]


def left_out_lines(data: dict[str, Any]) -> list[str]:
    """The recorded fields not broken down for their many values, and how to ask for one."""
    seen: dict[tuple[str, str], int] = {}
    for row in data["rows"]:
        for name, n in (row.get("fields_left_out") or {}).items():
            seen[row["stage"], name] = n
    return [f"{stage}: not broken down by {name} ({n} values, more than {item_scores.MAX_BREAKDOWN_VALUES}); "
            f"`runner report {data['run']['id']} --by {name}` shows it" for (stage, name), n in seen.items()]


def sent_with_lines(data: dict[str, Any]) -> list[str]:
    """What the run's requests went out with: one line for the API and SDK versions and the capability table they
    were shaped by, one per stage and model for the settings ``drop_unsupported`` left out."""
    sent = data.get("sent_with") or {}
    parts = []
    if sent.get("anthropic_version"):
        parts.append(f"anthropic-version {sent['anthropic_version']}")
    if sent.get("gemini_api_version"):
        parts.append(f"Gemini API {sent['gemini_api_version']}")
    if sent.get("sdk"):
        parts.append("SDKs " + ", ".join(f"{name} {version}" for name, version in sorted(sent["sdk"].items())))
    if sent.get("capabilities"):
        parts.append(f"capability table of {sent['capabilities']}"
                     + (f" with models.dev {sent['models_dev']}" if sent.get("models_dev") else ""))
    if sent.get("runner"):
        parts.append(f"runner {sent['runner']}")
    lines = [f"sent with: {'; '.join(parts)}"] if parts else []
    for stage, models in sorted((sent.get("dropped") or {}).items()):
        for model, dropped in sorted(models.items()):
            if dropped:
                lines.append(f"left out (drop_unsupported): {stage} {model}: {', '.join(dropped)}")
    return lines


def batch_lines(data: dict[str, Any]) -> list[str]:
    """One line per Batch API batch of the run: its provider id, state and lines by outcome."""
    return [f"batch: {b['stage']} {b['model']} {b['provider_batch_id'] or '(being submitted: no provider id yet)'} "
            f"(round {b['round']}): {b['lines']} requests, "
            f"{b['state']} ({b['provider_state']}); lines "
            + ", ".join(f"{status} {n}" for status, n in sorted(b["by_status"].items()))
            for b in data.get("batches") or []]


def details_lines(data: dict[str, Any]) -> list[str]:
    """Per stage and model: balanced accuracy, accuracy per variant value, and answer-position bias."""
    lines = []
    for r in data["rows"]:
        parts = []
        if r.get("balanced_accuracy") is not None:
            parts.append(f"balanced accuracy {pct(r['balanced_accuracy'])}")
        for key, values in (r.get("accuracy_by_variant") or {}).items():
            parts.append(f"by {key}: " + ", ".join(f"{v} {pct(a)}" for v, a in values.items()))
        bias = r.get("position_bias") or {}
        if bias:
            parts.append("answers by position (chosen/gold): " + ", ".join(
                f"{letter} {pct(b['chosen'])}/{pct(b['gold'])}" for letter, b in bias.items()))
        if parts:
            lines.append(f"{r['stage']} {r['model']}: " + "; ".join(parts))
    return lines
