"""The list of runs: ``runner runs [--format text|json|csv|md] [-o FILE]``.

One row per run, newest first: its id, job, status, tasks done and failed of its total, spend (charged and
possibly billed, from the ledger), and when it started and finished. A run recorded as running whose process is
gone was killed without a chance to say so: its status is ``crashed`` (``runner resume`` finishes it).
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from runner.store import Store

__all__ = ["FIELDS", "FORMATS", "build", "render"]

FORMATS = ("text", "json", "csv", "md")
#: the fields of a run, in the order of the json objects and the csv columns
FIELDS = ("id", "job", "status", "done", "failed", "total", "spend", "started", "finished")


def build(store: Store, limit: int = 50) -> dict[str, Any]:
    """The newest ``limit`` runs as plain data (what ``render`` shows and ``--format json`` prints)."""
    from runner.engine.run import pid_alive  # run imports the engine; keep this light to import

    runs = []
    for r in store.list_runs(limit):
        status = r["status"]
        if status == "running" and not pid_alive(r["pid"]):
            status = "crashed"
        runs.append({"id": r["id"], "job": r["job_name"], "status": status, "done": int(r["done"] or 0),
                     "failed": int(r["failed"] or 0), "total": int(r["total"] or 0),
                     "spend": round(float(r["spend"] or 0.0), 10), "started": r.get("started"),
                     "finished": r.get("finished")})
    return {"runs": runs}


def _when(stamp: str | None) -> str:
    return stamp[:19].replace("T", " ") if stamp else ""


def _progress(r: dict[str, Any]) -> str:
    return f"{r['done'] + r['failed']}/{r['total']}" + (f" ({r['failed']} failed)" if r["failed"] else "")


def render(data: dict[str, Any], fmt: str) -> str:
    runs = data["runs"]
    if fmt == "json":
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=FIELDS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(runs)
        return buffer.getvalue()
    if not runs:
        return "no runs yet\n"
    if fmt == "md":
        lines = ["| id | job | status | progress | spend | started | finished |", "|---|---|---|---:|---:|---|---|"]
        lines += [f"| {r['id']} | {r['job']} | {r['status']} | {_progress(r)} | ${r['spend']:.4f} | "
                  f"{_when(r['started'])} | {_when(r['finished'])} |" for r in runs]
        return "\n".join(lines) + "\n"
    lines = [f"{'id':<22} {'job':<20} {'status':<12} {'progress':>16} {'spend':>10}  started"]
    lines += [f"{r['id']:<22} {r['job']:<20} {r['status']:<12} {_progress(r):>16} ${r['spend']:>9.4f}  "
              f"{_when(r['started'])}" for r in runs]
    return "\n".join(lines) + "\n"
