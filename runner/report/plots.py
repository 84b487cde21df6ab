"""The HTML report's plots, drawn as inline SVG (no script, no network): accuracy per stage and model with its
spread over the choice seeds, stacked bars (cost and requests per stage and model, a pipeline's funnel), and the
answer letter against the gold option's shown position. Every text from the run goes through :func:`esc`, here
and in the page around the plots."""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Any

from runner.report import cells

#: plot colours
BLUE, ORANGE, GREEN, GREY, PURPLE = "#2563eb", "#f59e0b", "#16a34a", "#9ca3af", "#7c3aed"


def esc(value: Any) -> str:
    """A text from the run as HTML or SVG text or attribute value: escaped, quotes too."""
    return html.escape("" if value is None else str(value), quote=True)


def _svg(width: float, height: float, body: Iterable[str], label: str, kind: str) -> str:
    return (f'<svg class="plot" data-plot="{esc(kind)}" role="img" aria-label="{esc(label)}" width="{width:.0f}" '
            f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" xmlns="http://www.w3.org/2000/svg">'
            f'<title>{esc(label)}</title>{"".join(body)}</svg>')


def _text(x: float, y: float, text: str, anchor: str = "start", cls: str = "") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{f" class={chr(34)}{cls}{chr(34)}" if cls else ""}>'
            f'{esc(text)}</text>')


def _label(text: str, limit: int = 42) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _row_label(row: dict[str, Any]) -> str:
    return f"{row['stage']} · {row['model']}"


def accuracy_plot(rows: list[dict[str, Any]]) -> str:
    """Horizontal bars: mean accuracy over seeds, ± one standard deviation, each seed's accuracy as a dot, and a
    dashed chance line where the row's ``chance`` is set (a stage choosing among options)."""
    bars = [r for r in rows if r["scored"] or r.get("judged_by")]
    if not bars:
        return ""
    left, width, right, top, step = 270, 420, 150, 28, 30
    height = top + step * len(bars) + 10

    def x(v: float) -> float:
        return left + max(0.0, min(1.0, v)) * width

    body = []
    for tick in (0, 0.25, 0.5, 0.75, 1.0):
        body.append(f'<line x1="{x(tick):.1f}" y1="{top - 6}" x2="{x(tick):.1f}" y2="{height - 10}" class="grid"/>')
        body.append(_text(x(tick), top - 10, f"{100 * tick:.0f}%", "middle", "axis"))
    for i, r in enumerate(bars):
        y, mid = top + i * step, top + i * step + step / 2
        mean, std = r["accuracy_mean"] or 0.0, r["accuracy_std"]
        text = cells.accuracy_text(r)
        body.append(_text(left - 8, mid + 4, _label(_row_label(r)), "end"))
        body.append(f'<rect class="bar" x="{left}" y="{y + 6}" width="{x(mean) - left:.1f}" height="{step - 12}" '
                    f'fill="{BLUE}"><title>{esc(_row_label(r))}: {esc(text)}</title></rect>')
        if std is not None:  # a zero spread still gets its (flat) whisker
            lo, hi = x(mean - std), x(mean + std)
            body.append(f'<path class="errorbar" d="M{lo:.1f},{mid:.1f}H{hi:.1f}M{lo:.1f},{mid - 6:.1f}V{mid + 6:.1f}'
                        f'M{hi:.1f},{mid - 6:.1f}V{mid + 6:.1f}" stroke="#111827" stroke-width="1.5" fill="none"/>')
        for seed, value in r["accuracy_by_seed"].items():
            body.append(f'<circle cx="{x(value):.1f}" cy="{mid:.1f}" r="3" fill="{ORANGE}" stroke="#111827" '
                        f'stroke-width="0.5"><title>seed {esc(seed)}: {100 * value:.1f}%</title></circle>')
        chance = r.get("chance")
        if chance is not None:  # choosing among options: what guessing uniformly would score
            body.append(f'<line class="chance" x1="{x(chance):.1f}" y1="{y + 2}" x2="{x(chance):.1f}" '
                        f'y2="{y + step - 2}" stroke="#dc2626" stroke-width="1.5" stroke-dasharray="3,2">'
                        f'<title>chance {100 * chance:.1f}% (1 / options shown, mean over scored answers)</title>'
                        '</line>')
            body.append(_text(x(chance) + 2, y + 6, f"chance {100 * chance:.0f}%", "start", "chance"))
        end = max([mean + (std or 0), *r["accuracy_by_seed"].values()])
        body.append(_text(x(end) + 8, mid + 4, text))
    return _svg(left + width + right, height, body, "accuracy per stage and model, mean ± std over seeds",
                "accuracy")


def stacked_plot(kind: str, title: str, bars: list[tuple[str, list[tuple[float, str, str]]]],
                 unit: str) -> str:
    """Horizontal stacked bars: per label, (value, colour, part name) parts; a legend on top."""
    total = max((sum(v for v, _, _ in parts) for _, parts in bars), default=0.0)
    if not bars or total <= 0:
        return ""
    left, width, right, top, step = 270, 420, 150, 40, 30
    height = top + step * len(bars) + 6
    body, legend_x = [], left
    names = dict.fromkeys((name, colour) for _, parts in bars for _, colour, name in parts)
    for name, colour in names:
        body.append(f'<rect x="{legend_x}" y="8" width="12" height="12" fill="{colour}"/>')
        body.append(_text(legend_x + 16, 18, name))
        legend_x += 24 + 7 * len(name)
    for i, (label, parts) in enumerate(bars):
        y, mid, x = top + i * step, top + i * step + step / 2, float(left)
        body.append(_text(left - 8, mid + 4, _label(label), "end"))
        for value, colour, name in parts:
            if value <= 0:
                continue
            w = value / total * width
            body.append(f'<rect class="bar" x="{x:.1f}" y="{y + 6}" width="{max(w, 1):.1f}" height="{step - 12}" '
                        f'fill="{colour}"><title>{esc(label)}: {esc(name)} {esc(_amount(value, unit))}</title></rect>')
            x += w
        body.append(_text(x + 8, mid + 4, " / ".join(_amount(v, unit) for v, _, _ in parts)))
    return _svg(left + width + right + 60, height, body, title, kind)


def _amount(value: float, unit: str) -> str:
    return f"${value:.4f}" if unit == "usd" else f"{value:g}"


def cost_plots(rows: list[dict[str, Any]]) -> str:
    usd = [(_row_label(r), [(r["cost"], BLUE, "spent"), (r["saved"], GREEN, "saved by the cache"),
                            (r["batch_saved"], PURPLE, "saved by the Batch API")]) for r in rows]
    routes = [(_row_label(r), [(r["cache_hits"], GREEN, "cache hits"),
                               (max(r["sent"] - r["batched"], 0), BLUE, "sent online"),
                               (r["batched"], PURPLE, "sent in a batch"), (r["refused"], ORANGE, "refused"),
                               (r["failed"] - r["refused"], GREY, "failed")])
              for r in rows]
    money = stacked_plot("cost", "USD per stage and model: spent, saved by the cache, saved by the Batch API", usd,
                         "usd") or '<p class="note">Nothing was spent or saved (unpriced models).</p>'
    return money + stacked_plot("requests", "requests per stage and model: cache hits, online, batch, refused, failed",
                                routes, "count")


def heatmap_plot(heatmap: dict[str, Any]) -> str:
    """Rows: the gold option's shown letter; columns: the answer letter; shade: share of the row."""
    letters, counts = heatmap["letters"], heatmap["counts"]
    cell, left, top = 44, 70, 66
    size = len(letters) * cell
    caption = f"{heatmap['stage']} · {heatmap['model']} (n={heatmap['n']})"
    body = [_text(4, 14, _label(caption, 60), "start", "caption"),
            _text(left + size / 2, 36, "answer letter", "middle", "axis"),
            f'<text x="14" y="{top + size / 2:.0f}" text-anchor="middle" class="axis" '
            f'transform="rotate(-90 14 {top + size / 2:.0f})">gold shown at</text>']
    for j, answer in enumerate(letters):
        body.append(_text(left + j * cell + cell / 2, top - 8, answer, "middle"))
    for i, gold in enumerate(letters):
        row_total = sum(counts.get((gold, a), 0) for a in letters)
        body.append(_text(left - 10, top + i * cell + cell / 2 + 4, gold, "end"))
        for j, answer in enumerate(letters):
            n = counts.get((gold, answer), 0)
            share = n / row_total if row_total else 0.0
            body.append(f'<rect class="cell" x="{left + j * cell}" y="{top + i * cell}" width="{cell - 2}" '
                        f'height="{cell - 2}" fill="{BLUE}" fill-opacity="{0.06 + 0.94 * share:.3f}" stroke="#d1d5db">'
                        f'<title>gold at {gold}, answered {answer}: {n} ({100 * share:.1f}% of the row)</title></rect>')
            body.append(_text(left + j * cell + cell / 2 - 1, top + i * cell + cell / 2 + 4, str(n), "middle",
                              "light" if share > 0.55 else ""))
    title = f"answer letter against gold position: {heatmap['stage']} · {heatmap['model']} (n={heatmap['n']})"
    return _svg(max(left + size + 20, 7 * min(len(caption), 60) + 10), top + size + 10, body, title, "position")


def funnel_plot(pipeline: dict[str, Any]) -> str:
    stages = pipeline["stages"]
    biggest = max((max(s["rows_in"], s["rows_out"]) for s in stages), default=0)
    if not biggest:
        return ""
    bars = [(s["stage"], [(s["rows_out"], BLUE, "rows out"), (max(s["rows_in"] - s["rows_out"], 0), GREY,
                                                                "rows dropped")]) for s in stages]
    return stacked_plot("funnel", "pipeline funnel: rows out and rows dropped per stage", bars, "count")
