"""The recorder's typed rows: their fields are the store's columns in order, and a fresh answer, a cache hit and a
billed refusal recorded through it read back from the store with the values that went in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.engine.control import RunControl
from runner.engine.leases import ChunkLeases
from runner.engine.recorder import Recorder
from runner.engine.reserver import Reserver
from runner.engine.stats import RunStats
from runner.engine.triage import Triage
from runner.errors import Refused
from runner.plan.stage import StagePlan
from runner.providers.base import Completion
from runner.spec.job import load_job
from runner.store import CachedResponse, LedgerRow, ResponseRow, TaskRow, Writer, open_store
from runner.store.base import LEDGER_COLUMNS, RESPONSE_COLUMNS, TASK_COLUMNS
from tests.helpers import write_job, write_rows

#: USD per million tokens
PRICE_IN, PRICE_OUT = 1000.0, 3000.0


def test_each_rows_fields_are_columns_of_its_table_in_a_fresh_store(tmp_path: Path):
    """The rows are written by column name (the store's INSERTs list the fields), so every field must be a column of
    the table the migrations made; a renamed column fails here, not in a run."""
    store = open_store(tmp_path / "store.sqlite")
    try:
        for row, table in ((TaskRow, "tasks"), (ResponseRow, "responses"), (LedgerRow, "ledger")):
            columns = {r[1] for r in store.conn.execute(f"PRAGMA table_info({table})")}
            assert set(row._fields) <= columns, (table, set(row._fields) - columns)
    finally:
        store.close()
    assert (TASK_COLUMNS, RESPONSE_COLUMNS, LEDGER_COLUMNS) == (TaskRow._fields, ResponseRow._fields,
                                                                LedgerRow._fields)


def test_a_row_is_the_parameter_tuple_in_field_order():
    row = LedgerRow(run_id="r", stage="s", model="m", key="k", kind="charge", amount=0.5, created="t", tokens=9,
                    tier="flex", endpoint="sim:b")
    assert row == ("r", "s", "m", "k", "charge", 0.5, "t", 9, "flex", "sim:b") and row.amount == 0.5
    # a row written by an earlier version (unstored answers saved aside, runner/store/writer.py) has no tokens: 0,
    # no service tier and no pooled endpoint
    assert LedgerRow(*row[:7]).tokens == 0 and LedgerRow(*row[:8]).tier is None and LedgerRow(*row[:9]).endpoint is None
    values = {name: f"v{n}" for n, name in enumerate(RESPONSE_COLUMNS)}
    assert ResponseRow(**values) == tuple(values[c] for c in RESPONSE_COLUMNS)


async def test_recorded_rows_read_back_from_the_store_with_the_same_values(tmp_path: Path, fake_provider):
    path = write_job(tmp_path / "job.yaml", write_rows(tmp_path / "rows.jsonl", 3), models=["fake:m1"],
                     extra=f"prices: {{fake:m1: {{input: {PRICE_IN}, output: {PRICE_OUT}}}}}\nbudget: {{usd: 10}}")
    job = load_job(path)
    store = open_store(tmp_path / "store.sqlite")
    run_id = store.create_run(job.name, job.path, job.model_dump_json(), job.fingerprint(), 3)
    stats, control = RunStats(), RunControl()
    leases = ChunkLeases(stats)
    triage = Triage(store, run_id, stats)
    reserver = Reserver(run_id=run_id, job=job, store=store, stats=stats, control=control, leases=leases)
    writer = Writer(store, lambda batch: None)
    recorder = Recorder(run_id=run_id, job=job, stats=stats, writer=writer, reserver=reserver, triage=triage,
                        leases=leases, provenance=lambda task: {"run_id": run_id})
    answered, hit, refused = list(StagePlan(job, job.stages[0]))
    writer.start()

    held = await reserver.reserve(answered)
    answer = Completion(text="B", finish_reason="stop", input_tokens=12, output_tokens=3, raw={"id": "x"},
                        thinking="think first", reasoning_tokens=2, reported_model="m1-2026-01-01",
                        sent_with="lean wire")
    recorder.fresh(answered, answer, 2, 0.25, held)
    memo = CachedResponse("C", "stop", 20, 1, 4, 0.5, None, 0, "m1-2025-12-01", "fake-sdk 1.0")
    recorder.cached(hit, memo)
    refusal_held = await reserver.reserve(refused)
    bill = Completion(text="", input_tokens=7, output_tokens=5, cached_tokens=1)
    recorder.failed(refused, Refused("declined", billed=bill), 1, refusal_held.ledger_id, reservation=refusal_held)
    await writer.close()

    def usd(input_tokens: int, output_tokens: int, cached: int = 0) -> float:
        return reserver.pricing.cost("fake:m1", input_tokens, output_tokens, cached)

    rows = {row["item"]: row for row in store.tasks(run_id)}
    assert {k: rows[answered.item][k] for k in ("key", "status", "cache_hit", "attempts", "input_tokens",
                                                 "output_tokens", "cost", "latency", "valid", "saved")} == {
        "key": answered.key, "status": "done", "cache_hit": 0, "attempts": 2, "input_tokens": 12,
        "output_tokens": 3, "cost": pytest.approx(usd(12, 3)), "latency": 0.25, "valid": 1, "saved": 0.0}
    assert {k: rows[hit.item][k] for k in ("status", "cache_hit", "attempts", "input_tokens", "output_tokens",
                                            "cached_tokens", "cost", "saved")} == {
        "status": "done", "cache_hit": 1, "attempts": 0, "input_tokens": 20, "output_tokens": 1, "cached_tokens": 4,
        "cost": 0.0, "saved": pytest.approx(usd(20, 1, 4))}
    assert {k: rows[refused.item][k] for k in ("status", "error_class", "error", "input_tokens", "output_tokens",
                                                "cached_tokens", "cost", "score", "valid")} == {
        "status": "failed", "error_class": "refused", "error": "declined", "input_tokens": 7, "output_tokens": 5,
        "cached_tokens": 1, "cost": pytest.approx(usd(7, 5, 1)), "score": None, "valid": 0}
    # every column of the two rows the recorder builds positionally (an answer's and a hit's), by name
    for task, cache_hit, attempts, tokens, cost, latency, saved in (
            (answered, 0, 2, (12, 3, 0), pytest.approx(usd(12, 3)), 0.25, 0.0),
            (hit, 1, 0, (20, 1, 4), 0.0, None, pytest.approx(usd(20, 1, 4)))):
        row = rows[task.item]
        line = json.loads(row["result_json"])
        assert {c: row[c] for c in TASK_COLUMNS} == {
            "run_id": run_id, "stage": "mc", "item": task.item, "model": "fake:m1", "row_id": task.row_id,
            "variant_json": task.variant_json, "key": task.key, "status": "done", "cache_hit": cache_hit,
            "attempts": attempts, "error_class": None, "error": None, "input_tokens": tokens[0],
            "output_tokens": tokens[1], "cost": cost, "latency": latency, "score": line["score"],
            "valid": int(line["valid"]), "result_json": row["result_json"], "cached_tokens": tokens[2],
            "saved": saved, "batch_saved": None, "cache_saved": 0.0}
        assert (line["cache_key"], line["cache_hit"]) == (task.key, bool(cache_hit))
    (memo_row,) = store.responses()  # the answer's memo row, every column by name (a hit writes none)
    assert {c: memo_row[c] for c in RESPONSE_COLUMNS if c != "created"} == {
        "key": answered.key, "provider": "fake", "model": answered.call.model_id,
        "request_json": answered.call.canonical, "response_text": "B", "response_json": '{"id":"x"}',
        "finish_reason": "stop", "input_tokens": 12, "output_tokens": 3, "cached_tokens": 0,
        "cost": pytest.approx(usd(12, 3)), "latency": 0.25, "thinking": "think first", "reasoning_tokens": 2,
        "reported_model": "m1-2026-01-01", "sent_with": "lean wire"}
    assert memo_row["created"].startswith("20")
    # each line's provenance says what produced its answer: the fresh one's, the memo's for the hit
    assert {item: {k: json.loads(rows[item]["result_json"])["provenance"].get(k) for k in ("reported_model",
                                                                                         "sent_with")}
            for item in (answered.item, hit.item, refused.item)} == {
        answered.item: {"reported_model": "m1-2026-01-01", "sent_with": "lean wire"},
        hit.item: {"reported_model": "m1-2025-12-01", "sent_with": "fake-sdk 1.0"},
        refused.item: {"reported_model": None, "sent_with": None}}

    stored = store.lookup_many([answered.key])[answered.key]
    assert stored == CachedResponse("B", "stop", 12, 3, 0, pytest.approx(usd(12, 3)), "think first", 2,
                                    "m1-2026-01-01", "lean wire")
    assert hit.key not in store.lookup_many([hit.key])  # a cache hit writes no memo row
    charges = sorted((row["key"], row["amount"], row["tokens"]) for row in store.ledger(run_id, kind="charge"))
    assert charges == sorted([(answered.key, pytest.approx(usd(12, 3)), 15),
                              (refused.key, pytest.approx(usd(7, 5, 1)), 12)])
    assert store.ledger(run_id, kind="reserved") == []  # both reservations became charges in the same commit
    run = reserver.budgets.run  # type: ignore[union-attr]
    assert (run.spent_usd, run.reserved_usd, run.inflight) == (pytest.approx(usd(12, 3) + usd(7, 5, 1)), 0.0, 0)
    counters = stats.counters("mc", "fake:m1")
    assert (counters.done, counters.sent, counters.cache_hits, counters.errors, counters.refused) == (3, 1, 1, 1, 1)
    assert triage.answered(answered.key) == stored  # a repeat of the request is not sent again
