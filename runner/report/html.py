"""``runner report RUN_ID --format html -o FILE``: one self-contained HTML page of a run.

The page holds what the text report prints (the per stage and model table, the paper's layout, the pipeline
funnel), plots as inline SVG (``runner/report/plots.py``: accuracy per model with its spread over the choice seeds,
cost and requests per stage and model, answer position against gold position, the funnel), and the run's answers
one by one (prompt, options' shown order, raw answer, parse, score), filtered by a little inline JavaScript on data
attributes. No network, no CDN: inline CSS, SVG and JS only. Every text from the run is escaped.

The figures are :func:`runner.report.summary.build`'s; only what it does not keep is asked of the store: the
joint counts of answer letter and gold position (the heatmap), the result lines and the requests in the memo.
At most ``max_samples`` answers are embedded (a note says how many were left out), so the file stays small.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from runner.plan.choices import LETTERS
from runner.report import cells, layouts, modes, stops
from runner.report import funnel as funnels
from runner.report import summary as reports
from runner.report.plots import accuracy_plot, cost_plots, esc, funnel_plot, heatmap_plot
from runner.store import Reads, Store

MAX_SAMPLES = 5000
#: characters of one message shown in a sample; the rest is cut with a note
MAX_MESSAGE_CHARS = 20_000
OUTCOMES = ("correct", "wrong", "invalid", "refused", "failed", "unscored")


def build(store: Store, run_id: str, judged: str | None = None, max_samples: int = MAX_SAMPLES,
          by: str | None = None) -> dict[str, Any]:
    """The text report's data, with the position heatmaps and up to ``max_samples`` answers."""
    data = reports.build(store, run_id, judged=judged, by=by)
    run = data["run"]["id"]
    data["heatmaps"] = []
    for stage in dict.fromkeys(row["stage"] for row in data["rows"]):
        chance = chance_levels(json.loads(line) for line in store.iter_results(run, stage))
        for row in data["rows"]:
            if row["stage"] == stage:
                row["chance"] = chance.get(row["model"])
    for row in data["rows"]:
        heatmap = position_counts(store, run, row["stage"], row["model"]) if row.get("position_bias") else None
        if heatmap and heatmap["n"]:
            data["heatmaps"].append(heatmap)
    samples: list[dict[str, Any]] = []
    for stage in dict.fromkeys(row["stage"] for row in data["rows"]):
        if len(samples) >= max_samples:
            break
        samples += _samples(store, run, stage, max_samples - len(samples))
    data["samples"] = samples
    data["samples_total"] = data["totals"]["requests"]
    return data


def chance_levels(results: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Per model, the accuracy of guessing uniformly: the mean over its scored answers of 1 / the number of options
    shown (models whose answers showed no options are left out)."""
    sums: dict[str, list[float]] = {}
    for result in results:
        shown = result.get("options_shown") or result.get("permutation")
        if result.get("score") is None or not shown:
            continue
        acc = sums.setdefault(result.get("model"), [0.0, 0])
        acc[0] += 1 / len(shown)
        acc[1] += 1
    return {model: total / n for model, (total, n) in sums.items()}


def position_counts(store: Store, run_id: str, stage: str, model: str) -> dict[str, Any]:
    """Valid letter answers of one stage and model counted by (gold's shown letter, answer letter), as the
    report's position bias counts them (answers whose gold was not shown are left out)."""
    counts: dict[tuple[str, str], int] = {}
    width = 0
    for shown, letter, options in reports.letter_positions(store, run_id, stage, model):
        width = max(width, options)
        counts[shown, letter] = counts.get((shown, letter), 0) + 1
    return {"stage": stage, "model": model, "letters": list(LETTERS[:width]), "n": sum(counts.values()),
            "counts": counts}


def _samples(store: Store, run_id: str, stage: str, cap: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    chunk: list[dict[str, Any]] = []

    def flush() -> None:
        requests = Reads(store).request_texts([r["cache_key"] for r in chunk if r.get("cache_key")])
        for result in chunk:
            text = requests.get(result.get("cache_key") or "")
            result["_request"] = json.loads(text) if text else None
        out.extend(chunk)
        chunk.clear()

    for line in store.iter_results(run_id, stage):
        if len(out) + len(chunk) >= cap:
            break
        chunk.append(json.loads(line))
        if len(chunk) >= 500:
            flush()
    flush()
    return out


def outcome(result: dict[str, Any]) -> str:
    """correct, wrong (a valid answer scored below 1), invalid (unparsable), refused (the model declined: never
    scored), failed (no answer) or unscored."""
    if result.get("status") == "failed":
        return "refused" if result.get("error_class") == cells.REFUSED else "failed"
    if result.get("valid") is False:
        return "invalid"
    score = result.get("score")
    if score is None:
        return "unscored"
    return "correct" if score >= 1 else "wrong"


# -- tables ------------------------------------------------------------------------------------------------
def _table(headers: list[str], rows: list[list[str]], cls: str) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def summary_table(data: dict[str, Any]) -> str:
    """The text report's table, cell for cell."""
    pct = cells.pct
    headers = ["stage", "model", "requests", "cache hits", "sent", "batched", "tokens in (cached)",
               cells.tokens_out_header(data), "cost", "saved", "saved by batch", "saved by prompt cache", "errors",
               "refused", "p50", "p95",
               "invalid", *cells.ITEM_HEADERS, "score (mean ± std over seeds)"]
    rows = [[r["stage"], r["model"], str(r["requests"]), f"{r['cache_hits']} ({pct(r['cache_hit_rate'])})",
             str(r["sent"]), str(r["batched"]), f"{r['input_tokens']} ({r['cached_input_tokens']})",
             cells.tokens_out_text(r),
             f"${r['cost']:.4f}" + (f" + ${r['possibly_billed']:.4f}?" if r["possibly_billed"] else ""),
             f"${r['saved']:.4f}", f"${r['batch_saved']:.4f}", f"${r['cache_saved']:.4f}", cells.errors_text(r),
             str(r["refused"]),
             cells.seconds(r["latency_p50"]), cells.seconds(r["latency_p95"]), str(r["invalid"]),
             *cells.item_cells(r), cells.accuracy_text(r)]
            for r in data["rows"]]
    return _table(headers, rows, "summary")


def breakdown_section(data: dict[str, Any]) -> str:
    """The scores per value of each recorded field broken down (a table per stage and field), and the fields
    left out for their many values."""
    parts = []
    for title, headers, rows in cells.breakdown_tables(data):
        parts += [f"<h3>{esc(title)}</h3>", _table(headers, rows, "breakdown")]
    parts += [f'<p class="note">{esc(line)}</p>' for line in cells.left_out_lines(data)]
    return "".join(parts)


def layout_table(layout: dict[str, Any]) -> str:
    labels = layout.get("labels") or {}
    headers = ["model", *(labels.get(c, c) for c in layout["columns"])]
    rows = [[row["model"], *(layouts.cell(row.get(c)) for c in layout["columns"])] for row in layout["rows"]]
    return _table(headers, rows, "layout") + f'<p class="note">{esc(layout["note"])}</p>'


def funnel_table(pipeline: dict[str, Any]) -> str:
    headers = ["stage", "kind", "rows in", "rows out", "sent", "cost", "reused", "dropped (rows)",
               "rejected (pieces)"]
    rows = [[s["stage"], s["kind"], str(s["rows_in"]), str(s["rows_out"]),
             "-" if s["kind"] != "llm" else str(s.get("sent", 0)), f"${s.get('cost', 0.0):.4f}",
             f"yes (run {s['built_in']})" if s.get("reused") else "", funnels.rules(s.get("dropped")),
             funnels.rules(s.get("rejected"))] for s in pipeline["stages"]]
    return _table(headers, rows, "funnel") + f'<p class="note">{esc(funnels.summary(pipeline))}</p>'


# -- samples -----------------------------------------------------------------------------------------------
def _messages(request: dict[str, Any] | None) -> str:
    if request is None:
        return '<p class="note">No request in the memo (the request failed before an answer was stored).</p>'
    if "messages" in request:
        parts = []
        for message in request["messages"]:
            content = message.get("content")
            text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False, indent=1)
            if len(text) > MAX_MESSAGE_CHARS:
                text = text[:MAX_MESSAGE_CHARS] + f"\n… ({len(text) - MAX_MESSAGE_CHARS} more characters)"
            parts.append(f'<div class="msg"><span class="role">{esc(message.get("role"))}</span>'
                         f"<pre>{esc(text)}</pre></div>")
        return "".join(parts)
    if "pairs" in request:  # a log-likelihood call: (context, continuation) pairs
        return "".join(f'<div class="msg"><span class="role">option {i}</span><pre>{esc(context)}'
                       f'<mark>{esc(continuation)}</mark></pre></div>'
                       for i, (context, continuation) in enumerate(request["pairs"]))
    return f"<pre>{esc(json.dumps(request, ensure_ascii=False, indent=1))}</pre>"


def shown_options(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The options as shown, in order: letter, text (from the result line's ``options_shown``, else read back from
    the prompt as sent, else None), the original option index when the permutation is stored, and whether it is
    the gold one."""
    perm, gold = result.get("permutation"), result.get("gold")
    texts = result.get("options_shown") or _options_in_prompt(result.get("_request"), len(perm) if perm else 0)
    count = len(texts) if texts else len(perm or [])
    out = []
    for i in range(count):
        original = perm[i] if perm and i < len(perm) else None
        out.append({"letter": LETTERS[i] if i < len(LETTERS) else str(i), "text": texts[i] if texts else None,
                    "index": original, "gold": original is not None and original == gold})
    return out


def _options_in_prompt(request: dict[str, Any] | None, count: int) -> list[str] | None:
    """The option texts of a prompt whose options block (runner/plan/choices.py ``options_block``: one "A. text"
    line per option) has exactly ``count`` lines, A first; None when no such block is found."""
    if not count or count > len(LETTERS) or not request or not request.get("messages"):
        return None
    content = request["messages"][-1].get("content")
    lines = content.splitlines() if isinstance(content, str) else []
    for start, line in enumerate(lines):
        block = lines[start:start + count]
        if line.startswith("A. ") and len(block) == count and all(
                b.startswith(f"{LETTERS[i]}. ") for i, b in enumerate(block)):
            after = lines[start + count] if start + count < len(lines) else ""
            if not after.startswith(f"{LETTERS[count] if count < len(LETTERS) else '?'}. "):
                return [b[3:] for b in block]
    return None


def _options(result: dict[str, Any]) -> str:
    options = shown_options(result)
    if not options:
        return ""
    items = "".join(f"<li>{esc(o['letter'])}. "
                    + (esc(o["text"]) if o["text"] is not None else f"option {esc(o['index'])} (its text is in the "
                       "prompt above)")
                    + (" <b>(gold)</b>" if o["gold"] else "") + "</li>" for o in options)
    return f'<ol class="options">{items}</ol>'


def _field(name: str, value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return f"<dt>{esc(name)}</dt><dd><pre>{esc(text)}</pre></dd>"


def sample_html(result: dict[str, Any]) -> str:
    kind = outcome(result)
    variant = result.get("variant") or {}
    head = " · ".join(str(x) for x in (result.get("stage"), result.get("model"), f"row {result.get('id')}",
                                       ", ".join(f"{k} {v}" for k, v in variant.items())) if x not in (None, ""))
    answer = next((result[k] for k in ("answer_letter", "answer", "parsed") if result.get(k) is not None), None)
    parsed = result.get("parsed")
    thinking = result.get("thinking")
    if thinking and len(thinking) > MAX_MESSAGE_CHARS:
        thinking = thinking[:MAX_MESSAGE_CHARS] + f"\n… ({len(thinking) - MAX_MESSAGE_CHARS} more characters)"
    fields = [("raw answer", result.get("response")), ("thinking", thinking),
              ("reasoning tokens", result.get("reasoning_tokens")),
              ("parsed", "none" if parsed is None and result.get("status") == "done" else parsed),
              ("answer field", result.get("answer")),
              ("answer letter", result.get("answer_letter")), ("gold", result.get("gold")),
              ("score", result.get("score")), ("invalid because", result.get("invalid_reason")),
              ("error", result.get("error")), ("cache hit", result.get("cache_hit"))]
    return (f'<details class="sample" data-model="{esc(result.get("model"))}" data-stage="{esc(result.get("stage"))}" '
            f'data-outcome="{kind}"><summary><span class="tag {kind}">{kind}</span> {esc(head)}'
            f'{" → " + esc(answer) if answer is not None else ""}</summary>'
            f'<div class="body"><h4>Prompt</h4>{_messages(result.get("_request"))}{_options(result)}'
            f'<dl>{"".join(_field(n, v) for n, v in fields if v is not None)}</dl></div></details>')


def samples_section(data: dict[str, Any]) -> str:
    samples = data["samples"]
    models = sorted({str(s.get("model")) for s in samples})
    stages = list(dict.fromkeys(str(s.get("stage")) for s in samples))
    kinds = {outcome(s) for s in samples}

    def select(name: str, label: str, values: Iterable[str]) -> str:
        options = "".join(f'<option value="{esc(v)}">{esc(v)}</option>' for v in values)
        return f'<label>{label} <select id="f-{name}" data-filter="{name}"><option value="">all</option>{options}' \
               "</select></label>"

    left = data["samples_total"] - len(samples)
    note = (f'<p class="note" id="left-out">{len(samples)} of {data["samples_total"]} answers are embedded; '
            f"{left} were left out to keep the file small (results/…/STAGE.jsonl has them all).</p>"
            if left > 0 else "")
    filters = (select("model", "model", models) + select("stage", "stage", stages)
               + select("outcome", "outcome", [k for k in OUTCOMES if k in kinds]))
    return (f'<div class="filters">{filters} <span id="shown">{len(samples)}</span> of {len(samples)} shown</div>'
            f'{note}<div id="samples">{"".join(sample_html(s) for s in samples)}</div>')


# -- the page ----------------------------------------------------------------------------------------------
CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1280px;padding:0 16px;
color:#111827;background:#fff}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #e5e7eb;padding-bottom:4px}
table{border-collapse:collapse;margin:8px 0;font-size:13px}th,td{border:1px solid #e5e7eb;padding:3px 8px;
text-align:left;vertical-align:top}th{background:#f3f4f6}tbody tr:nth-child(even){background:#fafafa}
.note{color:#4b5563}.plot{display:block;margin:8px 0}.plot text{font-size:12px;fill:#111827}
.plot text.axis{fill:#6b7280}.plot text.caption{font-weight:600}.plot text.light{fill:#fff}.plot .grid{stroke:#e5e7eb}
h3{font-size:15px;margin-bottom:2px}.heatmaps{display:flex;flex-wrap:wrap;gap:16px}
.filters{position:sticky;top:0;background:#fff;padding:8px 0;border-bottom:1px solid #e5e7eb;z-index:1}
.filters label{margin-right:12px}
.sample{border:1px solid #e5e7eb;border-radius:4px;margin:4px 0;padding:2px 8px}.sample summary{cursor:pointer}
.sample .body{padding:4px 0 8px}.msg{margin:4px 0}.role{font-weight:600;color:#374151}
pre{white-space:pre-wrap;word-break:break-word;background:#f9fafb;padding:4px 6px;margin:2px 0}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:4px 0}dd{margin:0}dd pre{margin:0}
.tag{display:inline-block;min-width:64px;text-align:center;border-radius:3px;font-size:12px;color:#fff}
.tag.correct{background:#16a34a}.tag.wrong{background:#dc2626}.tag.invalid{background:#f59e0b}
.tag.failed{background:#6b7280}.tag.unscored{background:#9ca3af}.tag.refused{background:#7c3aed}
"""

JS = """
(function(){
  var selects = document.querySelectorAll('select[data-filter]');
  var samples = document.querySelectorAll('#samples .sample');
  function apply(){
    var want = {};
    selects.forEach(function(s){ want[s.dataset.filter] = s.value; });
    var shown = 0;
    samples.forEach(function(el){
      var ok = Object.keys(want).every(function(k){ return !want[k] || el.dataset[k] === want[k]; });
      el.hidden = !ok;
      if (ok) shown++;
    });
    document.getElementById('shown').textContent = shown;
  }
  selects.forEach(function(s){ s.addEventListener('change', apply); });
  apply();
})();
"""


def render(data: dict[str, Any]) -> str:
    run = data["run"]
    t = data["totals"]
    title = f"Run {run['id']} · job {run['job_name']} · {run['status']}"
    parts = [f"<h1>{esc(title)}</h1>",
             f'<p class="note">{esc(run.get("job_path"))} · created {esc(run.get("created"))}'
             f'{" · finished " + esc(run.get("finished")) if run.get("finished") else ""}'
             f'{" · " + esc(run.get("message")) if run.get("message") else ""}</p>']
    if data.get("layout"):
        parts += ["<h2>The paper's table</h2>", layout_table(data["layout"])]
    parts += ["<h2>Per stage and model</h2>", summary_table(data),
              f'<p class="note">{esc(_total_line(data))}</p>']
    if any(r.get("items") for r in data["rows"]):
        parts.append(f'<p class="note" id="ci-method">{esc(cells.CI_NOTE)}</p>')
    for line in [*_shuffle_lines(data), *cells.batch_lines(data), *cells.details_lines(data)]:
        parts.append(f'<p class="note">{esc(line)}</p>')
    breakdowns = breakdown_section(data)
    if breakdowns:
        parts += ["<h2>Scores by recorded field</h2>", breakdowns]
    accuracy = accuracy_plot(data["rows"])
    if accuracy:
        parts += ["<h2>Accuracy per model</h2>",
                  '<p class="note">Bar: mean over the choice seeds; whisker: ± one standard deviation; dots: each '
                  "seed's accuracy; dashed red line: chance (1 / the options shown, mean over the scored "
                  "answers).</p>", accuracy]
    parts += ["<h2>Cost per stage and model</h2>",
              f'<p class="note">Total ${t["cost"]:.4f} spent, ${t["saved"]:.4f} saved by the cache, '
              f'${t["batch_saved"]:.4f} saved by the Batch API ({t["batched"]} batched of {t["sent"]} sent), '
              f'${t["cache_saved"]:.4f} by the provider\'s prompt cache ({t["cached_input_tokens"]} input tokens '
              "read from it).</p>",
              cost_plots(data["rows"]), modes.html_section(data.get("modes") or [])]
    if data["heatmaps"]:
        parts += ["<h2>Position bias</h2>",
                  '<p class="note">Valid letter answers by the letter the gold option was shown at (rows) and the '
                  "letter answered (columns); shade: share of the row. An unbiased model fills the diagonal, a "
                  "biased one a column.</p>",
                  '<div class="heatmaps">' + "".join(heatmap_plot(h) for h in data["heatmaps"]) + "</div>"]
    if data.get("pipeline"):
        parts += ["<h2>Pipeline funnel</h2>", funnel_plot(data["pipeline"]), funnel_table(data["pipeline"])]
    parts.append(stops.html_section(data.get("stops") or []))
    parts += ["<h2>Answers</h2>", samples_section(data)]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>{''.join(parts)}"
            f"<script>{JS}</script></body></html>\n")


def _total_line(data: dict[str, Any]) -> str:
    """The text report's total line (cost, cache, batch, possibly billed), as it prints it."""
    return next(line for line in reports.render(data, "text").splitlines() if line.startswith("Total: "))


def _shuffle_lines(data: dict[str, Any]) -> list[str]:
    return [f"{stage}: options " + (f"shuffled under seeds {s['seeds']}" if s["shuffle"] else "in original order")
            for stage, s in data["shuffled_options"].items() if s.get("seeds") is not None]


def write(store: Store, run_id: str, path: Path, judged: str | None = None,
          max_samples: int = MAX_SAMPLES, by: str | None = None) -> None:
    path.write_text(render(build(store, run_id, judged=judged, max_samples=max_samples, by=by)), encoding="utf-8")
