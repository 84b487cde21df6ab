"""The list of runs: ``runner runs [--format text|json|csv|md] [-o FILE]``.

One row per run, newest first: its id, job, status, tasks done and failed of its total, spend (charged and
possibly billed, from the ledger), and when it started and finished. A run recorded as running whose process is
gone was killed without a chance to say so: its status is ``crashed`` (``runner resume`` finishes it).
"""

from __future__ import annotations

from typing import Any

from runner.processes import pid_alive
from runner.report.tables import Column, Table, csv_text, json_text
from runner.store import Store

__all__ = ["FIELDS", "FORMATS", "build", "render"]

FORMATS = ("text", "json", "csv", "md")
#: the fields of a run, in the order of the json objects and the csv columns
FIELDS = ("id", "job", "status", "done", "failed", "total", "spend", "started", "finished")


def build(store: Store, limit: int = 50) -> dict[str, Any]:
    """The newest ``limit`` runs as plain data (what ``render`` shows and ``--format json`` prints)."""
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


#: the text table's columns: each cell padded to its width alone, as a line of ``runner runs`` always was
TEXT_COLUMNS = (Column("id", width=22), Column("job", width=20), Column("status", width=12),
                Column("progress", right=True, width=16), Column("spend", right=True, width=10),
                Column("started", gap="  "))
#: the Markdown table's columns (progress and spend right-aligned)
MD_COLUMNS = (Column("id"), Column("job"), Column("status"), Column("progress", right=True),
              Column("spend", right=True), Column("started"), Column("finished"))


def render(data: dict[str, Any], fmt: str) -> str:
    runs = data["runs"]
    if fmt == "json":
        return json_text(data)
    if fmt == "csv":
        return csv_text(FIELDS, runs, lineterminator="\n")
    if not runs:
        return "no runs yet\n"
    if fmt == "md":
        rows = [[r["id"], r["job"], r["status"], _progress(r), f"${r['spend']:.4f}", _when(r["started"]),
                 _when(r["finished"])] for r in runs]
        return "\n".join(Table(MD_COLUMNS, rows).markdown()) + "\n"
    rows = [[r["id"], r["job"], r["status"], _progress(r), f"${r['spend']:>9.4f}", _when(r["started"])] for r in runs]
    return "\n".join(Table(TEXT_COLUMNS, rows).text(gap=" ", fit=False)) + "\n"
