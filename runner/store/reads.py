"""The read side: the questions the reports, the estimate and the cost sums ask of a store, written once for
SQLite and PostgreSQL (spelled through :mod:`runner.store.dialect`). The engine never asks them, so they are not
part of :class:`~runner.store.base.Store`; ``runner/report/*`` ask ``Reads(store)`` (the viewer's paged reads are
:mod:`runner.store.view_reads`).

It lives in the store package, not in ``runner/report/``, because its SQL depends on the schema and the dialects
as the store's own queries do: a migration and the queries that read its tables change together, in one place.

Grouped answers are in SQLite's order (NULL, then numbers, then text in code point order), JSON values as SQLite's
json_extract gives them (true as 1, an object or array as its compact text), on both databases.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from runner.store.base import Store
from runner.store.dialect import sql_value, sqlite_sorted, zero
from runner.store.sql import SQLStore

#: the group of ledger and task rows whose run is gone, in ``runner costs --by job``
UNKNOWN_JOB = "(unknown run)"
#: how ``runner costs --by`` groups ledger rows and task rows
_GROUP_SQL = {
    "model": ("l.model", "t.model"),
    "job": (f"coalesce(r.job_name, '{UNKNOWN_JOB}')", f"coalesce(r.job_name, '{UNKNOWN_JOB}')"),
    "day": ("substr(l.created, 1, 10)", "substr(t.updated, 1, 10)"),
    # a pooled model's charges per endpoint that answered them (runner/engine/pools.py); a cache hit is no endpoint's
    "endpoint": ("coalesce(l.model || ' at ' || l.endpoint, l.model)", "t.model"),
}
#: the scored tasks of one stage and model
_SCORED = " FROM tasks WHERE run_id = ? AND stage = ? AND model = ? AND score IS NOT NULL"


@dataclass(slots=True)
class GroupSummary:
    """One stage and model of a run, summed over its tasks (the report's row before derived figures)."""

    stage: str
    model: str
    requests: int
    done: int
    failed: int
    cache_hits: int
    input_tokens: int
    output_tokens: int
    cost: float
    scored: int
    invalid: int
    accuracy: float | None
    cached_input_tokens: int
    saved: float
    #: tasks answered through a Batch API, and what its price saved against the standard one
    batched: int = 0
    batch_saved: float = 0.0
    #: output tokens the requests sent spent thinking (in ``output_tokens`` too), from the memo
    reasoning_tokens: int = 0
    #: what the provider's prompt cache saved (net of its write premium)
    cache_saved: float = 0.0


class Reads:
    """The report's questions of one store."""

    def __init__(self, store: Store) -> None:
        assert isinstance(store, SQLStore), "the reads are SQL: a store of runner/store/sqlite.py or postgres.py"
        self.store = store
        self.dialect = store.dialect

    # -- the memo and the runs ----------------------------------------------------------------------------
    def request_texts(self, keys: list[str]) -> dict[str, str]:
        """The stored request (canonical JSON: messages, model, parameters) of several memo keys, in one query
        per chunk of keys; keys without a memo row are left out (the HTML report's samples)."""
        found: dict[str, str] = {}
        for start in range(0, len(keys), 500):
            where, args = self.dialect.in_list("key", keys[start:start + 500])
            found.update(self.store.rows(f"SELECT key, request_json FROM responses WHERE {where}", args))
        return found

    def output_history(self, provider: str, model_id: str, cap: int, sample: int) -> tuple[int, float]:
        """(count, mean output tokens, each capped at ``cap``) of up to ``sample`` stored responses of a model."""
        n, mean = self.store.row(
            "SELECT count(*), CAST(avg(CASE WHEN output_tokens < ? THEN output_tokens ELSE ? END) AS DOUBLE PRECISION)"
            " FROM (SELECT output_tokens FROM responses WHERE provider = ? AND model = ?"
            " AND output_tokens IS NOT NULL LIMIT ?) s", (cap, cap, provider, model_id, sample))
        return int(n or 0), float(mean or 0.0)

    def running_runs(self) -> list[tuple[str, int | None]]:
        """(run id, pid) of the runs whose status is ``running``."""
        return [(run_id, pid) for run_id, pid in self.store.rows("SELECT id, pid FROM runs WHERE status = 'running'")]

    # -- money ------------------------------------------------------------------------------------------
    def unsettled(self, run_id: str, include_reserved: bool) -> dict[tuple[str, str], tuple[float, int]]:
        """Per (stage, model), (USD, requests) possibly billed; ``include_reserved`` counts reservations still
        open (a run that is not live any more) as possibly billed too."""
        kinds = "('possibly_billed', 'reserved')" if include_reserved else "('possibly_billed')"
        found = self.store.rows(f"SELECT stage, model, sum(amount), count(*) FROM ledger WHERE run_id = ? AND kind IN"
                                f" {kinds} GROUP BY stage, model", (run_id,))
        return {(stage, model): (usd, n) for stage, model, usd, n in sqlite_sorted(found, 2)}

    def stored_prompt_costs(self, run_id: str) -> dict[tuple[str, str], float]:
        """Per (stage, model), what the prompt prefixes the run stored at the provider cost: their creation and
        storage, less the storage given back when they were deleted early (runner/engine/stored_prompts.py)."""
        return {(stage, model): zero(usd) for stage, model, usd in self.store.rows(
            "SELECT stage, model, sum(amount) FROM ledger WHERE run_id = ? AND kind = 'charge' AND key LIKE ?"
            " GROUP BY stage, model", (run_id, "stored-prompt:%"))}

    def ledger_sums(self, by: str, since: str | None) -> list[tuple[str | None, str, str, int, float]]:
        """(group, run id, kind, rows, USD) of the ledger grouped by ``by`` (model, job, day or endpoint: a pooled
        model's ``MODEL at LABEL``), from ``since``. A
        charge of tokens alone (an answer that cost nothing, kept for a token budget) is not counted as a row."""
        where, params = ("WHERE l.created >= ?", [since]) if since else ("", [])
        found = self.store.rows(f"SELECT {_GROUP_SQL[by][0]}, l.run_id, l.kind,"
                                " count(CASE WHEN l.kind != 'charge' OR l.amount > 0 THEN 1 END), sum(l.amount)"
                                f" FROM ledger l LEFT JOIN runs r ON r.id = l.run_id {where} GROUP BY 1, 2, 3", params)
        return sqlite_sorted([(*row[:4], zero(row[4])) for row in found], 3)

    def saved_sums(self, by: str, since: str | None) -> list[tuple[str | None, str, int, float]]:
        """(group, run id, cache hits, USD saved) of tasks that saved money, grouped as :meth:`ledger_sums`."""
        where, params = ("AND t.updated >= ?", [since]) if since else ("", [])
        return sqlite_sorted(self.store.rows(
            f"SELECT {_GROUP_SQL[by][1]}, t.run_id, count(*), sum(t.saved) FROM tasks t"
            f" LEFT JOIN runs r ON r.id = t.run_id WHERE t.cache_hit = 1 AND t.saved > 0 {where} GROUP BY 1, 2",
            params), 2)

    # -- a run's tasks ------------------------------------------------------------------------------------
    def group_summaries(self, run_id: str) -> list[GroupSummary]:
        """Per stage and model of a run, in the order they first finished a task: sums over its tasks."""
        n = self.dialect.as_int.format
        done, failed, invalid = n("t.status = 'done'"), n("t.status = 'failed'"), n("t.status = 'done' AND t.valid = 0")
        sent = "CASE WHEN t.cache_hit = 0 THEN t.{} ELSE 0 END".format
        # reasoning tokens of the requests sent come from their memo rows (a primary-key lookup per sent task)
        found = self.store.rows(
            f"SELECT t.stage, t.model, count(*), sum({done}), sum({failed}), CAST(sum(t.cache_hit) AS BIGINT),"
            f" CAST(sum({sent('input_tokens')}) AS BIGINT), CAST(sum({sent('output_tokens')}) AS BIGINT),"
            f" sum(t.cost), count(t.score), sum({invalid}), avg(t.score),"
            f" CAST(coalesce(sum({sent('cached_tokens')}), 0) AS BIGINT), sum(t.saved), count(t.batch_saved),"
            " sum(t.batch_saved), CAST(coalesce(sum(r.reasoning_tokens), 0) AS BIGINT), sum(t.cache_saved)"
            " FROM tasks t LEFT JOIN responses r ON t.cache_hit = 0 AND t.status = 'done' AND r.key = t.key"
            f" WHERE t.run_id = ? GROUP BY t.stage, t.model ORDER BY min(t.{self.dialect.task_order})", (run_id,))
        return [GroupSummary(*row[:8], zero(row[8]), *row[9:13], zero(row[13]), row[14], zero(row[15]),
                             int(row[16]), zero(row[17])) for row in found]

    def error_counts(self, run_id: str, stage: str, model: str) -> dict[str, int]:
        """Failed tasks by error class."""
        return dict(self.store.rows(
            "SELECT error_class, count(*) FROM tasks WHERE run_id = ? AND stage = ? AND model = ?"
            f" AND status = 'failed' GROUP BY error_class ORDER BY error_class{self.dialect.text_order} NULLS FIRST",
            (run_id, stage, model)))

    def served_tiers(self, run_id: str) -> list[tuple[str, str, str, int, float]]:
        """(stage, model, tier, charges, USD) of the run's charges by the service tier they were served and priced
        at (runner/engine/tiers.py); charges without a tier are left out."""
        return sorted((stage, model, tier, int(n), float(usd or 0.0)) for stage, model, tier, n, usd in self.store.rows(
            "SELECT stage, model, tier, count(*), sum(amount) FROM ledger WHERE run_id = ? AND kind = 'charge'"
            " AND tier IS NOT NULL GROUP BY stage, model, tier", (run_id,)))

    def mode_usage(self, run_id: str) -> list[tuple[str, str, str, int, int, float, int, int]]:
        """(stage, model, mode, input tokens, requests, USD, cached input tokens, output tokens) of the run's
        requests sent and answered, by the way each went (batch: through a Batch API; else the service tier its
        charge was served at, standard where none was asked) and by input tokens (a price may depend on them)."""
        found = self.store.rows(
            "SELECT t.stage, t.model, CASE WHEN t.batch_saved IS NOT NULL THEN 'batch' ELSE"
            " coalesce(l.tier, 'standard') END, coalesce(t.input_tokens, 0), count(*), sum(t.cost),"
            " CAST(sum(coalesce(t.cached_tokens, 0)) AS BIGINT), CAST(sum(coalesce(t.output_tokens, 0)) AS BIGINT)"
            " FROM tasks t LEFT JOIN (SELECT key, max(tier) AS tier FROM ledger WHERE run_id = ? AND kind = 'charge'"
            " GROUP BY key) l ON l.key = t.key WHERE t.run_id = ? AND t.status = 'done' AND t.cache_hit = 0"
            " GROUP BY 1, 2, 3, 4", (run_id, run_id))
        return sqlite_sorted([(stage, model, mode, int(tokens), int(k), zero(usd), int(cached or 0), int(out or 0))
                              for stage, model, mode, tokens, k, usd, cached, out in found], 4)

    def latencies(self, run_id: str, stage: str, model: str) -> list[float]:
        """The latencies of the requests sent, ascending."""
        return [latency for (latency,) in self.store.rows(
            "SELECT latency FROM tasks WHERE run_id = ? AND stage = ? AND model = ? AND latency IS NOT NULL"
            " ORDER BY latency", (run_id, stage, model))]

    def accuracy_by_variant(self, run_id: str, stage: str, model: str, key: str) -> dict[str, float]:
        """Mean score per value of one variant axis (``seed``, ``template``, ...), of scored tasks."""
        d = self.dialect
        found = self.store.rows(
            f"SELECT {d.json_scalar('v')}, avg(score) FROM (SELECT {d.json_at.format('variant_json')} AS v, score"
            f" {_SCORED}) s GROUP BY 1", (d.json_path("$." + key), run_id, stage, model))
        return {str(v): acc for v, acc in sqlite_sorted([(sql_value(v), acc) for v, acc in found], 1)}

    def variant_axes(self, run_id: str, stage: str, model: str) -> list[str]:
        """The variant axes of a stage's scored tasks, in order of first appearance."""
        axes: dict[str, None] = {}
        for (text,) in self.store.rows(f"SELECT variant_json {_SCORED} GROUP BY variant_json"
                                       f" ORDER BY min({self.dialect.task_order})", (run_id, stage, model)):
            variant = json.loads(text) if text else None
            if isinstance(variant, dict):
                axes.update(dict.fromkeys(variant))
        return list(axes)

    def accuracy_by_gold_type(self, run_id: str, stage: str, model: str) -> list[tuple[str, float]]:
        """(JSON type of the gold, mean score) per gold value of scored tasks (balanced accuracy of yes/no); a
        group's type is its first task's (true and 1 are one group)."""
        d = self.dialect
        found = self.store.rows(
            f"SELECT {d.json_const('result_json', '$.gold')},"
            f" {d.first_of_group(d.json_type_const('result_json', '$.gold'))}, avg(score) {_SCORED} GROUP BY 1",
            (run_id, stage, model))
        return [(kind, acc) for _, kind, acc in sqlite_sorted([(sql_value(g), k, a) for g, k, a in found], 1)]

    def letter_answers(self, run_id: str, stage: str, model: str) -> Iterator[tuple[str, str | None, Any]]:
        """(answer letter, permutation JSON, gold) of scored, valid letter answers (position bias), streamed."""
        d = self.dialect
        letter = d.json_const("result_json", "$.answer_letter")
        for got in self.store.stream(
                f"SELECT {letter}, {d.json_const('result_json', '$.permutation')},"
                f" {d.json_const('result_json', '$.gold')} {_SCORED} AND valid = 1 AND {letter} IS NOT NULL"
                f" ORDER BY {d.task_order}", (run_id, stage, model)):
            yield sql_value(got[0]), sql_value(got[1]), sql_value(got[2])

    def seed_scores(self, run_id: str, stage: str, variant: dict[str, Any] | None = None
                    ) -> list[tuple[str, Any, float, int]]:
        """(model, seed, mean score, scored tasks) of a stage, optionally of tasks whose variant has these values."""
        d = self.dialect
        names = list(variant or {})
        inner = "".join(f", {d.json_at.format('variant_json')} AS f{i}" for i in range(len(names)))
        where = "".join(f" AND {d.json_scalar(f'f{i}')} = ?" for i in range(len(names)))
        found = self.store.rows(
            f"SELECT model, {d.json_scalar('v')}, avg(score), count(score) FROM (SELECT model,"
            f" {d.json_const('variant_json', '$.seed')} AS v, score{inner} FROM tasks WHERE run_id = ? AND stage = ?"
            f" AND score IS NOT NULL) s WHERE 1 = 1{where} GROUP BY 1, 2",
            (*(d.json_path("$." + name) for name in names), run_id, stage,
             *(d.json_argument(value) for value in (variant or {}).values())))
        return sqlite_sorted([(model, sql_value(seed), acc, n) for model, seed, acc, n in found], 2)

    def accuracy_groups(self, run_id: str, stage: str, paths: list[str]) -> list[tuple]:
        """(model, value at each JSON path of the result line, mean score, scored tasks) of a stage's scored
        tasks, grouped by model and those values (``$.variant.shots``, ``$.fields.bucket``)."""
        d = self.dialect
        inner = "".join(f", {d.json_at.format('result_json')} AS r{i}" for i in range(len(paths)))
        outer = "".join(f", {d.json_scalar(f'r{i}')}" for i in range(len(paths)))
        groups = "".join(f", {i + 2}" for i in range(len(paths)))
        found = self.store.rows(
            f"SELECT model{outer}, avg(score), count(score) FROM (SELECT model{inner}, score FROM tasks"
            f" WHERE run_id = ? AND stage = ? AND score IS NOT NULL) s GROUP BY 1{groups}",
            (*(d.json_path(p) for p in paths), run_id, stage))
        width = 1 + len(paths)
        return sqlite_sorted([(*(sql_value(v) for v in row[:width]), *row[width:]) for row in found], width)

    def variant_kinds(self, run_id: str) -> list[tuple[str, str, str, int]]:
        """(stage, model, variant JSON, tasks) of a run: what kinds of tasks it has."""
        return sqlite_sorted(self.store.rows("SELECT stage, model, variant_json, count(*) FROM tasks WHERE run_id = ?"
                                             " GROUP BY stage, model, variant_json", (run_id,)), 3)

    def first_task(self, run_id: str) -> tuple[str, str] | None:
        """(item, row id) of one task of a run."""
        found = self.store.row(f"SELECT item, row_id FROM tasks WHERE run_id = ?{self.dialect.any_task_order}"
                               " LIMIT 1", (run_id,))
        return (found[0], found[1]) if found else None

    def count_tasks(self, run_id: str, stage: str) -> int:
        """Finished tasks of a stage."""
        return int(self.store.row("SELECT count(*) FROM tasks WHERE run_id = ? AND stage = ?", (run_id, stage))[0])

    # -- a judge's verdicts on another run's answers --------------------------------------------------------------
    def unmatched_verdicts(self, judge_id: str, judge_stage: str, run_id: str, stage: str) -> tuple[int, str | None]:
        """(count, one example) of a judge run's tasks whose row id is no task item of ``run_id``'s stage."""
        count, example = self.store.row(
            f"SELECT count(*), min(j.row_id{self.dialect.text_order}) FROM tasks j WHERE j.run_id = ? AND j.stage = ?"
            " AND NOT EXISTS (SELECT 1 FROM tasks m WHERE m.run_id = ? AND m.stage = ? AND m.item = j.row_id)",
            (judge_id, judge_stage, run_id, stage))
        return int(count), example

    def judged_groups(self, judge_id: str, judge_stage: str, suffix: str, run_id: str, stage: str) -> list[tuple]:
        """Per model and seed of the judged stage: (model, seed, answers, judged, right, unreadable, first
        answer without a verdict); a verdict is the judge task whose item is the answer's item + ``suffix``."""
        d = self.dialect
        n = d.as_int.format
        parsed = d.json_const("j.result_json", "$.parsed")
        judged, right = n("j.status = 'done'"), n(f"j.status = 'done' AND {parsed} = {d.json_one}")
        unreadable = n("j.status = 'done' AND j.valid = 0")
        found = self.store.rows(
            f"SELECT m.model, {d.json_const('m.variant_json', '$.seed')}, count(*), sum({judged}), sum({right}),"
            f" sum({unreadable}), min(CASE WHEN j.item IS NULL OR j.status != 'done' THEN m.item END{d.text_order})"
            " FROM tasks m LEFT JOIN tasks j ON j.run_id = ? AND j.stage = ? AND j.item = m.item || ?"
            " WHERE m.run_id = ? AND m.stage = ? AND m.status = 'done' GROUP BY 1, 2",
            (judge_id, judge_stage, suffix, run_id, stage))
        return sqlite_sorted([(model, sql_value(seed), *rest) for model, seed, *rest in found], 2)

    # -- a finished run re-priced, a request explained (runner costs RUN --as, runner explain) ---------------------
    def run_requests(self, run_id: str, *, requests: bool = True
                     ) -> Iterator[tuple[str, str, str, str, int, int, int, float, str | None]]:
        """(stage, model, key, status, cache hit, input tokens, output tokens, cost, stored request JSON) of each
        finished task of a run, in the run's order, streamed; without ``requests`` the JSON is None (not read)."""
        request = "r.request_json" if requests else "NULL"
        join = " LEFT JOIN responses r ON r.key = t.key AND t.status = 'done'" if requests else ""
        yield from self.store.stream(
            "SELECT t.stage, t.model, t.key, t.status, t.cache_hit, coalesce(t.input_tokens, 0),"
            f" coalesce(t.output_tokens, 0), coalesce(t.cost, 0), {request} FROM tasks t{join}"
            f" WHERE t.run_id = ? ORDER BY t.{self.dialect.task_order}", (run_id,))

    def payers(self, keys: list[str]) -> dict[str, str]:
        """The first run (by id, which starts with its time) that sent each of these requests and was answered;
        keys no run sent are left out."""
        found: dict[str, str] = {}
        for start in range(0, len(keys), 500):
            where, args = self.dialect.in_list("key", keys[start:start + 500])
            found.update(self.store.rows(
                f"SELECT key, min(run_id{self.dialect.text_order}) FROM tasks WHERE {where} AND cache_hit = 0"
                " AND status = 'done' GROUP BY key", args))
        return found

    def item_tasks(self, run_id: str, stage: str, row_id: str) -> list[tuple[str, str, int, str | None]]:
        """(key, status, cache hit, error class) of a run's tasks of one item (row id) of a stage."""
        return [tuple(row) for row in self.store.rows(
            "SELECT key, status, cache_hit, error_class FROM tasks WHERE run_id = ? AND stage = ? AND row_id = ?"
            f" ORDER BY {self.dialect.task_order}", (run_id, stage, row_id))]

    def stored_requests(self, stage: str, model: str | None, *, row_id: str | None = None,
                        before: str | None = None, limit: int = 2000) -> list[tuple[str, str, str | None]]:
        """(key, stored request JSON, the run that sent it) of memo rows that answered tasks of a stage (and a
        model as the job names it, and one item), stored before ``before`` (a time stamp); at most ``limit``, in
        key order."""
        where, args = "t.stage = ?", [stage]
        for column, value in (("t.model", model), ("t.row_id", row_id)):
            if value is not None:
                where, args = f"{where} AND {column} = ?", [*args, value]
        if before is not None:
            where, args = f"{where} AND r.created < ?", [*args, before]
        c = self.dialect.text_order
        return [tuple(row) for row in self.store.rows(
            f"SELECT r.key, r.request_json, min(CASE WHEN t.cache_hit = 0 THEN t.run_id END{c}) FROM tasks t"
            " JOIN responses r ON r.key = t.key"
            f" WHERE {where} GROUP BY r.key, r.request_json ORDER BY r.key{c} LIMIT ?", (*args, limit))]
