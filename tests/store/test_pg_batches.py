"""A transaction's batch of rows on PostgreSQL goes as ordinary statements (runner/store/pg_batches.py), never as a
pipeline a stopped process could leave active: the statements it makes, and on a real server the same rows as
running the statement once per row."""

from __future__ import annotations

from runner.store import open_store
from runner.store.pg_batches import MAX_PARAMETERS, batched


def test_an_insert_becomes_one_multi_row_statement() -> None:
    statements = batched("INSERT INTO t (a, b) VALUES (?, ?)", [(1, "x"), (2, "y"), (3, "z")])
    assert statements == [("INSERT INTO t (a, b) VALUES (?, ?), (?, ?), (?, ?)", [1, "x", 2, "y", 3, "z"])]


def test_an_expression_in_the_values_is_repeated_with_each_row() -> None:
    sql = "INSERT INTO t (a, b, at) VALUES (?, ?, extract(epoch from clock_timestamp())) ON CONFLICT DO NOTHING"
    [(statement, parameters)] = batched(sql, [(1, 2), (3, 4)])
    assert statement == ("INSERT INTO t (a, b, at) VALUES (?, ?, extract(epoch from clock_timestamp())), "
                         "(?, ?, extract(epoch from clock_timestamp())) ON CONFLICT DO NOTHING")
    assert parameters == [1, 2, 3, 4]


def test_an_upsert_keeps_the_last_row_of_each_key() -> None:
    sql = "INSERT INTO t (k1, k2, v) VALUES (?, ?, ?) ON CONFLICT (k1, k2) DO UPDATE SET v = excluded.v"
    [(statement, parameters)] = batched(sql, [("a", 1, "first"), ("b", 1, "other"), ("a", 1, "last")])
    assert statement.count("(?, ?, ?)") == 2
    assert parameters == ["b", 1, "other", "a", 1, "last"]  # in the place of the last row, as one by one


def test_a_long_batch_is_cut_below_the_parameter_bound() -> None:
    rows = [(i, i, i) for i in range(50_000)]
    statements = batched("INSERT INTO t (a, b, c) VALUES (?, ?, ?)", rows)
    assert len(statements) == 3
    assert all(len(parameters) <= MAX_PARAMETERS for _, parameters in statements)
    assert [value for _, parameters in statements for value in parameters] == [v for row in rows for v in row]


def test_a_delete_by_one_column_becomes_one_any() -> None:
    assert batched("DELETE FROM ledger WHERE id = ?", [(4,), (9,)]) == [
        ("DELETE FROM ledger WHERE id = ANY(?)", [[4, 9]])]


def test_other_statements_and_odd_rows_run_one_by_one() -> None:
    update = "UPDATE t SET s = ? WHERE a = ? AND b = ?"
    assert batched(update, [(1, 2, 3), (4, 5, 6)]) == [(update, [1, 2, 3]), (update, [4, 5, 6])]
    insert = "INSERT INTO t (a, b) VALUES (?, ?)"
    assert batched(insert, [(1, 2), ("short",)]) == [(insert, [1, 2]), (insert, ["short"])]
    returning = "INSERT INTO t (a) VALUES (?) RETURNING id"
    assert batched(returning, [(1,), (2,)]) == [(returning, [1]), (returning, [2])]
    assert batched(insert, []) == []


def test_on_the_server_a_batch_leaves_what_one_statement_per_row_leaves(pg_url: str, tmp_path) -> None:
    """One writer batch with a repeated memo row, one item's task twice (failed, then done), charges and releases,
    on PostgreSQL and on SQLite (whose ``executemany`` runs the statement row by row): the same rows."""
    from tests.store.test_store import ledger, new_run, response, task

    tables = []
    for store in (open_store(pg_url), open_store(tmp_path / "s.sqlite")):
        run_id = new_run(store)
        reserved = [store.reserve(run_id, "mc", "sim:gpt-test", key, 0.5) for key in ("k1", "k2")]
        store.write_batch(
            [task(run_id, "1", "k1", status="failed"), task(run_id, "2", "k2"), task(run_id, "1", "k1")],
            [response("k1", "first"), response("k2"), response("k1", "second")],
            [ledger(run_id, "k1"), ledger(run_id, "k2", 0.002)],
            [(ledger_id,) for ledger_id in reserved])
        tables.append((
            store.rows("SELECT key, response_text FROM responses ORDER BY key"),
            [(t["item"], t["status"], t["key"]) for t in store.tasks(run_id)],
            store.rows("SELECT key, kind, amount FROM ledger ORDER BY key"),
        ))
        store.close()
    assert tables[0] == tables[1]
    assert tables[0] == ([("k1", "first"), ("k2", "B")], [("2", "done", "k2"), ("1", "done", "k1")],
                         [("k1", "charge", 0.001), ("k2", "charge", 0.002)])
