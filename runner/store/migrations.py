"""The store's schema as append-only migrations, one list for SQLite and PostgreSQL. Never edit one that has
shipped: append a new one. A store records the names of the migrations applied to it (``_migrations``), so a
store made by any earlier version opens and takes only the migrations it lacks.

A migration's DDL is written once with the types as placeholders (:data:`TYPES`); where the two databases differ
for a reason, the reason is said:

- ``tasks.seq`` (PostgreSQL only, BIGSERIAL): SQLite orders a run's tasks by ``rowid``, which ``INSERT OR
  REPLACE`` renews; the PostgreSQL store orders by ``seq`` and gives a replaced task the next one;
- ``ledger.id``: SQLite's INTEGER PRIMARY KEY (the rowid), PostgreSQL's BIGSERIAL (never reused);
- SQLite's tables keyed by text only are WITHOUT ROWID;
- the triggers that keep budget_use (m009, made again with the tokens by m013) are SQLite triggers, or one plpgsql
  function in PostgreSQL.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from functools import cache
from typing import Any

from runner.store.dialect import Dialect

#: the column types and table options of each database
TYPES: dict[str, dict[str, str]] = {
    "sqlite": {"text": "TEXT", "int": "INTEGER", "real": "REAL", "id": "INTEGER PRIMARY KEY", "seq": "",
               "no_rowid": " WITHOUT ROWID"},
    "postgres": {"text": "TEXT", "int": "BIGINT", "real": "DOUBLE PRECISION", "id": "BIGSERIAL PRIMARY KEY",
                 "seq": ", seq BIGSERIAL NOT NULL", "no_rowid": ""},
}
#: pg_advisory_xact_lock's key for migrations (any constant; other locks use hashtext(run id), a 32-bit value)
MIGRATION_LOCK = 0x72756E6E6572  # "runner"


class Schema:
    """What a migration changes the schema with: DDL in :data:`TYPES`' spelling, on one connection."""

    def __init__(self, conn: Any, dialect: Dialect) -> None:
        self.conn, self.dialect, self.types = conn, dialect, TYPES[dialect.name]

    def execute(self, ddl: str) -> None:
        self.conn.execute(ddl.format(**self.types))

    def add_column(self, table: str, column: str, kind: str) -> None:
        self.execute(f"ALTER TABLE {table} ADD COLUMN {column} {{{kind}}}")

    def index(self, table: str, *columns: str) -> None:
        self.execute(f"CREATE INDEX idx_{table}_{'_'.join(columns)} ON {table} ({', '.join(columns)})")


MIGRATIONS: list[Callable[[Schema], None]] = []
migration = MIGRATIONS.append


@migration
def m001_responses(db: Schema) -> None:
    """The memo: one row per distinct request ever answered, keyed by its cache key."""
    db.execute("CREATE TABLE responses (key {text} PRIMARY KEY, provider {text}, model {text}, request_json {text},"
               " response_text {text}, response_json {text}, finish_reason {text}, input_tokens {int},"
               " output_tokens {int}, cached_tokens {int}, cost {real}, latency {real}, created {text})")


@migration
def m002_runs(db: Schema) -> None:
    db.execute("CREATE TABLE runs (id {text} PRIMARY KEY, job_name {text}, job_path {text}, job_json {text},"
               " fingerprint {text}, status {text}, total {int}, pid {int}, message {text}, created {text},"
               " started {text}, finished {text})")


@migration
def m003_tasks(db: Schema) -> None:
    """One row per finished (done or failed) task of a run; pending tasks are not materialised."""
    db.execute("CREATE TABLE tasks (run_id {text}, stage {text}, item {text}, model {text}, row_id {text},"
               " variant_json {text}, key {text}, status {text}, cache_hit {int}, attempts {int}, error_class {text},"
               " error {text}, input_tokens {int}, output_tokens {int}, cost {real}, latency {real}, score {real},"
               " valid {int}, result_json {text}, updated {text}{seq}, PRIMARY KEY (run_id, stage, item))")
    db.index("tasks", "run_id", "stage", "model")


@migration
def m004_ledger(db: Schema) -> None:
    db.execute("CREATE TABLE ledger (id {id}, run_id {text}, stage {text}, model {text}, key {text}, kind {text},"
               " amount {real}, created {text})")
    db.index("ledger", "run_id")


@migration
def m005_costs(db: Schema) -> None:
    """Cost control: each task's cached input tokens and the money its cache hit saved; ledger rows by kind
    ('reserved' while a request is in flight, 'charge' once settled, 'possibly_billed' after a crash)."""
    db.add_column("tasks", "cached_tokens", "int")
    db.add_column("tasks", "saved", "real")
    db.index("ledger", "run_id", "kind")


@migration
def m006_pipelines(db: Schema) -> None:
    """Pipelines: each stage's output rows under its content address (reused by any later run whose stage has
    the same address), and what each stage of a run did (the funnel report)."""
    db.execute("CREATE TABLE stage_outputs (hash {text} PRIMARY KEY, stage {text}, run_id {text}, rows {int},"
               " cost {real}, funnel {text}, created {text})")
    db.execute("CREATE TABLE stage_rows (hash {text} NOT NULL, n {int} NOT NULL, row {text} NOT NULL,"
               " PRIMARY KEY (hash, n)){no_rowid}")
    db.execute("CREATE TABLE run_stages (run_id {text} NOT NULL, stage {text} NOT NULL, position {int} NOT NULL,"
               " hash {text} NOT NULL, funnel {text} NOT NULL, PRIMARY KEY (run_id, stage))")


@migration
def m007_stage_replays(db: Schema) -> None:
    """Evaluation stages a run finished completely, under their content address (runner/engine/replay.py): a later
    run of the unchanged stage copies that run's tasks instead of planning every request again."""
    db.execute("CREATE TABLE stage_replays (hash {text} PRIMARY KEY, run_id {text}, stage {text}, tasks {int},"
               " created {text})")


@migration
def m008_batches(db: Schema) -> None:
    """Batch API requests: each batch a run submitted (the provider's id, so a later process polls it instead of
    submitting again), the request keys it carries with their ledger reservations, and per task the money the
    batch price saved against the standard one."""
    db.execute("CREATE TABLE batches (id {text} PRIMARY KEY, run_id {text}, stage {text}, model {text},"
               " provider_batch_id {text}, round {int}, state {text}, provider_state {text}, lines {int},"
               " created {text}, updated {text})")
    db.index("batches", "run_id", "stage", "state")
    db.execute("CREATE TABLE batch_lines (batch_id {text} NOT NULL, key {text} NOT NULL, ledger_id {int},"
               " status {text} NOT NULL DEFAULT 'pending', PRIMARY KEY (batch_id, key)){no_rowid}")
    db.execute("CREATE INDEX batch_lines_key ON batch_lines (key)")
    db.add_column("tasks", "batch_saved", "real")
    db.add_column("runs", "deadline", "text")


#: ledger kinds that count against a budget
_BUDGET_KINDS = "('reserved', 'charge', 'possibly_billed')"


def _use_upsert(row: str, sign: str, *, tokens: bool) -> str:
    """Add (sign "") or remove (sign "-") a ledger row's amount (and with ``tokens`` its tokens, from m013) in the
    three budget_use rows it counts in."""
    inflight = f"{sign}(CASE WHEN {row}.kind = 'reserved' THEN 1 ELSE 0 END)"
    count = f", {sign}{row}.tokens" if tokens else ""
    values = ", ".join(f"({row}.run_id, {scope}, {sign}{row}.amount, {inflight}{count})"
                       for scope in ("'run'", f"'stage:' || {row}.stage", f"'model:' || {row}.model"))
    return (f"INSERT INTO budget_use (run_id, scope, usd, inflight{', tokens' if tokens else ''}) SELECT * FROM"
            f" (VALUES {values}) AS v WHERE {row}.kind IN {_BUDGET_KINDS} ON CONFLICT (run_id, scope) DO UPDATE SET"
            " usd = budget_use.usd + excluded.usd, inflight = budget_use.inflight + excluded.inflight"
            + (", tokens = budget_use.tokens + excluded.tokens;" if tokens else ";"))


def _budget_triggers(db: Schema, *, tokens: bool = False) -> None:
    """Triggers that keep budget_use the sums of the ledger: three SQLite triggers, or PostgreSQL's three calling
    one plpgsql function (the trigger syntax differs; the statement they run is :func:`_use_upsert`). m009 made
    them without ``tokens``; m013 makes them again with it."""
    columns = "kind, amount, tokens" if tokens else "kind, amount"
    if db.dialect.name == "sqlite":
        db.execute("CREATE TRIGGER ledger_use_insert AFTER INSERT ON ledger BEGIN "
                   + _use_upsert("NEW", "", tokens=tokens) + " END")
        db.execute("CREATE TRIGGER ledger_use_delete AFTER DELETE ON ledger BEGIN "
                   + _use_upsert("OLD", "-", tokens=tokens) + " END")
        db.execute(f"CREATE TRIGGER ledger_use_update AFTER UPDATE OF {columns} ON ledger BEGIN "
                   + _use_upsert("OLD", "-", tokens=tokens) + _use_upsert("NEW", "", tokens=tokens) + " END")
        return
    db.execute("CREATE OR REPLACE FUNCTION ledger_use() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
               " IF TG_OP IN ('DELETE', 'UPDATE') THEN " + _use_upsert("OLD", "-", tokens=tokens) + " END IF;"
               " IF TG_OP IN ('INSERT', 'UPDATE') THEN " + _use_upsert("NEW", "", tokens=tokens) + " END IF;"
               " RETURN NULL; END $$")
    for event, name in (("INSERT", "insert"), ("DELETE", "delete"), (f"UPDATE OF {columns}", "update")):
        db.execute(f"CREATE TRIGGER ledger_use_{name} AFTER {event} ON ledger FOR EACH ROW"
                   " EXECUTE FUNCTION ledger_use()")


@migration
def m009_workers(db: Schema) -> None:
    """Several processes on one run (runner/engine/workers.py): the workers that joined it with their heartbeats,
    leases of chunks of a stage's planned tasks, claims of requests being sent (so an identical request goes out
    once across processes), who made each ledger reservation, and per run and budget scope the USD charged and
    reserved (kept by triggers on the ledger), which a reservation checks in the same transaction."""
    db.execute("CREATE TABLE workers (id {text} PRIMARY KEY, run_id {text} NOT NULL, host {text}, pid {int},"
               " started {text}, seen {real} NOT NULL, state {text} NOT NULL DEFAULT 'live')")
    db.execute("CREATE INDEX workers_run ON workers (run_id)")
    db.execute("CREATE TABLE leases (run_id {text} NOT NULL, stage {text} NOT NULL, chunk {int} NOT NULL,"
               " worker {text} NOT NULL, expires {real} NOT NULL, done {int} NOT NULL DEFAULT 0,"
               " PRIMARY KEY (run_id, stage, chunk)){no_rowid}")
    db.execute("CREATE INDEX leases_worker ON leases (worker)")
    db.execute("CREATE TABLE claims (key {text} PRIMARY KEY, worker {text} NOT NULL, expires {real} NOT NULL)"
               "{no_rowid}")
    db.execute("CREATE INDEX claims_worker ON claims (worker)")
    db.add_column("ledger", "worker", "text")
    db.execute("CREATE TABLE budget_use (run_id {text} NOT NULL, scope {text} NOT NULL,"
               " usd {real} NOT NULL DEFAULT 0, inflight {int} NOT NULL DEFAULT 0,"
               " PRIMARY KEY (run_id, scope)){no_rowid}")
    _budget_triggers(db)
    # the sums of what the ledger holds already
    for scope in ("'run'", "'stage:' || stage", "'model:' || model"):
        db.execute(f"INSERT INTO budget_use (run_id, scope, usd, inflight) SELECT run_id, {scope}, sum(amount),"
                   f" sum(CASE WHEN kind = 'reserved' THEN 1 ELSE 0 END) FROM ledger WHERE kind IN {_BUDGET_KINDS}"
                   " GROUP BY 1, 2 ON CONFLICT (run_id, scope) DO UPDATE SET"
                   " usd = budget_use.usd + excluded.usd, inflight = budget_use.inflight + excluded.inflight")


@migration
def m010_thinking(db: Schema) -> None:
    """Reasoning models: the memo keeps an answer's thinking text (apart from the answer the parsers read) and its
    reasoning tokens (counted in output_tokens too), so a cache hit gives the result line a fresh answer gave."""
    db.add_column("responses", "thinking", "text")
    db.add_column("responses", "reasoning_tokens", "int")


@migration
def m011_fencing(db: Schema) -> None:
    """Fencing (runner/engine/workers.py): each chunk lease carries a token that grows whenever the lease is taken
    over; a worker's writes for the lease carry the token it got, and the store refuses them once it changed."""
    db.execute("ALTER TABLE leases ADD COLUMN token {int} NOT NULL DEFAULT 1")


@migration
def m012_prompt_cache_savings(db: Schema) -> None:
    """Provider prompt caching: what each task's cache reads saved against the same input uncached, less the
    premium of its cache writes (NULL for tasks of earlier versions, read as 0)."""
    db.add_column("tasks", "cache_saved", "real")


@migration
def m013_ledger_tokens(db: Schema) -> None:
    """Token budgets across processes: each ledger row's tokens (a reservation's worst case, a charge's input and
    output tokens, kept by a possibly billed row), and per run and budget scope their sum in budget_use, kept by the
    triggers (made again with the tokens), which a reservation checks as it checks USD. A charge an earlier version
    wrote takes the tokens of its answer in the memo (a billed refusal's or a stored prompt's, which the memo has
    not, count 0)."""
    db.execute("ALTER TABLE ledger ADD COLUMN tokens {int} NOT NULL DEFAULT 0")
    db.execute("ALTER TABLE budget_use ADD COLUMN tokens {int} NOT NULL DEFAULT 0")
    for name in ("insert", "delete", "update"):
        db.execute(f"DROP TRIGGER ledger_use_{name}" + ("" if db.dialect.name == "sqlite" else " ON ledger"))
    _budget_triggers(db, tokens=True)
    # the update trigger adds each charge's tokens to budget_use as it takes them
    db.execute("UPDATE ledger SET tokens = (SELECT coalesce(r.input_tokens, 0) + coalesce(r.output_tokens, 0)"
               " FROM responses r WHERE r.key = ledger.key)"
               " WHERE kind = 'charge' AND key IN (SELECT key FROM responses)")


@migration
def m014_worker_steady(db: Schema) -> None:
    """A worker's heartbeats without a gap since ``steady`` (the store's clock, seconds): a worker takes leases over
    and declares others dead only once its own heartbeats have come steadily for a lease, so a store that stalled
    everyone (a stopped server, a lock held elsewhere) makes no live worker look dead when it answers again
    (runner/engine/workers.py). NULL for workers of earlier versions."""
    db.add_column("workers", "steady", "real")


@migration
def m015_stage_stops(db: Schema) -> None:
    """A stage's ``stop:`` rule as the run left it (runner/engine/early_stop.py): what it decided, after how many of
    its items, and its confidence sequences at each look, for the reports and the viewer to show."""
    db.execute("CREATE TABLE stage_stops (run_id {text} NOT NULL, stage {text} NOT NULL, record {text} NOT NULL,"
               " PRIMARY KEY (run_id, stage)){no_rowid}")


@migration
def m016_token_counts(db: Schema) -> None:
    """Input tokens a provider's count endpoint counted for a prompt (runner/engine/exact_counts.py), under a hash of
    what was counted, the provider, its base URL and the model (``count_key`` in runner/providers/token_counts.py):
    asked once per distinct prompt, whatever run asks it again, and read by ``runner estimate``."""
    db.execute("CREATE TABLE token_counts (key {text} PRIMARY KEY, provider {text} NOT NULL, model {text} NOT NULL,"
               " tokens {int} NOT NULL, created {text}){no_rowid}")


@migration
def m017_ledger_tier(db: Schema) -> None:
    """Service tiers (runner/engine/tiers.py): the tier each charge's answer was served and priced at (NULL where its
    stage asked none, and for charges of earlier versions)."""
    db.add_column("ledger", "tier", "text")


@migration
def m018_response_origin(db: Schema) -> None:
    """Provenance: the model the provider said answered each memo entry (its response's ``model``), and what sent
    the request (an SDK and its version, or the lean wire), for the result lines of the request and of its cache
    hits (NULL for entries of earlier versions)."""
    db.add_column("responses", "reported_model", "text")
    db.add_column("responses", "sent_with", "text")


@migration
def m019_ledger_endpoint(db: Schema) -> None:
    """Pooled endpoints (runner/engine/pools.py): the endpoint of a pooled model that answered each charge (its label
    in the job's ``pools:``), priced at that endpoint's price (NULL outside pools, and for charges of earlier
    versions)."""
    db.add_column("ledger", "endpoint", "text")


def migrate(conn: Any, dialect: Dialect) -> None:
    """Apply the migrations not yet applied, in one transaction that holds a lock from its start (SQLite's write
    lock, PostgreSQL's advisory lock): several processes opening a new store at once take turns (the later ones
    wait, then find nothing to do) instead of failing when all read the schema and then all try to write it.
    ``conn`` is in autocommit mode."""
    if _up_to_date(conn, dialect):
        return
    if dialect.name == "sqlite":
        conn.execute("BEGIN IMMEDIATE")
        try:
            if conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
                _create_new(conn)
            else:
                _apply(conn, dialect, "?")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        _apply(conn, dialect, "%s")


def _apply(conn: Any, dialect: Dialect, mark: str) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at TEXT)")
    applied = {name for (name,) in conn.execute("SELECT name FROM _migrations").fetchall()}
    schema = Schema(conn, dialect)
    for fn in MIGRATIONS:
        if fn.__name__ not in applied:
            fn(schema)
            conn.execute(f"INSERT INTO _migrations (name, applied_at) VALUES ({mark}, {mark})",
                         (fn.__name__, dt.datetime.now(dt.UTC).isoformat()))


def _create_new(conn: Any) -> None:
    """A new SQLite store: the schema the migrations end with, made at once (a third of the time: each ALTER TABLE
    of the migrations makes SQLite read the whole schema again), every migration recorded as applied."""
    statements, names = _final_sqlite_schema(tuple(MIGRATIONS))
    for statement in statements:
        conn.execute(statement)
    applied = dt.datetime.now(dt.UTC).isoformat()
    conn.executemany("INSERT INTO _migrations (name, applied_at) VALUES (?, ?)", [(name, applied) for name in names])


@cache
def _final_sqlite_schema(migrations: tuple[Callable[[Schema], None], ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The statements that make the schema ``migrations`` make, in the order SQLite made its objects (a table
    before its indexes and triggers), read back from an in-memory database they ran on once per process; and
    their names."""
    import sqlite3

    from runner.store.dialect import SQLITE

    memory = sqlite3.connect(":memory:", isolation_level=None)
    try:
        _apply(memory, SQLITE, "?")
        statements = tuple(sql for (sql,) in memory.execute(
            "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' ORDER BY rowid"))
    finally:
        memory.close()
    return statements, tuple(fn.__name__ for fn in migrations)


def _up_to_date(conn: Any, dialect: Dialect) -> bool:
    """Whether every migration is applied (a read: the common case takes no lock)."""
    if dialect.name == "sqlite":
        exists = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_migrations'").fetchone()
    else:
        exists = conn.execute("SELECT to_regclass('_migrations')").fetchone()[0]
    if not exists:
        return False
    applied = {name for (name,) in conn.execute("SELECT name FROM _migrations").fetchall()}
    return all(fn.__name__ in applied for fn in MIGRATIONS)

