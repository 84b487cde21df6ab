"""Why a request was not a cache hit: ``runner explain RUN --item ID`` and ``runner explain JOB.yaml --item ID``.

The item's requests (each model, seed or variant, sample) are planned again from the job (the run's stored job, or
the job file before a run), exactly as a run plans them, and each is looked up in the memo:

- answered: by the memo, with the run that first sent it; for a run, whether that run had it from the memo (a cache
  hit) or sent it itself (a miss then: it is explained against what was stored before the run began);
- not answered (or a miss of the run): the nearest stored request of the same stage and model (as the job names
  it): one of the same item first, else any of the stage; among them the same model id and parameters first, then
  the smallest difference of the messages; and the difference field by field: provider, model id, each parameter
  (old -> new), the messages as a unified diff, the sample index, the request kind. With none of that stage and
  model: "never asked", and the nearest request of the item to another model, when there is one.

Prompts and answers are data: the text report goes through :mod:`runner.report.terminal` like every report.
Pipeline stages, whose rows exist only once the stages before them ran, are not planned here.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from runner.errors import RunnerError
from runner.plan.request import Task
from runner.plan.stage import StagePlan
from runner.report.terminal import clean_lines
from runner.report.whatif import stored_job
from runner.spec.schema import Job
from runner.spec.stage import Stage
from runner.store import Reads, Store

__all__ = ["FORMATS", "build", "differences", "render"]

FORMATS = ("text", "json")
#: stored requests of a stage compared at most, when none of the item is stored
CANDIDATES = 2000


@dataclass(slots=True)
class Explained:
    """One request of the item."""

    stage: str
    model: str
    variant: dict[str, Any]
    key: str
    #: whether the memo answers it now
    answered: bool
    #: the first run that sent it (None: none did)
    sent_by: str | None = None
    #: in a run: "cache hit", "sent", "failed (CLASS)" or "not reached"; None before a run
    in_run: str | None = None
    #: "nearest", "never asked" or None (nothing to explain)
    verdict: str | None = None
    #: the nearest stored request's first run, and whether it is of another model (with "never asked")
    nearest_run: str | None = None
    other_model: str | None = None
    changes: list[dict[str, Any]] = field(default_factory=list)


def _stages(job: Job, name: str | None) -> list[Stage]:
    llm = [s for s in job.stages if s.is_llm]
    if name is None:
        return [s for s in llm if s.from_ is None]
    for stage in llm:
        if stage.name == name:
            if stage.from_ is not None:
                raise RunnerError(f"stage {name!r} reads earlier stages' rows, which exist only once those ran; "
                                  "runner explain plans stages that read a dataset")
            return [stage]
    raise RunnerError(f"no stage {name!r} of model requests in job {job.name!r}; its stages: "
                      f"{', '.join(s.name for s in llm) or 'none'}")


def _item_tasks(job: Job, stage: Stage, item: str) -> list[Task] | None:
    plan = StagePlan(job, stage)
    for line_no, row_id, row in plan.rows():
        if row_id == item:
            return list(plan.expand(line_no, row, row_id))
    return None


def build(store: Store, item: str, *, run_id: str | None = None, job: Job | None = None,
          stage: str | None = None) -> dict[str, Any]:
    """The item's requests explained, as plain data; ``run_id`` or ``job`` says which plan."""
    run = None
    if run_id is not None:
        run, job = stored_job(store, run_id)
    assert job is not None
    stages = _stages(job, stage)
    planned = [(s, tasks) for s in stages if (tasks := _item_tasks(job, s, item)) is not None]
    if not planned:
        where = f"stage {stages[0].name!r}" if stage is not None else \
            f"any stage of job {job.name!r} ({', '.join(s.name for s in stages) or 'none'})"
        raise RunnerError(f"item {item!r} is not in {where}: an item is a dataset row's id (its dataset.id field, "
                          "else its row number)")
    reads = Reads(store)
    entries: list[Explained] = []
    for s, tasks in planned:
        keys = [t.key for t in tasks]
        memo = store.lookup_many(keys)
        payers = reads.payers(keys)
        in_run = {key: _run_status(status, hit, error) for key, status, hit, error in
                  reads.item_tasks(run["id"], s.name, item)} if run is not None else {}
        for task in tasks:
            entry = Explained(stage=s.name, model=task.model, variant=task.variant, key=task.key,
                              answered=task.key in memo, sent_by=payers.get(task.key))
            if run is not None:
                entry.in_run = in_run.get(task.key, "not reached")
            missed = not entry.answered or (run is not None and entry.in_run != "cache hit")
            if missed:
                _explain(reads, entry, task, item, before=run["created"] if run is not None else None)
            entries.append(entry)
    return {"item": item, "run": run["id"] if run is not None else None, "job": job.name,
            "requests": [asdict(e) for e in entries]}


def _run_status(status: str, hit: int, error: str | None) -> str:
    if status == "done":
        return "cache hit" if hit else "sent"
    return f"failed ({error})" if error else "failed"


def _explain(reads: Reads, entry: Explained, task: Task, item: str, before: str | None) -> None:
    """The nearest stored request of the same stage and model, and how it differs; else "never asked"."""
    mine = json.loads(task.call.canonical)
    found = [c for c in reads.stored_requests(task.stage, task.model, row_id=item, before=before) if c[0] != task.key]
    if not found:
        found = [c for c in reads.stored_requests(task.stage, task.model, before=before, limit=CANDIDATES)
                 if c[0] != task.key]
    if found:
        entry.verdict = "nearest"
    else:
        entry.verdict = "never asked"
        found = [c for c in reads.stored_requests(task.stage, None, row_id=item, before=before) if c[0] != task.key]
        if not found:
            return
    key, text, first_run = min(found, key=lambda c: _distance(json.loads(c[1]), mine))
    stored = json.loads(text)
    entry.nearest_run = first_run
    if entry.verdict == "never asked":
        entry.other_model = f"{stored.get('provider')}:{stored.get('model')}"
    entry.changes = differences(stored, mine)


def _messages_text(body: dict[str, Any]) -> list[str]:
    """A stored request's prompt as lines: each message's role, then its text; a log-likelihood call's pairs."""
    if body.get("kind") == "loglikelihood":
        return [f"[{context!r} -> {rest!r}]" for context, rest in body.get("pairs", [])]
    lines: list[str] = []
    for message in body.get("messages", []):
        content = message.get("content")
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        lines.append(f"[{message.get('role', '')}]")
        lines += text.splitlines() or [""]
    return lines


def _distance(stored: dict[str, Any], mine: dict[str, Any]) -> tuple[int, float]:
    """Order of nearness: same model id and parameters first, then the share of the prompt's lines that differ."""
    same = stored.get("model") == mine.get("model") and stored.get("params") == mine.get("params")
    ratio = difflib.SequenceMatcher(None, _messages_text(stored), _messages_text(mine), autojunk=False).ratio()
    return (0 if same else 1, 1.0 - ratio)


def differences(stored: dict[str, Any], mine: dict[str, Any]) -> list[dict[str, Any]]:
    """Field by field, what differs between a stored request's canonical body and this one's: ``{"field", "old",
    "new"}``, and for the messages ``{"field": "messages", "diff": [unified diff lines]}``."""
    changes: list[dict[str, Any]] = []
    for name in ("kind", "provider", "model"):
        old, new = stored.get(name, "chat" if name == "kind" else None), mine.get(name, "chat" if name == "kind"
                                                                                    else None)
        if old != new:
            changes.append({"field": "model id" if name == "model" else name, "old": old, "new": new})
    old_params, new_params = stored.get("params") or {}, mine.get("params") or {}
    for name in sorted(set(old_params) | set(new_params)):
        if old_params.get(name) != new_params.get(name):
            changes.append({"field": f"params.{name}", "old": old_params.get(name), "new": new_params.get(name)})
    old_lines, new_lines = _messages_text(stored), _messages_text(mine)
    if old_lines != new_lines:
        diff = list(difflib.unified_diff(old_lines, new_lines, "stored request", "this request", lineterm="", n=2))
        changes.append({"field": "messages", "diff": diff})
    if stored.get("sample", 0) != mine.get("sample", 0):
        changes.append({"field": "sample", "old": stored.get("sample", 0), "new": mine.get("sample", 0)})
    return changes


# -- display ---------------------------------------------------------------------------------------
def _value(value: Any) -> str:
    return "(unset)" if value is None else json.dumps(value, ensure_ascii=False)


def _lines(entry: dict[str, Any]) -> list[str]:
    variant = ",".join(f"{k}={v}" for k, v in entry["variant"].items())
    head = f"{entry['stage']} · {entry['model']}" + (f" · {variant}" if variant else "")
    sent = f" (first sent by run {entry['sent_by']})" if entry["sent_by"] else ""
    if entry["in_run"] == "cache hit":
        return [f"{head}: a cache hit in this run{sent}"]
    lines: list[str] = []
    if entry["in_run"] is not None:
        state = "sent by this run: a miss" if entry["in_run"] == "sent" else entry["in_run"]
        lines.append(f"{head}: {state}; against what was stored before the run began:")
    elif entry["answered"]:
        return [f"{head}: answered by the memo{sent}"]
    else:
        lines.append(f"{head}: not in the memo")
    if entry["verdict"] == "never asked":
        lines.append(f"  never asked: no stored request of stage {entry['stage']} and model {entry['model']}")
        if entry["other_model"]:
            lines.append(f"  nearest of another model ({entry['other_model']}, run {entry['nearest_run']}):")
    elif entry["verdict"] == "nearest":
        lines.append(f"  nearest stored request (run {entry['nearest_run']}):")
    for change in entry["changes"]:
        if change["field"] == "messages":
            lines.append("    messages:")
            lines += [f"      {line}" for line in change["diff"]]
        else:
            lines.append(f"    {change['field']}: {_value(change['old'])} -> {_value(change['new'])}")
    if entry["verdict"] == "nearest" and not entry["changes"]:
        lines.append("    no difference in what is keyed")
    return lines


def render(data: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    where = f"run {data['run']} (job {data['job']})" if data["run"] else f"job {data['job']} (before a run)"
    lines = [f"Item {data['item']} of {where}: {len(data['requests'])} request(s)"]
    for entry in data["requests"]:
        lines += _lines(entry)
    return "\n".join(clean_lines(lines)) + "\n"
