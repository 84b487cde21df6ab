"""The store's queries, written once for SQLite and PostgreSQL: :class:`SQLStore` implements every method of
:class:`~runner.store.base.Store` whose SQL both databases accept (spelled through :mod:`runner.store.dialect`):
the memo, runs, tasks, the ledger, replayed stages and pipelines' stage outputs, over the
primitives of :class:`~runner.store.sql_base.SQLBase`, with the worker protocol's shared queries of
:class:`~runner.store.sql_workers.WorkerSQL` and the Batch API's records of
:class:`~runner.store.sql_batch_api.BatchAPISQL`.

A backend (:mod:`runner.store.sqlite`, :mod:`runner.store.postgres`) adds its connection, its transactions
(:meth:`SQLBase.atomic`), the statements whose SQL must differ (a task row's upsert, which renews its order) and
the worker protocol's time-critical methods, which read each database's own clock and locks. The run listing
(:func:`runs_sql`) is shared with the viewer's page of runs (:mod:`runner.store.view_reads`).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
from collections.abc import Iterator
from typing import Any

from runner.errors import StoreError
from runner.store.base import (
    LEDGER_COLUMNS,
    RESPONSE_COLUMNS,
    TASK_COLUMNS,
    CachedResponse,
    Finished,
    ReserveAsk,
    RunExists,
    dumps,
    now,
)
from runner.store.dialect import Dialect, sqlite_sorted, zero
from runner.store.fencing import FENCED_RESERVATION_SQL, Fence, Fenced
from runner.store.sql_base import T, Tx, insert_sql, upsert
from runner.store.sql_batch_api import BatchAPISQL
from runner.store.sql_workers import WorkerSQL

__all__ = ["EPSILON", "RUN_SPEND", "SPENT", "SQLStore", "T", "Tx", "runs_sql", "upsert"]

#: tolerance of float sums of money (USD) against a budget; far below a cent
EPSILON = 1e-9
#: keys per query when a list of keys is asked about
_KEYS = 500
#: a memo row's columns as :class:`CachedResponse` takes them (rows older than m010 have no reasoning tokens)
_MEMO = ("response_text, finish_reason, input_tokens, output_tokens, cached_tokens, cost, thinking,"
         " coalesce(reasoning_tokens, 0), reported_model, sent_with")


# A memo row is never overwritten: the first answer to a request is the answer.
_RESPONSE_SQL = insert_sql("responses", RESPONSE_COLUMNS, " ON CONFLICT DO NOTHING")
_LEDGER_SQL = insert_sql("ledger", LEDGER_COLUMNS)
#: a reservation: its worst case in USD (``amount``) and in ``tokens``, and the worker that made it
_RESERVE_SQL = insert_sql("ledger", (*LEDGER_COLUMNS[:LEDGER_COLUMNS.index("tokens") + 1], "worker"),
                          " RETURNING id")
#: the ledger kinds a run's spend counts: charged, and possibly billed (in flight when a run was killed)
SPENT = "('charge', 'possibly_billed')"
#: a run's spend, ``{run}`` the column or placeholder that names the run
RUN_SPEND = f"SELECT sum(amount) FROM ledger l WHERE l.run_id = {{run}} AND l.kind IN {SPENT}"


def runs_sql(dialect: Dialect, columns: str, *, where: str = "", order: str = "r.created", text: bool = True,
             descending: bool = True, then: str = "", offset: bool = False) -> str:
    """The run listing: ``columns`` of the runs ``r`` that ``where`` keeps (a clause with its leading space), by
    ``order`` (in code point order where ``text``; NULLs last; then by ``then``, e.g. ``", r.id"``), the first
    ``?`` (from the ``?``-th with ``offset``). ``runner runs`` (:meth:`SQLStore.list_runs`) and the viewer's page
    of runs (:meth:`runner.store.view_reads.ViewReads.runs`) both list runs with it."""
    return (f"SELECT {columns} FROM runs r{where} ORDER BY {order}{dialect.text_order if text else ''}"
            f" {'DESC' if descending else 'ASC'} NULLS LAST{then} LIMIT ?{' OFFSET ?' if offset else ''}")


#: how many generated run ids one new run tries before it gives up (each taken one is a 1-in-65,536 draw)
RUN_ID_DRAWS = 20


class SQLStore(WorkerSQL, BatchAPISQL):
    """Every query both databases accept, once. Subclasses set :attr:`dialect` and :attr:`task_sql` and provide
    the primitives of :class:`~runner.store.sql_base.SQLBase` and :meth:`atomic`."""

    # -- the memo ----------------------------------------------------------------------------------
    def lookup(self, key: str) -> CachedResponse | None:
        row = self.row(f"SELECT {_MEMO} FROM responses WHERE key = ?", (key,))
        return CachedResponse(*row) if row else None

    def lookup_many(self, keys: list[str]) -> dict[str, CachedResponse]:
        found: dict[str, CachedResponse] = {}
        for start in range(0, len(keys), _KEYS):
            where, args = self.dialect.in_list("key", keys[start:start + _KEYS])
            for key, *values in self.rows(f"SELECT key, {_MEMO} FROM responses WHERE {where}", args):
                found[key] = CachedResponse(*values)
        return found

    def memo_keys(self) -> set[str]:
        return {key for (key,) in self.rows("SELECT key FROM responses")}

    def responses(self) -> list[dict[str, Any]]:
        c = self.dialect.text_order
        return self.dicts(f"SELECT * FROM responses ORDER BY created{c} NULLS FIRST, key{c}")

    # -- runs --------------------------------------------------------------------------------------
    def create_run(self, job_name: str, job_path: str, job_json: str, fingerprint: str, total: int,
                   run_id: str | None = None) -> str:
        # a generated id is the second it was made and 16 random bits: runs started in the same second of one store
        # (a script's many short runs, several workers starting) can draw the same bits, so a taken one is drawn again
        for _ in range(RUN_ID_DRAWS):
            chosen = run_id or dt.datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)
            inserted = self.row(  # RETURNING: a row only when this process inserted it (both databases)
                "INSERT INTO runs (id, job_name, job_path, job_json, fingerprint, status, total, pid, created,"
                " started) VALUES (?, ?, ?, ?, ?, 'running', ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING RETURNING id",
                (chosen, job_name, job_path, job_json, fingerprint, total, os.getpid(), now(), now()))
            if inserted is not None:
                return chosen
            if run_id:
                break
        raise RunExists(f"a run {chosen!r} exists already")

    def get_run(self, run_id: str) -> dict[str, Any]:
        found = self.dicts("SELECT * FROM runs WHERE id = ?", (run_id,))
        if not found:
            matches = self.rows(f"SELECT id FROM runs WHERE {self.dialect.contains.format('id', '?')}", (run_id,))
            if len(matches) == 1:
                return self.get_run(matches[0][0])
            raise StoreError(f"no run {run_id!r} in {self.path}; `runner runs` lists the runs")
        return found[0]

    def set_run(self, run_id: str, **fields: Any) -> None:
        assignments = ", ".join(f"{name} = ?" for name in fields)
        self.execute(f"UPDATE runs SET {assignments} WHERE id = ?", (*fields.values(), run_id))

    def list_runs(self, limit: int = 50) -> list[dict[str, Any]]:
        found = self.dicts(runs_sql(
            self.dialect, "r.*, (SELECT count(*) FROM tasks t WHERE t.run_id = r.id AND t.status = 'done') AS done,"
            " (SELECT count(*) FROM tasks t WHERE t.run_id = r.id AND t.status = 'failed') AS failed,"
            f" ({RUN_SPEND.format(run='r.id')}) AS spend"), (limit,))
        for run in found:
            run["spend"] = zero(run["spend"])
        return found

    # -- tasks -------------------------------------------------------------------------------------
    def task_status(self, run_id: str, stage: str, item: str) -> str | None:
        row = self.row("SELECT status FROM tasks WHERE run_id = ? AND stage = ? AND item = ?", (run_id, stage, item))
        return row[0] if row else None

    def done_items(self, run_id: str, stage: str, items: list[str]) -> set[str]:
        done: set[str] = set()
        for start in range(0, len(items), _KEYS):
            where, args = self.dialect.in_list("item", items[start:start + _KEYS])
            done.update(item for (item,) in self.rows(
                f"SELECT item FROM tasks WHERE run_id = ? AND stage = ? AND status = 'done' AND {where}",
                (run_id, stage, *args)))
        return done

    def has_tasks(self, run_id: str, stage: str) -> bool:
        return self.row("SELECT 1 FROM tasks WHERE run_id = ? AND stage = ? LIMIT 1", (run_id, stage)) is not None

    def stage_progress(self, run_id: str, stage: str) -> tuple[int, int]:
        done, other = self.row(
            "SELECT coalesce(sum(CASE WHEN status = 'done' THEN 1 ELSE 0 END), 0),"
            " coalesce(sum(CASE WHEN status != 'done' THEN 1 ELSE 0 END), 0) FROM tasks"
            " WHERE run_id = ? AND stage = ?", (run_id, stage))
        return int(done), int(other)

    def iter_results(self, run_id: str, stage: str) -> Iterator[str]:
        for (line,) in self.stream("SELECT result_json FROM tasks WHERE run_id = ? AND stage = ?"
                                   f" ORDER BY {self.dialect.task_order}", (run_id, stage)):
            yield line

    def stage_scores(self, run_id: str, stage: str, after: int = 0) -> tuple[int, list[dict[str, Any]]]:
        """The stage's tasks written since ``after`` (a position :meth:`stage_scores` gave), as (item, model,
        row_id, status, score), and the position to ask from next: what an early-stopping rule reads of the
        answers other workers wrote. A task written again comes again."""
        order = self.dialect.task_order
        found = self.dicts(f"SELECT {order} AS position, item, model, row_id, status, score FROM tasks"
                           f" WHERE run_id = ? AND stage = ? AND {order} > ? ORDER BY {order}", (run_id, stage, after))
        return (max((int(row["position"]) for row in found), default=after), found)

    def tasks(self, run_id: str | None = None, **where: Any) -> list[dict[str, Any]]:
        conditions = {"run_id": run_id, **where} if run_id is not None else dict(where)
        unknown = set(conditions) - set(TASK_COLUMNS) - {"updated"}
        if unknown:
            raise ValueError(f"no task column {', '.join(sorted(unknown))}")
        clause = " AND ".join(f"{name} = ?" for name in conditions)
        return self.dicts(f"SELECT {self.task_columns} FROM tasks{' WHERE ' + clause if clause else ''}"
                          f" ORDER BY {self.dialect.task_order}", list(conditions.values()))

    def write_batch(self, tasks: list[tuple], responses: list[tuple], ledger: list[tuple],
                    released: list[tuple[int]] | None = None, fenced: list[Finished] | None = None
                    ) -> list[Finished]:
        def body(tx: Tx) -> list[Finished]:
            written, charges, releases = list(tasks), list(ledger), list(released or ())
            refused: list[Finished] = []
            runs = {row[0] for row in written} | {item.task[0] for item in fenced or ()}
            if runs:
                self.order_task_writes(tx, sorted(runs))
            if responses:
                tx.executemany(_RESPONSE_SQL, responses)
            if fenced:
                held: dict[Fence, bool] = {}
                for item in fenced:
                    fence = item.fence
                    assert fence is not None
                    if fence not in held:
                        held[fence] = self.holds(tx, fence)
                    if held[fence]:
                        written.append(item.task)
                        if item.ledger is not None:
                            charges.append(item.ledger)
                        if item.release_id is not None:
                            releases.append((item.release_id,))
                    else:
                        refused.append(item)
                        if item.release_id is not None:
                            tx.execute(FENCED_RESERVATION_SQL, (item.release_id,))
            if written:
                tx.executemany(self.task_sql, written)
            if charges:
                tx.executemany(_LEDGER_SQL, charges)
            if releases:
                tx.executemany("DELETE FROM ledger WHERE id = ?", releases)
            if responses:  # an answered request's claim ends with the commit of its answer
                self.drop_claims(tx, sorted(row[0] for row in responses))
            return refused
        return self.atomic(body)

    def copy_tasks(self, source: str, source_stage: str, run_id: str, stage: str) -> list[tuple[str, int, int, float,
                                                                                                   float]]:
        # Replay's copied rows: cache hits that cost nothing and saved what the original answer cost (or saved).
        copy = (
            "INSERT INTO tasks (run_id, stage, item, model, row_id, variant_json, key, status, cache_hit, attempts,"
            " error_class, error, input_tokens, output_tokens, cost, latency, score, valid, result_json,"
            " cached_tokens, saved, updated)"
            " SELECT ?, ?, item, model, row_id, variant_json, key, 'done', 1, 0, NULL, NULL, input_tokens,"
            " output_tokens, 0.0, NULL, score, valid,"
            " replace(CASE WHEN ? = ? THEN result_json ELSE replace(result_json, ?, ?) END,"
            " '\"cache_hit\":false', '\"cache_hit\":true'),"
            f" cached_tokens, coalesce(cost, 0) + coalesce(saved, 0), {self.dialect.stamp}"
            f" FROM tasks WHERE run_id = ? AND stage = ? AND status = 'done' ORDER BY {self.dialect.task_order}")
        args = (run_id, stage, stage, source_stage, f'"stage":{dumps(source_stage)}', f'"stage":{dumps(stage)}',
                source, source_stage)

        def body(tx: Tx) -> None:
            self.order_task_writes(tx, [run_id])
            tx.execute(copy, args)
        self.atomic(body)
        found = self.rows("SELECT model, count(*), count(score), coalesce(sum(score), 0), coalesce(sum(saved), 0)"
                          " FROM tasks WHERE run_id = ? AND stage = ? GROUP BY model", (run_id, stage))
        return [(model, n, scored, float(correct), float(saved)) for model, n, scored, correct, saved in
                sqlite_sorted(found, 1)]

    def done_by_model(self, run_id: str, stage: str) -> dict[str, tuple[int, int]]:
        found = self.rows("SELECT model, count(*), CAST(coalesce(sum(output_tokens), 0) AS BIGINT) FROM tasks"
                          " WHERE run_id = ? AND stage = ? AND status = 'done' GROUP BY model", (run_id, stage))
        return {model: (n, int(out)) for model, n, out in sqlite_sorted(found, 1)}

    # -- the ledger ----------------------------------------------------------------------------------
    def reserve(self, run_id: str, stage: str, model: str, key: str, usd: float, worker: str | None = None, *,
                fence: Fence | None = None, tokens: int = 0) -> int:
        if fence is not None:
            return int(self.reserve_within(run_id, stage, model, key, usd, {}, worker, fence=fence,
                                           tokens=tokens)[0] or 0)
        row = self.row(_RESERVE_SQL, (run_id, stage, model, key, "reserved", usd, now(), tokens, worker))
        return int(row[0]) if row else 0

    def order_task_writes(self, tx: Tx, run_ids: list[str]) -> None:
        """Keep other processes from writing these runs' tasks until the transaction ends, so that the order of
        task positions (:meth:`stage_scores`) is the order of commits (SQLite: the write lock :meth:`atomic` holds
        already)."""

    def lock_run_budget(self, tx: Tx, run_id: str) -> None:
        """Keep other processes from reserving in this run until the transaction ends (SQLite: the write lock that
        :meth:`atomic` holds already)."""

    def reserve_within(self, run_id: str, stage: str, model: str, key: str, usd: float,
                       limits: dict[str, float], worker: str | None = None, *, fence: Fence | None = None,
                       tokens: int = 0, token_limits: dict[str, int] | None = None
                       ) -> tuple[int | None, str | None, int]:
        ask = ReserveAsk(run_id, stage, model, key, usd, tokens, worker, fence, limits, token_limits)
        return self.atomic(lambda tx: self._reserve_in(tx, ask, set()))

    def reserve_all(self, asks: list[ReserveAsk]) -> list[tuple[int | None, str | None, int] | Fenced]:
        def body(tx: Tx) -> list[tuple[int | None, str | None, int] | Fenced]:
            locked: set[str] = set()
            answers: list[tuple[int | None, str | None, int] | Fenced] = []
            for ask in asks:
                try:
                    answers.append(self._reserve_in(tx, ask, locked))
                except Fenced as exc:  # raised before it wrote anything: the others go on
                    answers.append(exc)
            return answers
        return self.atomic(body)

    def _reserve_in(self, tx: Tx, ask: ReserveAsk, locked: set[str]) -> tuple[int | None, str | None, int]:
        """One reservation inside a transaction; ``locked``: the runs whose budget lock it holds already."""
        limits, token_limits = ask.limits or {}, ask.token_limits or {}
        if ask.fence is not None and not self.holds(tx, ask.fence):
            fence = ask.fence
            raise Fenced(f"worker {fence.worker} lost its lease of chunk {fence.chunk} of stage {fence.stage}")
        if (ask.fence is not None or limits or token_limits) and ask.run_id not in locked:
            self.lock_run_budget(tx, ask.run_id)  # no other process reserves between the check and the insert
            locked.add(ask.run_id)
        if limits or token_limits:
            where, args = self.dialect.in_list("scope", sorted(set(limits) | set(token_limits)))
            used = {scope: (usd_, tokens_, inflight) for scope, usd_, tokens_, inflight in tx.execute(
                f"SELECT scope, usd, tokens, inflight FROM budget_use WHERE run_id = ? AND {where}",
                (ask.run_id, *args)).fetchall()}
            for scope, limit in limits.items():
                spent, _, inflight = used.get(scope, (0.0, 0, 0))
                if spent + ask.usd > limit + EPSILON:
                    return None, scope, int(inflight)
            for scope, most in token_limits.items():
                _, spent_tokens, inflight = used.get(scope, (0.0, 0, 0))
                if int(spent_tokens) + ask.tokens > most:
                    return None, scope, int(inflight)
        # fetchall: a RETURNING statement is finished only once its rows are read
        (ledger_id,) = tx.execute(_RESERVE_SQL, (ask.run_id, ask.stage, ask.model, ask.key, "reserved", ask.usd, now(),
                                                 ask.tokens, ask.worker)).fetchall()[0]
        return int(ledger_id), None, 0

    def release(self, ledger_id: int) -> None:
        self.execute("DELETE FROM ledger WHERE id = ? AND kind = 'reserved'", (ledger_id,))

    def keep_possibly_billed(self, run_id: str, stage: str, model: str, key: str, usd: float, tokens: int,
                             ledger_id: int | None, worker: str | None = None) -> None:
        if ledger_id is not None:
            self.execute(FENCED_RESERVATION_SQL, (ledger_id,))
        else:
            self.row(_RESERVE_SQL, (run_id, stage, model, key, "possibly_billed", usd, now(), tokens, worker))

    def resolve_reservations(self, run_id: str) -> tuple[int, int]:
        def body(tx: Tx) -> tuple[int, int]:
            settled = tx.execute(
                "UPDATE ledger SET kind = 'charge', amount = (SELECT cost FROM responses r WHERE r.key = ledger.key),"
                " tokens = (SELECT coalesce(r.input_tokens, 0) + coalesce(r.output_tokens, 0) FROM responses r"
                " WHERE r.key = ledger.key)"
                " WHERE run_id = ? AND kind = 'reserved' AND key IN (SELECT key FROM responses)", (run_id,)).rowcount
            # a reservation of a line still in a submitted batch is neither: the batch is polled again
            possibly = tx.execute(
                "UPDATE ledger SET kind = 'possibly_billed' WHERE run_id = ? AND kind = 'reserved' AND id NOT IN"
                " (SELECT l.ledger_id FROM batch_lines l JOIN batches b ON b.id = l.batch_id WHERE b.run_id = ?"
                " AND b.state != 'collected' AND l.status = 'pending' AND l.ledger_id IS NOT NULL)",
                (run_id, run_id)).rowcount
            return settled, possibly
        return self.atomic(body)

    def spent(self, run_id: str) -> list[tuple[str, str, float, int]]:
        money = {(stage, model): usd for stage, model, usd in self.rows(
            f"SELECT stage, model, sum(amount) FROM ledger WHERE run_id = ? AND kind IN {SPENT}"
            " GROUP BY stage, model", (run_id,))}
        tokens = {(stage, model): n for stage, model, n in self.rows(
            # failed tasks count too: a refusal's tokens were billed
            "SELECT stage, model, CAST(sum(input_tokens + output_tokens) AS BIGINT) FROM tasks WHERE run_id = ?"
            " AND cache_hit = 0 GROUP BY stage, model", (run_id,))}
        # requests whose answers were lost count at their worst case, as their USD does (ARCHITECTURE.md invariant 3)
        possibly = {(stage, model): n for stage, model, n in self.rows(
            "SELECT stage, model, CAST(sum(tokens) AS BIGINT) FROM ledger WHERE run_id = ? AND kind = 'possibly_billed'"
            " GROUP BY stage, model", (run_id,))}
        return [(stage, model, money.get((stage, model), 0.0),
                 int(tokens.get((stage, model)) or 0) + int(possibly.get((stage, model)) or 0))
                for stage, model in sorted(set(money) | set(tokens) | set(possibly))]

    def charged(self, run_id: str) -> float:
        return float(self.row("SELECT coalesce(sum(amount), 0) FROM ledger WHERE run_id = ? AND kind = 'charge'",
                              (run_id,))[0])

    def ledger(self, run_id: str | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        conditions = {name: value for name, value in (("run_id", run_id), ("kind", kind)) if value is not None}
        clause = " AND ".join(f"{name} = ?" for name in conditions)
        return self.dicts(f"SELECT * FROM ledger{' WHERE ' + clause if clause else ''} ORDER BY id",
                          list(conditions.values()))

    # -- input tokens counted by the providers (runner/engine/exact_counts.py) -----------------------------
    def token_counts(self, keys: list[str]) -> dict[str, int]:
        found: dict[str, int] = {}
        for start in range(0, len(keys), _KEYS):
            where, args = self.dialect.in_list("key", keys[start:start + _KEYS])
            found.update((key, int(tokens)) for key, tokens in self.rows(
                f"SELECT key, tokens FROM token_counts WHERE {where}", args))
        return found

    def save_token_counts(self, rows: list[tuple[str, str, str, int]]) -> None:
        if not rows:
            return
        stamp = now()

        def body(tx: Tx) -> None:
            tx.executemany(insert_sql("token_counts", ("key", "provider", "model", "tokens", "created"),
                                      " ON CONFLICT DO NOTHING"), [(*row, stamp) for row in rows])
        self.atomic(body)

    # -- evaluation stages finished whole (runner/engine/replay.py) -----------------------------------------
    def replayable(self, digest: str) -> tuple[str, int] | None:
        row = self.row("SELECT run_id, tasks FROM stage_replays WHERE hash = ?", (digest,))
        return (row[0], row[1]) if row else None

    def record_replayable(self, digest: str, run_id: str, stage: str, tasks: int) -> None:
        self.execute(upsert("stage_replays", ("hash", "run_id", "stage", "tasks", "created"), ("hash",)),
                 (digest, run_id, stage, tasks, now()))

    # -- pipelines: content-addressed stage outputs ---------------------------------------------------------
    def stage_output(self, digest: str) -> dict[str, Any] | None:
        found = self.dicts("SELECT * FROM stage_outputs WHERE hash = ?", (digest,))
        return found[0] if found else None

    def stage_rows(self, digest: str) -> list[dict[str, Any]]:
        return [json.loads(row) for (row,) in self.rows("SELECT row FROM stage_rows WHERE hash = ? ORDER BY n",
                                                        (digest,))]

    def save_stage_output(self, digest: str, stage: str, run_id: str, rows: list[dict[str, Any]], cost: float,
                          funnel: dict[str, Any]) -> None:
        def body(tx: Tx) -> None:
            tx.execute("DELETE FROM stage_rows WHERE hash = ?", (digest,))
            tx.executemany("INSERT INTO stage_rows (hash, n, row) VALUES (?, ?, ?)",
                           [(digest, n, dumps(row)) for n, row in enumerate(rows)])
            tx.execute(upsert("stage_outputs", ("hash", "stage", "run_id", "rows", "cost", "funnel", "created"),
                              ("hash",)), (digest, stage, run_id, len(rows), cost, dumps(funnel), now()))
        self.atomic(body)

    def record_run_stage(self, run_id: str, stage: str, position: int, digest: str, funnel: dict[str, Any]) -> None:
        self.execute(upsert("run_stages", ("run_id", "stage", "position", "hash", "funnel"), ("run_id", "stage")),
                 (run_id, stage, position, digest, dumps(funnel)))

    def record_stop(self, run_id: str, stage: str, record: dict[str, Any]) -> None:
        """A stage's early-stopping record (:meth:`runner.engine.early_stop.StageStopper.record`), replaced by a
        resume's."""
        self.execute(upsert("stage_stops", ("run_id", "stage", "record"), ("run_id", "stage")),
                     (run_id, stage, dumps(record)))

    def stops(self, run_id: str) -> list[dict[str, Any]]:
        """The run's early-stopping records, one per stage with a ``stop:`` rule, by stage name."""
        return [json.loads(record) for (record,) in self.rows(
            "SELECT record FROM stage_stops WHERE run_id = ? ORDER BY stage", (run_id,))]

    def run_stages(self, run_id: str) -> list[dict[str, Any]]:
        return [json.loads(funnel) for (funnel,) in self.rows(
            "SELECT funnel FROM run_stages WHERE run_id = ? ORDER BY position", (run_id,))]

    def stage_cost(self, run_id: str, stage: str) -> tuple[float, int]:
        usd, sent = self.row(
            "SELECT coalesce(sum(cost), 0), coalesce(sum(CASE WHEN cache_hit = 0 AND status = 'done' THEN 1 ELSE 0"
            " END), 0) FROM tasks WHERE run_id = ? AND stage = ?", (run_id, stage))
        return float(usd), int(sent)
