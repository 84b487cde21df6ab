"""The papers' table layouts of a run's scores, from the store.

``newterm``: NewTerm's Table 1 per model: COMA, COST, CSJ and their average in the Base setting, and the
average in the Gold setting. A task's score averages its items × prompt templates; each figure is the mean ±
standard deviation over the option-shuffle seeds.

``knowno``: Know-No's Table 3 per model: accuracy with the gold option, without it under each hint style, the
expected accuracy without gold E[A w/o] (the mean over the three no-gold styles) and OmniAccuracy =
½ (A with gold + E[A w/o]). The no-hint answers are not scored by the run (the paper judged them by hand); with
``runner report RUN --judged JUDGE_RUN`` the column is filled from a judge run (``jobs/knowno-judge.yaml``) over
the run's exported no-hint answers: right when the judge said YES, labelled with the judge's model. Until then
E[A w/o] and OmniAccuracy are not the paper's figures: their cells say so (``{"not_comparable": "n/a: ..."}``),
and the mean of the styles that were scored is kept apart as ``scored_no_gold_mean``.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from runner.errors import RunnerError
from runner.evaluate.score import mean_std
from runner.store import Reads, Store

NEWTERM_TASKS = ("COMA", "COST", "CSJ")
KNOWNO_STYLES = ("with_gold", "hint_option", "hint_instruction", "no_hint")
#: the styles without the gold option, whose mean is E[A w/o]
KNOWNO_NO_GOLD = KNOWNO_STYLES[1:]


def _seed_scores(store: Store, run_id: str, stage: str, variant: dict[str, Any] | None = None) -> dict[str, dict]:
    """model -> {seed: mean score} over the scored tasks of one stage (of tasks with these variant values)."""
    rows = Reads(store).seed_scores(run_id, stage, variant)
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
            for model, per_seed in _seed_scores(store, run_id, stage, {"setting": setting}).items():
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


class JudgeMismatch(RunnerError):
    """``runner report RUN --judged JUDGE_RUN`` with a judge run that is not a judge of that run's no-hint
    answers (other items, other models, verdicts missing)."""

    exit_code = 2


def judged_no_hint(store: Store, run_id: str, stage: str, judge_run_id: str) -> dict[str, Any]:
    """A judge run's verdicts on the no-hint answers of ``stage`` of a run, per original model and seed.

    The judge job's dataset is the run's exported ``no-hint.jsonl``, whose ``item`` (the task's identity in the
    stage: row id, model, variant) is its row id; so each verdict's task is found by the store's primary key,
    in SQLite, without loading either run. Every answered line of the stage must have a verdict and every
    verdict an answered line, else :class:`JudgeMismatch`. A verdict of YES is right; NO, or a verdict the
    yes/no parser cannot read, is wrong. Answers whose request failed are left out, as in the scored columns."""
    judge = store.get_run(judge_run_id)
    judge_id = judge["id"]
    kinds = Reads(store).variant_kinds(judge_id)
    if not kinds:
        raise JudgeMismatch(f"judge run {judge_id} has no verdicts yet (`runner runs` shows its status)")
    if len(kinds) > 1:
        stages, models = sorted({k[0] for k in kinds}), sorted({k[1] for k in kinds})
        raise JudgeMismatch(f"judge run {judge_id} is not a run of jobs/knowno-judge.yaml with one judge model: it "
                            f"has answers of {len(stages)} stage(s) ({', '.join(stages)}), {len(models)} model(s) "
                            f"({', '.join(models)}) and {len(kinds)} stage, model and variant combinations")
    judge_stage, judge_model, _, _ = kinds[0]
    sample_item, sample_row = Reads(store).first_task(judge_id) or ("", "")
    # a task's item is "<row id>|<model>|<variant>": the judge's suffix after the row id (the run's item)
    suffix = sample_item[len(sample_row):] if sample_item.startswith(sample_row) else None
    answered = Reads(store).count_tasks(run_id, stage)
    if not answered:
        raise JudgeMismatch(f"judge run {judge_id} does not match run {run_id}: the run has no answers in its "
                            f"no-hint stage {stage!r}")
    if suffix is None:
        raise JudgeMismatch(f"judge run {judge_id} is not a run of jobs/knowno-judge.yaml (its items do not start "
                            "with their row ids)")
    extra, extra_example = Reads(store).unmatched_verdicts(judge_id, judge_stage, run_id, stage)
    groups = Reads(store).judged_groups(judge_id, judge_stage, suffix, run_id, stage)
    lines = sum(g[2] for g in groups)
    judged = sum(g[3] or 0 for g in groups)
    missing_example = min((g[6] for g in groups if g[6] is not None), default=None)
    if extra or judged < lines:
        problems = []
        if extra:
            problems.append(f"{extra} of its verdicts are on answers that are not in run {run_id}'s {stage!r} "
                            f"stage (e.g. {extra_example!r}): judge that run's own {stage}.jsonl")
        if judged < lines:
            problems.append(f"{lines - judged} of the run's {lines} answered {stage!r} lines have no verdict "
                            f"(e.g. {missing_example!r}): `runner resume {judge_id}` finishes an unfinished judge "
                            "run, or judge the run's whole file")
        raise JudgeMismatch(f"judge run {judge_id} does not match run {run_id}: " + "; ".join(problems))
    per_model: dict[str, dict[Any, tuple[float, int]]] = defaultdict(dict)
    for model, seed, _, n, right, _, _ in groups:
        per_model[model][seed] = ((right or 0) / n, n)
    return {"run": judge_id, "model": judge_model, "stage": stage, "answers": judged,
            "right": sum(g[4] or 0 for g in groups), "unreadable": sum(g[5] or 0 for g in groups),
            "per_model": dict(per_model)}


def _not_judged(run_id: str) -> str:
    return f"no-hint not judged (runner report {run_id} --judged JUDGE_RUN)"


def knowno_row(model: str, cells: dict[str, Any], why_missing: dict[str, str]) -> dict[str, Any]:
    """One model's row of Table 3 from its figures per style. E[A w/o] is the mean over the three no-gold styles
    and OmniAccuracy = ½ (A w/ gold + E[A w/o]), as the paper defines them (§3.3): with a style missing (no-hint
    answers not judged) neither is the paper's figure, so both cells say why (``why_missing[style]``) instead of
    printing a mean of fewer styles under the paper's names; that mean is kept as ``scored_no_gold_mean``, with the
    styles it covers."""
    row: dict[str, Any] = {"model": model, **{style: cells.get(style) for style in KNOWNO_STYLES}}
    without = {style: cells.get(style) for style in KNOWNO_NO_GOLD}
    scored = [style for style, figure in without.items() if figure is not None]
    if len(scored) < len(KNOWNO_NO_GOLD):
        reasons = [why_missing.get(style, f"{style} not scored") for style in KNOWNO_NO_GOLD if style not in scored]
        not_comparable = {"not_comparable": "n/a: " + "; ".join(reasons)}
        row["E[A w/o]"], row["OmniAccuracy"] = not_comparable, dict(not_comparable)
        if scored:
            row["scored_no_gold_mean"] = {**_combine([without[style] for style in scored]), "styles": scored}
        return row
    expected = _combine(list(without.values()))
    with_gold = cells.get("with_gold")
    row["E[A w/o]"] = expected
    row["OmniAccuracy"] = None if with_gold is None or expected is None else {
        "mean": (with_gold["mean"] + expected["mean"]) / 2, "std": None, "seeds": None, "n": None}
    return row


def knowno(store: Store, run_id: str, spec: dict[str, Any], judged: dict[str, Any] | None = None) -> dict[str, Any]:
    styles: dict[str, str] = spec.get("styles") or {}
    rows: dict[str, dict[str, Any]] = defaultdict(dict)
    for style in KNOWNO_STYLES:
        stage = styles.get(style)
        if stage is None:
            continue
        for model, per_seed in _seed_scores(store, run_id, stage).items():
            rows[model][style] = _summary(per_seed)
    if judged is not None:  # the no-hint answers, right when the judge said YES
        for model, per_seed in judged["per_model"].items():
            rows[model]["no_hint"] = _summary(per_seed)
    why_missing = {style: f"{style} not in the job's report.styles" for style in KNOWNO_STYLES if style not in styles}
    if "no_hint" in styles and judged is None:
        why_missing["no_hint"] = _not_judged(run_id)
    table = [knowno_row(model, cells, why_missing) for model, cells in rows.items()]
    data = {"layout": "knowno", "columns": [*KNOWNO_STYLES, "E[A w/o]", "OmniAccuracy"], "rows": table,
            "note": "w/ gold, then without the gold option: hint as option, hint in instruction, no hint (scored "
                    "only when judged; otherwise exported for human review). E[A w/o] is the mean over the three "
                    "no-gold styles and OmniAccuracy = ½ (A w/ gold + E[A w/o]) (Know-No Table 3, §3.3): until the "
                    f"no-hint answers are judged (`runner report {run_id} --judged JUDGE_RUN`, a run of "
                    "jobs/knowno-judge.yaml) both say n/a, since a mean of the two hint styles is not the paper's "
                    "figure (the JSON keeps it as scored_no_gold_mean). Mean ± std over seeds."}
    if judged is not None:
        label = f"no_hint (judged by {judged['model']})"
        unreadable = (f", {judged['unreadable']} verdict{'s' if judged['unreadable'] != 1 else ''} the yes/no "
                      "parser could not read counted wrong" if judged["unreadable"] else "")
        data["labels"] = {"no_hint": label}
        data["judged"] = {k: judged[k] for k in ("run", "model", "stage", "answers", "right", "unreadable")}
        data["judged"]["by_seed"] = {model: {str(seed): {"accuracy": mean, "n": n} for seed, (mean, n) in
                                             per_seed.items()} for model, per_seed in judged["per_model"].items()}
        data["note"] = (
            "w/ gold, then without the gold option: hint as option, hint in instruction, and no hint JUDGED BY "
            f"{judged['model']} (judge run {judged['run']}: an LLM applying the paper's human-review rule, right "
            "if the answer says no option fits or proposes the gold answer; right when the judge said YES; "
            f"{judged['answers']} answers{unreadable}; the paper judged these by hand, so this column is not its "
            "human figure). E[A w/o] averages the three no-gold styles, the judged no hint included; "
            "OmniAccuracy = ½ (A w/ gold + E[A w/o]) includes it too (Know-No Table 3). Mean ± std over seeds.")
    return data


WINODICT_ORIGINAL = "unchanged"
#: the build's prompt strategies in WinoDict Table 3's words ("Def Suffix": the definition after the sentence);
#: the definition-and-synonym forms are the runner's, not the paper's
WINODICT_PROMPTS = {"none": "Empty", "definition_first": "Def Prefix", "definition_last": "Def Suffix",
                    "synonym_first": "Syn Prefix", "synonym_last": "Syn Suffix",
                    "definition_synonym_first": "Def+Syn Prefix", "definition_synonym_last": "Def+Syn Suffix"}
#: the strategy of items scored before results recorded it
_NOT_RECORDED = "(prompt not recorded)"


def winodict_setting(bucket: str, strategy: str | None) -> tuple[int, str]:
    """(column order, column name before the shots) of scored items of a bucket and prompt strategy. Table 2's
    columns are "WinoDict" (synthetic words, definition as suffix) and "Original" (the original words as they were,
    without a definition: Table 3's "Original / Empty"); every other setting is named as Table 3 names it
    ("Original Def Suffix": the original words with their definition as suffix)."""
    if bucket != WINODICT_ORIGINAL:
        if strategy == "definition_last":
            return 0, "WinoDict"
        return 1, f"WinoDict {WINODICT_PROMPTS.get(strategy or '', _NOT_RECORDED)}"
    if strategy == "none":
        return 2, "Original"
    return 3, f"Original {WINODICT_PROMPTS.get(strategy or '', _NOT_RECORDED)}"


def _prompt_form_setting(bucket: str, strategy: str | None) -> tuple[int, str]:
    """The same for the prompt form (winodict/choice), which shows the definition first unless the strategy is
    none (results that did not record it showed it always)."""
    shown = strategy != "none"
    if bucket != WINODICT_ORIGINAL:
        return (4, "prompt form WinoDict") if shown else (5, "prompt form WinoDict Empty")
    return (7, "prompt form Original with definition") if shown else (6, "prompt form Original")


def winodict(store: Store, run_id: str, spec: dict[str, Any]) -> dict[str, Any]:
    """WinoDict Tables 2 and 3: per model, setting and number of shots, the accuracy on the synthetic words (mean ±
    std over the five log-probability buckets of words) and on the original words, without a definition (Table
    2's Original) and with one (Table 3's Original / Def Suffix); the prompt form for chat models beside."""
    groups: dict[tuple[str, int, str, Any], dict[str, tuple]] = defaultdict(dict)
    paths = ["$.fields.bucket", "$.fields.strategy"]
    stage, chat = spec.get("stage"), spec.get("chat_stage")
    if stage:
        for model, shots, bucket, strategy, mean, n in Reads(store).accuracy_groups(run_id, stage, ["$.variant.shots",
                                                                                               *paths]):
            if bucket is not None:
                order, name = winodict_setting(str(bucket), strategy)
                groups[(model, order, f"{name} {shots}-shot", shots)][str(bucket)] = (mean, n)
    if chat:
        for model, bucket, strategy, mean, n in Reads(store).accuracy_groups(run_id, chat, paths):
            if bucket is not None:
                order, name = _prompt_form_setting(str(bucket), strategy)
                groups[(model, order, name, None)][str(bucket)] = (mean, n)
    rows: dict[str, dict[str, Any]] = defaultdict(dict)
    columns: dict[str, tuple] = {}
    for (model, order, name, shots), buckets in groups.items():
        figure = _summary(buckets)
        if figure is not None:
            rows[model][name] = figure
            columns[name] = (order, shots is None, shots if isinstance(shots, int) else 0, name)
    return {"layout": "winodict", "columns": sorted(columns, key=columns.__getitem__),
            "rows": [{"model": model, **cells} for model, cells in rows.items()],
            "note": "Accuracy of the option whose continuation is likelier (WinoDict's partial scoring). WinoDict: "
                    "synthetic words, definition as suffix, mean ± std over the five log-probability buckets of "
                    "words (Table 2); Original: the original words without a definition (Table 2's Original, "
                    "Table 3's Original / Empty); Original Def Suffix: the original words with their definition "
                    "as suffix (Table 3); other settings as Table 3 names them. The prompt form asks chat models "
                    "to pick A or B, the definition shown first unless the setting has none."}


LAYOUTS = {"newterm": newterm, "knowno": knowno, "winodict": winodict}


def build(store: Store, run_id: str, job_json: str, judged: str | None = None) -> dict[str, Any] | None:
    """The run's paper layout, if its job names one. ``judged``: a judge run of the run's no-hint answers
    (Know-No only), whose verdicts fill the no-hint column."""
    spec = (json.loads(job_json).get("report") or {})
    name = spec.get("layout") or ""
    layout = LAYOUTS.get(name)
    if judged is not None:
        stage = (spec.get("styles") or {}).get("no_hint") if name == "knowno" else None
        if stage is None:
            raise JudgeMismatch(f"run {run_id} has no Know-No no-hint stage to judge (its job's report layout is "
                                f"{name or 'none'}{'' if name != 'knowno' else ' without a no_hint style'}); "
                                "--judged is for runs of jobs/knowno-mctest.yaml or jobs/knowno-bank77.yaml")
        return knowno(store, run_id, spec, judged_no_hint(store, run_id, stage, judged))
    return layout(store, run_id, spec) if layout else None


def cell(figure: dict[str, Any] | None) -> str:
    """A figure as printed: mean ± std in percent, "-" when there is none, or why it is not comparable."""
    if figure is None:
        return "-"
    if "not_comparable" in figure:
        return str(figure["not_comparable"])
    text = f"{100 * figure['mean']:.2f}"
    if figure.get("std") is not None:
        text += f" ± {100 * figure['std']:.2f}"
    return text


#: the CSV report's columns of the paper's table, one row per model and column (long form, after the run's rows)
CSV_COLUMNS = ("layout", "layout_column", "layout_mean", "layout_std", "layout_note")


def csv_rows(data: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The paper's table as CSV rows: each model's figure of each column, in [0, 1] as the run's accuracy columns
    are (blank where there is none), with the reason where the figure is not the paper's (``layout_note``)."""
    labels = data.get("labels") or {}
    for row in data["rows"]:
        for column in data["columns"]:
            figure = row.get(column)
            out = {"model": row["model"], "layout": data["layout"], "layout_column": labels.get(column, column)}
            if figure is not None and "not_comparable" in figure:
                out["layout_note"] = figure["not_comparable"]
            elif figure is not None:
                out["layout_mean"] = figure["mean"]
                out["layout_std"] = figure.get("std")
            yield out


def render_text(data: dict[str, Any], markdown: bool = False) -> list[str]:
    labels = data.get("labels") or {}
    headers = ["model", *(labels.get(c, c) for c in data["columns"])]
    table = [[row["model"], *(cell(row.get(c)) for c in data["columns"])] for row in data["rows"]]
    if markdown:
        lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(r) + " |" for r in table]
        return [*lines, "", data["note"]]
    widths = [max(len(h), *(len(r[i]) for r in table)) if table else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in table]
    return [*lines, data["note"]]
