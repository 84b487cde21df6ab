"""A pipeline run's funnel: per stage, rows in and out, the rows dropped under each rule, the pieces of answers
the parser rejected, requests sent, cost, and whether the stage was reused from an earlier run; then what the
pipeline wrote and its cost per kept item."""

from __future__ import annotations

from typing import Any

from runner.store import Store


def build(store: Store, run_id: str) -> dict[str, Any] | None:
    """The funnel of a pipeline run, or None for a run without pipeline stages."""
    stages = store.run_stages(run_id)
    if not stages:
        return None
    # A reused stage cost nothing now; what it cost when built is the benchmark's price all the same.
    built = sum(s.get("cost_when_built", 0.0) if s.get("reused") else s.get("cost", 0.0) for s in stages)
    outputs = [{"stage": s["stage"], "path": s["write"], "items": s["rows_out"]} for s in stages if s.get("write")]
    kept = sum(o["items"] for o in outputs)
    return {
        "stages": stages,
        "outputs": outputs,
        "reused": [s["stage"] for s in stages if s.get("reused")],
        "cost_now": round(sum(s.get("cost", 0.0) for s in stages), 10),
        "cost_built": round(built, 10),
        "cost_per_item": round(built / kept, 10) if kept else None,
    }


def rules(counts: dict[str, int] | None) -> str:
    """Rule counts as "rule n, ...", the rules that counted nothing left out."""
    return ", ".join(f"{rule} {n}" for rule, n in (counts or {}).items() if n)


def render(funnel: dict[str, Any], *, markdown: bool = False) -> list[str]:
    headers = ["stage", "kind", "rows in", "rows out", "sent", "cost", "reused", "dropped (rows)", "rejected (pieces)"]
    table = []
    for s in funnel["stages"]:
        reused = f"yes (run {s['built_in']})" if s.get("reused") else ""
        sent = "-" if s["kind"] != "llm" else str(s.get("sent", 0))
        table.append([s["stage"], s["kind"], str(s["rows_in"]), str(s["rows_out"]), sent, f"${s.get('cost', 0.0):.4f}",
                      reused, rules(s.get("dropped")), rules(s.get("rejected"))])
    title = "Pipeline funnel: rows in and out of each stage, dropped rows and rejected pieces of answers by rule"
    if markdown:
        lines = [f"**{title}**", "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(row) + " |" for row in table]
    else:
        widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(headers)]
        lines = [title, "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table]
    lines.append(summary(funnel))
    return lines


def summary(funnel: dict[str, Any]) -> str:
    """One line: what was written, what the build cost, and how many stages were reused."""
    written = ", ".join(f"{o['path']} {o['items']} items" for o in funnel["outputs"]) or "nothing written"
    per_item = f" (${funnel['cost_per_item']:.4f} per kept item)" if funnel["cost_per_item"] is not None else ""
    reused = funnel["reused"]
    return (f"pipeline: {written}; cost of the build ${funnel['cost_built']:.4f}{per_item}, of this run "
            f"${funnel['cost_now']:.4f}; {len(reused)} of {len(funnel['stages'])} stages reused"
            + (" (their cost counted as when built)" if reused else ""))
