"""A store made by an earlier version opens and migrates unchanged: SQLite files and PostgreSQL schemas made by the
code before the migrations were written once (commit 541657b; tests/store/data/make_head_stores.py made them),
one at m008 (before the workers' tables and the budget triggers) and one at m011 (every migration then).

Each, opened by this code, has every migration recorded once, the schema a new store has (tables, columns, types,
keys, indexes, triggers), the rows it held, and a working ledger (the budget sums its triggers keep, in USD and, from
m013, in tokens)."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from devservers import postgres as pg
from runner.store import CachedResponse, Reads, SQLiteStore, open_store
from runner.store.migrations import MIGRATIONS

DATA = Path(__file__).parent / "data"
RUN = "20240101-000000-aaaa"


def _schema(store: Any) -> dict[str, Any]:
    """Tables with their columns and types, primary keys, indexes and triggers: what a migration makes."""
    if isinstance(store, SQLiteStore):
        tables = {name: ([(c.name, c.type, c.notnull, c.default_value) for c in store.db[name].columns],
                         store.db[name].pks, sorted(tuple(i.columns) for i in store.db[name].indexes))
                  for name in store.db.table_names()}
        triggers = sorted(t.name for t in store.db.triggers)
        return {"tables": tables, "triggers": triggers}
    conn = store.conn
    tables = {}
    for (name,) in conn.execute("SELECT table_name FROM information_schema.tables"
                                " WHERE table_schema = current_schema()").fetchall():
        columns = conn.execute("SELECT column_name, data_type, is_nullable, column_default FROM"
                               " information_schema.columns WHERE table_schema = current_schema() AND table_name = %s"
                               " ORDER BY ordinal_position", (name,)).fetchall()
        indexes = conn.execute("SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename = %s"
                               " ORDER BY indexname", (name,)).fetchall()
        tables[name] = ([(c[0], c[1], c[2], (c[3] or "").split("nextval")[0]) for c in columns],
                        [i[0].split(" ON ")[1].split(".", 1)[1] for i in indexes])
    triggers = conn.execute("SELECT trigger_name, event_manipulation FROM information_schema.triggers"
                            " WHERE trigger_schema = current_schema() ORDER BY 1, 2").fetchall()
    return {"tables": tables, "triggers": triggers}


def _budget(store: Any) -> list[tuple]:
    return sorted(tuple(row) for row in store.conn.execute("SELECT run_id, scope, usd, inflight FROM budget_use"
                                                           " WHERE run_id = '" + RUN + "'").fetchall())


def _check_upgraded(old: Any, new: Any, level: str) -> None:
    applied = [name for (name,) in old.conn.execute("SELECT name FROM _migrations ORDER BY name").fetchall()]
    assert applied == sorted(fn.__name__ for fn in MIGRATIONS)
    assert _schema(old) == _schema(new)
    # the rows the earlier version wrote
    assert old.get_run("aaaa")["job_name"] == "job"
    assert old.lookup("k1") == CachedResponse("A", "stop", 10, 2, 0, 0.25, "thought" if level == "m011" else None,
                                              3 if level == "m011" else 0)
    assert old.task_status(RUN, "mc", "i1") == "done"
    assert old.stage_rows("h1") == [{"a": 1}] and old.run_stages(RUN) == [{"stage": "mc", "rows": 1}]
    assert old.replayable("h2") == (RUN, 2)
    assert Reads(old).count_tasks(RUN, "mc") == (2 if level == "m011" else 1)
    # the ledger's budget sums: filled from the rows m009 found (m008), or kept by the triggers since (m011)
    charged = 0.5 if level == "m011" else 0.25
    assert _budget(old) == [(RUN, "model:sim:m", pytest.approx(charged + 0.5), 1),
                            (RUN, "run", pytest.approx(charged + 0.5), 1),
                            (RUN, "stage:mc", pytest.approx(charged + 0.5), 1)]
    # and the store goes on working: a reservation within the budget, then a charge that settles it
    got, blocked, _ = old.reserve_within(RUN, "mc", "sim:m", "k9", 1.0, {"run": charged + 1.5})
    assert got is not None and blocked is None
    old.write_batch([], [], [(RUN, "mc", "sim:m", "k9", "charge", 0.25, "2024-01-02T00:00:00", 12, None, None)],
                    [(got,)])
    assert old.reserve_within(RUN, "mc", "sim:m", "k10", 1.0, {"run": charged + 1.5})[1] == "run"
    assert _budget(old)[1] == (RUN, "run", pytest.approx(charged + 0.75), 1)
    # m013: the charges took their answers' tokens from the memo (10 in, 2 out each), the open reservation none
    # (its worst case was not recorded); budget_use counts them, and a token reservation goes on from there
    before = 24 if level == "m011" else 12
    assert {row["key"]: row["tokens"] for row in old.ledger(RUN)} == {
        **({"k1": 12, "k2": 12} if level == "m011" else {"k1": 12}), "k3": 0, "k9": 12}
    assert old.rows("SELECT tokens FROM budget_use WHERE run_id = ? AND scope = 'run'", (RUN,)) == [(before + 12,)]
    assert old.reserve_within(RUN, "mc", "sim:m", "k10", 0.0, {}, tokens=10, token_limits={"run": before + 21}
                              )[1] == "run"


@pytest.mark.parametrize("level", ["m008", "m011"])
def test_an_earlier_sqlite_store_opens_and_migrates(tmp_path: Path, level: str) -> None:
    path = tmp_path / "old.sqlite"
    shutil.copyfile(DATA / f"head-{level}.sqlite", path)
    old, new = open_store(path), open_store(tmp_path / "new.sqlite")
    try:
        _check_upgraded(old, new, level)
    finally:
        old.close()
        new.close()


@pytest.mark.parametrize("level", ["m008", "m011"])
def test_an_earlier_postgres_schema_opens_and_migrates(pg_server: pg.PgServer, pg_url: str, level: str) -> None:
    schema = f"old_{uuid.uuid4().hex[:12]}"
    dump = (DATA / f"head-{level}.pg.sql").read_text(encoding="utf-8").replace("__SCHEMA__", schema)
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        conn.execute(dump)
    old, new = open_store(pg_server.url(schema=schema)), open_store(pg_url)
    try:
        _check_upgraded(old, new, level)
    finally:
        old.close()
        new.close()
