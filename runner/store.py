"""The SQLite store: the response memo, runs, tasks and the cost ledger.

WAL mode and a busy timeout let ``runner runs`` and ``runner report`` read while a run writes. All writes of
a run go through one writer task (:class:`Writer`) that commits in small batches; a response is committed
in the same transaction that marks its task done (DESIGN invariant 2), so a crash loses only in-flight work.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import secrets
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlite_utils

from .errors import StoreError
from .migrations import migrate

DEFAULT_DB = "cache.sqlite"
BUSY_TIMEOUT_S = 30.0


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def default_path() -> str:
    return os.environ.get("RUNNER_DB") or DEFAULT_DB


@dataclass(slots=True)
class CachedResponse:
    text: str
    finish_reason: str | None
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    cost: float


TASK_COLUMNS = (
    "run_id", "stage", "item", "model", "row_id", "variant_json", "key", "status", "cache_hit", "attempts",
    "error_class", "error", "input_tokens", "output_tokens", "cost", "latency", "score", "valid",
    "result_json", "cached_tokens", "saved",
)
RESPONSE_COLUMNS = (
    "key", "provider", "model", "request_json", "response_text", "response_json", "finish_reason",
    "input_tokens", "output_tokens", "cached_tokens", "cost", "latency", "created",
)
LEDGER_COLUMNS = ("run_id", "stage", "model", "key", "kind", "amount", "created")


def _insert_sql(table: str, columns: tuple[str, ...], verb: str = "INSERT OR REPLACE") -> str:
    return f"{verb} INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})"


# The task's time stamp is taken by SQLite at commit: one clock read per row, none in Python's hot path.
_TASK_SQL = (
    f"INSERT OR REPLACE INTO tasks ({', '.join(TASK_COLUMNS)}, updated) "
    f"VALUES ({', '.join('?' for _ in TASK_COLUMNS)}, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))"
)
# A memo row is never overwritten: the first answer to a request is the answer.
_RESPONSE_SQL = _insert_sql("responses", RESPONSE_COLUMNS, "INSERT OR IGNORE")
_LEDGER_SQL = _insert_sql("ledger", LEDGER_COLUMNS, "INSERT")


class Store:
    def __init__(self, path: str | Path | None = None) -> None:
        self.path = str(path or default_path())
        try:
            self.conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
            self.db = sqlite_utils.Database(self.conn)
            migrate(self.db)
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"the store {self.path} cannot be opened ({exc}); set --db or RUNNER_DB") from None

    def close(self) -> None:
        self.conn.close()

    # -- the memo ----------------------------------------------------------------------------------
    def lookup(self, key: str) -> CachedResponse | None:
        row = self.conn.execute(
            "SELECT response_text, finish_reason, input_tokens, output_tokens, cached_tokens, cost "
            "FROM responses WHERE key = ?",
            (key,),
        ).fetchone()
        return CachedResponse(*row) if row else None

    def lookup_many(self, keys: list[str]) -> dict[str, CachedResponse]:
        """The memo rows of several keys in one query (the dispatcher asks per chunk of requests)."""
        found: dict[str, CachedResponse] = {}
        for start in range(0, len(keys), 500):
            part = keys[start:start + 500]
            rows = self.conn.execute(
                "SELECT key, response_text, finish_reason, input_tokens, output_tokens, cached_tokens, cost "
                f"FROM responses WHERE key IN ({', '.join('?' * len(part))})",
                part,
            )
            for key, *values in rows:
                found[key] = CachedResponse(*values)
        return found

    def memo_keys(self) -> set[str]:
        return {row[0] for row in self.conn.execute("SELECT key FROM responses")}

    # -- runs --------------------------------------------------------------------------------------
    def create_run(self, job_name: str, job_path: str, job_json: str, fingerprint: str, total: int) -> str:
        run_id = dt.datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)
        self.conn.execute(
            "INSERT INTO runs (id, job_name, job_path, job_json, fingerprint, status, total, pid, created, started)"
            " VALUES (?, ?, ?, ?, ?, 'running', ?, ?, ?, ?)",
            (run_id, job_name, job_path, job_json, fingerprint, total, os.getpid(), now(), now()),
        )
        return run_id

    def get_run(self, run_id: str) -> dict[str, Any]:
        cursor = self.conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,))
        row = cursor.fetchone()
        if row is None:
            matches = self.conn.execute("SELECT id FROM runs WHERE instr(id, ?) > 0", (run_id,)).fetchall()
            if len(matches) == 1:
                return self.get_run(matches[0][0])
            raise StoreError(f"no run {run_id!r} in {self.path}; `runner runs` lists the runs")
        return dict(zip([c[0] for c in cursor.description], row, strict=True))

    def set_run(self, run_id: str, **fields: Any) -> None:
        assignments = ", ".join(f"{name} = ?" for name in fields)
        self.conn.execute(f"UPDATE runs SET {assignments} WHERE id = ?", (*fields.values(), run_id))

    def list_runs(self, limit: int = 50) -> list[dict[str, Any]]:
        cursor = self.conn.execute(
            "SELECT r.*, (SELECT count(*) FROM tasks t WHERE t.run_id = r.id AND t.status = 'done') AS done,"
            " (SELECT count(*) FROM tasks t WHERE t.run_id = r.id AND t.status = 'failed') AS failed,"
            " (SELECT coalesce(sum(amount), 0) FROM ledger l WHERE l.run_id = r.id"
            " AND l.kind IN ('charge', 'possibly_billed')) AS spend"
            " FROM runs r ORDER BY r.created DESC LIMIT ?",
            (limit,),
        )
        names = [c[0] for c in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor]

    # -- tasks -------------------------------------------------------------------------------------
    def task_status(self, run_id: str, stage: str, item: str) -> str | None:
        row = self.conn.execute(
            "SELECT status FROM tasks WHERE run_id = ? AND stage = ? AND item = ?", (run_id, stage, item)
        ).fetchone()
        return row[0] if row else None

    def done_items(self, run_id: str, stage: str, items: list[str]) -> set[str]:
        """Which of ``items`` this run has finished already (for resume)."""
        done: set[str] = set()
        for start in range(0, len(items), 500):
            part = items[start:start + 500]
            rows = self.conn.execute(
                "SELECT item FROM tasks WHERE run_id = ? AND stage = ? AND status = 'done'"
                f" AND item IN ({', '.join('?' * len(part))})",
                (run_id, stage, *part),
            )
            done.update(row[0] for row in rows)
        return done

    def has_tasks(self, run_id: str, stage: str) -> bool:
        return self.conn.execute("SELECT 1 FROM tasks WHERE run_id = ? AND stage = ? LIMIT 1",
                                 (run_id, stage)).fetchone() is not None

    def iter_results(self, run_id: str, stage: str) -> Iterator[str]:
        """The stored result lines of a stage, in a stable order, streamed."""
        cursor = self.conn.execute(
            "SELECT result_json FROM tasks WHERE run_id = ? AND stage = ? ORDER BY rowid", (run_id, stage)
        )
        for (line,) in cursor:
            yield line

    def write_batch(self, tasks: list[tuple], responses: list[tuple], ledger: list[tuple],
                    released: list[tuple[int]] | None = None) -> None:
        """One transaction: the responses, the tasks they finish, their ledger charges, and the removal of the
        reservations those charges settle."""
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            if responses:
                conn.executemany(_RESPONSE_SQL, responses)
            if tasks:
                conn.executemany(_TASK_SQL, tasks)
            if ledger:
                conn.executemany(_LEDGER_SQL, ledger)
            if released:
                conn.executemany("DELETE FROM ledger WHERE id = ?", released)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise


    # -- the ledger's reservations (runner/budget.py) -------------------------------------------------------
    def reserve(self, run_id: str, stage: str, model: str, key: str, usd: float) -> int:
        """Record a request's worst-case cost before it is sent; committed at once, so a crash leaves it."""
        cursor = self.conn.execute(_LEDGER_SQL, (run_id, stage, model, key, "reserved", usd, now()))
        return int(cursor.lastrowid or 0)

    def release(self, ledger_id: int) -> None:
        self.conn.execute("DELETE FROM ledger WHERE id = ? AND kind = 'reserved'", (ledger_id,))

    def resolve_reservations(self, run_id: str) -> tuple[int, int]:
        """After a crash: a reservation whose answer is in the memo is settled to its cost; the others stay
        charged at their worst case as 'possibly_billed'. Returns (settled, possibly billed)."""
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            settled = conn.execute(
                "UPDATE ledger SET kind = 'charge', amount = (SELECT cost FROM responses r WHERE r.key = ledger.key)"
                " WHERE run_id = ? AND kind = 'reserved' AND key IN (SELECT key FROM responses)", (run_id,)
            ).rowcount
            possibly = conn.execute(
                "UPDATE ledger SET kind = 'possibly_billed' WHERE run_id = ? AND kind = 'reserved'", (run_id,)
            ).rowcount
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return settled, possibly

    # -- evaluation stages finished whole (runner/replay.py) -------------------------------------------------
    def replayable(self, digest: str) -> tuple[str, int] | None:
        """(run id, task count) of the latest run that finished a stage with this content address."""
        row = self.conn.execute("SELECT run_id, tasks FROM stage_replays WHERE hash = ?", (digest,)).fetchone()
        return (row[0], row[1]) if row else None

    def record_replayable(self, digest: str, run_id: str, stage: str, tasks: int) -> None:
        self.conn.execute("INSERT OR REPLACE INTO stage_replays (hash, run_id, stage, tasks, created)"
                          " VALUES (?, ?, ?, ?, ?)", (digest, run_id, stage, tasks, now()))

    # -- pipelines: content-addressed stage outputs ---------------------------------------------------------
    def stage_output(self, digest: str) -> dict[str, Any] | None:
        """A complete, reusable output of a pipeline stage with this content address, or None."""
        cursor = self.conn.execute("SELECT * FROM stage_outputs WHERE hash = ?", (digest,))
        row = cursor.fetchone()
        if row is None:
            return None
        return dict(zip([c[0] for c in cursor.description], row, strict=True))

    def stage_rows(self, digest: str) -> list[dict[str, Any]]:
        return [json.loads(row) for (row,) in self.conn.execute(
            "SELECT row FROM stage_rows WHERE hash = ? ORDER BY n", (digest,))]

    def save_stage_output(self, digest: str, stage: str, run_id: str, rows: list[dict[str, Any]], cost: float,
                          funnel: dict[str, Any]) -> None:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("DELETE FROM stage_rows WHERE hash = ?", (digest,))
            conn.executemany("INSERT INTO stage_rows (hash, n, row) VALUES (?, ?, ?)",
                             ((digest, n, dumps(row)) for n, row in enumerate(rows)))
            conn.execute("INSERT OR REPLACE INTO stage_outputs (hash, stage, run_id, rows, cost, funnel, created)"
                         " VALUES (?, ?, ?, ?, ?, ?, ?)",
                         (digest, stage, run_id, len(rows), cost, dumps(funnel), now()))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def record_run_stage(self, run_id: str, stage: str, position: int, digest: str, funnel: dict[str, Any]) -> None:
        """What a pipeline stage did in this run (the funnel report's row)."""
        self.conn.execute("INSERT OR REPLACE INTO run_stages (run_id, stage, position, hash, funnel) VALUES"
                          " (?, ?, ?, ?, ?)", (run_id, stage, position, digest, dumps(funnel)))

    def run_stages(self, run_id: str) -> list[dict[str, Any]]:
        return [json.loads(funnel) for (funnel,) in self.conn.execute(
            "SELECT funnel FROM run_stages WHERE run_id = ? ORDER BY position", (run_id,))]

    def stage_cost(self, run_id: str, stage: str) -> tuple[float, int]:
        """(USD, requests sent) of a stage's tasks in a run."""
        usd, sent = self.conn.execute(
            "SELECT coalesce(sum(cost), 0), coalesce(sum(cache_hit = 0 AND status = 'done'), 0) FROM tasks"
            " WHERE run_id = ? AND stage = ?", (run_id, stage)).fetchone()
        return float(usd), int(sent)

    def spent(self, run_id: str) -> list[tuple[str, str, float, int]]:
        """(stage, model, USD charged or possibly billed, tokens sent) of a run so far, for a resume's budgets."""
        money = dict(((stage, model), usd) for stage, model, usd in self.conn.execute(
            "SELECT stage, model, sum(amount) FROM ledger WHERE run_id = ? AND kind IN ('charge', 'possibly_billed')"
            " GROUP BY stage, model", (run_id,)))
        tokens = dict(((stage, model), n) for stage, model, n in self.conn.execute(
            "SELECT stage, model, sum(input_tokens + output_tokens) FROM tasks WHERE run_id = ? AND status = 'done'"
            " AND cache_hit = 0 GROUP BY stage, model", (run_id,)))
        return [(stage, model, money.get((stage, model), 0.0), int(tokens.get((stage, model)) or 0))
                for stage, model in sorted(set(money) | set(tokens))]


@dataclass(slots=True)
class Finished:
    """One finished task on its way to the store: its row, the memo and ledger rows it brings, and the
    reservation its ledger charge settles."""

    task: tuple
    response: tuple | None = None
    ledger: tuple | None = None
    result_line: str = ""
    stage: str = ""
    release_id: int | None = None


class Writer:
    """The single writer task: takes :class:`Finished` items from a queue and commits them in batches.

    ``on_commit`` is called with each committed batch (to append result lines to the JSONL files), so
    nothing is written to a results file before it is in the store.
    """

    def __init__(
        self,
        store: Store,
        on_commit: Callable[[list[Finished]], None],
        batch_size: int = 512,
    ) -> None:
        self.store = store
        self.on_commit = on_commit
        self.batch_size = batch_size
        self.queue: asyncio.Queue[Finished | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="store-writer")

    def put(self, item: Finished) -> None:
        self.queue.put_nowait(item)

    async def close(self) -> None:
        """Commit everything queued, then stop."""
        self.queue.put_nowait(None)
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        # Take what is queued (up to batch_size) and commit it at once; while a commit runs, the next
        # batch accumulates, so batches grow with the load and a lone result is never kept waiting.
        stopping = False
        while not stopping:
            first = await self.queue.get()
            if first is None:
                self.queue.task_done()
                break
            batch = [first]
            taken = 1
            while len(batch) < self.batch_size and not self.queue.empty():
                item = self.queue.get_nowait()
                taken += 1
                if item is None:
                    stopping = True
                    break
                batch.append(item)
            try:
                self._commit(batch)
            finally:
                for _ in range(taken):
                    self.queue.task_done()
            await asyncio.sleep(0)

    async def flush(self) -> None:
        """Wait until everything queued so far is committed (a pipeline stage reads its results next)."""
        if self._task is not None and not self._task.done():
            await self.queue.join()

    def _commit(self, batch: list[Finished]) -> None:
        self.store.write_batch(
            [f.task for f in batch],
            [f.response for f in batch if f.response is not None],
            [f.ledger for f in batch if f.ledger is not None],
            [(f.release_id,) for f in batch if f.release_id is not None],
        )
        self.on_commit(batch)


#: compact JSON for result lines and stored columns
dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
