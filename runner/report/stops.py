"""The stages that had a ``stop:`` rule, as the reports show them: what the rule decided (or why it did not stop),
the items asked of all, the dollars spent against what asking every item would have cost, and the confidence
sequences against items answered (a table of looks in text, a plot in HTML and the viewer).

The records come from the store (``stage_stops``, written by :class:`runner.engine.early_stop.StageStopper`); the
cost of running it all is the stage's spend scaled by items total / items asked: its mean cost per item asked.
"""

from __future__ import annotations

from typing import Any

from runner.report import plots
from runner.store import Store

#: looks shown in the text form's table (evenly spaced, the last among them)
TEXT_LOOKS = 8
COLOURS = (plots.BLUE, plots.ORANGE, plots.GREEN, plots.PURPLE, plots.GREY, "#db2777")


def build(store: Store, run_id: str) -> list[dict[str, Any]]:
    """Each stopped (or stop-ruled) stage's record with its spend and what every item would have cost."""
    found = []
    for record in store.stops(run_id):
        spent, sent = store.stage_cost(run_id, record["stage"])
        asked, total = record["items_asked"], record["items_total"]
        full = spent * total / asked if asked else 0.0
        found.append({**record, "spent": round(spent, 10), "sent": sent, "full_cost": round(full, 10),
                      "saved": round(max(0.0, full - spent), 10)})
    return found


def _bound(value: float) -> str:
    return f"{100 * value:.1f}"


def text_lines(stops: list[dict[str, Any]]) -> list[str]:
    """The text (and Markdown) form: one paragraph per stage and a table of its sequences at a few looks."""
    lines: list[str] = []
    for stop in stops:
        asked, total = stop["items_asked"], stop["items_total"]
        share = asked / total if total else 0.0
        lines += ["", f"Early stopping, stage {stop['stage']}: {stop['summary']}",
                  f"  asked {asked:,} of {total:,} items ({100 * share:.0f} %); spent ${stop['spent']:.4f} of the "
                  f"${stop['full_cost']:.4f} all {total:,} would have cost at its mean cost per item "
                  f"(saved ${stop['saved']:.4f})"]
        looks = stop["looks"]
        if not looks:
            continue
        last = len(looks) - 1
        shown = sorted({round(i * last / (TEXT_LOOKS - 1)) for i in range(TEXT_LOOKS)}) if last else [0]
        names = [sequence["name"] + (" (%)" if sequence["of"] == "accuracy" else " (points)")
                 for sequence in stop["sequences"]]
        lines.append("  " + "items".rjust(7) + "".join(f"  {name:>32}" for name in names))
        for index in shown:
            fed, intervals = looks[index]
            cells = "".join(f"  {f'[{_bound(low)}, {_bound(high)}]':>32}" for low, high in intervals)
            lines.append(f"  {fed:>7,}{cells}")
    return lines


def plot(stop: dict[str, Any]) -> str:
    """One stage's confidence sequences against items answered, as inline SVG: a band per sequence, the rule's
    target drawn in (the half-width's ends around the last estimate are implied; zero for a difference)."""
    legend = 16.0 * len(stop["sequences"])
    width, height, left, right, top, bottom = 560.0, 220.0 + legend, 52.0, 12.0, 26.0, 34.0 + legend
    looks = stop["looks"]
    total = max(1, stop["items_total"])
    lows = [low for _, intervals in looks for low, _ in intervals] or [0.0]
    highs = [high for _, intervals in looks for _, high in intervals] or [1.0]
    floor = min(0.0, min(lows))
    ceiling = max(1.0 if floor >= 0 else 0.0, max(highs))
    span = (ceiling - floor) or 1.0

    def x(fed: float) -> float:
        return left + (width - left - right) * fed / total

    def y(value: float) -> float:
        return top + (height - top - bottom) * (ceiling - value) / span

    body = [plots._text(left, 16, f"stage {stop['stage']}: confidence sequences against items answered")]
    body.append(f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" '
                'stroke="#6b7280"/>')
    body.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#6b7280"/>')
    for value in (floor, 0.0, ceiling) if floor < 0 else (0.0, 0.5, 1.0):
        body.append(plots._text(left - 6, y(value) + 4, f"{100 * value:.0f}", "end"))
    if floor < 0:  # a difference: its sign is settled once the band leaves zero
        body.append(f'<line x1="{left}" y1="{y(0.0):.1f}" x2="{width - right}" y2="{y(0.0):.1f}" '
                    'stroke="#9ca3af" stroke-dasharray="4 3"/>')
    axis = height - bottom + 18
    body.append(plots._text(width - right, axis, f"items answered (of {total:,})", "end"))
    body.append(plots._text(left, axis, "0"))
    for index, sequence in enumerate(stop["sequences"]):
        colour = COLOURS[index % len(COLOURS)]
        upper = [(x(fed), y(intervals[index][1])) for fed, intervals in looks]
        lower = [(x(fed), y(intervals[index][0])) for fed, intervals in reversed(looks)]
        if upper:
            points = " ".join(f"{px:.1f},{py:.1f}" for px, py in upper + lower)
            body.append(f'<polygon points="{points}" fill="{colour}" fill-opacity="0.25" stroke="{colour}">'
                        f'<title>{plots.esc(sequence["name"])}</title></polygon>')
        row = axis + 16 * (index + 1)
        body.append(f'<rect x="{left:.1f}" y="{row - 10:.1f}" width="10" height="10" fill="{colour}" '
                    'fill-opacity="0.5"/>')
        body.append(plots._text(left + 16, row, plots._label(sequence["name"], 70)))
    stopped_at = stop["items_asked"]
    body.append(f'<line x1="{x(stopped_at):.1f}" y1="{top}" x2="{x(stopped_at):.1f}" y2="{height - bottom}" '
                'stroke="#dc2626" stroke-dasharray="2 2"/>')
    label = f"confidence sequences of stage {stop['stage']}: {stop['summary']}"
    return plots._svg(width, height, body, label, "stop")


def html_section(stops: list[dict[str, Any]]) -> str:
    """The HTML report's and the viewer's section: each stage's reason, items and dollars, and its plot."""
    if not stops:
        return ""
    parts = ['<section id="early-stopping"><h2>Early stopping</h2>']
    for stop in stops:
        asked, total = stop["items_asked"], stop["items_total"]
        parts.append(f'<p class="stop">{plots.esc(stop["summary"])}. Asked {asked:,} of {total:,} items; spent '
                     f'${stop["spent"]:.4f} of the ${stop["full_cost"]:.4f} all items would have cost at its mean '
                     f'cost per item (saved ${stop["saved"]:.4f}).</p>')
        parts.append(plot(stop))
    parts.append("</section>")
    return "".join(parts)
