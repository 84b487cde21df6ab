"""How the stores in this folder were made: with the code of commit 541657b, the last before the store's queries and
migrations were written once (tests/store/test_store_upgrade.py opens them with today's code).

    git worktree add /tmp/head 541657b
    cd /tmp/head && PYTHONPATH=/tmp/head:/work/main python /work/main/tests/store/data/make_head_stores.py OUT

(``runner`` from that commit, ``devservers`` from today's tree, which that commit does not have.)

It writes, at two schema versions (m008: before the workers' tables and the budget triggers; m011: every migration
of that commit), an SQLite file and a PostgreSQL dump (``pg_dump --inserts`` of one schema, its name replaced by
``__SCHEMA__``, without psql's meta-commands). It imports ``runner.store.pg_migrations``, which that commit has.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from devservers import postgres as pg
from runner.store import migrations, open_store, pg_migrations  # type: ignore[attr-defined]

RUN = "20240101-000000-aaaa"
STAMP = "2024-01-01T00:00:00"


def _response(key: str, full: bool) -> tuple:
    return (key, "sim", "m", "{}", "A", "{}", "stop", 10, 2, 0, 0.25, 0.1, STAMP) + (("thought", 3) if full else ())


def _task(item: str, key: str) -> tuple:
    return (RUN, "mc", item, "sim:m", item, '{"seed":1}', key, "done", 0, 1, None, None, 10, 2, 0.25, 0.1, 1.0, 1,
            json.dumps({"item": item, "gold": "A"}), 0, 0.0, None)


def _charge(key: str) -> tuple:
    return (RUN, "mc", "sim:m", key, "charge", 0.25, STAMP)


def fill(store: Any, full: bool) -> None:
    """A run with tasks, memo rows, a charge and an open reservation, a pipeline stage's output and a replayable
    stage; at m011 also a worker, its leases and a batch (written through that commit's own methods)."""
    store.set_run(store.create_run("job", "job.yaml", '{"name":"job"}', "fp", 3), id=RUN, created=STAMP)
    if full:
        store.write_batch([_task("i1", "k1"), _task("i2", "k2")], [_response("k1", True), _response("k2", True)],
                          [_charge("k1"), _charge("k2")])
        store.reserve(RUN, "mc", "sim:m", "k3", 0.5, worker="w1")
        store.join_run(RUN, "w1", "host", 1, 30.0)
        store.lease_chunks(RUN, "mc", [0, 1], "w1", 30.0)
        store.record_batch("b1", RUN, "mc", "sim:m", "pb1", 1, [("k4", None)])
    else:  # that commit's write_batch names m010's columns: the rows are inserted as m008 has them
        mark = "?" if hasattr(store, "db") else "%s"

        def insert(sql: str, row: tuple) -> None:
            store.conn.execute(sql.replace("?", mark), row)

        insert(f"INSERT INTO responses VALUES ({', '.join('?' * 13)})", _response("k1", False))
        insert("INSERT INTO tasks (run_id, stage, item, model, row_id, variant_json, key, status, cache_hit, attempts,"
               " error_class, error, input_tokens, output_tokens, cost, latency, score, valid, result_json,"
               f" cached_tokens, saved, batch_saved, updated) VALUES ({', '.join('?' * 23)})",
               (*_task("i1", "k1"), STAMP))
        ledger = "INSERT INTO ledger (run_id, stage, model, key, kind, amount, created) VALUES (?, ?, ?, ?, ?, ?, ?)"
        insert(ledger, _charge("k1"))
        insert(ledger, (RUN, "mc", "sim:m", "k3", "reserved", 0.5, STAMP))
    store.save_stage_output("h1", "mc", RUN, [{"a": 1}], 0.5, {"stage": "mc", "rows": 1})
    store.record_run_stage(RUN, "mc", 0, "h1", {"stage": "mc", "rows": 1})
    store.record_replayable("h2", RUN, "mc", 2)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    server = pg.start_server()
    assert server is not None, "PostgreSQL's binaries are needed"
    try:
        for level, count in (("m008", 8), ("m011", 11)):
            migrations.MIGRATIONS[:] = migrations.MIGRATIONS[:count]
            pg_migrations.MIGRATIONS[:] = pg_migrations.MIGRATIONS[:count]
            path = out / f"head-{level}.sqlite"
            path.unlink(missing_ok=True)
            store = open_store(path)
            fill(store, count == 11)
            store.conn.execute("PRAGMA journal_mode=DELETE")  # one file, no WAL beside it
            store.close()
            schema = f"head_{level}"
            server.execute(f"CREATE SCHEMA {schema}", pg.TEST_DB)
            store = open_store(server.url(schema=schema))
            fill(store, count == 11)
            store.close()
            dump = subprocess.run([str(pg.find_bin() / "pg_dump"), "--no-owner", "--no-privileges", "--inserts",
                                   "--schema", schema, server.url()], check=True, capture_output=True,
                                  text=True).stdout
            # without psql's meta-commands (\restrict): the test runs the dump through psycopg
            dump = "".join(line for line in dump.splitlines(keepends=True) if not line.startswith("\\"))
            (out / f"head-{level}.pg.sql").write_text(dump.replace(schema, "__SCHEMA__"), encoding="utf-8")
            importlib.reload(migrations)
            importlib.reload(pg_migrations)
    finally:
        server.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
