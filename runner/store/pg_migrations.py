"""The PostgreSQL store's schema: the migrations of :mod:`runner.store.migrations`, under the same names, in
PostgreSQL's DDL. Append-only like them: never edit one that has shipped, append a new one (here and there).

Differences from the SQLite schema, each for a reason:

- ``tasks.seq`` (BIGSERIAL): SQLite orders a run's tasks by ``rowid``, which ``INSERT OR REPLACE`` renews; the
  PostgreSQL store orders by ``seq`` and gives a replaced task the next one.
- ``ledger.id`` is a BIGSERIAL (never reused; SQLite may reuse the highest id after a delete).
- the budget_use triggers of m009 are plpgsql functions.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import psycopg

MIGRATIONS: list[Callable[[psycopg.Connection], None]] = []
migration = MIGRATIONS.append
#: pg_advisory_xact_lock's key for migrations (any constant; other locks use hashtext(run id), a 32-bit value)
MIGRATION_LOCK = 0x72756E6E6572  # "runner"


@migration
def m001_responses(conn: psycopg.Connection) -> None:
    """The memo: one row per distinct request ever answered, keyed by its cache key."""
    conn.execute("CREATE TABLE responses (key TEXT PRIMARY KEY, provider TEXT, model TEXT, request_json TEXT,"
                 " response_text TEXT, response_json TEXT, finish_reason TEXT, input_tokens BIGINT,"
                 " output_tokens BIGINT, cached_tokens BIGINT, cost DOUBLE PRECISION, latency DOUBLE PRECISION,"
                 " created TEXT)")


@migration
def m002_runs(conn: psycopg.Connection) -> None:
    conn.execute("CREATE TABLE runs (id TEXT PRIMARY KEY, job_name TEXT, job_path TEXT, job_json TEXT,"
                 " fingerprint TEXT, status TEXT, total BIGINT, pid BIGINT, message TEXT, created TEXT, started TEXT,"
                 " finished TEXT)")


@migration
def m003_tasks(conn: psycopg.Connection) -> None:
    """One row per finished (done or failed) task of a run; pending tasks are not materialised."""
    conn.execute("CREATE TABLE tasks (run_id TEXT NOT NULL, stage TEXT NOT NULL, item TEXT NOT NULL, model TEXT,"
                 " row_id TEXT, variant_json TEXT, key TEXT, status TEXT, cache_hit BIGINT, attempts BIGINT,"
                 " error_class TEXT, error TEXT, input_tokens BIGINT, output_tokens BIGINT, cost DOUBLE PRECISION,"
                 " latency DOUBLE PRECISION, score DOUBLE PRECISION, valid BIGINT, result_json TEXT, updated TEXT,"
                 " seq BIGSERIAL NOT NULL, PRIMARY KEY (run_id, stage, item))")
    conn.execute("CREATE INDEX idx_tasks_run_id_stage_model ON tasks (run_id, stage, model)")


@migration
def m004_ledger(conn: psycopg.Connection) -> None:
    conn.execute("CREATE TABLE ledger (id BIGSERIAL PRIMARY KEY, run_id TEXT, stage TEXT, model TEXT, key TEXT,"
                 " kind TEXT, amount DOUBLE PRECISION, created TEXT)")
    conn.execute("CREATE INDEX idx_ledger_run_id ON ledger (run_id)")


@migration
def m005_costs(conn: psycopg.Connection) -> None:
    """Cost control: each task's cached input tokens and the money its cache hit saved; ledger rows by kind."""
    conn.execute("ALTER TABLE tasks ADD COLUMN cached_tokens BIGINT")
    conn.execute("ALTER TABLE tasks ADD COLUMN saved DOUBLE PRECISION")
    conn.execute("CREATE INDEX idx_ledger_run_id_kind ON ledger (run_id, kind)")


@migration
def m006_pipelines(conn: psycopg.Connection) -> None:
    """Pipelines: each stage's output rows under its content address, and what each stage of a run did."""
    conn.execute("CREATE TABLE stage_outputs (hash TEXT PRIMARY KEY, stage TEXT, run_id TEXT, rows BIGINT,"
                 " cost DOUBLE PRECISION, funnel TEXT, created TEXT)")
    conn.execute("CREATE TABLE stage_rows (hash TEXT NOT NULL, n BIGINT NOT NULL, row TEXT NOT NULL,"
                 " PRIMARY KEY (hash, n))")
    conn.execute("CREATE TABLE run_stages (run_id TEXT NOT NULL, stage TEXT NOT NULL, position BIGINT NOT NULL,"
                 " hash TEXT NOT NULL, funnel TEXT NOT NULL, PRIMARY KEY (run_id, stage))")


@migration
def m007_stage_replays(conn: psycopg.Connection) -> None:
    """Evaluation stages a run finished completely, under their content address."""
    conn.execute("CREATE TABLE stage_replays (hash TEXT PRIMARY KEY, run_id TEXT, stage TEXT, tasks BIGINT,"
                 " created TEXT)")


@migration
def m008_batches(conn: psycopg.Connection) -> None:
    """Batch API requests: the batches a run submitted, their lines, and the batch price's savings per task."""
    conn.execute("CREATE TABLE batches (id TEXT PRIMARY KEY, run_id TEXT, stage TEXT, model TEXT,"
                 " provider_batch_id TEXT, round BIGINT, state TEXT, provider_state TEXT, lines BIGINT, created TEXT,"
                 " updated TEXT)")
    conn.execute("CREATE INDEX idx_batches_run_id_stage_state ON batches (run_id, stage, state)")
    conn.execute("CREATE TABLE batch_lines (batch_id TEXT NOT NULL, key TEXT NOT NULL, ledger_id BIGINT,"
                 " status TEXT NOT NULL DEFAULT 'pending', PRIMARY KEY (batch_id, key))")
    conn.execute("CREATE INDEX batch_lines_key ON batch_lines (key)")
    conn.execute("ALTER TABLE tasks ADD COLUMN batch_saved DOUBLE PRECISION")
    conn.execute("ALTER TABLE runs ADD COLUMN deadline TEXT")


#: ledger kinds that count against a budget
_BUDGET_KINDS = "('reserved', 'charge', 'possibly_billed')"


def _use_upsert(row: str, sign: str) -> str:
    """Add (sign "") or remove (sign "-") a ledger row's amount in the three budget_use rows it counts in."""
    inflight = f"{sign}({row}.kind = 'reserved')::int"
    values = ", ".join(f"({row}.run_id, {scope}, {sign}{row}.amount, {inflight})"
                       for scope in ("'run'", f"'stage:' || {row}.stage", f"'model:' || {row}.model"))
    return (f"IF {row}.kind IN {_BUDGET_KINDS} THEN INSERT INTO budget_use (run_id, scope, usd, inflight) VALUES"
            f" {values} ON CONFLICT (run_id, scope) DO UPDATE SET usd = budget_use.usd + excluded.usd,"
            " inflight = budget_use.inflight + excluded.inflight; END IF;")


@migration
def m009_workers(conn: psycopg.Connection) -> None:
    """Several processes on one run: workers and their heartbeats, leases of chunks, claims of requests, who made
    each ledger reservation, and per run and budget scope the USD charged and reserved (kept by triggers)."""
    conn.execute("CREATE TABLE workers (id TEXT PRIMARY KEY, run_id TEXT NOT NULL, host TEXT, pid BIGINT,"
                 " started TEXT, seen DOUBLE PRECISION NOT NULL, state TEXT NOT NULL DEFAULT 'live')")
    conn.execute("CREATE INDEX workers_run ON workers (run_id)")
    conn.execute("CREATE TABLE leases (run_id TEXT NOT NULL, stage TEXT NOT NULL, chunk BIGINT NOT NULL,"
                 " worker TEXT NOT NULL, expires DOUBLE PRECISION NOT NULL, done BIGINT NOT NULL DEFAULT 0,"
                 " PRIMARY KEY (run_id, stage, chunk))")
    conn.execute("CREATE INDEX leases_worker ON leases (worker)")
    conn.execute("CREATE TABLE claims (key TEXT PRIMARY KEY, worker TEXT NOT NULL, expires DOUBLE PRECISION NOT NULL)")
    conn.execute("CREATE INDEX claims_worker ON claims (worker)")
    conn.execute("ALTER TABLE ledger ADD COLUMN worker TEXT")
    conn.execute("CREATE TABLE budget_use (run_id TEXT NOT NULL, scope TEXT NOT NULL,"
                 " usd DOUBLE PRECISION NOT NULL DEFAULT 0, inflight BIGINT NOT NULL DEFAULT 0,"
                 " PRIMARY KEY (run_id, scope))")
    conn.execute("CREATE FUNCTION ledger_use() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                 " IF TG_OP IN ('DELETE', 'UPDATE') THEN " + _use_upsert("OLD", "-") + " END IF;"
                 " IF TG_OP IN ('INSERT', 'UPDATE') THEN " + _use_upsert("NEW", "") + " END IF;"
                 " RETURN NULL; END $$")
    conn.execute("CREATE TRIGGER ledger_use_insert AFTER INSERT ON ledger FOR EACH ROW EXECUTE FUNCTION ledger_use()")
    conn.execute("CREATE TRIGGER ledger_use_delete AFTER DELETE ON ledger FOR EACH ROW EXECUTE FUNCTION ledger_use()")
    conn.execute("CREATE TRIGGER ledger_use_update AFTER UPDATE OF kind, amount ON ledger FOR EACH ROW"
                 " EXECUTE FUNCTION ledger_use()")
    # the sums of what the ledger holds already
    for scope in ("'run'", "'stage:' || stage", "'model:' || model"):
        conn.execute(f"INSERT INTO budget_use (run_id, scope, usd, inflight) SELECT run_id, {scope}, sum(amount),"
                     f" sum((kind = 'reserved')::int) FROM ledger WHERE kind IN {_BUDGET_KINDS}"
                     " GROUP BY 1, 2 ON CONFLICT (run_id, scope) DO UPDATE SET"
                     " usd = budget_use.usd + excluded.usd, inflight = budget_use.inflight + excluded.inflight")


@migration
def m010_thinking(conn: psycopg.Connection) -> None:
    """Reasoning models: the memo keeps an answer's thinking text and its reasoning tokens."""
    conn.execute("ALTER TABLE responses ADD COLUMN thinking TEXT")
    conn.execute("ALTER TABLE responses ADD COLUMN reasoning_tokens BIGINT")


@migration
def m011_fencing(conn: psycopg.Connection) -> None:
    """Fencing: each chunk lease carries a token that grows whenever the lease is taken over."""
    conn.execute("ALTER TABLE leases ADD COLUMN token BIGINT NOT NULL DEFAULT 1")


def migrate(conn: psycopg.Connection) -> None:
    """Apply the migrations not yet applied, in one transaction under an advisory lock: several processes opening a
    new database at once take turns (the later ones wait, then find nothing to do). ``conn`` is in autocommit mode."""
    if _up_to_date(conn):
        return
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        conn.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at TEXT)")
        applied = {name for (name,) in conn.execute("SELECT name FROM _migrations")}
        for fn in MIGRATIONS:
            if fn.__name__ not in applied:
                fn(conn)
                conn.execute("INSERT INTO _migrations (name, applied_at) VALUES (%s, %s)",
                             (fn.__name__, dt.datetime.now(dt.UTC).isoformat()))


def _up_to_date(conn: psycopg.Connection) -> bool:
    """Whether every migration is applied (a read: the common case takes no lock)."""
    if conn.execute("SELECT to_regclass('_migrations')").fetchone()[0] is None:
        return False
    applied = {name for (name,) in conn.execute("SELECT name FROM _migrations")}
    return all(fn.__name__ in applied for fn in MIGRATIONS)
