"""The SQLite store: schema from migrations, WAL, atomic batches (DESIGN invariant 2), the memo, runs, and the
single async writer."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest

from runner.errors import StoreError
from runner.store import CachedResponse, Finished, SQLiteStore, Writer, open_store
from runner.store.base import LEDGER_COLUMNS, RESPONSE_COLUMNS, TASK_COLUMNS
from runner.store.rows import LedgerRow, ResponseRow, TaskRow
from runner.store.writer import save_unstored, store_unstored

# The schema as declared in runner/store/migrations.py: a change there must be a new migration and a change here.
SCHEMA: dict[str, tuple[dict[str, type], list[str]]] = {
    "responses": (
        {
            "key": str, "provider": str, "model": str, "request_json": str, "response_text": str,
            "response_json": str, "finish_reason": str, "input_tokens": int, "output_tokens": int,
            "cached_tokens": int, "cost": float, "latency": float, "created": str, "thinking": str,
            "reasoning_tokens": int, "reported_model": str, "sent_with": str,
        },
        ["key"],
    ),
    "runs": (
        {
            "id": str, "job_name": str, "job_path": str, "job_json": str, "fingerprint": str, "status": str,
            "total": int, "pid": int, "message": str, "created": str, "started": str, "finished": str,
            "deadline": str,
        },
        ["id"],
    ),
    "tasks": (
        {
            "run_id": str, "stage": str, "item": str, "model": str, "row_id": str, "variant_json": str,
            "key": str, "status": str, "cache_hit": int, "attempts": int, "error_class": str, "error": str,
            "input_tokens": int, "output_tokens": int, "cost": float, "latency": float, "score": float,
            "valid": int, "result_json": str, "updated": str, "cached_tokens": int, "saved": float,
            "batch_saved": float, "cache_saved": float,
        },
        ["run_id", "stage", "item"],
    ),
    "ledger": (
        {
            "id": int, "run_id": str, "stage": str, "model": str, "key": str, "kind": str, "amount": float,
            "created": str, "worker": str, "tokens": int, "tier": str, "endpoint": str,
        },
        ["id"],
    ),
    "_migrations": ({"name": str, "applied_at": str}, ["name"]),
    "stage_outputs": ({"hash": str, "stage": str, "run_id": str, "rows": int, "cost": float, "funnel": str,
                       "created": str}, ["hash"]),
    "stage_rows": ({"hash": str, "n": int, "row": str}, ["hash", "n"]),
    "run_stages": ({"run_id": str, "stage": str, "position": int, "hash": str, "funnel": str}, ["run_id", "stage"]),
    "stage_replays": ({"hash": str, "run_id": str, "stage": str, "tasks": int, "created": str}, ["hash"]),
    "batches": ({"id": str, "run_id": str, "stage": str, "model": str, "provider_batch_id": str, "round": int,
                 "state": str, "provider_state": str, "lines": int, "created": str, "updated": str}, ["id"]),
    "batch_lines": ({"batch_id": str, "key": str, "ledger_id": int, "status": str}, ["batch_id", "key"]),
    "workers": ({"id": str, "run_id": str, "host": str, "pid": int, "started": str, "seen": float, "state": str,
                 "steady": float}, ["id"]),
    "leases": ({"run_id": str, "stage": str, "chunk": int, "worker": str, "expires": float, "done": int, "token": int},
               ["run_id", "stage", "chunk"]),
    "claims": ({"key": str, "worker": str, "expires": float}, ["key"]),
    "budget_use": ({"run_id": str, "scope": str, "usd": float, "inflight": int, "tokens": int}, ["run_id", "scope"]),
    "stage_stops": ({"run_id": str, "stage": str, "record": str}, ["run_id", "stage"]),
    "token_counts": ({"key": str, "provider": str, "model": str, "tokens": int, "created": str}, ["key"]),
}
MIGRATION_NAMES = ["m001_responses", "m002_runs", "m003_tasks", "m004_ledger", "m005_costs", "m006_pipelines",
                   "m007_stage_replays", "m008_batches", "m009_workers", "m010_thinking",
                   "m011_fencing", "m012_prompt_cache_savings", "m013_ledger_tokens", "m014_worker_steady",
                   "m015_stage_stops", "m016_token_counts", "m017_ledger_tier", "m018_response_origin",
                   "m019_ledger_endpoint"]


@pytest.fixture(params=["sqlite", "postgres"])
def store_path(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """Where a new store goes: an SQLite file, or a fresh PostgreSQL schema (devservers/postgres.py): every test
    below that is not about SQLite's file runs against both backends."""
    return tmp_path / "store.sqlite" if request.param == "sqlite" else request.getfixturevalue("pg_url")


@pytest.fixture
def store(store_path: Any) -> Any:
    s = open_store(store_path)
    yield s
    s.close()


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Any:
    """An SQLite store, for what is about SQLite itself (WAL, its file)."""
    s = open_store(tmp_path / "store.sqlite")
    yield s
    s.close()


#: what a malformed row raises, per backend (the store passes the driver's error through)
PROGRAMMING_ERRORS = (sqlite3.ProgrammingError, psycopg.ProgrammingError)
DB_ERRORS = (sqlite3.Error, psycopg.Error)
#: PostgreSQL's types of the SCHEMA's Python types
PG_TYPES = {"text": str, "bigint": int, "double precision": float}


def columns_dict(store: Any, table: str) -> dict[str, type]:
    """A table's columns as sqlite_utils' columns_dict, on either backend (PostgreSQL's tasks.seq, its rowid,
    left out)."""
    if isinstance(store, SQLiteStore):
        return store.db[table].columns_dict
    rows = store.conn.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s"
                              " AND table_schema = current_schema() ORDER BY ordinal_position", (table,)).fetchall()
    return {name: PG_TYPES[kind] for name, kind in rows if (table, name) != ("tasks", "seq")}


def primary_key(store: Any, table: str) -> list[str]:
    if isinstance(store, SQLiteStore):
        return store.db[table].pks
    return [name for (name,) in store.conn.execute(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
        " WHERE i.indrelid = to_regclass(%s) AND i.indisprimary ORDER BY array_position(i.indkey, a.attnum)",
        (table,))]


def table_names(store: Any) -> set[str]:
    if isinstance(store, SQLiteStore):
        return set(store.db.table_names())
    return {name for (name,) in store.conn.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")}


def index_columns(store: Any, table: str) -> list[list[str]]:
    if isinstance(store, SQLiteStore):
        return [i.columns for i in store.db[table].indexes]
    return [list(columns) for (columns,) in store.conn.execute(
        "SELECT ARRAY(SELECT a.attname::text FROM unnest(i.indkey) WITH ORDINALITY k(attnum, n) JOIN pg_attribute a"
        " ON a.attrelid = i.indrelid AND a.attnum = k.attnum ORDER BY k.n) FROM pg_index i"
        " WHERE i.indrelid = to_regclass(%s)", (table,))]


def migrations_applied(store: Any) -> dict[str, str]:
    return dict(store.conn.execute("SELECT name, applied_at FROM _migrations").fetchall())


def in_transaction(store: Any) -> bool:
    if isinstance(store, SQLiteStore):
        return store.conn.in_transaction
    return store.conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE


def response(key: str, text: str = "B", cost: float = 0.001, thinking: str | None = None,
             reasoning_tokens: int = 0, reported_model: str | None = None, sent_with: str | None = None) -> tuple:
    values = {
        "key": key, "provider": "sim", "model": "gpt-test", "request_json": "{}", "response_text": text,
        "response_json": "{}", "finish_reason": "stop", "input_tokens": 10, "output_tokens": 1,
        "cached_tokens": 0, "cost": cost, "latency": 0.01, "created": "2024-01-01T00:00:00", "thinking": thinking,
        "reasoning_tokens": reasoning_tokens, "reported_model": reported_model, "sent_with": sent_with,
    }
    return tuple(values[c] for c in RESPONSE_COLUMNS)


def task(run_id: str, item: str, key: str, status: str = "done", cost: float = 0.001) -> tuple:
    values = {
        "run_id": run_id, "stage": "mc", "item": item, "model": "sim:gpt-test", "row_id": item,
        "variant_json": "{}", "key": key, "status": status, "cache_hit": 0, "attempts": 1, "error_class": None,
        "error": None, "input_tokens": 10, "output_tokens": 1, "cost": cost, "latency": 0.01, "score": 1.0,
        "valid": 1, "result_json": f'{{"item":"{item}"}}', "updated": "2024-01-01T00:00:00", "cached_tokens": 0,
        "saved": 0.0, "batch_saved": None, "cache_saved": 0.0,
    }
    return tuple(values[c] for c in TASK_COLUMNS)


def ledger(run_id: str, key: str, amount: float = 0.001) -> tuple:
    values = {"run_id": run_id, "stage": "mc", "model": "sim:gpt-test", "key": key, "kind": "charge",
              "amount": amount, "created": "2024-01-01T00:00:00", "tokens": 12, "tier": None, "endpoint": None}
    return tuple(values[c] for c in LEDGER_COLUMNS)


def count(store: SQLiteStore, table: str) -> int:
    return store.conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def new_run(store: SQLiteStore, name: str = "job", total: int = 3) -> str:
    job_json = json.dumps({"name": name}, separators=(",", ":"))
    return store.create_run(name, f"jobs/{name}.yaml", job_json, "fp-" + name, total)


# -- schema and connection -----------------------------------------------------------------------------------

@pytest.mark.parametrize("table", list(SCHEMA))
def test_migrations_create_declared_schema(store: SQLiteStore, table: str) -> None:
    columns, pks = SCHEMA[table]
    assert table in table_names(store)
    assert columns_dict(store, table) == columns
    assert primary_key(store, table) == pks


def test_no_other_tables(store: SQLiteStore) -> None:
    assert table_names(store) == set(SCHEMA)


def test_indexes(store: SQLiteStore) -> None:
    assert ["run_id", "stage", "model"] in index_columns(store, "tasks")
    assert ["run_id"] in index_columns(store, "ledger")


def test_migrations_recorded_once(store_path: Any) -> None:
    path = store_path
    first = open_store(path)
    applied = migrations_applied(first)
    assert sorted(applied) == MIGRATION_NAMES
    first.write_batch([], [response("k1")], [])
    first.close()

    second = open_store(path)
    again = migrations_applied(second)
    assert again == applied  # same rows, same timestamps: nothing ran again
    assert count(second, "_migrations") == len(MIGRATION_NAMES)
    assert second.lookup("k1") is not None  # and nothing was recreated
    second.close()


def test_a_new_store_made_at_once_has_the_schema_the_migrations_make_one_by_one(tmp_path: Any) -> None:
    """A new SQLite store is made from the schema the migrations end with (runner/store/migrations.py's
    ``_create_new``): every table, column, index and trigger the same as applying each migration in turn, which a
    store that already has tables still does."""
    import sqlite3

    from runner.store.dialect import SQLITE
    from runner.store.migrations import _apply

    def schema(conn: sqlite3.Connection) -> tuple:
        objects = sorted(conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master "
                                      "WHERE name NOT LIKE 'sqlite_%'").fetchall())
        columns = {name: conn.execute(f"PRAGMA table_xinfo({name})").fetchall()
                   for kind, name, _, _ in objects if kind == "table"}
        return objects, columns, [name for (name,) in conn.execute("SELECT name FROM _migrations ORDER BY name")]

    at_once = open_store(tmp_path / "new.sqlite")
    one_by_one = sqlite3.connect(tmp_path / "stepwise.sqlite", isolation_level=None)
    _apply(one_by_one, SQLITE, "?")
    try:
        assert schema(at_once.conn) == schema(one_by_one)
        assert schema(one_by_one)[2] == MIGRATION_NAMES
    finally:
        at_once.close()
        one_by_one.close()


def test_m010_adds_thinking_to_an_existing_memo(store_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store made before m010 (its memo rows without thinking) opens, migrates, and answers its old rows with no
    thinking and no reasoning tokens."""
    from runner.store import migrations

    with monkeypatch.context() as patch:
        patch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:9])
        old = open_store(store_path)
        assert sorted(migrations_applied(old)) == MIGRATION_NAMES[:9]
        assert "thinking" not in columns_dict(old, "responses")
        mark = "?" if isinstance(old, SQLiteStore) else "%s"
        before = RESPONSE_COLUMNS[:RESPONSE_COLUMNS.index("thinking")]
        old.conn.execute(f"INSERT INTO responses ({', '.join(before)}) VALUES ({', '.join(mark for _ in before)})",
                         response("k1", "C")[:len(before)])
        old.close()
    new = open_store(store_path)
    assert sorted(migrations_applied(new)) == MIGRATION_NAMES
    assert new.lookup("k1") == CachedResponse("C", "stop", 10, 1, 0, 0.001, None, 0)
    new.write_batch([], [response("k2", "B", thinking="because", reasoning_tokens=5)], [])
    assert new.lookup_many(["k1", "k2"])["k2"] == CachedResponse("B", "stop", 10, 1, 0, 0.001, "because", 5)
    new.close()


# SQLite only: WAL mode, another connection to its file, what an unreadable file gives

def test_wal_and_busy_timeout(sqlite_store: SQLiteStore) -> None:
    store = sqlite_store
    assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.conn.execute("PRAGMA busy_timeout").fetchone()[0] >= 1000


def test_reader_sees_committed_rows_while_store_is_open(sqlite_store: SQLiteStore) -> None:
    store = sqlite_store
    store.write_batch([], [response("k1")], [])
    reader = sqlite3.connect(store.path)
    try:
        assert reader.execute("SELECT response_text FROM responses WHERE key='k1'").fetchone() == ("B",)
    finally:
        reader.close()


def test_unreadable_store_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "not-a-db.sqlite"
    path.write_bytes(b"this is not an sqlite file at all" * 100)
    with pytest.raises(StoreError, match="cannot be opened"):
        open_store(path)


# -- write_batch: one transaction (invariant 2) --------------------------------------------------------------

def test_write_batch_writes_all_three(store: SQLiteStore) -> None:
    run_id = new_run(store)
    store.write_batch(
        [task(run_id, "1", "k1"), task(run_id, "2", "k2")],
        [response("k1", "A"), response("k2", "C")],
        [ledger(run_id, "k1"), ledger(run_id, "k2")],
    )
    assert (count(store, "responses"), count(store, "tasks"), count(store, "ledger")) == (2, 2, 2)
    assert store.task_status(run_id, "mc", "1") == "done"
    assert store.task_status(run_id, "mc", "3") is None
    assert list(store.iter_results(run_id, "mc")) == ['{"item":"1"}', '{"item":"2"}']
    assert store.memo_keys() == {"k1", "k2"}


@pytest.mark.parametrize("broken", ["task", "ledger"])
def test_failed_batch_writes_nothing(store: SQLiteStore, broken: str) -> None:
    run_id = new_run(store)
    tasks = [task(run_id, "1", "k1"), task(run_id, "2", "k2")]
    ledgers = [ledger(run_id, "k1"), ledger(run_id, "k2")]
    if broken == "task":
        tasks[1] = tasks[1][:-1]  # one value short, after a valid response and a valid task
    else:
        ledgers[1] = (*ledgers[1], "extra")
    with pytest.raises(PROGRAMMING_ERRORS):
        store.write_batch(tasks, [response("k1"), response("k2")], ledgers)
    assert (count(store, "responses"), count(store, "tasks"), count(store, "ledger")) == (0, 0, 0)
    assert store.lookup("k1") is None
    # the connection is usable again afterwards: no transaction left open
    assert not in_transaction(store)
    store.write_batch([task(run_id, "1", "k1")], [response("k1")], [ledger(run_id, "k1")])
    assert (count(store, "responses"), count(store, "tasks"), count(store, "ledger")) == (1, 1, 1)


def test_failed_batch_keeps_earlier_batches(store: SQLiteStore) -> None:
    run_id = new_run(store)
    store.write_batch([task(run_id, "1", "k1")], [response("k1")], [ledger(run_id, "k1")])
    with pytest.raises(DB_ERRORS):
        store.write_batch([task(run_id, "2", "k2"), ("short",)], [response("k2")], [])
    assert store.memo_keys() == {"k1"}
    assert store.task_status(run_id, "mc", "1") == "done"
    assert store.task_status(run_id, "mc", "2") is None


def test_memo_row_is_never_overwritten(store: SQLiteStore) -> None:
    store.write_batch([], [response("k1", "first", cost=0.5)], [])
    store.write_batch([], [response("k1", "second", cost=0.9)], [])
    assert store.lookup("k1") == CachedResponse("first", "stop", 10, 1, 0, 0.5)
    assert count(store, "responses") == 1


def test_task_row_is_replaced(store: SQLiteStore) -> None:
    run_id = new_run(store)
    store.write_batch([task(run_id, "1", "k1", status="failed")], [], [])
    store.write_batch([task(run_id, "1", "k1", status="done")], [response("k1")], [])
    assert store.task_status(run_id, "mc", "1") == "done"
    assert count(store, "tasks") == 1


def test_lookup(store: SQLiteStore) -> None:
    assert store.lookup("missing") is None
    store.write_batch([], [response("k9", "The answer is D", cost=0.25)], [])
    assert store.lookup("k9") == CachedResponse(
        text="The answer is D", finish_reason="stop", input_tokens=10, output_tokens=1, cached_tokens=0, cost=0.25
    )


def test_m018_keeps_what_produced_each_answer_for_its_cache_hits(store_path: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The model the provider named and what sent the request come back with a memo row (a cache hit's result
    line carries them); rows of a store made before m018 come back with neither."""
    from runner.store import migrations

    with monkeypatch.context() as patch:
        patch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:17])
        old = open_store(store_path)
        mark = "?" if isinstance(old, SQLiteStore) else "%s"
        before = RESPONSE_COLUMNS[:RESPONSE_COLUMNS.index("reported_model")]
        old.conn.execute(f"INSERT INTO responses ({', '.join(before)}) VALUES ({', '.join(mark for _ in before)})",
                         response("k1", "C")[:len(before)])
        old.close()
    new = open_store(store_path)
    new.write_batch([], [response("k2", "B", reported_model="gpt-test-2024-01-01", sent_with="openai 3.57.0")], [])
    found = new.lookup_many(["k1", "k2"])
    assert (found["k1"].reported_model, found["k1"].sent_with) == (None, None)
    assert (found["k2"].reported_model, found["k2"].sent_with) == ("gpt-test-2024-01-01", "openai 3.57.0")
    new.close()


def test_the_memo_keeps_thinking_apart_from_the_answer(store: SQLiteStore) -> None:
    """A reasoning model's answer: its thinking text and reasoning tokens come back with it (m010), so a cache
    hit's result line is the fresh answer's."""
    store.write_batch([], [response("k1", "B", thinking="C looks tempting, but B", reasoning_tokens=40),
                           response("k2", "A")], [])
    assert store.lookup("k1") == CachedResponse("B", "stop", 10, 1, 0, 0.001, "C looks tempting, but B", 40)
    found = store.lookup_many(["k1", "k2"])
    assert (found["k1"].thinking, found["k1"].reasoning_tokens) == ("C looks tempting, but B", 40)
    assert (found["k2"].thinking, found["k2"].reasoning_tokens) == (None, 0)


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "not-committed"])
def test_answers_kept_aside_are_stored_once_whether_or_not_their_commit_landed(store: Any, tmp_path: Path,
                                                                               committed: bool) -> None:
    """A PostgreSQL server that restarts while a batch's COMMIT is on its way cannot say whether it took it, so the
    run ends keeping the batch aside (runner/store/writer.py); the resume stores it, and a batch that had committed
    after all is not charged twice (the fault simulation's seed 13 found the double charge)."""
    run_id = new_run(store)
    reservation = store.reserve(run_id, "mc", "sim:gpt-test", "k1", 0.01)
    item = Finished(task=TaskRow(*task(run_id, "1", "k1")), response=ResponseRow(*response("k1")),
                    ledger=LedgerRow(*ledger(run_id, "k1")), release_id=reservation)
    if committed:
        store.write_finished([item])
    kept = save_unstored([item], [tmp_path / "unstored.jsonl"])
    assert kept is not None
    assert store_unstored(store, kept) == 1
    assert [(row["key"], row["kind"]) for row in store.ledger(run_id)] == [("k1", "charge")]
    assert store.charged(run_id) == pytest.approx(0.001)
    assert store.task_status(run_id, "mc", "1") == "done" and not kept.exists()


# -- runs ----------------------------------------------------------------------------------------------------

def test_create_and_get_run(store: SQLiteStore) -> None:
    run_id = new_run(store, "alpha", total=12)
    run = store.get_run(run_id)
    assert run["id"] == run_id
    assert run["job_name"] == "alpha"
    assert run["job_path"] == "jobs/alpha.yaml"
    assert run["job_json"] == '{"name":"alpha"}'
    assert run["fingerprint"] == "fp-alpha"
    assert run["status"] == "running"
    assert run["total"] == 12
    assert run["finished"] is None
    assert set(run) == set(SCHEMA["runs"][0])


def test_a_generated_run_id_already_taken_is_drawn_again_and_a_given_one_is_refused(store: SQLiteStore,
                                                                                     monkeypatch) -> None:
    """Two runs made in the same second whose random bits collide (1 in 65,536 a pair: the budget trials, many short
    runs in one store, met it) both start; a run id the caller chose and a run holds is refused."""
    import datetime as dt
    from types import SimpleNamespace

    from runner.store import sql
    from runner.store.base import RunExists

    second = dt.datetime(2026, 11, 30, 1, 27, 24)
    frozen = type("Frozen", (dt.datetime,), {"now": classmethod(lambda cls, tz=None: second)})
    monkeypatch.setattr(sql, "dt", SimpleNamespace(datetime=frozen))  # this module's clock only
    draws = iter(["6639", "6639", "6639", "0a0b"])
    monkeypatch.setattr(sql.secrets, "token_hex", lambda n: next(draws))
    first = new_run(store, "alpha")
    again = new_run(store, "beta")
    assert (first, again) == ("20261130-012724-6639", "20261130-012724-0a0b")
    assert store.get_run(again)["job_name"] == "beta"
    with pytest.raises(RunExists, match="a run '20261130-012724-6639' exists already"):
        store.create_run("gamma", "jobs/gamma.yaml", "{}", "fp", 1, run_id=first)
    monkeypatch.setattr(sql.secrets, "token_hex", lambda n: "6639")
    with pytest.raises(RunExists):  # every draw taken: said, not looped for ever
        new_run(store, "delta")


def test_get_run_by_unique_fragment(store: SQLiteStore) -> None:
    first = new_run(store, "alpha")
    second = new_run(store, "beta")
    assert first != second
    # fixed ids, so that which fragments are unique does not depend on the clock or the random suffix
    store.set_run(first, id="20240101-120000-abcd")
    store.set_run(second, id="20240101-120000-ef01")
    assert store.get_run("20240101-120000-abcd")["job_name"] == "alpha"
    assert store.get_run("abcd")["job_name"] == "alpha"
    assert store.get_run("ef01")["id"] == "20240101-120000-ef01"
    for ambiguous in ("20240101", "-120000-"):
        with pytest.raises(StoreError, match="runner runs"):
            store.get_run(ambiguous)


def test_unknown_run_names_runner_runs(store: SQLiteStore) -> None:
    new_run(store)
    with pytest.raises(StoreError) as info:
        store.get_run("no-such-run")
    message = str(info.value)
    assert "'no-such-run'" in message
    assert "runner runs" in message
    assert store.path in message


def test_set_run(store: SQLiteStore) -> None:
    run_id = new_run(store)
    store.set_run(run_id, status="completed", message="all good", finished="2024-01-02T00:00:00")
    run = store.get_run(run_id)
    assert (run["status"], run["message"], run["finished"]) == ("completed", "all good", "2024-01-02T00:00:00")
    other = new_run(store, "other")
    assert store.get_run(other)["status"] == "running"


def test_list_runs(store: SQLiteStore) -> None:
    assert store.list_runs() == []
    old = new_run(store, "old")
    new = new_run(store, "new")
    store.set_run(old, created="2024-01-01T00:00:00")
    store.set_run(new, created="2024-06-01T00:00:00")
    store.write_batch(
        [task(new, "1", "k1"), task(new, "2", "k2"), task(new, "3", "k3", status="failed")],
        [response("k1"), response("k2")],
        [ledger(new, "k1", 0.25), ledger(new, "k2", 0.5)],
    )
    runs = store.list_runs()
    assert [r["id"] for r in runs] == [new, old]
    assert (runs[0]["done"], runs[0]["failed"], runs[0]["spend"]) == (2, 1, 0.75)
    assert (runs[1]["done"], runs[1]["failed"], runs[1]["spend"]) == (0, 0, 0)
    assert [r["id"] for r in store.list_runs(limit=1)] == [new]


# -- the async writer ----------------------------------------------------------------------------------------

async def test_writer_commits_everything_and_reports_each_once(store: SQLiteStore) -> None:
    run_id = new_run(store)
    committed: list[list[Finished]] = []
    seen_in_store: list[bool] = []

    def on_commit(batch: list[Finished]) -> None:
        committed.append(list(batch))
        # nothing reaches a results file before it is in the store
        seen_in_store.extend(store.task_status(run_id, "mc", f.task[2]) == "done" for f in batch)

    writer = Writer(store, on_commit, batch_size=2)
    writer.start()
    items = [
        Finished(
            task=task(run_id, str(i), f"k{i}"),
            response=response(f"k{i}") if i % 2 == 0 else None,  # odd ones: cache hits, no new memo row
            ledger=ledger(run_id, f"k{i}") if i % 2 == 0 else None,
            result_line=f'{{"item":"{i}"}}',
            stage="mc",
        )
        for i in range(5)
    ]
    for item in items[:3]:
        writer.put(item)
    await asyncio.sleep(0.01)
    for item in items[3:]:
        writer.put(item)
    await writer.close()

    flat = [f for batch in committed for f in batch]
    assert sorted(f.result_line for f in flat) == sorted(f.result_line for f in items)
    assert len(flat) == len(items)
    assert all(len(batch) <= 2 for batch in committed)
    assert all(seen_in_store) and len(seen_in_store) == 5
    assert count(store, "tasks") == 5
    assert store.memo_keys() == {"k0", "k2", "k4"}
    assert count(store, "ledger") == 3


async def test_writer_close_with_nothing_queued(store: SQLiteStore) -> None:
    calls: list[list[Finished]] = []
    writer = Writer(store, calls.append)
    writer.start()
    await writer.close()
    assert calls == []
    assert count(store, "tasks") == 0


def test_a_new_store_waits_for_another_process_writing_the_file_before_turning_it_to_wal(tmp_path: Path) -> None:
    """Another connection writes the new file (not yet WAL) when the store opens it: SQLite refuses the switch to
    WAL at once, without its busy handler, since waiting could deadlock; the store tries again until the other
    commits (this is what failed one start in a few hundred when three runs opened a new store together)."""
    import threading

    db = tmp_path / "new.sqlite"
    other = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    other.execute("CREATE TABLE other_process (x)")
    locked = sqlite3.connect(db, timeout=0.1, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        locked.execute("PRAGMA journal_mode=WAL")  # what SQLite does without the store's waiting
    locked.close()
    threading.Timer(0.3, other.execute, ("COMMIT",)).start()
    store = SQLiteStore(db)
    assert store.conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert store.list_runs() == []
    other.close()


# SQLite only (its file's write lock): tests/store/test_store_postgres.py has PostgreSQL's advisory lock's test
def test_processes_opening_a_new_store_at_once_all_succeed(tmp_path: Path) -> None:
    """Several runs started at once on a store that does not exist yet: the first migrates it while the others
    wait for its write lock, then find nothing to do (before, one in two died with "database is locked")."""
    import subprocess
    import sys

    code = ("import sys; from runner.store import open_store; s = open_store(sys.argv[1]); "
            "print(s.create_run('j', 'j.yaml', '{}', 'fp', 1))")
    for trial in range(5):
        db = tmp_path / f"new{trial}.sqlite"
        procs = [subprocess.Popen([sys.executable, "-c", code, str(db)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(3)]
        results = [(p.wait(timeout=60), p.stdout.read(), p.stderr.read()) for p in procs]
        assert [code for code, _, _ in results] == [0, 0, 0], [err for _, _, err in results]
        store = open_store(db)
        assert len(store.list_runs()) == 3
        assert [row["name"] for row in store.db["_migrations"].rows] == MIGRATION_NAMES


def test_a_stages_stop_record_is_kept_and_a_resumes_replaces_it(store_path: Any) -> None:
    store = open_store(store_path)
    run_id = store.create_run("j", "j.yaml", "{}", "fp", 10)
    assert store.stops(run_id) == []
    first = {"stage": "mc", "items_asked": 3, "looks": [[1, [[0.0, 1.0]]]]}
    store.record_stop(run_id, "mc", first)
    store.record_stop(run_id, "judge", {"stage": "judge", "items_asked": 5})
    again = {**first, "items_asked": 7}
    store.record_stop(run_id, "mc", again)
    assert store.stops(run_id) == [{"stage": "judge", "items_asked": 5}, again]
    assert store.stops("another run") == []
    store.close()
