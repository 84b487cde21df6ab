"""``runner compare RUN_A RUN_B`` and ``runner compare RUN --models A B``: two sets of answers to the same items,
compared item by item.

A side is a run and a model. Two runs are compared model by model (each model both ran, on each stage both ran);
``--models X Y`` compares model X of the first run with model Y of the second (or of the same run, given one run);
one run without ``--models`` compares every pair of its models. Per stage and pair: the items scored on both sides
(an item is a stage's row id, its scores over seeds, samples and variants averaged first), those only on one side,
each side's accuracy on the shared items, the difference B − A with its 95 % paired interval, and a paired test
(:func:`runner.evaluate.stats.paired`: McNemar's exact test when every item score is 0 or 1, else a sign-flip
permutation test under a fixed seed).

Result lines are streamed one stage at a time; only per-item sums are kept.
"""

from __future__ import annotations

import csv
import html
import io
import itertools
import json
from typing import Any

from runner.errors import RunnerError
from runner.evaluate import stats
from runner.evaluate.clusters import ALPHA, holm, paired_clustered
from runner.report.item_scores import cluster_map, stage_clusters, stage_items
from runner.report.terminal import clean, clean_lines
from runner.store import Reads, Store

FORMATS = ("text", "json", "csv", "md", "html")

METHOD_NOTE = (
    "Items: a stage's row ids scored on both sides, each item's scores averaged over its seeds, samples and variants "
    "first. B - A in points; 95% CI = mean per-item difference ± 1.96·SE, SE = sd(differences, n-1)/sqrt(n) "
    "(normal; none when every difference is the same). Test (two-sided): McNemar's exact binomial test on the items "
    "right on one side only when every item score is 0 or 1, else a sign-flip permutation test of the per-item "
    f"differences (every sign pattern up to {stats.EXACT_FLIPS} non-zero differences, else {stats.RESAMPLES:,} random "
    f"ones under seed {stats.SEED}). In a stage with cluster: FIELD, the SE, interval and test are cluster-robust "
    "instead (CR1 over the clusters, Student's t on clusters - 1 degrees of freedom). p (Holm): every row's p adjusted "
    "together by Holm's method; the verdict compares it with alpha. W/T/L: items B scored higher, equal, lower."
)
METHOD = {
    "unit": "item (a stage's row id) scored on both sides; its scores over seeds, samples and variants averaged first",
    "difference": "B - A, the mean of the per-item differences",
    "interval": "normal", "level": 0.95, "se": "sample sd of the per-item differences (n-1) / sqrt(n)",
    "test": {"mcnemar-exact": "every item score 0 or 1: exact binomial test on the discordant items",
             "sign-flip": f"otherwise: permutation test flipping the signs of the differences, exact up to "
                          f"{stats.EXACT_FLIPS} non-zero ones, else {stats.RESAMPLES} draws under seed {stats.SEED}",
             "cluster-t": "a stage with cluster: the t test of the mean difference with its cluster-robust SE (CR1) "
                          "on clusters - 1 degrees of freedom"},
    "multiplicity": "p_holm: the rows' p values adjusted together by Holm's step-down method (family-wise error at "
                    "alpha); verdict: B better / A better when p_holm < alpha, else not decided at alpha",
}
#: the CSV's columns
COLUMNS = ("stage", "run_a", "model_a", "run_b", "model_b", "n", "only_a", "only_b", "mean_a", "mean_b",
           "difference", "se", "low", "high", "ci_method", "test", "p_value", "a_only_right", "b_only_right",
           "resamples", "seed", "wins", "ties", "losses", "clusters", "design_effect", "p_holm", "verdict")


def _scored_cells(store: Store, run: dict[str, Any]) -> dict[str, list[str]]:
    """Stage → models with scored tasks, in the job's order of stages and models (then by name)."""
    job = json.loads(run["job_json"])
    stage_order = [stage.get("name") for stage in job.get("stages", [])]
    model_order = [str(model) for model in job.get("models") or []]

    def rank(order: list[str], name: str) -> tuple[int, str]:
        return (order.index(name) if name in order else len(order)), name

    cells: dict[str, list[str]] = {}
    for group in Reads(store).group_summaries(run["id"]):
        if group.scored:
            cells.setdefault(group.stage, []).append(group.model)
    return {stage: sorted(cells[stage], key=lambda model: rank(model_order, model))
            for stage in sorted(cells, key=lambda stage: rank(stage_order, stage))}


def _names(values: list[str]) -> str:
    return ", ".join(values) if values else "none"


def build(store: Store, run_a: str, run_b: str | None = None, stage: str | None = None,
          models: tuple[str, str] | list[str] | None = None, seed: int = stats.SEED, alpha: float = ALPHA
          ) -> dict[str, Any]:
    """The comparison's data (module docstring); a RunnerError in one sentence for an unknown run, stage or
    model, and for runs that share no stage or no items."""
    first = store.get_run(run_a)
    second = store.get_run(run_b) if run_b is not None else first
    same = first["id"] == second["id"]
    return _data([first, second], _rows(store, first, second, stage, models, seed, alpha), alpha,
                 mode="models" if same or models is not None else "runs", every_pair=same and models is None)


def build_runs(store: Store, runs: list[str], stage: str | None = None,
               models: tuple[str, str] | list[str] | None = None, seed: int = stats.SEED, alpha: float = ALPHA
               ) -> dict[str, Any]:
    """Three runs or more: every pair of them (the earlier named as A), model by model (or ``models``), with Holm's
    adjustment across every row of every pair."""
    found = [store.get_run(run) for run in runs]
    ids = [run["id"] for run in found]
    if len(set(ids)) != len(ids):
        raise RunnerError(f"runs {', '.join(runs)}: a run is named twice")
    rows = [row for first, second in itertools.combinations(found, 2)
            for row in _rows(store, first, second, stage, models, seed, alpha)]
    data = _data(found, rows, alpha, mode="models" if models is not None else "runs", every_pair=True)
    data["runs"] = [{"run": run["id"], "job_name": run["job_name"]} for run in found]
    return data


def _data(found: list[dict[str, Any]], rows: list[dict[str, Any]], alpha: float, *, mode: str, every_pair: bool
          ) -> dict[str, Any]:
    """The comparison of the runs ``found`` (A and B: the first two), its rows adjusted by Holm's method across all
    of them, each with its verdict."""
    adjusted = holm([1.0 if row["p_value"] is None else row["p_value"] for row in rows])
    for row, p_holm in zip(rows, adjusted, strict=True):
        row["p_holm"] = p_holm
        row["verdict"] = verdict(row, p_holm, alpha)
    first, second = found[0], found[1]
    return {
        "a": {"run": first["id"], "job_name": first["job_name"]},
        "b": {"run": second["id"], "job_name": second["job_name"]},
        "mode": mode,
        "every_pair": every_pair,
        "alpha": alpha,
        "method": METHOD,
        "rows": rows,
    }


def _rows(store: Store, first: dict[str, Any], second: dict[str, Any], stage: str | None,
          models: tuple[str, str] | list[str] | None, seed: int, alpha: float) -> list[dict[str, Any]]:
    """One pair of runs (or one run with itself): a row per stage and pair of models, not yet adjusted."""
    a_id, b_id = first["id"], second["id"]
    same = a_id == b_id
    if models is not None and len(models) != 2:
        raise RunnerError(f"--models takes two models, not {len(models)}")
    cells_a, cells_b = _scored_cells(store, first), _scored_cells(store, second)
    label = f"run {a_id}" if same else f"runs {a_id} and {b_id}"
    if stage is not None:
        for run_id, cells in ((a_id, cells_a), (b_id, cells_b)):
            if stage not in cells:
                raise RunnerError(f"--stage {stage}: run {run_id} has no scored stage {stage!r} (its scored stages: "
                                  f"{_names(list(cells))})")
        stages = [stage]
    else:
        stages = [s for s in cells_a if s in cells_b]
    if not stages:
        raise RunnerError(f"{label} share no scored stage (run {a_id}: {_names(list(cells_a))}; run {b_id}: "
                          f"{_names(list(cells_b))}), so there is nothing to compare")
    pairs = {s: _pairs(cells_a[s], cells_b[s], same, models) for s in stages}
    if not any(pairs.values()):
        if models is not None:
            raise RunnerError(f"--models {models[0]} {models[1]}: no scored stage of {label} has model "
                              f"{models[0]} in run {a_id} and {models[1]} in run {b_id} (models: "
                              f"{_names(list(dict.fromkeys(m for s in stages for m in cells_a[s] + cells_b[s])))})")
        if same:
            raise RunnerError(f"run {a_id} has one model per scored stage: compare it with another run "
                              "(runner compare RUN_A RUN_B)")
        raise RunnerError(f"{label} share no model on their shared stages ({_names(stages)}): name one of each "
                          "with --models MODEL_A MODEL_B")
    rows = []
    clusters = stage_clusters(store, a_id)
    for name in stages:
        if not pairs[name]:
            continue
        items_a = stage_items(store, a_id, name)
        items_b = items_a if same else stage_items(store, b_id, name)
        cluster_of = cluster_map(items_a, clusters.get(name))
        for model_a, model_b in pairs[name]:
            means_a = items_a.scores.get(model_a, stats.ItemScores()).means()
            means_b = items_b.scores.get(model_b, stats.ItemScores()).means()
            row = {"stage": name, "run_a": a_id, "model_a": model_a, "run_b": b_id, "model_b": model_b,
                   **stats.paired(means_a, means_b, seed=seed).as_dict()}
            robust = paired_clustered(means_a, means_b, cluster_of, alpha)
            row.update(wins=robust.wins, ties=robust.ties, losses=robust.losses, clusters=None, design_effect=None)
            if cluster_of is not None and robust.difference.se and robust.p_value is not None:
                found = robust.difference
                row.update(se=found.se, low=found.low, high=found.high, ci_method="cluster-t", test="cluster-t",
                           p_value=robust.p_value, clusters=found.clusters, design_effect=found.design_effect,
                           a_only_right=None, b_only_right=None, resamples=None, seed=None)
            rows.append(row)
    if not any(row["n"] for row in rows):
        raise RunnerError(f"{label} share no scored items: no row id of a shared stage was scored on both sides")
    return rows


def verdict(row: dict[str, Any], p_holm: float, alpha: float) -> str:
    """``B better``, ``A better``, or ``not decided at alpha`` (the Holm-adjusted p against ``alpha``)."""
    if row["difference"] is None or row["difference"] == 0 or p_holm >= alpha:
        return f"not decided at alpha {alpha:g}"
    return "B better" if row["difference"] > 0 else "A better"


def _pairs(models_a: list[str], models_b: list[str], same: bool, models: tuple[str, str] | list[str] | None
           ) -> list[tuple[str, str]]:
    """The (model of A, model of B) pairs one stage compares."""
    if models is not None:
        return [(models[0], models[1])] if models[0] in models_a and models[1] in models_b else []
    if same:
        return list(itertools.combinations(models_a, 2))
    return [(model, model) for model in models_a if model in models_b]


# -- rendering ---------------------------------------------------------------------------------------------
def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _points(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f}"


def _p(value: float | None) -> str:
    if value is None:
        return "-"
    return "<0.0001" if value < 0.0001 else f"{value:.4f}"


def _test(row: dict[str, Any]) -> str:
    if row["test"] == "mcnemar-exact":
        return f"McNemar exact ({row['a_only_right']} vs {row['b_only_right']} right on one side only)"
    if row["test"] == "sign-flip":
        return "sign-flip " + ("exact" if not row["resamples"] else f"({row['resamples']:,} draws, seed {row['seed']})")
    if row["test"] == "cluster-t":
        design = row.get("design_effect")
        return "cluster-robust t" + (f" (design effect {design:.2f})" if design is not None else "")
    return "-"


def headers(data: dict[str, Any]) -> list[str]:
    sides = ["model A", "model B"] if data["mode"] == "models" else ["model"]
    if data.get("runs"):
        sides = ["run A", "run B", *sides]
    return ["stage", *sides, "items", "only A", "only B", "A", "B", "B - A (points)", "95% CI", "test", "p",
            "W/T/L", "p (Holm)", "verdict"]


def table_rows(data: dict[str, Any]) -> list[list[str]]:
    out = []
    for row in data["rows"]:
        sides = [row["model_a"], row["model_b"]] if data["mode"] == "models" else [row["model_a"]]
        if data.get("runs"):
            sides = [row["run_a"], row["run_b"], *sides]
        interval = "-" if row["low"] is None else f"[{_points(row['low'])}, {_points(row['high'])}]"
        items = str(row["n"]) + (f" in {row['clusters']} clusters" if row.get("clusters") else "")
        out.append([row["stage"], *sides, items, str(row["only_a"]), str(row["only_b"]), _pct(row["mean_a"]),
                    _pct(row["mean_b"]), _points(row["difference"]), interval, _test(row), _p(row["p_value"]),
                    f"{row['wins']}/{row['ties']}/{row['losses']}", _p(row["p_holm"]), row["verdict"]])
    return out


def title(data: dict[str, Any]) -> str:
    if data.get("runs"):
        named = ", ".join(f"{run['run']} (job {run['job_name']})" for run in data["runs"])
        return f"Runs {named}: every pair, the earlier named A; B - A on the items both answered"
    a, b = data["a"], data["b"]
    if a["run"] == b["run"]:
        which = "every pair of its models" if data["every_pair"] else "two of its models"
        return f"Run {a['run']} (job {a['job_name']}): {which} compared, B - A on the items both answered"
    return (f"A = run {a['run']} (job {a['job_name']}), B = run {b['run']} (job {b['job_name']}): B - A on the items "
            "both answered")


def render(data: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(data, indent=2, ensure_ascii=False)
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(data["rows"])
        return buffer.getvalue()
    heads, name = headers(data), title(data)
    if fmt == "html":
        return _html(name, heads, table_rows(data))
    table = [[clean(cell) for cell in row] for row in table_rows(data)]
    if fmt == "md":
        cells = [[cell.replace("|", "\\|") for cell in row] for row in table]
        lines = [f"**{clean(name)}**", "", "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads),
                 *("| " + " | ".join(row) + " |" for row in cells), "", METHOD_NOTE]
        return "\n".join(clean_lines(lines)) + "\n"
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(heads)]
    lines = [clean(name), "  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table]
    lines += [METHOD_NOTE]
    return "\n".join(clean_lines(lines)) + "\n"


def _html(title: str, headers: list[str], table: list[list[str]]) -> str:
    """One self-contained page: the table and the method, every text escaped."""
    def esc(text: str) -> str:
        return html.escape(text, quote=True)

    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in table)
    style = ("body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1280px;padding:0 16px}"
             "table{border-collapse:collapse}th,td{border:1px solid #e5e7eb;padding:3px 8px;text-align:left}"
             "th{background:#f3f4f6}.note{color:#4b5563}")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{esc(title)}</title><style>{style}</style></head><body><h1>{esc(title)}</h1>"
            f'<table class="compare"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
            f'<p class="note">{esc(METHOD_NOTE)}</p></body></html>\n')
