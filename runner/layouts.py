"""The papers' table layouts of a run's scores, from the store.

``newterm``: NewTerm's Table 1 per model: COMA, COST, CSJ and their average in the Base setting, and the
average in the Gold setting. A task's score averages its items × prompt templates; each figure is the mean ±
standard deviation over the option-shuffle seeds.

``knowno``: Know-No's Table 3 per model: accuracy with the gold option, without it under each hint style, the
expected accuracy without gold E[A w/o] (the mean over the no-gold styles that were scored) and OmniAccuracy =
½ (A with gold + E[A w/o]).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from typing import Any

from .score import mean_std
from .store import Store

NEWTERM_TASKS = ("COMA", "COST", "CSJ")
KNOWNO_STYLES = ("with_gold", "hint_option", "hint_instruction", "no_hint")


def _seed_scores(store: Store, run_id: str, stage: str, where: str = "", args: tuple = ()) -> dict[str, dict]:
    """model -> {seed: mean score} over the scored tasks of one stage (and an optional variant filter)."""
    rows = store.conn.execute(
        "SELECT model, json_extract(variant_json, '$.seed'), avg(score), count(score) FROM tasks"
        f" WHERE run_id = ? AND stage = ? AND score IS NOT NULL {where} GROUP BY model, 2",
        (run_id, stage, *args),
    ).fetchall()
    out: dict[str, dict] = defaultdict(dict)
    for model, seed, mean, n in rows:
        out[model][seed] = (mean, n)
    return out


def _summary(per_seed: dict[Any, tuple[float, int]] | None) -> dict[str, Any] | None:
    figure = mean_std(m for m, _ in (per_seed or {}).values())
    if figure is None or not per_seed:
        return None
    return {"mean": figure.mean, "std": figure.std, "seeds": figure.n, "n": sum(n for _, n in per_seed.values())}


def _combine(figures: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The mean of several figures (a column average), None if any is missing."""
    if not figures or any(f is None for f in figures):
        return None
    return {"mean": statistics.fmean(f["mean"] for f in figures if f), "std": None, "seeds": None, "n": None}


def newterm(store: Store, run_id: str, spec: dict[str, Any]) -> dict[str, Any]:
    tasks: dict[str, str] = spec.get("tasks") or {}
    rows: dict[str, dict[str, Any]] = defaultdict(dict)
    for task in NEWTERM_TASKS:
        stage = tasks.get(task)
        if stage is None:
            continue
        for setting in ("base", "gold"):
            for model, per_seed in _seed_scores(store, run_id, stage, "AND json_extract(variant_json, "
                                                "'$.setting') = ?", (setting,)).items():
                rows[model][f"{task} {setting}"] = _summary(per_seed)
    table = []
    for model, cells in rows.items():
        base = [cells.get(f"{task} base") for task in NEWTERM_TASKS if task in tasks]
        gold = [cells.get(f"{task} gold") for task in NEWTERM_TASKS if task in tasks]
        table.append({"model": model, **{task: cells.get(f"{task} base") for task in NEWTERM_TASKS},
                      "Avg": _combine(base), "Gold": _combine(gold)})
    return {"layout": "newterm", "columns": [*NEWTERM_TASKS, "Avg", "Gold"], "rows": table,
            "note": "Base: zero-shot; Gold: the term's meaning given in the system prompt. Each task averages its "
                    "items × 3 prompt templates; mean ± std over the option-shuffle seeds (NewTerm Table 1)."}


def knowno(store: Store, run_id: str, spec: dict[str, Any]) -> dict[str, Any]:
    styles: dict[str, str] = spec.get("styles") or {}
    rows: dict[str, dict[str, Any]] = defaultdict(dict)
    for style in KNOWNO_STYLES:
        stage = styles.get(style)
        if stage is None:
            continue
        for model, per_seed in _seed_scores(store, run_id, stage).items():
            rows[model][style] = _summary(per_seed)
    table = []
    for model, cells in rows.items():
        without = [cells[s] for s in KNOWNO_STYLES[1:] if cells.get(s) is not None]
        expected = _combine(without) if without else None
        with_gold = cells.get("with_gold")
        omni = None
        if with_gold is not None and expected is not None:
            omni = {"mean": (with_gold["mean"] + expected["mean"]) / 2, "std": None, "seeds": None, "n": None}
        table.append({"model": model, **{s: cells.get(s) for s in KNOWNO_STYLES}, "E[A w/o]": expected,
                      "OmniAccuracy": omni})
    return {"layout": "knowno", "columns": [*KNOWNO_STYLES, "E[A w/o]", "OmniAccuracy"], "rows": table,
            "note": "w/ gold, then without the gold option: hint as option, hint in instruction, no hint (scored "
                    "only when judged; otherwise exported for human review). E[A w/o] averages the scored no-gold "
                    "styles; OmniAccuracy = ½ (A w/ gold + E[A w/o]) (Know-No Table 3). Mean ± std over seeds."}


LAYOUTS = {"newterm": newterm, "knowno": knowno}


def build(store: Store, run_id: str, job_json: str) -> dict[str, Any] | None:
    spec = (json.loads(job_json).get("report") or {})
    layout = LAYOUTS.get(spec.get("layout") or "")
    return layout(store, run_id, spec) if layout else None


def cell(figure: dict[str, Any] | None) -> str:
    if figure is None:
        return "-"
    text = f"{100 * figure['mean']:.2f}"
    if figure.get("std") is not None:
        text += f" ± {100 * figure['std']:.2f}"
    return text


def render_text(data: dict[str, Any], markdown: bool = False) -> list[str]:
    headers = ["model", *data["columns"]]
    table = [[row["model"], *(cell(row.get(c)) for c in data["columns"])] for row in data["rows"]]
    if markdown:
        lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(r) + " |" for r in table]
        return [*lines, "", data["note"]]
    widths = [max(len(h), *(len(r[i]) for r in table)) if table else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in table]
    return [*lines, data["note"]]
