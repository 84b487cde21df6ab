"""The guarantee table: each guarantee a named check of one seed's end state, against the simulated server's own log
of what it answered and billed (:mod:`simserver.request_log`) and the store. A check returns the lines saying how it
was broken (empty: it held).

- ``ended``: the run completed (or stopped on its budget) within the resumes allowed, no process left running.
- ``answered_once``: every task once in the results file, none missing (a run stopped by its budget: each task the
  store holds, once); a task failed only for a reason a fault gave: a refused batch input file, or a request the
  server answered 500 on every one of its ``MAX_ATTEMPTS`` attempts (the retry policy's documented end, which a 30 %
  storm of 500s reaches for one request in about 170,000), and the tasks that shared that request.
- ``billed_once``: every request the server billed more than once (one per model asked and messages) is a request
  the store keeps as possibly billed, at least once per extra time; every request billed is in the memo or possibly
  billed (nothing billed was lost).
- ``charged_once``: the store charged no request twice in the run.
- ``budget``: spend (charged and possibly billed) within the budget plus one reservation's worst case.
- ``no_open_reservation``: no ledger row still reserved.
- ``integrity``: SQLite's ``PRAGMA integrity_check`` ok; on both stores, the budget sums the triggers keep equal the
  ledger's, and every task answered by a request has its answer in the memo.
- ``clean_exit``: no process ended in a traceback or an "unexpected" error.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from faultsim.draw import Scenario
from faultsim.jobfile import JOB_NAME, MAX_ATTEMPTS, STAGE
from faultsim.run import ENDED, Record
from simserver.answers import message_digest

__all__ = ["CHECKS", "State", "check_all"]

#: a failed task's error classes a fault explains (a batch input file refused, its lines refused again)
REFUSAL_CLASSES = {"bad_request", "batch_refused"}


@dataclass
class State:
    """A seed's end state, read once: the store's rows of the run, the results file and the server's log."""

    scenario: Scenario
    record: Record
    run: dict[str, Any] | None
    tasks: list[dict[str, Any]]
    ledger: list[dict[str, Any]]
    asked: dict[str, tuple[str, str]]  #: cache key -> (model asked, messages' digest), from the memo
    results: list[dict[str, Any]] | None  #: the results file's lines, None when there is no file
    integrity: list[str]  #: what the store's own checks found wrong


def read_state(scenario: Scenario, record: Record) -> State:
    from runner.store import open_store

    store = open_store(record.db)
    try:
        try:
            run = store.get_run(record.run_id)
        except Exception:
            run = None
        tasks = store.tasks(record.run_id)
        ledger = store.ledger(record.run_id)
        keys = {t["key"] for t in tasks} | {row["key"] for row in ledger}
        asked = {}
        for key, request_json in store.rows("SELECT key, request_json FROM responses"):
            if key in keys:
                request = json.loads(request_json)
                asked[key] = (request.get("model"), message_digest(request.get("messages") or []))
        integrity = _integrity(store, record)
    finally:
        store.close()
    path = record.results / JOB_NAME / record.run_id / f"{STAGE}.jsonl"
    results = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else None
    return State(scenario, record, run, tasks, ledger, asked, results, integrity)


def _integrity(store: Any, record: Record) -> list[str]:
    found = []
    if "://" not in record.db:
        (verdict,) = store.row("PRAGMA integrity_check")
        if verdict != "ok":
            found.append(f"PRAGMA integrity_check: {verdict}")
    sums = store.rows("SELECT usd, inflight FROM budget_use WHERE run_id = ? AND scope = 'run'", (record.run_id,))
    ledger = store.row("SELECT coalesce(sum(amount), 0), coalesce(sum(CASE WHEN kind = 'reserved' THEN 1 ELSE 0 END),"
                       " 0) FROM ledger WHERE run_id = ? AND kind IN ('reserved', 'charge', 'possibly_billed')",
                       (record.run_id,))
    usd, inflight = sums[0] if sums else (0.0, 0)
    if abs(float(usd) - float(ledger[0])) > 1e-6 or int(inflight) != int(ledger[1]):
        found.append(f"budget_use says ${float(usd):.6f} and {inflight} in flight, the ledger ${float(ledger[0]):.6f}"
                     f" and {ledger[1]}")
    (orphans,) = store.row("SELECT count(*) FROM tasks t WHERE t.run_id = ? AND t.status = 'done' AND t.cache_hit = 0"
                           " AND NOT EXISTS (SELECT 1 FROM responses r WHERE r.key = t.key)", (record.run_id,))
    if orphans:
        found.append(f"{orphans} done task(s) whose answer is not in the memo")
    return found


def ended(state: State) -> list[str]:
    record, out = state.record, []
    if record.unfinished:
        out.append(f"the run did not end: {record.unfinished}")
    elif state.run is None or state.run["status"] not in ENDED:
        out.append(f"the run ended {state.run and state.run['status']}")
    elif state.run["status"] == "budget_exhausted" and state.scenario.budget is None:
        out.append("stopped by a budget it does not have")
    return out


def _task_of(line: dict[str, Any]) -> tuple:
    return line["id"], line["model"], line.get("seed"), json.dumps(line.get("variant"), sort_keys=True)


def answered_once(state: State) -> list[str]:
    out = []
    if state.results is None:
        return ["no results file"] if state.tasks or state.scenario.budget is None else []
    seen = Counter(_task_of(line) for line in state.results)
    twice = [task for task, n in seen.items() if n > 1]
    if twice:
        out.append(f"{len(twice)} task(s) more than once in the results, e.g. {twice[0]}")
    completed = state.run is not None and state.run["status"] == "completed"
    expected = state.scenario.tasks if completed else len(state.tasks)
    if len(seen) != expected:
        out.append(f"{len(seen)} task(s) in the results, {expected} expected ({len(state.tasks)} in the store)")
    allowed = REFUSAL_CLASSES if state.record.injected["batch_refused"] else set()
    given_up = _given_up(state)
    failed = Counter(t["error_class"] for t in state.tasks if t["status"] != "done"
                     and t["error_class"] not in allowed and t["key"] not in given_up)
    if failed:
        out.append("task(s) failed: " + ", ".join(f"{n} {cls}" for cls, n in failed.most_common()))
    return out


def _given_up(state: State) -> set[str]:
    """The keys of the failed tasks the runner gave up on after its whole retry budget went on 500s: each such task
    (a server error after ``MAX_ATTEMPTS`` attempts) needs a request of its own the server answered 500 at least that
    many times and never answered otherwise; a task that waited on the same request (it failed with no attempt of its
    own) goes with it. Anything short of that is a task given up too soon, and stays a violation."""
    if not state.record.injected["http_500"]:
        return set()
    statuses: dict[tuple[str, str], Counter] = {}
    for entry in state.record.log:
        if entry.get("kind") == "request":
            statuses.setdefault((entry["model"], entry["digest"]), Counter())[entry["status"]] += 1
    exhausted = sum(1 for seen in statuses.values() if seen[500] >= MAX_ATTEMPTS and seen.total() == seen[500])
    spent = {t["key"] for t in state.tasks if t["status"] == "failed" and t["error_class"] == "server_error"
             and t["attempts"] == MAX_ATTEMPTS}
    return spent if len(spent) <= exhausted else set()


def billed_once(state: State) -> list[str]:
    billed = Counter((e["model"], e["digest"]) for e in state.record.log if e.get("billed"))
    possibly = Counter(row["key"] for row in state.ledger if row["kind"] == "possibly_billed")
    by_request: dict[tuple[str, str], list[str]] = {}
    for key, request in state.asked.items():
        by_request.setdefault(request, []).append(key)
    out, unkept, extra = [], 0, 0
    for request, n in billed.items():
        keys = by_request.get(request, [])
        kept = sum(possibly[key] for key in keys)
        if n > 1:
            extra += n - 1
            if kept < n - 1:
                out.append(f"request {request[1][:12]} ({request[0]}) billed {n} times, {kept} kept as possibly "
                           "billed")
        if not keys:
            unkept += 1
    if unkept and unkept > sum(possibly.values()):
        out.append(f"{unkept} billed request(s) neither in the memo nor possibly billed")
    if extra > sum(possibly.values()):
        out.append(f"{extra} extra billing(s), {sum(possibly.values())} possibly billed")
    return out[:3] + ([f"... and {len(out) - 3} more"] if len(out) > 3 else [])


def charged_once(state: State) -> list[str]:
    charges = Counter(row["key"] for row in state.ledger if row["kind"] == "charge")
    twice = [key for key, n in charges.items() if n > 1]
    if not twice:
        return []
    return [f"{len(twice)} request(s) charged more than once, e.g. {twice[0][:12]} x{charges[twice[0]]}"]


def budget(state: State) -> list[str]:
    if state.scenario.budget is None:
        return []
    spent = sum(row["amount"] for row in state.ledger if row["kind"] in ("charge", "possibly_billed"))
    worst = max((row["amount"] for row in state.ledger if row["kind"] == "possibly_billed"), default=0.0)
    if spent > state.scenario.budget + worst + 1e-9:
        return [f"spent ${spent:.4f} of a ${state.scenario.budget:g} budget (one reservation: ${worst:.4f})"]
    return []


def no_open_reservation(state: State) -> list[str]:
    open_rows = [row for row in state.ledger if row["kind"] == "reserved"]
    return [f"{len(open_rows)} reservation(s) left open"] if open_rows else []


def integrity(state: State) -> list[str]:
    return state.integrity


def clean_exit(state: State) -> list[str]:
    return state.record.problems


#: the guarantees, in the table's order
CHECKS: dict[str, Callable[[State], list[str]]] = {
    "ended": ended, "answered_once": answered_once, "billed_once": billed_once, "charged_once": charged_once,
    "budget": budget, "no_open_reservation": no_open_reservation, "integrity": integrity, "clean_exit": clean_exit,
}


def check_all(scenario: Scenario, record: Record) -> dict[str, list[str]]:
    """Each guarantee's violations (empty lists where it held)."""
    state = read_state(scenario, record)
    return {name: check(state) for name, check in CHECKS.items()}
