"""What is PostgreSQL's own in the shared store: opening it by URL (argument or RUNNER_DB), one sentence without the
password when it cannot be opened, several processes migrating a new database at once, the same schema and the same
answers (values and Python types) as the SQLite store, the server's locks under concurrency, and a whole job through
the CLI on PostgreSQL with the same report as on SQLite. tests/store/test_store.py runs the common store tests on
both."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from devservers import postgres as pg
from runner.errors import StoreError
from runner.store import Reads, SQLiteStore, open_store
from runner.store.base import LEDGER_COLUMNS, RESPONSE_COLUMNS, TASK_COLUMNS
from runner.store.pg_url import redact
from runner.store.postgres import PostgresStore
from runner.store.view_reads import RUN_SORTS, AnswerFilter, RunFilter, ViewReads
from tests.helpers import ROOT, run_cli, write_job, write_rows


def _names(store: Any) -> list[str]:
    return [name for (name,) in store.conn.execute("SELECT name FROM _migrations ORDER BY name").fetchall()]


# -- opening ------------------------------------------------------------------------------------------------------

def test_open_store_with_a_url_is_a_postgres_store(pg_url: str) -> None:
    store = open_store(pg_url)
    try:
        assert isinstance(store, PostgresStore)
        run_id = store.create_run("j", "j.yaml", "{}", "fp", 1)
        assert store.get_run(run_id)["job_name"] == "j"
    finally:
        store.close()
    again = open_store(pg_url)  # the rows are in the server, not in this process
    assert [run["id"] for run in again.list_runs()] == [run_id]
    again.close()


def test_runner_db_postgres_url_is_picked_up(pg_server: pg.PgServer, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    url = pg_server.new_database().replace("postgresql://", "postgres://")  # both spellings are PostgreSQL
    monkeypatch.setenv("RUNNER_DB", url)
    store = open_store()
    assert isinstance(store, PostgresStore)
    run_id = store.create_run("from-env", "j.yaml", "{}", "fp", 1)
    store.close()
    code, out, err = run_cli(monkeypatch, capsys, "runs")
    assert code == 0, err
    assert run_id in out and "from-env" in out


def test_a_path_that_folded_the_url_still_opens_postgres(pg_server: pg.PgServer) -> None:
    """``--db`` typed as a Path turns ``postgresql://`` into ``postgresql:/``; open_store still sees the URL."""
    store = open_store(Path(pg_server.new_database()))
    assert isinstance(store, PostgresStore)
    store.close()


@pytest.mark.parametrize("case", ["wrong password", "server down", "no such database"])
def test_a_store_that_cannot_be_opened_is_one_sentence_without_the_password(pg_server: pg.PgServer,
                                                                            case: str) -> None:
    secret = pg.PASSWORD + ("-wrong" if case == "wrong password" else "")
    url = pg_server.url(user=pg.PASSWORD_ROLE, password=secret)
    if case == "server down":
        closed = pg._free_port()
        url = url.replace(f":{pg_server.port}/", f":{closed}/")
    elif case == "no such database":
        url = url.replace(f"/{pg.TEST_DB}", "/no_such_db")
    with pytest.raises(StoreError) as info:
        open_store(url)
    message = str(info.value)
    assert pg.PASSWORD not in message
    assert redact(url) in message and redact(url).startswith(f"postgresql://{pg.PASSWORD_ROLE}@127.0.0.1:")
    assert "\n" not in message and message.count(". ") == 0, message
    assert "check that the server is running" in message and "--db or RUNNER_DB" in message
    assert {"wrong password": "password authentication failed", "server down": "refused",
            "no such database": "does not exist"}[case] in message


@pytest.mark.parametrize("url", ["postgresql://u:s3cret@[bad/db", "postgresql://[::1"])
def test_a_url_python_cannot_split_is_one_sentence_at_the_command_line(url: str, tmp_path: Path) -> None:
    """An unclosed IPv6 bracket: `urlsplit` raises ValueError, which ended `unexpected ValueError` (issue 41)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "runner.cli", "runs", "--db", url], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "Traceback" not in done.stderr and "unexpected" not in done.stderr, done.stderr
    line = done.stderr.strip().splitlines()[-1]  # (after a warning that --db carries a password)
    assert line == ("Error: the PostgreSQL store postgresql://... cannot be opened (the URL is malformed): check "
                    "that the server is running and the URL is right, or set --db or RUNNER_DB"), line
    assert "s3cret" not in done.stderr


def test_the_right_password_opens_it_and_is_never_kept(pg_server: pg.PgServer) -> None:
    pg_server.execute("CREATE SCHEMA pw_store", pg.TEST_DB)
    store = open_store(pg_server.url(user=pg.PASSWORD_ROLE, password=pg.PASSWORD, schema="pw_store"))
    try:
        assert pg.PASSWORD not in store.path
        store.create_run("j", "j.yaml", "{}", "fp", 1)
    finally:
        store.close()


def test_redact_drops_every_password() -> None:
    assert redact("postgresql://u:p%40ss@h:5/db?sslmode=require&password=x") == \
        "postgresql://u@h:5/db?sslmode=require"
    assert redact("postgres://h/db") == "postgres://h/db"


def test_processes_opening_a_new_database_at_once_all_succeed(pg_server: pg.PgServer) -> None:
    """Several runs started at once on a new database: all of them find it unmigrated and queue on the advisory
    lock (held here until all four wait), then one migrates and the others find nothing to do."""
    import psycopg

    from runner.store.migrations import MIGRATION_LOCK, MIGRATIONS

    url = pg_server.new_database()
    code = ("import sys; from runner.store import open_store; s = open_store(sys.argv[1]); "
            "print(s.create_run('j', 'j.yaml', '{}', 'fp', 1))")
    with psycopg.connect(url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
        procs = [subprocess.Popen([sys.executable, "-c", code, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, cwd=ROOT) for _ in range(4)]
        deadline = time.monotonic() + 60
        while holder.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                             ).fetchone()[0] < 4:
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.05)
        holder.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))
    results = [(p.wait(timeout=60), p.stdout.read(), p.stderr.read()) for p in procs]
    assert [code for code, _, _ in results] == [0] * 4, [err for _, _, err in results]
    store = open_store(url)
    assert len(store.list_runs()) == 4
    assert _names(store) == sorted(fn.__name__ for fn in MIGRATIONS)
    store.close()


# -- the same schema and the same answers as SQLite -------------------------------------------------------------

PG_TYPES = {"text": str, "bigint": int, "double precision": float}


def test_same_migrations_and_schema_as_sqlite(tmp_path: Path, pg_url: str) -> None:
    lite, post = open_store(tmp_path / "s.sqlite"), open_store(pg_url)
    assert _names(post) == _names(lite)
    for table in lite.db.table_names():
        rows = post.conn.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s"
                                 " AND table_schema = current_schema() ORDER BY ordinal_position", (table,)).fetchall()
        columns = {name: PG_TYPES[kind] for name, kind in rows if (table, name) != ("tasks", "seq")}
        assert columns == lite.db[table].columns_dict, table


def _task(run_id: str, stage: str, item: str, model: str, variant: dict, result: dict, *, status: str = "done",
          score: float | None = 1.0, valid: int | None = 1, cache_hit: int = 0, error_class: str | None = None,
          cost: float = 0.25, saved: float = 0.0, latency: float | None = 0.5, batch_saved: float | None = None,
          row_id: str | None = None) -> tuple:
    values = {
        "run_id": run_id, "stage": stage, "item": item, "model": model, "row_id": row_id or item,
        "variant_json": json.dumps(variant, separators=(",", ":")), "key": f"k-{stage}-{item}-{model}",
        "status": status, "cache_hit": cache_hit, "attempts": 1, "error_class": error_class, "error": error_class,
        "input_tokens": 10, "output_tokens": 2, "cost": cost, "latency": latency, "score": score, "valid": valid,
        "result_json": json.dumps(result, separators=(",", ":")), "cached_tokens": 4, "saved": saved,
        "batch_saved": batch_saved, "cache_saved": 0.125 if batch_saved is None and cost > 0.3 else 0.0,
    }
    return tuple(values[c] for c in TASK_COLUMNS)


def _fill(store: Any) -> tuple[str, str]:
    """The same varied rows in a store: two stages and models, variant axes in different orders, golds of every
    JSON type, failures, cache hits, a judge run; returns (run id, judge run id), fixed."""
    run_id, judge = "20240101-000000-aaaa", "20240101-000000-bbbb"
    for fixed, name in ((run_id, "eval"), (judge, "judge")):
        store.set_run(store.create_run(name, f"{name}.yaml", "{}", "fp", 9), id=fixed, created=f"2024-01-0{len(name)}")
    golds: list[Any] = [0, 1, True, False, "yes", None, 2.5, [1, 2], {"b": 1, "a": 2}]
    tasks = []
    for i, gold in enumerate(golds):
        for model in ("sim:b-model", "sim:a-model"):
            variant = {"seed": i % 3, "template": "tb" if i % 2 else "ta"} if i % 4 else {"template": "tc", "seed": 2}
            result = {"gold": gold, "answer_letter": "ABCD"[i % 4] if i % 5 else None, "permutation": [i % 4, 0],
                      "variant": variant, "parsed": i % 2 == 0, "fields": {"bucket": ["x", "y", None][i % 3]}}
            if i == 7:
                del result["gold"]
            tasks.append(_task(run_id, "mc", f"item{i}", model, variant, result, score=[1.0, 0.0, None][i % 3],
                               valid=i % 2, cache_hit=int(i % 4 == 0), saved=0.125 * (i % 4 == 0),
                               batch_saved=0.5 if i == 3 else None))
    tasks.append(_task(run_id, "mc", "bad1", "sim:a-model", {"seed": 0}, {}, status="failed", score=None,
                       error_class="rate_limited", latency=None))
    tasks.append(_task(run_id, "mc", "bad2", "sim:a-model", {"seed": 0}, {}, status="failed", score=None,
                       error_class=None, latency=None))
    tasks.append(_task(run_id, "other", "o1", "sim:a-model", {"seed": 1}, {"gold": "B"}, cost=0.5))
    for i in range(0, 9, 2):  # verdicts on some answers; one about an item that is not there
        tasks.append(_task(judge, "verdicts", f"item{i}:j", "sim:judge", {}, {"parsed": [True, 1, False][i % 3]},
                           row_id=f"item{i}", status="done" if i != 4 else "failed"))
    tasks.append(_task(judge, "verdicts", "zzz:j", "sim:judge", {}, {"parsed": True}, row_id="zzz"))
    responses = [tuple({"key": t[6], "provider": "sim", "model": t[3], "request_json": "{}", "response_text": "A",
                        "response_json": "{}", "finish_reason": "stop", "input_tokens": 10, "output_tokens": 2 + n % 5,
                        "cached_tokens": 0, "cost": 0.25, "latency": 0.5, "created": f"2024-01-0{1 + n % 3}",
                        "thinking": f"thought {n}" if n % 2 else None, "reasoning_tokens": n % 3 or None,
                        "reported_model": f"model-{n % 2}", "sent_with": None if n % 3 else "lean wire"}[c]
                       for c in RESPONSE_COLUMNS) for n, t in enumerate(tasks) if t[7] == "done"]
    ledger = [tuple({"run_id": run_id, "stage": t[1], "model": t[3], "key": t[6], "kind": "charge", "amount": 0.25,
                     "created": "2024-01-02T00:00:00", "tokens": 12, "tier": None,
                     "endpoint": "sim:b" if t[6] == "k1" else None}[c] for c in LEDGER_COLUMNS)
              for t in tasks[:6]]
    store.write_batch(tasks[:10], responses, ledger)
    store.write_batch(tasks[10:], [], [])
    store.write_batch([tasks[3]], [], [])  # a replaced row moves to the end, as INSERT OR REPLACE's new rowid
    store.reserve(run_id, "mc", "sim:a-model", "k-open", 0.5, worker="w1")
    store.reserve(run_id, "other", "sim:a-model", "k-other", 0.125)
    store.save_token_counts([("count-b", "anthropic", "claude-x", 12), ("count-a", "gemini", "gemini-y", 7)])
    store.save_token_counts([("count-a", "gemini", "gemini-y", 99)])  # a key counted again keeps its first count
    return run_id, judge


def _answers(store: Any, run_id: str, judge: str) -> dict[str, Any]:
    """Every question the report, replay, pipelines and the cost sums ask, with its answer."""
    out: dict[str, Any] = {}
    reads = Reads(store)
    pairs = [("mc", "sim:a-model"), ("mc", "sim:b-model"), ("other", "sim:a-model")]
    for stage, model in pairs:
        tag = f"{stage}/{model}"
        out[f"errors {tag}"] = reads.error_counts(run_id, stage, model)
        out[f"latencies {tag}"] = reads.latencies(run_id, stage, model)
        for axis in ("seed", "template", "missing"):
            out[f"by variant {axis} {tag}"] = reads.accuracy_by_variant(run_id, stage, model, axis)
        out[f"axes {tag}"] = reads.variant_axes(run_id, stage, model)
        out[f"gold types {tag}"] = reads.accuracy_by_gold_type(run_id, stage, model)
        out[f"letters {tag}"] = list(reads.letter_answers(run_id, stage, model))
    for stage in ("mc", "other", "none"):
        out[f"seeds {stage}"] = reads.seed_scores(run_id, stage)
        out[f"seeds ta {stage}"] = reads.seed_scores(run_id, stage, {"template": "ta"})
        out[f"seeds 2 {stage}"] = reads.seed_scores(run_id, stage, {"seed": 2, "template": "tc"})
        out[f"groups {stage}"] = reads.accuracy_groups(run_id, stage, ["$.variant.seed", "$.gold", "$.fields.bucket"])
        out[f"groups perm {stage}"] = reads.accuracy_groups(run_id, stage, ["$.permutation", "$.permutation[0]"])
        out[f"progress {stage}"] = store.stage_progress(run_id, stage)
        out[f"results {stage}"] = list(store.iter_results(run_id, stage))
        out[f"has {stage}"] = store.has_tasks(run_id, stage)
        out[f"count {stage}"] = reads.count_tasks(run_id, stage)
        out[f"done by model {stage}"] = store.done_by_model(run_id, stage)
        out[f"cost {stage}"] = store.stage_cost(run_id, stage)
        out[f"done items {stage}"] = sorted(store.done_items(run_id, stage, ["item1", "item3", "bad1", "nope"]))
    out["summaries"] = reads.group_summaries(run_id)
    out["kinds"] = reads.variant_kinds(run_id)
    out["unmatched"] = reads.unmatched_verdicts(judge, "verdicts", run_id, "mc")
    out["judged"] = reads.judged_groups(judge, "verdicts", ":j", run_id, "mc")
    out["tasks"] = [{k: v for k, v in row.items() if k != "updated"} for row in store.tasks(run_id)]
    out["failed tasks"] = [row["item"] for row in store.tasks(status="failed")]
    out["spent"] = store.spent(run_id)
    out["unsettled"] = reads.unsettled(run_id, True), reads.unsettled(run_id, False)
    out["charged"] = store.charged(run_id)
    out["ledger"] = [{k: v for k, v in row.items() if k not in ("id", "created")} for row in store.ledger(run_id)]
    for by in ("model", "job", "day", "endpoint"):
        out[f"ledger sums {by}"] = reads.ledger_sums(by, None), reads.ledger_sums(by, "2024-01-02")
        out[f"saved sums {by}"] = reads.saved_sums(by, None)
    out["runs"] = [{k: v for k, v in run.items() if k not in ("pid", "started")} for run in store.list_runs()]
    out["run by fragment"] = store.get_run("aaaa")["id"]
    out["running"] = [run for run, _ in reads.running_runs()]
    out["memo"] = sorted(store.memo_keys()), len(store.responses())
    out["history"] = reads.output_history("sim", "sim:a-model", 4, 1000)
    out["lookup"] = store.lookup("k-mc-item0-sim:a-model"), store.lookup_many(["k-mc-item0-sim:b-model", "x"])
    out["status"] = store.task_status(run_id, "mc", "item3"), store.task_status(run_id, "mc", "nope")
    out["token counts"] = store.token_counts(["count-a", "count-b", "count-none"]), store.token_counts([])
    # what-if pricing and ``runner explain`` (runner/report/whatif.py, explain.py)
    out["run requests"] = list(reads.run_requests(run_id)), list(reads.run_requests(run_id, requests=False))
    out["payers"] = reads.payers(["k-mc-item1-sim:a-model", "k-mc-item2-sim:b-model", "k-mc-item0-sim:a-model", "x"])
    out["item tasks"] = reads.item_tasks(run_id, "mc", "item2"), reads.item_tasks(judge, "verdicts", "item4")
    out["stored"] = (reads.stored_requests("mc", "sim:a-model"), reads.stored_requests("mc", None, before="2024-01-02"),
                     reads.stored_requests("mc", "sim:a-model", row_id="item1"))
    return out


def _typed(value: Any) -> Any:
    """A value with the type of each leaf (1 and 1.0 and True differ)."""
    if isinstance(value, dict):
        return {repr(_typed(k)): _typed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_typed(v) for v in value]
    if hasattr(value, "__dataclass_fields__"):
        return [type(value).__name__, _typed([getattr(value, f) for f in value.__dataclass_fields__])]
    return (type(value).__name__, value)


def test_every_answer_equals_sqlites_in_value_type_and_order(tmp_path: Path, pg_url: str) -> None:
    lite, post = open_store(tmp_path / "s.sqlite"), open_store(pg_url)
    run_lite, judge_lite = _fill(lite)
    run_post, judge_post = _fill(post)
    expected, got = _answers(lite, run_lite, judge_lite), _answers(post, run_post, judge_post)
    assert got.keys() == expected.keys()
    for name in expected:
        assert _typed(got[name]) == _typed(expected[name]), name
    # replay's copy and its sums, then everything again (the copies are new rows in both)
    assert _typed(post.copy_tasks(run_post, "mc", judge_post, "again")) == \
        _typed(lite.copy_tasks(run_lite, "mc", judge_lite, "again"))
    assert _typed(_answers(post, judge_post, run_post)) == _typed(_answers(lite, judge_lite, run_lite))


def _view_answers(store: Any) -> dict[str, Any]:
    """Every question ``runner view`` asks (runner/store/view_reads.py), with its answer, of a filled store with
    three runs in three statuses."""
    run_id, judge = _fill(store)
    store.set_run(judge, status="completed", finished="2024-01-06T00:00:00", message="done")
    job = json.dumps({"budget": {"usd": 2.5}, "models": ["sim:a-model"]})
    store.set_run(store.create_run("view_job%", "v.yaml", job, "fp", 3), id="20240101-000000-cccc",
                  created="2024-01-03", status="failed")
    reads, out = ViewReads(store), {}

    def runs(f: RunFilter) -> tuple[list[dict[str, Any]], int]:
        found, total = reads.runs(f)
        return [{k: v for k, v in run.items() if k not in ("pid", "started")} for run in found], total

    for sort in RUN_SORTS:
        for descending in (True, False):
            out[f"runs by {sort} {descending}"] = runs(RunFilter(sort=sort, descending=descending))
    out["runs again (settled figures)"] = runs(RunFilter())
    for name, f in (("text", RunFilter(text="aaaa")), ("wildcard", RunFilter(text="_job%")),
                    ("status", RunFilter(status="completed")), ("page", RunFilter(limit=1, offset=1)),
                    ("past the end", RunFilter(offset=5))):
        out[f"runs {name}"] = runs(f)
    out["statuses"] = reads.statuses()
    for name, a in (("all", AnswerFilter()), ("model", AnswerFilter(stage="mc", model="sim:a-model")),
                    ("failed", AnswerFilter(outcome="failed")), ("error", AnswerFilter(error_class="rate_limited")),
                    ("row", AnswerFilter(row="item3")), ("text", AnswerFilter(text='"gold":"yes"')),
                    ("page", AnswerFilter(limit=3, offset=2))):
        out[f"answers {name}"] = reads.answers(run_id, a)
    out["answers of the judge"] = reads.answers(judge, AnswerFilter(text="true"))
    out["facets"] = reads.facets(run_id), reads.facets(judge), reads.facets("no-run")
    for by in ("model", "job", "day"):
        out[f"savings {by}"] = reads.savings(by), reads.savings(by, "2024-01-02"), reads.savings(by, "2999-01-01")
    return out


def test_the_viewers_reads_equal_sqlites_in_value_type_and_order(tmp_path: Path, pg_url: str) -> None:
    expected, got = _view_answers(open_store(tmp_path / "s.sqlite")), _view_answers(open_store(pg_url))
    assert got.keys() == expected.keys()
    for name in expected:
        assert _typed(got[name]) == _typed(expected[name]), name
    assert expected["runs by started True"][1] == 3 and expected["runs wildcard"][1] == 1
    assert len(expected["answers all"][0]) == expected["answers all"][1] > len(expected["answers failed"][0]) == 2


def test_first_task_is_a_task_of_the_run(pg_url: str) -> None:
    store = open_store(pg_url)
    run_id, _ = _fill(store)
    item, row_id = Reads(store).first_task(run_id)
    assert store.task_status(run_id, "mc", item) is not None and item == row_id
    assert Reads(store).first_task("no-run") is None


def test_resolve_reservations_and_budget_sums_as_sqlite(tmp_path: Path, pg_url: str) -> None:
    answers = []
    for store in (open_store(tmp_path / "s.sqlite"), open_store(pg_url)):
        run_id, _ = _fill(store)
        store.reserve(run_id, "mc", "sim:b-model", "k-mc-item0-sim:b-model", 1.0, worker="w1")  # answered: settles
        kept = store.reserve(run_id, "mc", "sim:b-model", "k-none", 0.5)
        store.release(kept)
        use = sorted(store.conn.execute("SELECT scope, usd, inflight FROM budget_use").fetchall())
        resolved = store.resolve_reservations(run_id)
        after = sorted(store.conn.execute("SELECT scope, usd, inflight FROM budget_use").fetchall())
        answers.append(_typed([use, resolved, after, Reads(store).unsettled(run_id, False), store.spent(run_id)]))
    assert answers[0] == answers[1]


# -- the server's clock and locks ----------------------------------------------------------------------------------

def test_claims_leases_and_workers(pg_url: str) -> None:
    store = open_store(pg_url)
    run_id, _ = _fill(store)
    assert store.claim_keys(["a", "b", "a"], "w1", 30) == {"a", "b"}
    assert store.claim_keys(["a", "c"], "w2", 30) == {"c"}  # a is w1's, live
    assert store.claim_keys(["a"], "w1", 30) == {"a"}  # its own again
    store.claim_keys(["d"], "w3", -1)  # expired at once
    assert store.claim_keys(["d"], "w2", 30) == {"d"}
    store.release_keys(["a"], "w2")  # not w2's: stays
    assert store.claim_keys(["a"], "w2", 30) == set()
    store.write_batch([], [("a", "sim", "m", "{}", "A", "{}", "stop", 1, 1, 0, 0.0, 0.0, "x", None, 0, None, None)], [])
    assert store.claim_keys(["a"], "w2", 30) == {"a"}  # the answer's commit ended w1's claim

    assert store.claim_chunk(run_id, "mc", 0, "w1", 30) == "new"
    assert store.claim_chunk(run_id, "mc", 0, "w2", 30) is None
    assert store.claim_chunk(run_id, "mc", 0, "w1", 30) == "taken"  # its own, renewed
    assert store.claim_chunk(run_id, "mc", 1, "w3", -1) == "new"
    assert store.take_expired_chunk(run_id, "mc", "w2", 30) == 1
    assert store.take_expired_chunk(run_id, "mc", "w2", 30) is None
    assert store.open_chunks(run_id, "mc") == 2
    store.finish_chunks(run_id, "mc", "w2")
    assert store.open_chunks(run_id, "mc") == 1
    store.reset_chunks(run_id)
    assert store.open_chunks(run_id, "mc") == 0

    store.join_run(run_id, "w1", "host", 11, 30)
    store.join_run(run_id, "w2", "host", 12, -1)
    store.heartbeat("w1", 30)
    assert [(w["id"], w["state"]) for w in store.workers(run_id)] == [("w1", "live"), ("w2", "dead")]
    assert store.dead_workers(run_id) == ["w2"]
    store.reserve(run_id, "mc", "sim:a-model", "k-mc-item1-sim:a-model", 1.0, worker="w2")
    store.reserve(run_id, "mc", "sim:a-model", "never-answered", 1.0, worker="w2")
    assert store.resolve_worker(run_id, "w2") == 2  # another process's answer in the memo settles nothing of w2's
    assert store.dead_workers(run_id) == []
    store.leave_run("w1")
    assert [w["state"] for w in store.workers(run_id)] == ["left", "dead"]


def test_reservations_from_many_connections_never_overshoot(pg_url: str) -> None:
    """Eight processes' connections reserve 0.1 USD five times each against 1.0 USD: exactly ten fit."""
    stores = [open_store(pg_url) for _ in range(8)]
    run_id = stores[0].create_run("j", "j.yaml", "{}", "fp", 1)
    results: list[tuple] = []

    def reserve(store: Any) -> None:
        for n in range(5):
            results.append(store.reserve_within(run_id, "mc", "m", f"k{n}", 0.1, {"run": 1.0, "stage:mc": 5.0}))

    threads = [threading.Thread(target=reserve, args=(store,)) for store in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    fitted = [r for r in results if r[0] is not None]
    assert len(fitted) == 10
    assert {r[1:] for r in results if r[0] is None} == {("run", 10)}
    assert Reads(stores[0]).unsettled(run_id, True) == {("mc", "m"): (pytest.approx(1.0), 10)}
    for store in stores:
        store.close()


def test_one_store_shared_by_two_threads(pg_url: str) -> None:
    """Transactions from two threads on one connection never interleave (the store's lock)."""
    store = open_store(pg_url)
    run_id = store.create_run("j", "j.yaml", "{}", "fp", 1)
    errors: list[BaseException] = []

    def work(prefix: str) -> None:
        try:
            for n in range(40):
                key = f"{prefix}{n}"
                store.write_batch([_task(run_id, "mc", key, "m", {}, {})], [], [])
                assert store.reserve_within(run_id, "mc", "m", key, 0.01, {"run": 100.0})[0] is not None
                assert sum(1 for _ in store.iter_results(run_id, "mc")) >= n + 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(p,)) for p in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert Reads(store).count_tasks(run_id, "mc") == 80 and len(store.ledger(run_id)) == 80


def test_task_positions_are_read_in_commit_order_across_processes(pg_url: str) -> None:
    """Two processes write one run's tasks at once; a third reads them by position as they come
    (``stage_scores``, what an early-stopping worker reads of the others' answers). Process A's transaction draws
    its task's position first but commits last: B's write waits for it, so the reader, which had read up to what
    was committed, still reads A's task afterwards. (Before, B committed a later position first, the reader moved
    past A's, and a worker waited forever for an item another had answered: a flaky two-worker test.)"""
    a, b, reader = open_store(pg_url), open_store(pg_url), open_store(pg_url)
    run_id = a.create_run("j", "j.yaml", "{}", "fp", 2)
    inside, let_go = threading.Event(), threading.Event()

    def stalled_claims(tx: Any, keys: list[str], worker: str | None = None) -> None:  # after A's task is written
        inside.set()
        assert let_go.wait(30), "the test never let A's transaction commit"
    a.drop_claims = stalled_claims  # type: ignore[method-assign]
    response = tuple({"key": "k-mc-a-m", "provider": "sim", "model": "m", "request_json": "{}", "response_text": "A",
                      "response_json": "{}", "finish_reason": "stop", "input_tokens": 1, "output_tokens": 1,
                      "cached_tokens": 0, "cost": 0.0, "latency": 0.1, "created": "2024-01-01", "thinking": None,
                      "reasoning_tokens": None, "reported_model": None, "sent_with": None}[c] for c in RESPONSE_COLUMNS)
    writers = [threading.Thread(target=a.write_batch, args=([_task(run_id, "mc", "a", "m", {}, {})], [response], [])),
               threading.Thread(target=b.write_batch, args=([_task(run_id, "mc", "b", "m", {}, {})], [], []))]
    writers[0].start()
    assert inside.wait(30), "A's transaction never reached its commit"
    writers[1].start()
    writers[1].join(1.0)  # B waits for A's transaction (before, it committed within milliseconds)
    seen: list[str] = []
    position, rows = reader.stage_scores(run_id, "mc", 0)
    seen += [row["item"] for row in rows]
    let_go.set()
    for writer in writers:
        writer.join(30)
        assert not writer.is_alive(), "a write never ended"
    position, rows = reader.stage_scores(run_id, "mc", position)
    seen += [row["item"] for row in rows]
    assert sorted(seen) == ["a", "b"], f"the reader read {seen} by position"
    for store in (a, b, reader):
        store.close()


def test_results_stream_through_a_server_cursor(pg_url: str) -> None:
    store = open_store(pg_url)
    run_id = store.create_run("j", "j.yaml", "{}", "fp", 1)
    store.write_batch([_task(run_id, "mc", f"i{n:05}", "m", {}, {"n": n}) for n in range(5000)], [], [])
    lines = store.iter_results(run_id, "mc")
    assert json.loads(next(lines)) == {"n": 0}
    store.write_batch([_task(run_id, "mc", "late", "m", {}, {"n": -1})], [], [])  # the stream is a snapshot
    assert [json.loads(line)["n"] for line in lines] == list(range(1, 5000))


# -- a whole job on PostgreSQL through the CLI ------------------------------------------------------------------

def _normalized(text: str, run_id: str) -> str:
    """A report without what differs between two runs of one job: the run id, latencies and time stamps."""
    data = json.loads(text.replace(run_id, "RUN"))

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items()
                    if not any(part in k for part in ("latency", "created", "started", "finished", "duration",
                                                      "elapsed", "updated"))}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return json.dumps(strip(data), sort_keys=True)


def _text(text: str, run_id: str) -> str:
    text = text.replace(run_id, "RUN")
    return re.sub(r"\b\d+(\.\d+)?\s?(ms|s)\b", "T", text)


def test_a_job_on_postgres_reports_as_on_sqlite(tmp_path: Path, pg_server: pg.PgServer, sim_server: str,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    dataset = write_rows(tmp_path / "rows.jsonl", 12)
    extra = (f"providers: {{sim: {{base_url: {json.dumps(sim_server)}, concurrency: 8, timeout: 5}}}}\n"
             "prices: {sim:gpt-sim: {input: 1.0, output: 2.0}}")
    job = write_job(tmp_path / "job.yaml", dataset, models=["sim:gpt-sim"], extra=extra, seeds="[0, 1]")
    url = pg_server.new_database()
    reports = {}
    for db in (str(tmp_path / "s.sqlite"), url):
        code, out, err = run_cli(monkeypatch, capsys, "submit", str(job), "--db", db)
        assert code == 0, err
        run_id = re.search(r"run (\d{8}-\d{6}-[0-9a-f]{4}): completed", out).group(1)
        _, as_json, err = run_cli(monkeypatch, capsys, "report", run_id, "--db", db, "--format", "json")
        _, as_text, _ = run_cli(monkeypatch, capsys, "report", run_id, "--db", db)
        reports[db] = (_normalized(as_json, run_id), _text(as_text, run_id))
    assert reports[url] == reports[str(tmp_path / "s.sqlite")]

    code, out, err = run_cli(monkeypatch, capsys, "submit", str(job), "--db", url)
    assert code == 0, err
    assert "0 sent, 24 cache hits = 100.0%" in out, out
    store = open_store(url)
    assert isinstance(store, PostgresStore) and len(store.list_runs()) == 2
    lite = open_store(tmp_path / "s.sqlite")
    assert isinstance(lite, SQLiteStore)
    # the memo holds the same distinct requests (two seeds may show a row's options in the same order)
    assert sorted(r["key"] for r in store.responses()) == sorted(r["key"] for r in lite.responses())
    store.close()


# -- a worker stopped inside a transaction --------------------------------------------------------------------------

_STOPPED_INSIDE = r"""
import os, signal, sys
import psycopg
from runner.store import open_store

url, run_id = sys.argv[1], sys.argv[2]
store = open_store(url)
store.join_run(run_id, "victim", "h", os.getpid(), 4.0)  # a 4 s lease: transactions idle past 1 s are ended
execute = psycopg.Connection.execute
stopped = []

def execute_then_stop(self, query, *args, **kwargs):
    cursor = execute(self, query, *args, **kwargs)
    if "pg_advisory_xact_lock" in str(query) and not stopped:  # the run's reservation lock is held: stop here
        stopped.append(True)
        print("locked", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    return cursor

psycopg.Connection.execute = execute_then_stop
got = store.reserve_within(run_id, "mc", "sim:m", "victim-key", 0.25, {"run": 10.0}, "victim")
print("reserved", got[0] is not None, flush=True)
"""


def test_a_worker_stopped_inside_a_transaction_holds_no_lock_past_its_bound(pg_url: str, tmp_path: Path) -> None:
    """A worker stopped (SIGSTOP) while it holds the run's reservation lock: the server ends its idle transaction
    within the bound (a quarter of its lease), so another worker's reservation goes through instead of waiting for
    ever; woken, the stopped worker connects again and runs its whole reservation again, and each is in the ledger
    once."""
    store = open_store(pg_url)
    run_id = store.create_run("j", "j.yaml", "{}", "fp", 2)
    store.join_run(run_id, "other", "h", 1, 4.0)
    store.conn.execute("SET statement_timeout = '30s'")  # without the bound this would wait for ever: fail instead
    script = tmp_path / "victim.py"
    script.write_text(_STOPPED_INSIDE)
    victim = subprocess.Popen([sys.executable, str(script), pg_url, run_id], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert victim.stdout is not None and victim.stdout.readline().strip() == "locked"
        started = time.monotonic()
        ledger_id, blocked, _ = store.reserve_within(run_id, "mc", "sim:m", "other-key", 0.25, {"run": 10.0}, "other")
        waited = time.monotonic() - started
        assert ledger_id is not None and blocked is None
        assert 0.5 < waited < 10, waited  # it waited for the server to end the stopped transaction, not for ever
    finally:
        victim.send_signal(subprocess.signal.SIGCONT)
    out, err = victim.communicate(timeout=60)
    assert victim.returncode == 0, err
    assert out.strip() == "reserved True", (out, err)
    keys = sorted(row["key"] for row in store.ledger(run_id, kind="reserved"))
    assert keys == ["other-key", "victim-key"]
    store.close()


def test_a_write_whose_transaction_the_server_ended_runs_again_whole(pg_url: str, monkeypatch) -> None:
    """A worker paused inside its fenced write (after the fence check, before the batched inserts): the server ends
    the idle transaction, the write connects again and runs whole, once: one task row, one charge, the reservation
    released."""
    from runner.store.base import Finished
    from runner.store.fencing import Fence

    store = open_store(pg_url)
    run_id = store.create_run("j", "j.yaml", "{}", "fp", 1)
    store.join_run(run_id, "w1", "h", 1, 4.0)  # transactions idle past 1 s are ended
    assert store.lease_chunks(run_id, "mc", [0], "w1", 30) == {0: ("new", 1)}
    fence = Fence("w1", run_id, "mc", 0, 1)
    reserved = store.reserve_within(run_id, "mc", "sim:m", "k1", 0.5, {"run": 10.0}, "w1", fence=fence)[0]
    holds, pauses = PostgresStore.holds, []

    def pausing(self, tx, fence):
        held = holds(self, tx, fence)
        if not pauses:  # the first time only: as a process stopped here and woken 1.5 s later
            pauses.append(True)
            time.sleep(1.5)
        return held

    monkeypatch.setattr(PostgresStore, "holds", pausing)
    task = (run_id, "mc", "i1", "sim:m", "r1", "{}", "k1", "done", 0, 1, None, None, 1, 1, 0.25, 0.1, None, 1, "{}",
            0, 0.0, None, 0.0)
    response = ("k1", "sim", "m", "{}", "A", "{}", "stop", 1, 1, 0, 0.25, 0.1, "x", None, 0, None, None)
    charge = (run_id, "mc", "sim:m", "k1", "charge", 0.25, "2026-01-01T00:00:00", 2, None, None)
    item = Finished(task=task, response=response, ledger=charge, stage="mc", release_id=reserved, fence=fence)
    assert store.write_finished([item]) == [item]
    assert pauses == [True]
    assert [t["status"] for t in store.tasks(run_id)] == ["done"]
    assert [(row["kind"], row["amount"]) for row in store.ledger(run_id)] == [("charge", 0.25)]
    store.close()


# -- a session the server ends: connected again within RUNNER_STORE_WAIT, only what is safe done again --------------

def _end_session(pg_server: pg.PgServer, store: PostgresStore, *, shut: bool = False) -> None:
    """End ``store``'s session on the server, as ``pg_terminate_backend`` or a restart does; ``shut``: and take no
    new connection to its database until :func:`_open`."""
    import psycopg

    pid = store.conn.info.backend_pid
    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as admin:
        if shut:
            admin.execute(f"ALTER DATABASE {pg.TEST_DB} ALLOW_CONNECTIONS false")
        assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
        while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
            time.sleep(0.01)  # the backend has gone, its goodbye is on this process's socket


def _open(pg_server: pg.PgServer) -> None:
    import psycopg

    with psycopg.connect(pg_server.url("postgres"), autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {pg.TEST_DB} ALLOW_CONNECTIONS true")


def test_a_write_after_the_server_ended_the_idle_session_goes_once_on_a_new_one(pg_server: pg.PgServer,
                                                                              pg_url: str) -> None:
    """The usual case: the server ends a session between two statements. The next one, a write that would be
    wrong twice (a reservation is a new ledger row), goes on a new session, once."""
    store = open_store(pg_url)
    assert isinstance(store, PostgresStore)
    run_id = store.create_run("j", "j.yaml", "{}", "fp", 1)
    before = store.conn.info.backend_pid
    _end_session(pg_server, store)
    store.reserve(run_id, "mc", "sim:m", "k1", 0.5)
    assert store.conn.info.backend_pid != before
    assert [row["key"] for row in store.ledger(run_id)] == ["k1"]
    store.close()


def test_a_transaction_cut_before_its_commit_runs_again_whole(pg_server: pg.PgServer, pg_url: str) -> None:
    store = open_store(pg_url)
    assert isinstance(store, PostgresStore)
    run_id = store.create_run("j", "j.yaml", "{}", "fp", 1)
    attempts: list[int] = []

    def body(tx: Any) -> None:
        attempts.append(store.conn.info.backend_pid)
        tx.execute("INSERT INTO ledger (run_id, stage, model, key, kind, amount, created) VALUES"
                   " (?, 'mc', 'sim:m', 'k1', 'charge', 0.25, 'now')", (run_id,))
        if len(attempts) == 1:
            _end_session(pg_server, store)  # cut inside the transaction, its insert not committed
        tx.execute("SELECT 1")

    store.atomic(body)
    assert len(attempts) == 2 and attempts[0] != attempts[1]
    assert [(row["key"], row["kind"]) for row in store.ledger(run_id)] == [("k1", "charge")]
    store.close()


def test_a_statement_cut_by_the_server_is_sent_again_on_a_new_session(pg_server: pg.PgServer, pg_url: str) -> None:
    """A session ended while a statement runs: a read is sent again on a new session; so is a write, which runs as
    a transaction that did not commit (a write cut at its COMMIT: tests/store/test_pg_commit_cut.py)."""
    import psycopg

    store = open_store(pg_url)
    assert isinstance(store, PostgresStore)
    run_id = store.create_run("j", "j.yaml", "{}", "fp", 1)

    def end_soon() -> threading.Thread:
        pid = store.conn.info.backend_pid

        def end() -> None:
            with psycopg.connect(pg_server.url("postgres"), autocommit=True) as admin:
                while not admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s AND query LIKE %s",
                                        (pid, "%pg_sleep%")).fetchone():
                    time.sleep(0.01)
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        thread = threading.Thread(target=end)
        thread.start()
        return thread

    ender = end_soon()
    assert store.rows("SELECT count(*) FROM runs, pg_sleep(2) WHERE id = ?", (run_id,)) == [(1,)]
    ender.join()
    ender = end_soon()
    assert store.execute("UPDATE runs SET status = 'x' FROM pg_sleep(2) WHERE id = ?", (run_id,)) == 1
    ender.join()
    assert store.get_run(run_id)["status"] == "x"
    store.close()


def test_a_server_back_within_the_wait_is_connected_to_again(pg_server: pg.PgServer, pg_url: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNNER_STORE_WAIT", "20")
    store = open_store(pg_url)
    assert isinstance(store, PostgresStore)
    run_id = store.create_run("j", "j.yaml", "{}", "fp", 1)
    _end_session(pg_server, store, shut=True)
    opener = threading.Timer(1.0, _open, (pg_server,))
    opener.start()
    try:
        started = time.monotonic()
        store.reserve(run_id, "mc", "sim:m", "k1", 0.5)
        waited = time.monotonic() - started
    finally:
        opener.join()
    assert 0.9 < waited < 10, waited
    assert [row["key"] for row in store.ledger(run_id)] == ["k1"]
    store.close()


def test_a_server_not_back_within_the_wait_ends_in_one_sentence(pg_server: pg.PgServer, pg_url: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import psycopg

    monkeypatch.setenv("RUNNER_STORE_WAIT", "1.5")
    store = open_store(pg_url)
    assert isinstance(store, PostgresStore)
    run_id = store.create_run("j", "j.yaml", "{}", "fp", 1)
    _end_session(pg_server, store, shut=True)
    try:
        started = time.monotonic()
        with pytest.raises(psycopg.OperationalError) as info:
            store.reserve(run_id, "mc", "sim:m", "k1", 0.5)
        waited = time.monotonic() - started
    finally:
        _open(pg_server)
    assert 1.0 < waited < 5, waited
    said = store.failure(info.value, run_id)
    assert said is not None and said.startswith(f"the PostgreSQL store {store.path} went away (") and \
        said.endswith(f"once the server is back, `runner resume {run_id}` (with the same --db or RUNNER_DB) "
                      "continues the run")
    assert [row["key"] for row in store.ledger(run_id)] == []  # the server is back: nothing was written
    store.close()
