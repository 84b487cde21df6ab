"""The viewer's questions of the store (``runner view``, runner/view/app.py): a page of runs and a page of a run's
answers, each one query with LIMIT/OFFSET (never every row), their filter choices, and the savings per group,
written once for SQLite and PostgreSQL through the store's dialect.

A page of runs is listed by the store's own run listing (:func:`runner.store.sql.runs_sql`, which ``runner runs``
lists with) and its spend counted as ``runner runs`` counts it (:data:`runner.store.sql.RUN_SPEND`); its tasks
and spend in one grouped query each. It lives in the store package beside :mod:`runner.store.reads` for the same
reason: its SQL reads the schema the migrations make.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from runner.store.base import Store
from runner.store.dialect import zero
from runner.store.reads import UNKNOWN_JOB
from runner.store.sql import RUN_SPEND, SPENT, SQLStore, runs_sql

__all__ = ["ANSWER_OUTCOMES", "RUN_SORTS", "AnswerFilter", "RunFilter", "ViewReads", "like_pattern"]

#: sort keys of the runs page → their SQL
RUN_SORTS = {"started": "r.created", "job": "r.job_name", "status": "r.status", "spend": "spend", "id": "r.id"}
#: the runs page's sorts in code point order
_TEXT_SORTS = ("r.created", "r.job_name", "r.id")
#: the answers page's outcome filter (a task's status)
ANSWER_OUTCOMES = ("done", "failed")
_LIKE_ESCAPE = "!"
#: the columns of a run on the runs page
_RUN_COLUMNS = "r.id, r.job_name, r.job_json, r.status, r.total, r.pid, r.message, r.created, r.started, r.finished"


def like_pattern(text: str) -> str:
    """``%text%`` with LIKE's wildcards in ``text`` taken literally (escaped with ``!``)."""
    escaped = text.replace("!", "!!").replace("%", "!%").replace("_", "!_")
    return f"%{escaped}%"


@dataclass(slots=True)
class RunFilter:
    text: str = ""
    status: str = ""
    sort: str = "started"
    descending: bool = True
    limit: int = 50
    offset: int = 0


@dataclass(slots=True)
class AnswerFilter:
    text: str = ""
    stage: str = ""
    model: str = ""
    outcome: str = ""
    error_class: str = ""
    row: str = ""
    limit: int = 50
    offset: int = 0


class ViewReads:
    """Paged reads of one store for the viewer."""

    def __init__(self, store: Store) -> None:
        assert isinstance(store, SQLStore), "the viewer reads SQL stores (runner/store/sqlite.py or postgres.py)"
        self.store = store
        self.dialect = store.dialect
        #: the figures of runs that are not running, by (run id, status, finished)
        self._settled: dict[tuple[str, str, str | None], tuple[int, int, float | None, float]] = {}

    # -- runs ------------------------------------------------------------------------------------------
    def runs(self, f: RunFilter) -> tuple[list[dict[str, Any]], int]:
        """(a page of runs, how many runs match the filter). Each run is its row (``job`` its job JSON read,
        ``{}`` when unreadable) with its figures: ``finished`` and ``failed`` tasks, mean ``score`` of the scored
        ones, ``spend`` (USD charged and possibly billed)."""
        where, args = self._run_where(f)
        order = RUN_SORTS.get(f.sort, "r.created")
        found = self.store.dicts(runs_sql(
            self.dialect, _RUN_COLUMNS, where=where,
            order=f"({RUN_SPEND.format(run='r.id')})" if order == "spend" else order, text=order in _TEXT_SORTS,
            descending=f.descending, then=", r.id", offset=True), (*args, f.limit, f.offset))
        total = int(self.store.row(f"SELECT count(*) FROM runs r{where}", args)[0])
        figures = self._figures(found)
        runs = []
        for r in found:
            done, failed, score, spent = figures[r["id"]]
            runs.append({**{k: v for k, v in r.items() if k != "job_json"}, "job": _object(r["job_json"]),
                         "finished_tasks": done, "failed": failed, "score": score, "spend": spent})
        return runs, total

    def _figures(self, runs: list[dict[str, Any]]) -> dict[str, tuple[int, int, float | None, float]]:
        """Per run: (finished tasks, failed tasks, mean score of its scored tasks, USD charged and possibly billed),
        in one grouped query each for the page's runs. A run that is not running keeps its figures (kept here while
        its status and finish time stay the same), so the page's poll counts only the running ones."""
        figures = {r["id"]: self._settled[r["id"], r["status"], r["finished"]] for r in runs
                   if (r["id"], r["status"], r["finished"]) in self._settled}
        ask = [r["id"] for r in runs if r["id"] not in figures]
        if ask:
            where, args = self.dialect.in_list("run_id", ask)
            counts = {run: (int(n), int(failed or 0), score) for run, n, failed, score in self.store.rows(
                "SELECT run_id, count(*), sum(CASE WHEN status = 'failed' THEN 1 ELSE 0 END), avg(score) FROM tasks"
                f" WHERE {where} GROUP BY run_id", args)}
            spent = dict(self.store.rows(f"SELECT run_id, sum(amount) FROM ledger WHERE {where}"
                                         f" AND kind IN {SPENT} GROUP BY run_id", args))
            for run in ask:
                figures[run] = (*counts.get(run, (0, 0, None)), zero(spent.get(run)))
        for r in runs:
            if r["status"] != "running":
                self._settled[r["id"], r["status"], r["finished"]] = figures[r["id"]]
        return figures

    def _run_where(self, f: RunFilter) -> tuple[str, list[Any]]:
        clauses, args = [], []
        if f.text:
            clauses.append(f"(r.id LIKE ? ESCAPE '{_LIKE_ESCAPE}' OR r.job_name LIKE ? ESCAPE '{_LIKE_ESCAPE}')")
            args += [like_pattern(f.text)] * 2
        if f.status:
            clauses.append("r.status = ?")
            args.append(f.status)
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), args

    def statuses(self) -> list[str]:
        return sorted(s for (s,) in self.store.rows("SELECT DISTINCT status FROM runs") if s)

    # -- a run's answers --------------------------------------------------------------------------------
    def answers(self, run_id: str, f: AnswerFilter) -> tuple[list[dict[str, Any]], int]:
        """(a page of a run's answers, each its result line with the task's figures and the request from the
        memo, how many match the filter)."""
        where, args = self._answer_where(run_id, f)
        found = self.store.dicts(
            "SELECT t.stage, t.model, t.row_id, t.status, t.cache_hit, t.error_class, t.cost, t.key, t.score,"
            f" t.result_json, m.request_json FROM tasks t LEFT JOIN responses m ON m.key = t.key{where}"
            f" ORDER BY t.{self.dialect.task_order} LIMIT ? OFFSET ?", (*args, f.limit, f.offset))
        total = int(self.store.row(f"SELECT count(*) FROM tasks t{where}", args)[0])
        answers = []
        for row in found:
            result = _object(row["result_json"])
            request = _object(row["request_json"]) if row["request_json"] else None
            answers.append({"stage": row["stage"], "model": row["model"], "row": row["row_id"],
                            "status": row["status"], "cache_hit": bool(row["cache_hit"]),
                            "error_class": row["error_class"], "cost": zero(row["cost"]), "key": row["key"],
                            "score": row["score"], "result": result, "request": request})
        return answers, total

    def _answer_where(self, run_id: str, f: AnswerFilter) -> tuple[str, list[Any]]:
        clauses, args = ["t.run_id = ?"], [run_id]
        for column, value in (("t.stage", f.stage), ("t.model", f.model), ("t.status", f.outcome),
                              ("t.error_class", f.error_class), ("t.row_id", f.row)):
            if value:
                clauses.append(f"{column} = ?")
                args.append(value)
        if f.text:
            clauses.append(f"t.result_json LIKE ? ESCAPE '{_LIKE_ESCAPE}'")
            args.append(like_pattern(f.text))
        return " WHERE " + " AND ".join(clauses), args

    def facets(self, run_id: str) -> dict[str, list[str]]:
        """The stages, models and error classes of a run's tasks (the answers page's filter choices)."""
        groups = self.store.rows("SELECT stage, model FROM tasks WHERE run_id = ? GROUP BY stage, model", (run_id,))
        errors = self.store.rows("SELECT DISTINCT error_class FROM tasks WHERE run_id = ? AND error_class IS NOT NULL",
                                 (run_id,))
        return {"stages": sorted({s for s, _ in groups}), "models": sorted({m for _, m in groups}),
                "error_classes": sorted(e for (e,) in errors)}

    # -- savings ----------------------------------------------------------------------------------------
    def savings(self, by: str, since: str | None = None) -> dict[str, tuple[float, float]]:
        """Per group (model, job, day or endpoint, as ``runner costs --by`` groups tasks, from ``since``): (USD saved
        by the Batch API's price, USD saved by the provider's prompt cache)."""
        group = {"model": "t.model", "job": f"coalesce(r.job_name, '{UNKNOWN_JOB}')",
                 "day": "substr(t.updated, 1, 10)",
                 # a task names no endpoint: a model's savings go on its row (a pooled one's are not split by endpoint)
                 "endpoint": "t.model"}[by]
        where, args = (" AND t.updated >= ?", [since]) if since else ("", [])
        found = self.store.rows(
            f"SELECT {group}, sum(t.batch_saved), sum(t.cache_saved) FROM tasks t LEFT JOIN runs r ON r.id = t.run_id"
            f" WHERE (t.batch_saved > 0 OR t.cache_saved > 0){where} GROUP BY 1", args)
        return {str(g if g is not None else "-"): (zero(b), zero(c)) for g, b, c in found}


def _object(text: str | None) -> dict[str, Any]:
    """A JSON object column read, ``{}`` when empty or not an object."""
    try:
        found = json.loads(text) if text else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}
