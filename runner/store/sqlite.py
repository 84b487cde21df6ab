"""The SQLite store: the response memo, runs, tasks and the cost ledger in one file.

WAL mode and a busy timeout let ``runner runs`` and ``runner report`` read while a run writes. All writes of
a run go through one writer task (:mod:`runner.store.writer`) that commits in small batches; a response is
committed in the same transaction that marks its task done (ARCHITECTURE.md invariant 2), so a crash loses
only in-flight work. This is the only module that writes SQL for the store (migrations aside).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import shlex
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from runner.errors import StoreError
from runner.store._sqlite_utils import sqlite_utils
from runner.store.base import (
    FENCED_RESERVATION_SQL,
    HELD_SQL,
    LEDGER_COLUMNS,
    LEFT_RESERVATIONS_SQL,
    LIVE_SQL,
    RESPONSE_COLUMNS,
    TASK_COLUMNS,
    UNKNOWN_JOB,
    CachedResponse,
    Fence,
    Fenced,
    Finished,
    GroupSummary,
    Store,
    default_path,
    dumps,
    now,
)
from runner.store.migrations import migrate

BUSY_TIMEOUT_S = 30.0
#: tolerance of float sums of money (USD) against a budget; far below a cent
EPSILON = 1e-9
#: how ``runner costs --by`` groups ledger rows and task rows
_GROUP_SQL = {
    "model": ("l.model", "t.model"),
    "job": (f"coalesce(r.job_name, '{UNKNOWN_JOB}')", f"coalesce(r.job_name, '{UNKNOWN_JOB}')"),
    "day": ("substr(l.created, 1, 10)", "substr(t.updated, 1, 10)"),
}


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
_RESERVE_SQL = _insert_sql("ledger", (*LEDGER_COLUMNS, "worker"), "INSERT")

# Replay's copied rows: cache hits that cost nothing and saved what the original answer cost (or saved).
_COPY_SQL = """
INSERT INTO tasks (run_id, stage, item, model, row_id, variant_json, key, status, cache_hit, attempts,
                   error_class, error, input_tokens, output_tokens, cost, latency, score, valid, result_json,
                   cached_tokens, saved, updated)
SELECT ?1, ?2, item, model, row_id, variant_json, key, 'done', 1, 0, NULL, NULL, input_tokens, output_tokens,
       0.0, NULL, score, valid,
       replace(CASE WHEN ?2 = ?4 THEN result_json ELSE replace(result_json, ?5, ?6) END,
               '"cache_hit":false', '"cache_hit":true'),
       cached_tokens, coalesce(cost, 0) + coalesce(saved, 0), strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
FROM tasks WHERE run_id = ?3 AND stage = ?4 AND status = 'done' ORDER BY rowid
"""

#: the scored tasks of one stage and model
_SCORED = " FROM tasks WHERE run_id = ? AND stage = ? AND model = ? AND score IS NOT NULL"
#: a memo row's columns as :class:`CachedResponse` takes them (rows older than m010 have no reasoning tokens)
_MEMO = ("response_text, finish_reason, input_tokens, output_tokens, cached_tokens, cost, thinking,"
         " coalesce(reasoning_tokens, 0)")


_FULL = {sqlite3.SQLITE_FULL}
_CORRUPT = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}


def explain(exc: BaseException, path: str, run_id: str | None = None) -> str | None:
    """One sentence for a SQLite error that is about the store's file (its disk is full, it is corrupt, it cannot be
    read or written), naming the file and how to go on; None for any other error."""
    if not isinstance(exc, sqlite3.Error):
        return None
    text = str(exc)
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    where = shlex.quote(path)
    resume = f"`runner resume {run_id}`" if run_id else "try again"
    if primary in _FULL or "disk is full" in text:
        return f"the disk holding the store {path} is full ({text}): free space, then {resume}"
    if primary in _CORRUPT or "malformed" in text or "not a database" in text:
        then = f"`runner resume {run_id} --db NEW.sqlite`" if run_id else "use --db NEW.sqlite"
        return (f"the store {path} is corrupt ({text}): recover what it holds with `sqlite3 {where} .recover | "
                f"sqlite3 NEW.sqlite`, then {then}; or start a new store with --db NEW.sqlite (it is a cache: only "
                "the answers and runs kept in it are lost)")
    if primary == sqlite3.SQLITE_IOERR or "disk I/O error" in text:
        return f"the store {path} cannot be read or written ({text}): check its disk, then {resume}"
    if primary == sqlite3.SQLITE_READONLY or "readonly" in text:
        return f"the store {path} cannot be written ({text}): make it writable, then {resume}"
    return None


class SQLiteStore(Store):
    """The embedded store: one SQLite file in WAL mode, one connection per process."""

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
            found = explain(exc, self.path)
            if found is not None and getattr(exc, "sqlite_errorcode", None) != sqlite3.SQLITE_NOTADB:
                raise StoreError(found) from None
            raise StoreError(f"the store {self.path} cannot be opened ({exc}); set --db or RUNNER_DB") from None

    def close(self) -> None:
        self.conn.close()

    def failure(self, exc: BaseException, run_id: str | None = None) -> str | None:
        """The sentence for an error of this store (a full disk, a corrupt file), with how to go on: ``runner resume
        RUN_ID`` when ``run_id`` is given; None when ``exc`` is not about the store's file."""
        return explain(exc, self.path, run_id)

    # -- the memo ----------------------------------------------------------------------------------
    def lookup(self, key: str) -> CachedResponse | None:
        row = self.conn.execute(f"SELECT {_MEMO} FROM responses WHERE key = ?", (key,)).fetchone()
        return CachedResponse(*row) if row else None

    def lookup_many(self, keys: list[str]) -> dict[str, CachedResponse]:
        """The memo rows of several keys in one query (the dispatcher asks per chunk of requests)."""
        found: dict[str, CachedResponse] = {}
        for start in range(0, len(keys), 500):
            part = keys[start:start + 500]
            rows = self.conn.execute(
                f"SELECT key, {_MEMO} FROM responses WHERE key IN ({', '.join('?' * len(part))})",
                part,
            )
            for key, *values in rows:
                found[key] = CachedResponse(*values)
        return found

    def request_texts(self, keys: list[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        for start in range(0, len(keys), 500):
            part = keys[start:start + 500]
            found.update(self.conn.execute(
                f"SELECT key, request_json FROM responses WHERE key IN ({', '.join('?' * len(part))})", part))
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
                    released: list[tuple[int]] | None = None, fenced: list[Finished] | None = None
                    ) -> list[Finished]:
        """One transaction: the responses, the tasks they finish, their ledger charges, and the removal of the
        reservations those charges settle; ``fenced`` tasks only where their lease holds."""
        conn = self.conn
        refused: list[Finished] = []
        conn.execute("BEGIN IMMEDIATE")
        try:
            if responses:
                conn.executemany(_RESPONSE_SQL, responses)
            if fenced:
                held: dict[Fence, bool] = {}
                for item in fenced:
                    fence = item.fence
                    assert fence is not None
                    if fence not in held:
                        held[fence] = self._holds(fence)
                    if held[fence]:
                        tasks = [*tasks, item.task]
                        if item.ledger is not None:
                            ledger = [*ledger, item.ledger]
                        if item.release_id is not None:
                            released = [*(released or []), (item.release_id,)]
                    else:
                        refused.append(item)
                        if item.release_id is not None:
                            conn.execute(FENCED_RESERVATION_SQL, (item.release_id,))
            if tasks:
                conn.executemany(_TASK_SQL, tasks)
            if ledger:
                conn.executemany(_LEDGER_SQL, ledger)
            if released:
                conn.executemany("DELETE FROM ledger WHERE id = ?", released)
            if responses:  # an answered request's claim ends with the commit of its answer
                conn.executemany("DELETE FROM claims WHERE key = ?", ((row[0],) for row in responses))
            conn.execute("COMMIT")
        except BaseException:
            # a COMMIT that failed (a full disk) may have rolled back already: a ROLLBACK then would hide its error
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return refused

    def _holds(self, fence: Fence) -> bool:
        """Whether the lease is still the fence's worker's, with its token, and that worker live (in a transaction)."""
        return self.conn.execute(HELD_SQL, (fence.run_id, fence.stage, fence.chunk, fence.worker,
                                            fence.token)).fetchone() is not None

    # -- the ledger's reservations (runner/engine/budget.py) -------------------------------------------------------
    def reserve(self, run_id: str, stage: str, model: str, key: str, usd: float, worker: str | None = None, *,
                fence: Fence | None = None) -> int:
        """Record a request's worst-case cost before it is sent; committed at once, so a crash leaves it."""
        if fence is None:
            cursor = self.conn.execute(_RESERVE_SQL, (run_id, stage, model, key, "reserved", usd, now(), worker))
            return int(cursor.lastrowid or 0)
        got = self.reserve_within(run_id, stage, model, key, usd, {}, worker, fence=fence)
        return int(got[0] or 0)

    def reserve_within(self, run_id: str, stage: str, model: str, key: str, usd: float,
                       limits: dict[str, float], worker: str | None = None, *, fence: Fence | None = None
                       ) -> tuple[int | None, str | None, int]:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")  # the write lock first: no other process reserves between check and insert
        try:
            if fence is not None and not self._holds(fence):
                raise Fenced(f"worker {fence.worker} lost its lease of chunk {fence.chunk} of stage {fence.stage}")
            scopes = list(limits)
            used = {scope: (usd_, inflight) for scope, usd_, inflight in conn.execute(
                f"SELECT scope, usd, inflight FROM budget_use WHERE run_id = ? AND scope IN"
                f" ({', '.join('?' * len(scopes))})", (run_id, *scopes))}
            for scope, limit in limits.items():
                spent, inflight = used.get(scope, (0.0, 0))
                if spent + usd > limit + EPSILON:
                    conn.execute("ROLLBACK")
                    return None, scope, int(inflight)
            cursor = conn.execute(_RESERVE_SQL, (run_id, stage, model, key, "reserved", usd, now(), worker))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return int(cursor.lastrowid or 0), None, 0

    # -- several processes on one run (runner/engine/workers.py) -------------------------------------------------
    def join_run(self, run_id: str, worker: str, host: str, pid: int, ttl: float) -> None:
        self.conn.execute("INSERT OR REPLACE INTO workers (id, run_id, host, pid, started, seen, state)"
                          " VALUES (?, ?, ?, ?, ?, ?, 'live')", (worker, run_id, host, pid, now(), time.time() + ttl))

    def heartbeat(self, worker: str, ttl: float) -> list[tuple[str, int, int]] | None:
        until = time.time() + ttl
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            beat = conn.execute("UPDATE workers SET seen = ? WHERE id = ? AND state = 'live'", (until, worker))
            if not beat.rowcount:
                conn.execute("COMMIT")
                return None  # declared dead (or gone): nothing of it is extended
            conn.execute("UPDATE leases SET expires = ? WHERE worker = ? AND done = 0", (until, worker))
            conn.execute("UPDATE claims SET expires = ? WHERE worker = ?", (until, worker))
            held = [(stage, int(chunk), int(token)) for stage, chunk, token in conn.execute(
                "SELECT stage, chunk, token FROM leases WHERE worker = ? AND done = 0 ORDER BY stage, chunk",
                (worker,))]
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return held

    def leave_run(self, worker: str) -> None:
        self._transaction([
            ("UPDATE workers SET state = 'left' WHERE id = ? AND state = 'live'", (worker,)),
            (LEFT_RESERVATIONS_SQL, (worker,)),
            ("UPDATE leases SET expires = 0 WHERE worker = ? AND done = 0", (worker,)),
            ("DELETE FROM claims WHERE worker = ?", (worker,)),
        ])

    def workers(self, run_id: str) -> list[dict[str, Any]]:
        rows = self._dicts("SELECT id, host, pid, started, seen, state FROM workers WHERE run_id = ? ORDER BY started,"
                           " id", (run_id,))
        clock = time.time()
        for row in rows:
            if row["state"] == "live" and row["seen"] < clock:
                row["state"] = "dead"
            del row["seen"]
        return rows

    def lease_chunks(self, run_id: str, stage: str, chunks: list[int], worker: str, ttl: float
                     ) -> dict[int, tuple[str, int] | None]:
        clock = time.time()
        conn = self.conn
        got: dict[int, tuple[str, int] | None] = {}
        conn.execute("BEGIN IMMEDIATE")
        try:
            held = {chunk: (holder, expires, done, token) for chunk, holder, expires, done, token in conn.execute(
                "SELECT chunk, worker, expires, done, token FROM leases WHERE run_id = ? AND stage = ? AND chunk"
                " BETWEEN ? AND ?", (run_id, stage, min(chunks), max(chunks)))}
            for chunk in chunks:
                row = held.get(chunk)
                if row is None:
                    got[chunk] = ("new", 1)
                    conn.execute("INSERT INTO leases (run_id, stage, chunk, worker, expires, token) VALUES"
                                 " (?, ?, ?, ?, ?, 1)", (run_id, stage, chunk, worker, clock + ttl))
                elif row[2] or (row[0] != worker and row[1] >= clock):
                    got[chunk] = None
                else:  # a new token unless it is this worker's lease, still live
                    token = row[3] + (0 if row[0] == worker and row[1] >= clock else 1)
                    got[chunk] = ("taken", token)
                    conn.execute("UPDATE leases SET worker = ?, expires = ?, token = ? WHERE run_id = ? AND stage = ?"
                                 " AND chunk = ?", (worker, clock + ttl, token, run_id, stage, chunk))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return got

    def take_expired_lease(self, run_id: str, stage: str, worker: str, ttl: float) -> tuple[int, int] | None:
        clock = time.time()
        row = self.conn.execute(
            "UPDATE leases SET worker = ?, expires = ?, token = token + 1 WHERE run_id = ? AND stage = ? AND chunk ="
            " (SELECT chunk FROM leases WHERE run_id = ? AND stage = ? AND done = 0 AND expires < ? ORDER BY chunk"
            " LIMIT 1) RETURNING chunk, token",
            (worker, clock + ttl, run_id, stage, run_id, stage, clock)).fetchone()
        return None if row is None else (int(row[0]), int(row[1]))

    def finish_chunks(self, run_id: str, stage: str, worker: str, chunks: list[int] | None = None,
                      tokens: list[int] | None = None) -> None:
        live = f" AND {LIVE_SQL}"
        if chunks is None:
            self.conn.execute("UPDATE leases SET done = 1 WHERE run_id = ? AND stage = ? AND worker = ? AND done = 0"
                              + live, (run_id, stage, worker))
        elif tokens is None:
            self._transaction([("UPDATE leases SET done = 1 WHERE run_id = ? AND stage = ? AND chunk = ? AND"
                                " worker = ?" + live, (run_id, stage, chunk, worker)) for chunk in chunks])
        else:
            self._transaction([("UPDATE leases SET done = 1 WHERE run_id = ? AND stage = ? AND chunk = ? AND"
                                " worker = ? AND token = ?" + live, (run_id, stage, chunk, worker, token))
                               for chunk, token in zip(chunks, tokens, strict=True)])

    def open_chunks(self, run_id: str, stage: str) -> int:
        return int(self.conn.execute("SELECT count(*) FROM leases WHERE run_id = ? AND stage = ? AND done = 0",
                                     (run_id, stage)).fetchone()[0])

    def reset_chunks(self, run_id: str) -> None:
        self.conn.execute("DELETE FROM leases WHERE run_id = ?", (run_id,))

    def claim_keys(self, keys: list[str], worker: str, ttl: float) -> set[str]:
        clock = time.time()
        ours: set[str] = set()
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            for key in keys:
                row = conn.execute(
                    "INSERT INTO claims (key, worker, expires) VALUES (?, ?, ?) ON CONFLICT (key) DO UPDATE SET"
                    " worker = excluded.worker, expires = excluded.expires WHERE claims.expires < ? OR"
                    " claims.worker = excluded.worker RETURNING key", (key, worker, clock + ttl, clock)).fetchone()
                if row is not None:
                    ours.add(row[0])
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return ours

    def release_keys(self, keys: list[str], worker: str) -> None:
        self.conn.executemany("DELETE FROM claims WHERE key = ? AND worker = ?", ((key, worker) for key in keys))

    def dead_workers(self, run_id: str) -> list[str]:
        return [worker for (worker,) in self.conn.execute(
            "SELECT id FROM workers WHERE run_id = ? AND state = 'live' AND seen < ?", (run_id, time.time()))]

    def resolve_worker(self, run_id: str, worker: str) -> int:
        possibly, _ = self._transaction([
            ("UPDATE ledger SET kind = 'possibly_billed' WHERE run_id = ? AND worker = ? AND kind = 'reserved'",
             (run_id, worker)),
            ("UPDATE workers SET state = 'dead' WHERE id = ?", (worker,)),
        ])
        return possibly

    def release(self, ledger_id: int) -> None:
        self.conn.execute("DELETE FROM ledger WHERE id = ? AND kind = 'reserved'", (ledger_id,))

    def resolve_reservations(self, run_id: str) -> tuple[int, int]:
        """After a crash: a reservation whose answer is in the memo is settled to its cost; the others stay
        charged at their worst case as 'possibly_billed'. Returns (settled, possibly billed)."""
        settled, possibly = self._transaction([
            ("UPDATE ledger SET kind = 'charge', amount = (SELECT cost FROM responses r WHERE r.key = ledger.key)"
             " WHERE run_id = ? AND kind = 'reserved' AND key IN (SELECT key FROM responses)", (run_id,)),
            # a reservation of a line still in a submitted batch is neither: the batch is polled again
            ("UPDATE ledger SET kind = 'possibly_billed' WHERE run_id = ? AND kind = 'reserved' AND id NOT IN"
             " (SELECT l.ledger_id FROM batch_lines l JOIN batches b ON b.id = l.batch_id WHERE b.run_id = ?"
             " AND b.state != 'collected' AND l.status = 'pending' AND l.ledger_id IS NOT NULL)", (run_id, run_id)),
        ])
        return settled, possibly

    # -- evaluation stages finished whole (runner/engine/replay.py) -------------------------------------------------
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
            # failed tasks count too: a refusal's tokens were billed
            "SELECT stage, model, sum(input_tokens + output_tokens) FROM tasks WHERE run_id = ? AND cache_hit = 0"
            " GROUP BY stage, model", (run_id,)))
        return [(stage, model, money.get((stage, model), 0.0), int(tokens.get((stage, model)) or 0))
                for stage, model in sorted(set(money) | set(tokens))]

    # -- transactions --------------------------------------------------------------------------------
    def _transaction(self, statements: list[tuple[str, tuple]]) -> list[int]:
        """Run statements in one immediate transaction; returns each one's rowcount."""
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            counts = [conn.execute(sql, args).rowcount for sql, args in statements]
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:  # as in write_batch: keep the COMMIT's own error
                conn.execute("ROLLBACK")
            raise
        return counts

    def _dicts(self, sql: str, args: tuple | list = ()) -> list[dict[str, Any]]:
        cursor = self.conn.execute(sql, args)
        names = [c[0] for c in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor]

    # -- more of the memo, runs and tasks ------------------------------------------------------------------
    def output_history(self, provider: str, model_id: str, cap: int, sample: int) -> tuple[int, float]:
        n, mean = self.conn.execute(
            "SELECT count(*), avg(min(output_tokens, ?)) FROM (SELECT output_tokens FROM responses"
            " WHERE provider = ? AND model = ? AND output_tokens IS NOT NULL LIMIT ?)",
            (cap, provider, model_id, sample),
        ).fetchone()
        return int(n or 0), float(mean or 0.0)

    def responses(self) -> list[dict[str, Any]]:
        return self._dicts("SELECT * FROM responses ORDER BY created, key")

    def running_runs(self) -> list[tuple[str, int | None]]:
        return [(run_id, pid) for run_id, pid in self.conn.execute("SELECT id, pid FROM runs WHERE status = 'running'")]

    def stage_progress(self, run_id: str, stage: str) -> tuple[int, int]:
        done, other = self.conn.execute(
            "SELECT coalesce(sum(status = 'done'), 0), coalesce(sum(status != 'done'), 0) FROM tasks"
            " WHERE run_id = ? AND stage = ?", (run_id, stage)).fetchone()
        return int(done), int(other)

    def tasks(self, run_id: str | None = None, **where: Any) -> list[dict[str, Any]]:
        conditions = {"run_id": run_id, **where} if run_id is not None else dict(where)
        unknown = set(conditions) - set(TASK_COLUMNS) - {"updated"}
        if unknown:
            raise ValueError(f"no task column {', '.join(sorted(unknown))}")
        clause = " AND ".join(f"{name} = ?" for name in conditions)
        return self._dicts(f"SELECT * FROM tasks{' WHERE ' + clause if clause else ''} ORDER BY rowid",
                           list(conditions.values()))

    def copy_tasks(self, source: str, source_stage: str, run_id: str, stage: str) -> list[tuple[str, int, int, float,
                                                                                                   float]]:
        self._transaction([(_COPY_SQL, (run_id, stage, source, source_stage, f'"stage":{dumps(source_stage)}',
                                        f'"stage":{dumps(stage)}'))])
        return [(model, n, scored, float(correct), float(saved)) for model, n, scored, correct, saved in
                self.conn.execute("SELECT model, count(*), count(score), coalesce(sum(score), 0),"
                                  " coalesce(sum(saved), 0) FROM tasks WHERE run_id = ? AND stage = ? GROUP BY model",
                                  (run_id, stage))]

    def done_by_model(self, run_id: str, stage: str) -> dict[str, tuple[int, int]]:
        return {model: (n, int(out)) for model, n, out in self.conn.execute(
            "SELECT model, count(*), coalesce(sum(output_tokens), 0) FROM tasks WHERE run_id = ? AND stage = ?"
            " AND status = 'done' GROUP BY model", (run_id, stage))}

    # -- more of the ledger --------------------------------------------------------------------------
    def unsettled(self, run_id: str, include_reserved: bool) -> dict[tuple[str, str], tuple[float, int]]:
        kinds = "('possibly_billed', 'reserved')" if include_reserved else "('possibly_billed')"
        return {(stage, model): (usd, n) for stage, model, usd, n in self.conn.execute(
            f"SELECT stage, model, sum(amount), count(*) FROM ledger WHERE run_id = ? AND kind IN {kinds}"
            " GROUP BY stage, model", (run_id,))}

    def charged(self, run_id: str) -> float:
        return float(self.conn.execute("SELECT coalesce(sum(amount), 0) FROM ledger WHERE run_id = ? AND"
                                       " kind = 'charge'", (run_id,)).fetchone()[0])

    def ledger(self, run_id: str | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        conditions = {name: value for name, value in (("run_id", run_id), ("kind", kind)) if value is not None}
        clause = " AND ".join(f"{name} = ?" for name in conditions)
        return self._dicts(f"SELECT * FROM ledger{' WHERE ' + clause if clause else ''} ORDER BY id",
                           list(conditions.values()))

    def ledger_sums(self, by: str, since: str | None) -> list[tuple[str | None, str, str, int, float]]:
        group = _GROUP_SQL[by][0]
        where, params = ("WHERE l.created >= ?", [since]) if since else ("", [])
        return self.conn.execute(
            f"SELECT {group}, l.run_id, l.kind, count(*), coalesce(sum(l.amount), 0) FROM ledger l"
            f" LEFT JOIN runs r ON r.id = l.run_id {where} GROUP BY 1, 2, 3", params).fetchall()

    def saved_sums(self, by: str, since: str | None) -> list[tuple[str | None, str, int, float]]:
        group = _GROUP_SQL[by][1]
        where, params = ("AND t.updated >= ?", [since]) if since else ("", [])
        return self.conn.execute(
            f"SELECT {group}, t.run_id, count(*), sum(t.saved) FROM tasks t LEFT JOIN runs r ON r.id = t.run_id"
            f" WHERE t.cache_hit = 1 AND t.saved > 0 {where} GROUP BY 1, 2", params).fetchall()

    # -- the report's questions -------------------------------------------------------------------------
    def group_summaries(self, run_id: str) -> list[GroupSummary]:
        # reasoning tokens of the requests sent come from their memo rows (a primary-key lookup per sent task)
        rows = self.conn.execute(
            "SELECT t.stage, t.model, count(*), sum(t.status = 'done'), sum(t.status = 'failed'), sum(t.cache_hit),"
            " sum(CASE WHEN t.cache_hit = 0 THEN t.input_tokens ELSE 0 END),"
            " sum(CASE WHEN t.cache_hit = 0 THEN t.output_tokens ELSE 0 END), coalesce(sum(t.cost), 0),"
            " count(t.score), sum(t.status = 'done' AND t.valid = 0), avg(t.score),"
            " coalesce(sum(CASE WHEN t.cache_hit = 0 THEN t.cached_tokens ELSE 0 END), 0), coalesce(sum(t.saved), 0),"
            " count(t.batch_saved), coalesce(sum(t.batch_saved), 0), coalesce(sum(r.reasoning_tokens), 0)"
            " FROM tasks t LEFT JOIN responses r ON t.cache_hit = 0 AND t.status = 'done' AND r.key = t.key"
            " WHERE t.run_id = ? GROUP BY t.stage, t.model ORDER BY min(t.rowid)", (run_id,)).fetchall()
        return [GroupSummary(*row) for row in rows]

    def error_counts(self, run_id: str, stage: str, model: str) -> dict[str, int]:
        return dict(self.conn.execute(
            "SELECT error_class, count(*) FROM tasks WHERE run_id = ? AND stage = ? AND model = ?"
            " AND status = 'failed' GROUP BY error_class ORDER BY error_class", (run_id, stage, model)).fetchall())

    def latencies(self, run_id: str, stage: str, model: str) -> list[float]:
        return [r[0] for r in self.conn.execute(
            "SELECT latency FROM tasks WHERE run_id = ? AND stage = ? AND model = ? AND latency IS NOT NULL"
            " ORDER BY latency", (run_id, stage, model))]

    def accuracy_by_variant(self, run_id: str, stage: str, model: str, key: str) -> dict[str, float]:
        return {str(v): acc for v, acc in self.conn.execute(
            f"SELECT json_extract(variant_json, '$.' || ?) AS v, avg(score) {_SCORED}"
            " GROUP BY v ORDER BY v", (key, run_id, stage, model))}

    def variant_axes(self, run_id: str, stage: str, model: str) -> list[str]:
        return [k for (k,) in self.conn.execute(
            f"SELECT DISTINCT j.key FROM (SELECT variant_json {_SCORED}) t, json_each(t.variant_json) j",
            (run_id, stage, model))]

    def accuracy_by_gold_type(self, run_id: str, stage: str, model: str) -> list[tuple[str, float]]:
        return self.conn.execute(f"SELECT json_type(result_json, '$.gold') AS t, avg(score) {_SCORED} GROUP BY "
                                 "json_extract(result_json, '$.gold')", (run_id, stage, model)).fetchall()

    def letter_answers(self, run_id: str, stage: str, model: str) -> Iterator[tuple[str, str | None, Any]]:
        yield from self.conn.execute(
            "SELECT json_extract(result_json, '$.answer_letter') AS letter, json_extract(result_json, '$.permutation'),"
            f" json_extract(result_json, '$.gold') {_SCORED} AND valid = 1 AND letter IS NOT NULL",
            (run_id, stage, model))

    def seed_scores(self, run_id: str, stage: str, variant: dict[str, Any] | None = None
                    ) -> list[tuple[str, Any, float, int]]:
        where = "".join(" AND json_extract(variant_json, '$.' || ?) = ?" for _ in (variant or {}))
        args = [x for name, value in (variant or {}).items() for x in (name, value)]
        return self.conn.execute(
            "SELECT model, json_extract(variant_json, '$.seed'), avg(score), count(score) FROM tasks"
            f" WHERE run_id = ? AND stage = ? AND score IS NOT NULL{where} GROUP BY model, 2",
            (run_id, stage, *args)).fetchall()

    def variant_kinds(self, run_id: str) -> list[tuple[str, str, str, int]]:
        return self.conn.execute("SELECT stage, model, variant_json, count(*) FROM tasks"
                                 " WHERE run_id = ? GROUP BY stage, model, variant_json", (run_id,)).fetchall()

    def first_task(self, run_id: str) -> tuple[str, str] | None:
        row = self.conn.execute("SELECT item, row_id FROM tasks WHERE run_id = ? LIMIT 1", (run_id,)).fetchone()
        return (row[0], row[1]) if row else None

    def count_tasks(self, run_id: str, stage: str) -> int:
        return int(self.conn.execute("SELECT count(*) FROM tasks WHERE run_id = ? AND stage = ?",
                                     (run_id, stage)).fetchone()[0])

    def unmatched_verdicts(self, judge_id: str, judge_stage: str, run_id: str, stage: str) -> tuple[int, str | None]:
        count, example = self.conn.execute(
            "SELECT count(*), min(j.row_id) FROM tasks j WHERE j.run_id = ? AND j.stage = ? AND NOT EXISTS"
            " (SELECT 1 FROM tasks m WHERE m.run_id = ? AND m.stage = ? AND m.item = j.row_id)",
            (judge_id, judge_stage, run_id, stage)).fetchone()
        return int(count), example

    def judged_groups(self, judge_id: str, judge_stage: str, suffix: str, run_id: str, stage: str) -> list[tuple]:
        return self.conn.execute(
            "SELECT m.model, json_extract(m.variant_json, '$.seed') AS seed, count(*), sum(j.status = 'done'),"
            " sum(j.status = 'done' AND json_extract(j.result_json, '$.parsed') = 1),"
            " sum(j.status = 'done' AND j.valid = 0),"
            " min(CASE WHEN j.item IS NULL OR j.status != 'done' THEN m.item END)"
            " FROM tasks m LEFT JOIN tasks j ON j.run_id = ? AND j.stage = ? AND j.item = m.item || ?"
            " WHERE m.run_id = ? AND m.stage = ? AND m.status = 'done' GROUP BY m.model, seed ORDER BY m.model, seed",
            (judge_id, judge_stage, suffix, run_id, stage)).fetchall()

    # -- Batch API requests ----------------------------------------------------------------------------
    def record_batch(self, batch_id: str, run_id: str, stage: str, model: str, provider_batch_id: str | None,
                     round: int, lines: list[tuple[str, int | None]], *, state: str = "running") -> None:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("INSERT INTO batches (id, run_id, stage, model, provider_batch_id, round, state,"
                         " provider_state, lines, created, updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         (batch_id, run_id, stage, model, provider_batch_id, round, state,
                          "submitted" if state == "running" else state, len(lines), now(), now()))
            conn.executemany("INSERT OR REPLACE INTO batch_lines (batch_id, key, ledger_id, status)"
                             " VALUES (?, ?, ?, 'pending')", [(batch_id, key, ledger) for key, ledger in lines])
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def open_batches(self, run_id: str, stage: str) -> list[dict[str, Any]]:
        found = self._dicts("SELECT * FROM batches WHERE run_id = ? AND stage = ? AND state != 'collected'"
                            " ORDER BY created, id", (run_id, stage))
        for batch in found:
            batch["lines"] = {key: (ledger, status) for key, ledger, status in self.conn.execute(
                "SELECT key, ledger_id, status FROM batch_lines WHERE batch_id = ?", (batch["id"],))}
        return found

    def update_batch(self, batch_id: str, **fields: Any) -> None:
        fields.setdefault("updated", now())
        assignments = ", ".join(f"{name} = ?" for name in fields)
        self.conn.execute(f"UPDATE batches SET {assignments} WHERE id = ?", (*fields.values(), batch_id))

    def finish_batch(self, batch_id: str, statuses: dict[str, str]) -> None:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany("UPDATE batch_lines SET status = ? WHERE batch_id = ? AND key = ?",
                             [(status, batch_id, key) for key, status in statuses.items()])
            conn.execute("UPDATE batches SET state = 'collected', updated = ? WHERE id = ?", (now(), batch_id))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def drop_batch(self, batch_id: str) -> None:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("DELETE FROM batch_lines WHERE batch_id = ?", (batch_id,))
            conn.execute("DELETE FROM batches WHERE id = ?", (batch_id,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def batches(self, run_id: str) -> list[dict[str, Any]]:
        found = self._dicts("SELECT * FROM batches WHERE run_id = ? ORDER BY created, id", (run_id,))
        for batch in found:
            batch["by_status"] = dict(self.conn.execute(
                "SELECT status, count(*) FROM batch_lines WHERE batch_id = ? GROUP BY status", (batch["id"],)))
        return found

    def accuracy_groups(self, run_id: str, stage: str, paths: list[str]) -> list[tuple]:
        columns = "".join(f", json_extract(result_json, ?) AS g{i}" for i in range(len(paths)))
        groups = "".join(f", g{i}" for i in range(len(paths)))
        return self.conn.execute(
            f"SELECT model{columns}, avg(score), count(score) FROM tasks WHERE run_id = ? AND stage = ?"
            f" AND score IS NOT NULL GROUP BY model{groups} ORDER BY model{groups}",
            (*paths, run_id, stage)).fetchall()
