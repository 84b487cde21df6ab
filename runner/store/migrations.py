"""Store schema as append-only migrations. Never edit one that has shipped: append a new one."""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import Callable

from runner.store._sqlite_utils import sqlite_utils

MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = []
migration = MIGRATIONS.append


@migration
def m001_responses(db: sqlite_utils.Database) -> None:
    """The memo: one row per distinct request ever answered, keyed by its cache key."""
    db["responses"].create(
        {
            "key": str,
            "provider": str,
            "model": str,
            "request_json": str,
            "response_text": str,
            "response_json": str,
            "finish_reason": str,
            "input_tokens": int,
            "output_tokens": int,
            "cached_tokens": int,
            "cost": float,
            "latency": float,
            "created": str,
        },
        pk="key",
    )


@migration
def m002_runs(db: sqlite_utils.Database) -> None:
    db["runs"].create(
        {
            "id": str,
            "job_name": str,
            "job_path": str,
            "job_json": str,
            "fingerprint": str,
            "status": str,
            "total": int,
            "pid": int,
            "message": str,
            "created": str,
            "started": str,
            "finished": str,
        },
        pk="id",
    )


@migration
def m003_tasks(db: sqlite_utils.Database) -> None:
    """One row per finished (done or failed) task of a run; pending tasks are not materialised."""
    db["tasks"].create(
        {
            "run_id": str,
            "stage": str,
            "item": str,
            "model": str,
            "row_id": str,
            "variant_json": str,
            "key": str,
            "status": str,
            "cache_hit": int,
            "attempts": int,
            "error_class": str,
            "error": str,
            "input_tokens": int,
            "output_tokens": int,
            "cost": float,
            "latency": float,
            "score": float,
            "valid": int,
            "result_json": str,
            "updated": str,
        },
        pk=("run_id", "stage", "item"),
    )
    db["tasks"].create_index(["run_id", "stage", "model"])


@migration
def m004_ledger(db: sqlite_utils.Database) -> None:
    db["ledger"].create(
        {
            "id": int,
            "run_id": str,
            "stage": str,
            "model": str,
            "key": str,
            "kind": str,
            "amount": float,
            "created": str,
        },
        pk="id",
    )
    db["ledger"].create_index(["run_id"])


@migration
def m005_costs(db: sqlite_utils.Database) -> None:
    """Cost control: each task's cached input tokens and the money its cache hit saved; ledger rows by kind
    ('reserved' while a request is in flight, 'charge' once settled, 'possibly_billed' after a crash)."""
    db["tasks"].add_column("cached_tokens", int)
    db["tasks"].add_column("saved", float)
    db["ledger"].create_index(["run_id", "kind"])


@migration
def m006_pipelines(db: sqlite_utils.Database) -> None:
    """Pipelines: each stage's output rows under its content address (reused by any later run whose stage has
    the same address), and what each stage of a run did (the funnel report)."""
    db["stage_outputs"].create(
        {"hash": str, "stage": str, "run_id": str, "rows": int, "cost": float, "funnel": str, "created": str},
        pk="hash",
    )
    db.execute("CREATE TABLE stage_rows (hash TEXT NOT NULL, n INTEGER NOT NULL, row TEXT NOT NULL,"
               " PRIMARY KEY (hash, n)) WITHOUT ROWID")
    db.execute("CREATE TABLE run_stages (run_id TEXT NOT NULL, stage TEXT NOT NULL, position INTEGER NOT NULL,"
               " hash TEXT NOT NULL, funnel TEXT NOT NULL, PRIMARY KEY (run_id, stage))")



@migration
def m007_stage_replays(db: sqlite_utils.Database) -> None:
    """Evaluation stages a run finished completely, under their content address (runner/engine/replay.py): a later
    run of the unchanged stage copies that run's tasks instead of planning every request again."""
    db["stage_replays"].create({"hash": str, "run_id": str, "stage": str, "tasks": int, "created": str}, pk="hash")


@migration
def m008_batches(db: sqlite_utils.Database) -> None:
    """Batch API requests: each batch a run submitted (the provider's id, so a later process polls it instead of
    submitting again), the request keys it carries with their ledger reservations, and per task the money the
    batch price saved against the standard one."""
    db["batches"].create(
        {"id": str, "run_id": str, "stage": str, "model": str, "provider_batch_id": str, "round": int,
         "state": str, "provider_state": str, "lines": int, "created": str, "updated": str},
        pk="id",
    )
    db["batches"].create_index(["run_id", "stage", "state"])
    db.execute("CREATE TABLE batch_lines (batch_id TEXT NOT NULL, key TEXT NOT NULL, ledger_id INTEGER,"
               " status TEXT NOT NULL DEFAULT 'pending', PRIMARY KEY (batch_id, key)) WITHOUT ROWID")
    db.execute("CREATE INDEX batch_lines_key ON batch_lines (key)")
    db["tasks"].add_column("batch_saved", float)
    db["runs"].add_column("deadline", str)


#: ledger kinds that count against a budget, and the one that is still in flight
_BUDGET_KINDS = "('reserved', 'charge', 'possibly_billed')"


def _use_rows(row: str, sign: str) -> str:
    """The three budget_use rows (run, stage, model) a ledger row counts in, with its amount signed."""
    inflight = f"{sign}({row}.kind = 'reserved')"
    return ", ".join(f"({row}.run_id, {scope}, {sign}{row}.amount, {inflight})"
                     for scope in ("'run'", f"'stage:' || {row}.stage", f"'model:' || {row}.model"))


_UPSERT = ("INSERT INTO budget_use (run_id, scope, usd, inflight) VALUES {rows} ON CONFLICT (run_id, scope) DO UPDATE"
           " SET usd = usd + excluded.usd, inflight = inflight + excluded.inflight;")


@migration
def m009_workers(db: sqlite_utils.Database) -> None:
    """Several processes on one run (runner/engine/workers.py): the workers that joined it with their heartbeats,
    leases of chunks of a stage's planned tasks, claims of requests being sent (so an identical request goes out
    once across processes), who made each ledger reservation, and per run and budget scope the USD charged and
    reserved (kept by triggers on the ledger), which a reservation checks in the same transaction."""
    db.execute("CREATE TABLE workers (id TEXT PRIMARY KEY, run_id TEXT NOT NULL, host TEXT, pid INTEGER,"
               " started TEXT, seen REAL NOT NULL, state TEXT NOT NULL DEFAULT 'live')")
    db.execute("CREATE INDEX workers_run ON workers (run_id)")
    db.execute("CREATE TABLE leases (run_id TEXT NOT NULL, stage TEXT NOT NULL, chunk INTEGER NOT NULL,"
               " worker TEXT NOT NULL, expires REAL NOT NULL, done INTEGER NOT NULL DEFAULT 0,"
               " PRIMARY KEY (run_id, stage, chunk)) WITHOUT ROWID")
    db.execute("CREATE INDEX leases_worker ON leases (worker)")
    db.execute("CREATE TABLE claims (key TEXT PRIMARY KEY, worker TEXT NOT NULL, expires REAL NOT NULL)"
               " WITHOUT ROWID")
    db.execute("CREATE INDEX claims_worker ON claims (worker)")
    db["ledger"].add_column("worker", str)
    db.execute("CREATE TABLE budget_use (run_id TEXT NOT NULL, scope TEXT NOT NULL, usd REAL NOT NULL DEFAULT 0,"
               " inflight INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (run_id, scope)) WITHOUT ROWID")
    db.execute(f"CREATE TRIGGER ledger_use_insert AFTER INSERT ON ledger WHEN NEW.kind IN {_BUDGET_KINDS} BEGIN "
               + _UPSERT.format(rows=_use_rows("NEW", "")) + " END")
    db.execute(f"CREATE TRIGGER ledger_use_delete AFTER DELETE ON ledger WHEN OLD.kind IN {_BUDGET_KINDS} BEGIN "
               + _UPSERT.format(rows=_use_rows("OLD", "-")) + " END")
    db.execute("CREATE TRIGGER ledger_use_update AFTER UPDATE OF kind, amount ON ledger BEGIN "
               + _UPSERT.format(rows=_use_rows("OLD", "-")).replace("VALUES", "SELECT * FROM (VALUES", 1)
               .replace(" ON CONFLICT", f") WHERE OLD.kind IN {_BUDGET_KINDS} ON CONFLICT", 1)
               + _UPSERT.format(rows=_use_rows("NEW", "")).replace("VALUES", "SELECT * FROM (VALUES", 1)
               .replace(" ON CONFLICT", f") WHERE NEW.kind IN {_BUDGET_KINDS} ON CONFLICT", 1)
               + " END")
    # the sums of what the ledger holds already
    for scope in ("'run'", "'stage:' || stage", "'model:' || model"):
        db.execute(f"INSERT INTO budget_use (run_id, scope, usd, inflight) SELECT run_id, {scope}, sum(amount),"
                   f" sum(kind = 'reserved') FROM ledger WHERE kind IN {_BUDGET_KINDS} GROUP BY run_id, {scope}"
                   " ON CONFLICT (run_id, scope) DO UPDATE SET usd = usd + excluded.usd,"
                   " inflight = inflight + excluded.inflight")


@migration
def m010_thinking(db: sqlite_utils.Database) -> None:
    """Reasoning models: the memo keeps an answer's thinking text (apart from the answer the parsers read) and its
    reasoning tokens (counted in output_tokens too), so a cache hit gives the result line a fresh answer gave."""
    db["responses"].add_column("thinking", str)
    db["responses"].add_column("reasoning_tokens", int)


@migration
def m011_fencing(db: sqlite_utils.Database) -> None:
    """Fencing (runner/engine/workers.py): each chunk lease carries a token that grows whenever the lease is taken
    over; a worker's writes for the lease carry the token it got, and the store refuses them once it changed."""
    db.execute("ALTER TABLE leases ADD COLUMN token INTEGER NOT NULL DEFAULT 1")


def migrate(db: sqlite_utils.Database) -> None:
    """Apply the migrations not yet applied, in one transaction that holds the write lock from its start: two
    processes opening a new store at once take turns (the second waits, then finds nothing to do) instead of one
    failing with "database is locked" when both read the schema and then both try to write it."""
    conn = db.conn
    if _up_to_date(conn):
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        table = db["_migrations"]
        if not table.exists():
            table.create({"name": str, "applied_at": str}, pk="name")
        applied = {name for (name,) in conn.execute("SELECT name FROM _migrations")}
        for fn in MIGRATIONS:
            if fn.__name__ not in applied:
                fn(db)
                conn.execute("INSERT INTO _migrations (name, applied_at) VALUES (?, ?)",
                             (fn.__name__, dt.datetime.now(dt.UTC).isoformat()))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _up_to_date(conn: sqlite3.Connection) -> bool:
    """Whether every migration is applied (a read: the common case takes no write lock)."""
    try:
        applied = {name for (name,) in conn.execute("SELECT name FROM _migrations")}
    except sqlite3.OperationalError:  # no such table: a new store
        return False
    return all(fn.__name__ in applied for fn in MIGRATIONS)
