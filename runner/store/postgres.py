"""The PostgreSQL store: the same tables and answers as :class:`~runner.store.sqlite.SQLiteStore`, in a database
server that several processes (and machines) share: ``--db postgresql://user@host/dbname``.

One connection per process, in autocommit mode: a query is its own transaction, and the writes SQLite makes under
``BEGIN IMMEDIATE`` are one ``with conn.transaction():`` block here. The connection is shared by the threads of a
process under one lock (a transaction block is never interleaved with another thread's statements).

Where SQLite's answers depend on its own rules, this module reproduces them:

- order: SQLite returns a grouped query's rows sorted by the group key (NULL first, then numbers, then text in byte
  order); the grouped answers here are sorted the same way in Python, text ordered with ``COLLATE "C"``, and the
  ``rowid`` order of tasks is the ``seq`` column (renewed when a task row is replaced, as ``INSERT OR REPLACE``
  renews a rowid);
- JSON: ``json_extract`` gives true/false as 1/0, JSON null as NULL, an object or array as its compact text;
- types: sums of integers are cast back to integers and averages to floats (PostgreSQL widens them to numeric).

Lease and claim times are the database server's clock (``clock_timestamp()``), the same for every machine.

A worker's process may stop inside a transaction (a stopped or swapped-out process, a machine under load) while it
holds row locks or the run's reservation lock, and every other worker would wait on them until it wakes. So a
worker's session ends a transaction left idle longer than a quarter of its lease (``idle_in_transaction_session_
timeout``): the server rolls it back and frees its locks; when the process wakes, it connects again and runs the
whole transaction again, where its fence (a lease now another worker's) refuses what it may no longer write.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.types.json import Jsonb

from runner.errors import StoreError
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
    dumps,
    now,
)
from runner.store.pg_migrations import migrate

#: tolerance of float sums of money (USD) against a budget, as in SQLiteStore
EPSILON = 1e-9
#: seconds to wait for the server when the URL does not say (``connect_timeout``)
CONNECT_TIMEOUT_S = 10
#: rows per round trip when a result is streamed
_FETCH = 2000
#: the session's bound on a transaction left idle (module docstring)
_STALL_SQL = "SELECT set_config('idle_in_transaction_session_timeout', %s, false)"
#: the server's clock in seconds since the epoch
_CLOCK = "extract(epoch from clock_timestamp())::float8"


class _Stalled(Exception):
    """The server ended this process's transaction, left idle past the session's bound (the process stopped inside
    it): rolled back, so it may run again on a new connection."""


def _deadlock_retried(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run again a transaction PostgreSQL chose as a deadlock's victim (processes claiming, beating and committing
    at once may lock the same claims rows in different orders; keys are sorted where one statement takes many), or
    ended because this process stopped inside it (:class:`_Stalled`). Each method so marked is one transaction, with
    nothing committed before it, so running it again is safe."""
    def retried(*args: Any, **kwargs: Any) -> Any:
        for attempt in range(5):
            try:
                return method(*args, **kwargs)
            except (psycopg.errors.DeadlockDetected, _Stalled) as exc:
                if attempt == 4:
                    if isinstance(exc, _Stalled) and exc.__cause__ is not None:
                        raise exc.__cause__ from None
                    raise
                time.sleep(0.01 * (attempt + 1))
        raise AssertionError("unreachable")
    retried.__name__, retried.__doc__ = method.__name__, method.__doc__
    return retried
#: SQLite's strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
_STAMP = "to_char(clock_timestamp() at time zone 'utc', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"
_C = 'COLLATE "C"'
#: how ``runner costs --by`` groups ledger rows and task rows
_GROUP_SQL = {
    "model": ("l.model", "t.model"),
    "job": (f"coalesce(r.job_name, '{UNKNOWN_JOB}')", f"coalesce(r.job_name, '{UNKNOWN_JOB}')"),
    "day": ("substr(l.created, 1, 10)", "substr(t.updated, 1, 10)"),
}


#: a fence holds (base.HELD_SQL), its lease row locked against a takeover until the write commits
_HELD_SQL = HELD_SQL.replace("?", "%s") + " FOR SHARE"
_FENCED_RESERVATION_SQL = FENCED_RESERVATION_SQL.replace("?", "%s")


def _values(columns: tuple[str, ...]) -> str:
    return ", ".join("%s" for _ in columns)


# The task's time stamp is taken by the server at commit; a replaced task row gets a new seq (SQLite: a new rowid).
_TASK_SQL = (
    f"INSERT INTO tasks ({', '.join(TASK_COLUMNS)}, updated) VALUES ({_values(TASK_COLUMNS)}, {_STAMP})"
    " ON CONFLICT (run_id, stage, item) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in (*TASK_COLUMNS[3:], "updated", "seq"))
)
# A memo row is never overwritten: the first answer to a request is the answer.
_RESPONSE_SQL = (f"INSERT INTO responses ({', '.join(RESPONSE_COLUMNS)}) VALUES ({_values(RESPONSE_COLUMNS)})"
                 " ON CONFLICT DO NOTHING")
_LEDGER_SQL = f"INSERT INTO ledger ({', '.join(LEDGER_COLUMNS)}) VALUES ({_values(LEDGER_COLUMNS)})"
_RESERVE_SQL = (f"INSERT INTO ledger ({', '.join(LEDGER_COLUMNS)}, worker) VALUES ({_values(LEDGER_COLUMNS)}, %s)"
                " RETURNING id")

# Replay's copied rows: cache hits that cost nothing and saved what the original answer cost (or saved).
_COPY_SQL = f"""
INSERT INTO tasks (run_id, stage, item, model, row_id, variant_json, key, status, cache_hit, attempts,
                   error_class, error, input_tokens, output_tokens, cost, latency, score, valid, result_json,
                   cached_tokens, saved, updated)
SELECT %(run)s, %(stage)s, item, model, row_id, variant_json, key, 'done', 1, 0, NULL, NULL, input_tokens,
       output_tokens, 0.0, NULL, score, valid,
       replace(CASE WHEN %(stage)s = %(source_stage)s THEN result_json ELSE replace(result_json, %(old)s, %(new)s)
               END, '"cache_hit":false', '"cache_hit":true'),
       cached_tokens, coalesce(cost, 0) + coalesce(saved, 0), {_STAMP}
FROM tasks WHERE run_id = %(source)s AND stage = %(source_stage)s AND status = 'done' ORDER BY seq
"""

#: the scored tasks of one stage and model
_SCORED = " FROM tasks WHERE run_id = %s AND stage = %s AND model = %s AND score IS NOT NULL"
#: a memo row's columns as :class:`CachedResponse` takes them (rows older than m010 have no reasoning tokens)
_MEMO = ("response_text, finish_reason, input_tokens, output_tokens, cached_tokens, cost, thinking,"
         " coalesce(reasoning_tokens, 0)")


def _jx(value: str) -> str:
    """SQLite's json_extract of a jsonb ``value``: true/false as 1/0 and JSON null as NULL."""
    return (f"(CASE jsonb_typeof({value}) WHEN 'boolean' THEN to_jsonb(({value})::boolean::int)"
            f" WHEN 'null' THEN NULL ELSE {value} END)")


#: a judge task's verdict (``$.parsed``), as json_extract gives it
_PARSED = _jx("(j.result_json::jsonb -> 'parsed')")


def _json_type(value: str) -> str:
    """SQLite's json_type of a jsonb ``value`` (integer, real, text, true, false, null, object, array)."""
    return (f"(CASE jsonb_typeof({value}) WHEN 'number' THEN CASE WHEN ({value})::text ~ '^-?[0-9]+$'"
            f" THEN 'integer' ELSE 'real' END WHEN 'string' THEN 'text' WHEN 'boolean' THEN ({value})::text"
            f" ELSE jsonb_typeof({value}) END)")


_PATH_PART = re.compile(r'\.(?:"([^"]*)"|([^.\[]+))|\[(\d+)\]')


def _path(path: str) -> list[str]:
    """A SQLite JSON path (``$.variant.shots``, ``$.a[0]``) as the text[] of PostgreSQL's ``#>``."""
    if not path.startswith("$"):
        raise ValueError(f"bad JSON path {path!r}")
    parts, rest = [], path[1:]
    while rest:
        match = _PATH_PART.match(rest)
        if match is None:
            raise ValueError(f"bad JSON path {path!r}")
        parts.append(next(g for g in match.groups() if g is not None))
        rest = rest[match.end():]
    return parts


def _sql_value(value: Any) -> Any:
    """A JSON value as SQLite's json_extract returns it: an object or array as its compact text."""
    if isinstance(value, dict | list):
        return dumps(value)
    if isinstance(value, bool):
        return int(value)
    return value


def _zero(total: Any) -> Any:
    """SQLite's coalesce(sum(x), 0): the sum, or the integer 0 when there was nothing to add."""
    return 0 if total is None else total


def _order(value: Any) -> tuple:
    """SQLite's sort order: NULL, then numbers, then text (byte order, which is code point order)."""
    if value is None:
        return (0, 0)
    if isinstance(value, int | float):
        return (1, value)
    return (2, str(value))


def _sorted(rows: list[tuple], width: int) -> list[tuple]:
    """Rows of a grouped query in the order SQLite returns them: by their first ``width`` columns."""
    return sorted(rows, key=lambda row: tuple(_order(v) for v in row[:width]))


def redact(url: str) -> str:
    """The URL without its password (in the user part or a ``password=`` parameter)."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            user, host = netloc.rsplit("@", 1)
            netloc = user.split(":", 1)[0] + "@" + host
        query = urlencode([(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "password"])
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return url.split("://", 1)[0] + "://..."


def _reason(exc: Exception, url: str) -> str:
    """The server's or libpq's reason, on one line, without the password: ``Connection refused``, ``password
    authentication failed for user "u"``, ``database "x" does not exist``."""
    diag = getattr(exc, "diag", None)
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    reason = (diag and diag.message_primary) or (lines[0] if lines else type(exc).__name__)
    reason = re.sub(r"^.*\bfailed: ", "", reason) if reason.startswith("connection ") else reason
    reason = re.sub(r"\s+", " ", re.sub(r"^(FATAL|ERROR):\s*", "", reason))
    password = urlsplit(url).password if "://" in url else None
    for secret in filter(None, [password, *(v for k, v in parse_qsl(urlsplit(url).query) if k == "password")]):
        reason = reason.replace(secret, "***")
    return reason.rstrip(".")


class PostgresStore(Store):
    """The shared store: a PostgreSQL database, one connection per process (thread-safe, serialized)."""

    def __init__(self, url: str) -> None:
        self.path = redact(url)
        self._lock = threading.RLock()
        self._cursors = itertools.count(1)
        #: kept in memory only, to connect again after a stall (it may hold a password)
        self._url = url
        #: the session's bound on a transaction left idle, in ms (0: none); set when a worker joins a run
        self._stall_ms = 0
        try:
            self.conn = self._connect()
        except psycopg.Error as exc:
            raise StoreError(f"the PostgreSQL store {self.path} cannot be opened ({_reason(exc, url)}): check that"
                             " the server is running and the URL is right, or set --db or RUNNER_DB") from None
        try:
            migrate(self.conn)
            cursor = self.conn.execute("SELECT * FROM tasks LIMIT 0")
            #: the task table's columns as SQLite has them (seq is this store's rowid)
            self._task_columns = ", ".join(c.name for c in cursor.description or [] if c.name != "seq")
        except psycopg.Error as exc:
            self.conn.close()
            raise StoreError(f"the PostgreSQL store {self.path} cannot be opened ({_reason(exc, url)}): check the"
                             " database and its permissions, or set --db or RUNNER_DB") from None

    def _connect(self) -> psycopg.Connection:
        kwargs: dict[str, Any] = {}
        if "connect_timeout" not in psycopg.conninfo.conninfo_to_dict(self._url):
            kwargs["connect_timeout"] = CONNECT_TIMEOUT_S
        conn = psycopg.connect(self._url, autocommit=True, **kwargs)
        if self._stall_ms:
            conn.execute(_STALL_SQL, (f"{self._stall_ms}ms",))
        return conn

    def _bound_stalls(self, ttl: float) -> None:
        """A transaction this session leaves idle for more than a quarter of the lease (at least a second) is ended
        by the server (module docstring)."""
        ms = max(1000, int(ttl * 1000 / 4))
        if ms != self._stall_ms:
            self._stall_ms = ms
            self._run(_STALL_SQL, (f"{ms}ms",))

    def close(self) -> None:
        with self._lock:
            self.conn.close()

    def failure(self, exc: BaseException, run_id: str | None = None) -> str | None:
        """The sentence for an error that is about the server rather than a statement: the connection is lost (a
        restart, a terminated backend) or its disk is full; with how to go on (``runner resume RUN_ID`` when
        ``run_id`` is given); None for any other error."""
        if not isinstance(exc, psycopg.Error):
            return None
        resume = (f"`runner resume {run_id}` (with the same --db or RUNNER_DB) continues the run" if run_id
                  else "try again")
        reason = _reason(exc, "")
        if isinstance(exc, psycopg.errors.DiskFull):
            return (f"the disk of the PostgreSQL server of {self.path} is full ({reason}): free space there, "
                    f"then {resume}")
        if isinstance(exc, psycopg.OperationalError) or self.conn.broken or self.conn.closed:
            return f"the PostgreSQL store {self.path} went away ({reason}): once the server is back, {resume}"
        return None

    # -- plumbing -------------------------------------------------------------------------------------------
    @contextmanager
    def _tx(self) -> Iterator[psycopg.Connection]:
        """One transaction on the connection, no other thread's statement inside it. Ended by the server because
        this process stopped inside it: a new connection, and :class:`_Stalled` for the method to run it again."""
        with self._lock:
            body_done, started = False, time.monotonic()
            try:
                with self.conn.transaction():
                    yield self.conn
                    body_done = True
            except psycopg.errors.IdleInTransactionSessionTimeout as exc:
                self._reconnect_after(exc)
            except psycopg.OperationalError as exc:
                # The server's reason does not always reach the client (in pipeline mode, executemany's, it says only
                # that the connection closed): a connection lost inside a transaction open for longer than the bound
                # is taken for the bound's end. Lost before COMMIT was sent, the transaction did not commit, so it may
                # run again; lost at COMMIT, whether it committed is unknown, and it is not. A connection lost
                # otherwise (a terminated backend, a restart) is the store going away, as before.
                if body_done or not self._stall_ms or time.monotonic() - started < self._stall_ms / 1000:
                    raise
                self._reconnect_after(exc)

    def _reconnect_after(self, exc: psycopg.Error) -> None:
        """A new connection after the server ended this one inside a transaction, and :class:`_Stalled` for the
        method to run that transaction again; ``exc`` itself when the server cannot be reached."""
        self.conn.close()
        try:
            self.conn = self._connect()
        except psycopg.Error:
            raise exc from None
        raise _Stalled from exc

    def _all(self, sql: str, args: tuple | list | dict | None = None) -> list[tuple]:
        with self._lock:
            return self.conn.execute(sql, args).fetchall()

    def _one(self, sql: str, args: tuple | list | dict | None = None) -> tuple | None:
        with self._lock:
            return self.conn.execute(sql, args).fetchone()

    def _run(self, sql: str, args: tuple | list | dict | None = None) -> int:
        with self._lock:
            return self.conn.execute(sql, args).rowcount

    def _dicts(self, sql: str, args: tuple | list | None = None) -> list[dict[str, Any]]:
        with self._lock:
            cursor = self.conn.execute(sql, args)
            names = [c.name for c in cursor.description or []]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def _stream(self, sql: str, args: tuple | list) -> Iterator[tuple]:
        """A query's rows through a server-side cursor, fetched in slices: memory does not grow with the result."""
        with self._lock:
            cursor = self.conn.cursor(f"runner_stream_{next(self._cursors)}", withhold=True)
            cursor.execute(sql, args)
        try:
            while True:
                with self._lock:
                    rows = cursor.fetchmany(_FETCH)
                if not rows:
                    return
                yield from rows
        finally:
            with self._lock, suppress(psycopg.Error):
                cursor.close()

    # -- the memo ----------------------------------------------------------------------------------
    def lookup(self, key: str) -> CachedResponse | None:
        row = self._one(f"SELECT {_MEMO} FROM responses WHERE key = %s", (key,))
        return CachedResponse(*row) if row else None

    def lookup_many(self, keys: list[str]) -> dict[str, CachedResponse]:
        found: dict[str, CachedResponse] = {}
        for start in range(0, len(keys), 500):
            for key, *values in self._all(
                    f"SELECT key, {_MEMO} FROM responses WHERE key = ANY(%s)", (keys[start:start + 500],)):
                found[key] = CachedResponse(*values)
        return found

    def request_texts(self, keys: list[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        for start in range(0, len(keys), 500):
            found.update(self._all("SELECT key, request_json FROM responses WHERE key = ANY(%s)",
                                   (keys[start:start + 500],)))
        return found

    def memo_keys(self) -> set[str]:
        return {key for (key,) in self._all("SELECT key FROM responses")}

    def output_history(self, provider: str, model_id: str, cap: int, sample: int) -> tuple[int, float]:
        n, mean = self._one(
            "SELECT count(*), avg(least(output_tokens, %s))::float8 FROM (SELECT output_tokens FROM responses"
            " WHERE provider = %s AND model = %s AND output_tokens IS NOT NULL LIMIT %s) s",
            (cap, provider, model_id, sample))
        return int(n or 0), float(mean or 0.0)

    def responses(self) -> list[dict[str, Any]]:
        return self._dicts(f"SELECT * FROM responses ORDER BY created {_C} NULLS FIRST, key {_C}")

    # -- runs --------------------------------------------------------------------------------------
    def create_run(self, job_name: str, job_path: str, job_json: str, fingerprint: str, total: int) -> str:
        run_id = dt.datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)
        self._run("INSERT INTO runs (id, job_name, job_path, job_json, fingerprint, status, total, pid, created,"
                  " started) VALUES (%s, %s, %s, %s, %s, 'running', %s, %s, %s, %s)",
                  (run_id, job_name, job_path, job_json, fingerprint, total, os.getpid(), now(), now()))
        return run_id

    def get_run(self, run_id: str) -> dict[str, Any]:
        rows = self._dicts("SELECT * FROM runs WHERE id = %s", (run_id,))
        if not rows:
            matches = self._all("SELECT id FROM runs WHERE strpos(id, %s) > 0", (run_id,))
            if len(matches) == 1:
                return self.get_run(matches[0][0])
            raise StoreError(f"no run {run_id!r} in {self.path}; `runner runs` lists the runs")
        return rows[0]

    def set_run(self, run_id: str, **fields: Any) -> None:
        assignments = ", ".join(f"{name} = %s" for name in fields)
        self._run(f"UPDATE runs SET {assignments} WHERE id = %s", (*fields.values(), run_id))

    def list_runs(self, limit: int = 50) -> list[dict[str, Any]]:
        runs = self._dicts(
            "SELECT r.*, (SELECT count(*) FROM tasks t WHERE t.run_id = r.id AND t.status = 'done') AS done,"
            " (SELECT count(*) FROM tasks t WHERE t.run_id = r.id AND t.status = 'failed') AS failed,"
            " (SELECT sum(amount) FROM ledger l WHERE l.run_id = r.id"
            " AND l.kind IN ('charge', 'possibly_billed')) AS spend"
            f" FROM runs r ORDER BY r.created {_C} DESC NULLS LAST LIMIT %s", (limit,))
        for run in runs:
            run["spend"] = _zero(run["spend"])
        return runs

    def running_runs(self) -> list[tuple[str, int | None]]:
        return [(run_id, pid) for run_id, pid in self._all("SELECT id, pid FROM runs WHERE status = 'running'")]

    # -- tasks -------------------------------------------------------------------------------------
    def task_status(self, run_id: str, stage: str, item: str) -> str | None:
        row = self._one("SELECT status FROM tasks WHERE run_id = %s AND stage = %s AND item = %s",
                        (run_id, stage, item))
        return row[0] if row else None

    def done_items(self, run_id: str, stage: str, items: list[str]) -> set[str]:
        done: set[str] = set()
        for start in range(0, len(items), 500):
            done.update(item for (item,) in self._all(
                "SELECT item FROM tasks WHERE run_id = %s AND stage = %s AND status = 'done' AND item = ANY(%s)",
                (run_id, stage, items[start:start + 500])))
        return done

    def has_tasks(self, run_id: str, stage: str) -> bool:
        return self._one("SELECT 1 FROM tasks WHERE run_id = %s AND stage = %s LIMIT 1", (run_id, stage)) is not None

    def stage_progress(self, run_id: str, stage: str) -> tuple[int, int]:
        done, other = self._one(
            "SELECT coalesce(sum((status = 'done')::int), 0), coalesce(sum((status != 'done')::int), 0) FROM tasks"
            " WHERE run_id = %s AND stage = %s", (run_id, stage))
        return int(done), int(other)

    def iter_results(self, run_id: str, stage: str) -> Iterator[str]:
        for (line,) in self._stream("SELECT result_json FROM tasks WHERE run_id = %s AND stage = %s ORDER BY seq",
                                    (run_id, stage)):
            yield line

    def tasks(self, run_id: str | None = None, **where: Any) -> list[dict[str, Any]]:
        conditions = {"run_id": run_id, **where} if run_id is not None else dict(where)
        unknown = set(conditions) - set(TASK_COLUMNS) - {"updated"}
        if unknown:
            raise ValueError(f"no task column {', '.join(sorted(unknown))}")
        clause = " AND ".join(f"{name} = %s" for name in conditions)
        return self._dicts(f"SELECT {self._task_columns} FROM tasks{' WHERE ' + clause if clause else ''}"
                           " ORDER BY seq", list(conditions.values()))

    @_deadlock_retried
    def write_batch(self, tasks: list[tuple], responses: list[tuple], ledger: list[tuple],
                    released: list[tuple[int]] | None = None, fenced: list[Finished] | None = None
                    ) -> list[Finished]:
        refused: list[Finished] = []
        with self._tx() as conn:
            cursor = conn.cursor()
            if responses:
                cursor.executemany(_RESPONSE_SQL, responses)
            if fenced:
                held: dict[Fence, bool] = {}
                for item in fenced:
                    fence = item.fence
                    assert fence is not None
                    if fence not in held:
                        held[fence] = self._holds(conn, fence)
                    if held[fence]:
                        tasks = [*tasks, item.task]
                        if item.ledger is not None:
                            ledger = [*ledger, item.ledger]
                        if item.release_id is not None:
                            released = [*(released or []), (item.release_id,)]
                    else:
                        refused.append(item)
                        if item.release_id is not None:
                            conn.execute(_FENCED_RESERVATION_SQL, (item.release_id,))
            if tasks:
                cursor.executemany(_TASK_SQL, tasks)
            if ledger:
                cursor.executemany(_LEDGER_SQL, ledger)
            if released:
                cursor.executemany("DELETE FROM ledger WHERE id = %s", released)
            if responses:  # an answered request's claim ends with the commit of its answer
                cursor.execute("DELETE FROM claims WHERE key = ANY(%s)", (sorted(row[0] for row in responses),))
        return refused

    @staticmethod
    def _holds(conn: psycopg.Connection, fence: Fence) -> bool:
        """Whether the lease is still the fence's worker's, with its token, and that worker live. The lease row is
        locked (FOR SHARE) until the transaction ends, so it cannot be taken over while the write commits."""
        return conn.execute(_HELD_SQL, (fence.run_id, fence.stage, fence.chunk, fence.worker,
                                        fence.token)).fetchone() is not None

    @_deadlock_retried
    def copy_tasks(self, source: str, source_stage: str, run_id: str, stage: str) -> list[tuple[str, int, int, float,
                                                                                                   float]]:
        with self._tx() as conn:
            conn.execute(_COPY_SQL, {"run": run_id, "stage": stage, "source": source, "source_stage": source_stage,
                                     "old": f'"stage":{dumps(source_stage)}', "new": f'"stage":{dumps(stage)}'})
        rows = self._all("SELECT model, count(*), count(score), coalesce(sum(score), 0), coalesce(sum(saved), 0)"
                         " FROM tasks WHERE run_id = %s AND stage = %s GROUP BY model", (run_id, stage))
        return [(model, n, scored, float(correct), float(saved)) for model, n, scored, correct, saved in
                _sorted(rows, 1)]

    def done_by_model(self, run_id: str, stage: str) -> dict[str, tuple[int, int]]:
        rows = self._all("SELECT model, count(*), coalesce(sum(output_tokens), 0)::bigint FROM tasks"
                         " WHERE run_id = %s AND stage = %s AND status = 'done' GROUP BY model", (run_id, stage))
        return {model: (n, int(out)) for model, n, out in _sorted(rows, 1)}

    # -- the ledger ----------------------------------------------------------------------------------
    def reserve(self, run_id: str, stage: str, model: str, key: str, usd: float, worker: str | None = None, *,
                fence: Fence | None = None) -> int:
        if fence is not None:
            return int(self.reserve_within(run_id, stage, model, key, usd, {}, worker, fence=fence)[0] or 0)
        row = self._one(_RESERVE_SQL, (run_id, stage, model, key, "reserved", usd, now(), worker))
        return int(row[0]) if row else 0

    def release(self, ledger_id: int) -> None:
        self._run("DELETE FROM ledger WHERE id = %s AND kind = 'reserved'", (ledger_id,))

    @_deadlock_retried
    def resolve_reservations(self, run_id: str) -> tuple[int, int]:
        with self._tx() as conn:
            settled = conn.execute(
                "UPDATE ledger SET kind = 'charge', amount = (SELECT cost FROM responses r WHERE r.key = ledger.key)"
                " WHERE run_id = %s AND kind = 'reserved' AND key IN (SELECT key FROM responses)", (run_id,)).rowcount
            # a reservation of a line still in a submitted batch is neither: the batch is polled again
            possibly = conn.execute(
                "UPDATE ledger SET kind = 'possibly_billed' WHERE run_id = %s AND kind = 'reserved' AND id NOT IN"
                " (SELECT l.ledger_id FROM batch_lines l JOIN batches b ON b.id = l.batch_id WHERE b.run_id = %s"
                " AND b.state != 'collected' AND l.status = 'pending' AND l.ledger_id IS NOT NULL)",
                (run_id, run_id)).rowcount
        return settled, possibly

    def spent(self, run_id: str) -> list[tuple[str, str, float, int]]:
        money = {(stage, model): usd for stage, model, usd in self._all(
            "SELECT stage, model, sum(amount) FROM ledger WHERE run_id = %s AND kind IN ('charge', 'possibly_billed')"
            " GROUP BY stage, model", (run_id,))}
        tokens = {(stage, model): n for stage, model, n in self._all(
            # failed tasks count too: a refusal's tokens were billed
            "SELECT stage, model, sum(input_tokens + output_tokens)::bigint FROM tasks WHERE run_id = %s"
            " AND cache_hit = 0 GROUP BY stage, model", (run_id,))}
        return [(stage, model, money.get((stage, model), 0.0), int(tokens.get((stage, model)) or 0))
                for stage, model in sorted(set(money) | set(tokens))]

    def unsettled(self, run_id: str, include_reserved: bool) -> dict[tuple[str, str], tuple[float, int]]:
        kinds = "('possibly_billed', 'reserved')" if include_reserved else "('possibly_billed')"
        rows = self._all(f"SELECT stage, model, sum(amount), count(*) FROM ledger WHERE run_id = %s AND kind IN"
                         f" {kinds} GROUP BY stage, model", (run_id,))
        return {(stage, model): (usd, n) for stage, model, usd, n in _sorted(rows, 2)}

    def charged(self, run_id: str) -> float:
        return float(self._one("SELECT coalesce(sum(amount), 0) FROM ledger WHERE run_id = %s AND kind = 'charge'",
                               (run_id,))[0])

    def ledger(self, run_id: str | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        conditions = {name: value for name, value in (("run_id", run_id), ("kind", kind)) if value is not None}
        clause = " AND ".join(f"{name} = %s" for name in conditions)
        return self._dicts(f"SELECT * FROM ledger{' WHERE ' + clause if clause else ''} ORDER BY id",
                           list(conditions.values()))

    def ledger_sums(self, by: str, since: str | None) -> list[tuple[str | None, str, str, int, float]]:
        group = _GROUP_SQL[by][0]
        where, params = ("WHERE l.created >= %s", [since]) if since else ("", [])
        return _sorted([(*row[:4], _zero(row[4])) for row in self._all(
            f"SELECT {group}, l.run_id, l.kind, count(*), sum(l.amount) FROM ledger l"
            f" LEFT JOIN runs r ON r.id = l.run_id {where} GROUP BY 1, 2, 3", params)], 3)

    def saved_sums(self, by: str, since: str | None) -> list[tuple[str | None, str, int, float]]:
        group = _GROUP_SQL[by][1]
        where, params = ("AND t.updated >= %s", [since]) if since else ("", [])
        return _sorted(self._all(
            f"SELECT {group}, t.run_id, count(*), sum(t.saved) FROM tasks t LEFT JOIN runs r ON r.id = t.run_id"
            f" WHERE t.cache_hit = 1 AND t.saved > 0 {where} GROUP BY 1, 2", params), 2)

    # -- Batch API requests ----------------------------------------------------------------------------
    @_deadlock_retried
    def record_batch(self, batch_id: str, run_id: str, stage: str, model: str, provider_batch_id: str | None,
                     round: int, lines: list[tuple[str, int | None]], *, state: str = "running") -> None:
        with self._tx() as conn:
            conn.execute("INSERT INTO batches (id, run_id, stage, model, provider_batch_id, round, state,"
                         " provider_state, lines, created, updated) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s,"
                         " %s)", (batch_id, run_id, stage, model, provider_batch_id, round, state,
                                  "submitted" if state == "running" else state, len(lines), now(), now()))
            conn.cursor().executemany(
                "INSERT INTO batch_lines (batch_id, key, ledger_id, status) VALUES (%s, %s, %s, 'pending')"
                " ON CONFLICT (batch_id, key) DO UPDATE SET ledger_id = excluded.ledger_id, status = 'pending'",
                [(batch_id, key, ledger) for key, ledger in lines])

    def open_batches(self, run_id: str, stage: str) -> list[dict[str, Any]]:
        found = self._dicts("SELECT * FROM batches WHERE run_id = %s AND stage = %s AND state != 'collected'"
                            f" ORDER BY created {_C} NULLS FIRST, id {_C}", (run_id, stage))
        for batch in found:
            batch["lines"] = {key: (ledger, status) for key, ledger, status in self._all(
                "SELECT key, ledger_id, status FROM batch_lines WHERE batch_id = %s ORDER BY key COLLATE \"C\"",
                (batch["id"],))}
        return found

    def update_batch(self, batch_id: str, **fields: Any) -> None:
        fields.setdefault("updated", now())
        assignments = ", ".join(f"{name} = %s" for name in fields)
        self._run(f"UPDATE batches SET {assignments} WHERE id = %s", (*fields.values(), batch_id))

    @_deadlock_retried
    def finish_batch(self, batch_id: str, statuses: dict[str, str]) -> None:
        with self._tx() as conn:
            conn.cursor().executemany("UPDATE batch_lines SET status = %s WHERE batch_id = %s AND key = %s",
                                      [(status, batch_id, key) for key, status in statuses.items()])
            conn.execute("UPDATE batches SET state = 'collected', updated = %s WHERE id = %s", (now(), batch_id))

    @_deadlock_retried
    def drop_batch(self, batch_id: str) -> None:
        with self._tx() as conn:
            conn.execute("DELETE FROM batch_lines WHERE batch_id = %s", (batch_id,))
            conn.execute("DELETE FROM batches WHERE id = %s", (batch_id,))

    def batches(self, run_id: str) -> list[dict[str, Any]]:
        found = self._dicts(f"SELECT * FROM batches WHERE run_id = %s ORDER BY created {_C} NULLS FIRST, id {_C}",
                            (run_id,))
        for batch in found:
            batch["by_status"] = dict(_sorted(self._all(
                "SELECT status, count(*) FROM batch_lines WHERE batch_id = %s GROUP BY status", (batch["id"],)), 1))
        return found

    # -- several processes on one run (runner/engine/workers.py) -------------------------------------------------
    def join_run(self, run_id: str, worker: str, host: str, pid: int, ttl: float) -> None:
        self._bound_stalls(ttl)
        self._run("INSERT INTO workers (id, run_id, host, pid, started, seen, state) VALUES"
                  f" (%s, %s, %s, %s, %s, {_CLOCK} + %s, 'live') ON CONFLICT (id) DO UPDATE SET"
                  " run_id = excluded.run_id, host = excluded.host, pid = excluded.pid, started = excluded.started,"
                  " seen = excluded.seen, state = excluded.state", (worker, run_id, host, pid, now(), ttl))

    @_deadlock_retried
    def heartbeat(self, worker: str, ttl: float) -> list[tuple[str, int, int]] | None:
        self._bound_stalls(ttl)  # a widened lease widens the bound too
        with self._tx() as conn:
            (until,) = conn.execute(f"SELECT {_CLOCK} + %s", (ttl,)).fetchone()
            if not conn.execute("UPDATE workers SET seen = %s WHERE id = %s AND state = 'live'",
                                (until, worker)).rowcount:
                return None  # declared dead (or gone): nothing of it is extended
            held = conn.execute("UPDATE leases SET expires = %s WHERE worker = %s AND done = 0 RETURNING stage, chunk,"
                                " token", (until, worker)).fetchall()
            conn.execute("UPDATE claims SET expires = %s WHERE worker = %s", (until, worker))
        return sorted((stage, int(chunk), int(token)) for stage, chunk, token in held)

    @_deadlock_retried
    def leave_run(self, worker: str) -> None:
        with self._tx() as conn:
            conn.execute("UPDATE workers SET state = 'left' WHERE id = %s AND state = 'live'", (worker,))
            conn.execute(LEFT_RESERVATIONS_SQL.replace("?", "%s"), (worker,))
            conn.execute("UPDATE leases SET expires = 0 WHERE worker = %s AND done = 0", (worker,))
            conn.execute("DELETE FROM claims WHERE worker = %s", (worker,))

    def workers(self, run_id: str) -> list[dict[str, Any]]:
        rows = self._dicts(f"SELECT id, host, pid, started, seen < {_CLOCK} AS expired, state FROM workers"
                           f" WHERE run_id = %s ORDER BY started {_C} NULLS FIRST, id {_C}", (run_id,))
        for row in rows:
            if row.pop("expired") and row["state"] == "live":
                row["state"] = "dead"
        return rows

    def lease_chunks(self, run_id: str, stage: str, chunks: list[int], worker: str, ttl: float
                     ) -> dict[int, tuple[str, int] | None]:
        # xmax is 0 in a row this statement inserted and set in a row it updated (taken over); the token grows
        # unless the lease was this worker's and live
        rows = self._all(
            f"INSERT INTO leases (run_id, stage, chunk, worker, expires, token) SELECT %s, %s, c, %s, {_CLOCK} + %s, 1"
            " FROM unnest(%s::bigint[]) AS c"
            " ON CONFLICT (run_id, stage, chunk) DO UPDATE SET worker = excluded.worker, expires = excluded.expires,"
            " token = leases.token + CASE WHEN leases.worker = excluded.worker AND leases.expires >= excluded.expires"
            " - %s THEN 0 ELSE 1 END"
            " WHERE leases.done = 0 AND (leases.expires < excluded.expires - %s OR leases.worker = excluded.worker)"
            " RETURNING chunk, xmax = 0, token", (run_id, stage, worker, ttl, list(dict.fromkeys(chunks)), ttl, ttl))
        got: dict[int, tuple[str, int] | None] = dict.fromkeys(chunks)
        for chunk, inserted, token in rows:
            got[int(chunk)] = ("new" if inserted else "taken", int(token))
        return got

    @_deadlock_retried
    def take_expired_lease(self, run_id: str, stage: str, worker: str, ttl: float) -> tuple[int, int] | None:
        with self._tx() as conn:
            row = conn.execute(
                f"SELECT chunk FROM leases WHERE run_id = %s AND stage = %s AND done = 0 AND expires < {_CLOCK}"
                " ORDER BY chunk LIMIT 1 FOR UPDATE SKIP LOCKED", (run_id, stage)).fetchone()
            if row is None:
                return None
            (token,) = conn.execute(f"UPDATE leases SET worker = %s, expires = {_CLOCK} + %s, token = token + 1"
                                    " WHERE run_id = %s AND stage = %s AND chunk = %s RETURNING token",
                                    (worker, ttl, run_id, stage, row[0])).fetchone()
        return int(row[0]), int(token)

    def finish_chunks(self, run_id: str, stage: str, worker: str, chunks: list[int] | None = None,
                      tokens: list[int] | None = None) -> None:
        if chunks is None:
            self._run("UPDATE leases SET done = 1 WHERE run_id = %s AND stage = %s AND worker = %s AND done = 0"
                      f" AND {LIVE_SQL}", (run_id, stage, worker))
        elif tokens is None:
            self._run("UPDATE leases SET done = 1 WHERE run_id = %s AND stage = %s AND worker = %s"
                      f" AND chunk = ANY(%s::bigint[]) AND {LIVE_SQL}", (run_id, stage, worker, sorted(chunks)))
        else:
            self._run("UPDATE leases SET done = 1 FROM unnest(%s::bigint[], %s::bigint[]) AS f(chunk, token)"
                      " WHERE leases.run_id = %s AND leases.stage = %s AND leases.worker = %s"
                      f" AND leases.chunk = f.chunk AND leases.token = f.token AND {LIVE_SQL}",
                      (list(chunks), list(tokens), run_id, stage, worker))

    def open_chunks(self, run_id: str, stage: str) -> int:
        return int(self._one("SELECT count(*) FROM leases WHERE run_id = %s AND stage = %s AND done = 0",
                             (run_id, stage))[0])

    def reset_chunks(self, run_id: str) -> None:
        self._run("DELETE FROM leases WHERE run_id = %s", (run_id,))

    @_deadlock_retried
    def claim_keys(self, keys: list[str], worker: str, ttl: float) -> set[str]:
        if not keys:
            return set()
        unique = sorted(set(keys))  # one statement may not update a row twice; one order for every process
        return {key for (key,) in self._all(
            f"INSERT INTO claims (key, worker, expires) SELECT k, %s, {_CLOCK} + %s FROM unnest(%s::text[]) AS k"
            " ON CONFLICT (key) DO UPDATE SET worker = excluded.worker, expires = excluded.expires"
            " WHERE claims.expires < excluded.expires - %s OR claims.worker = excluded.worker RETURNING key",
            (worker, ttl, unique, ttl))}

    def release_keys(self, keys: list[str], worker: str) -> None:
        if keys:
            self._run("DELETE FROM claims WHERE worker = %s AND key = ANY(%s)", (worker, sorted(keys)))

    def dead_workers(self, run_id: str) -> list[str]:
        return [worker for (worker,) in self._all(
            f"SELECT id FROM workers WHERE run_id = %s AND state = 'live' AND seen < {_CLOCK}"
            f" ORDER BY started {_C} NULLS FIRST, id {_C}", (run_id,))]

    @_deadlock_retried
    def resolve_worker(self, run_id: str, worker: str) -> int:
        with self._tx() as conn:
            possibly = conn.execute("UPDATE ledger SET kind = 'possibly_billed' WHERE run_id = %s AND worker = %s"
                                    " AND kind = 'reserved'", (run_id, worker)).rowcount
            conn.execute("UPDATE workers SET state = 'dead' WHERE id = %s", (worker,))
        return possibly

    @_deadlock_retried
    def reserve_within(self, run_id: str, stage: str, model: str, key: str, usd: float,
                       limits: dict[str, float], worker: str | None = None, *, fence: Fence | None = None
                       ) -> tuple[int | None, str | None, int]:
        with self._tx() as conn:
            if fence is not None and not self._holds(conn, fence):
                raise Fenced(f"worker {fence.worker} lost its lease of chunk {fence.chunk} of stage {fence.stage}")
            # the run's lock first: no other process reserves in this run between the check and the insert
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (run_id,))
            used = {scope: (usd_, inflight) for scope, usd_, inflight in conn.execute(
                "SELECT scope, usd, inflight FROM budget_use WHERE run_id = %s AND scope = ANY(%s)",
                (run_id, list(limits))).fetchall()}
            for scope, limit in limits.items():
                spent, inflight = used.get(scope, (0.0, 0))
                if spent + usd > limit + EPSILON:
                    return None, scope, int(inflight)
            (ledger_id,) = conn.execute(_RESERVE_SQL, (run_id, stage, model, key, "reserved", usd, now(),
                                                       worker)).fetchone()
        return int(ledger_id), None, 0

    # -- evaluation stages finished whole (runner/engine/replay.py) -------------------------------------------------
    def replayable(self, digest: str) -> tuple[str, int] | None:
        row = self._one("SELECT run_id, tasks FROM stage_replays WHERE hash = %s", (digest,))
        return (row[0], row[1]) if row else None

    def record_replayable(self, digest: str, run_id: str, stage: str, tasks: int) -> None:
        self._run("INSERT INTO stage_replays (hash, run_id, stage, tasks, created) VALUES (%s, %s, %s, %s, %s)"
                  " ON CONFLICT (hash) DO UPDATE SET run_id = excluded.run_id, stage = excluded.stage,"
                  " tasks = excluded.tasks, created = excluded.created", (digest, run_id, stage, tasks, now()))

    # -- pipelines: content-addressed stage outputs ---------------------------------------------------------
    def stage_output(self, digest: str) -> dict[str, Any] | None:
        rows = self._dicts("SELECT * FROM stage_outputs WHERE hash = %s", (digest,))
        return rows[0] if rows else None

    def stage_rows(self, digest: str) -> list[dict[str, Any]]:
        return [json.loads(row) for (row,) in self._all("SELECT row FROM stage_rows WHERE hash = %s ORDER BY n",
                                                        (digest,))]

    @_deadlock_retried
    def save_stage_output(self, digest: str, stage: str, run_id: str, rows: list[dict[str, Any]], cost: float,
                          funnel: dict[str, Any]) -> None:
        with self._tx() as conn:
            conn.execute("DELETE FROM stage_rows WHERE hash = %s", (digest,))
            conn.cursor().executemany("INSERT INTO stage_rows (hash, n, row) VALUES (%s, %s, %s)",
                                      [(digest, n, dumps(row)) for n, row in enumerate(rows)])
            conn.execute("INSERT INTO stage_outputs (hash, stage, run_id, rows, cost, funnel, created) VALUES"
                         " (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (hash) DO UPDATE SET stage = excluded.stage,"
                         " run_id = excluded.run_id, rows = excluded.rows, cost = excluded.cost,"
                         " funnel = excluded.funnel, created = excluded.created",
                         (digest, stage, run_id, len(rows), cost, dumps(funnel), now()))

    def record_run_stage(self, run_id: str, stage: str, position: int, digest: str, funnel: dict[str, Any]) -> None:
        self._run("INSERT INTO run_stages (run_id, stage, position, hash, funnel) VALUES (%s, %s, %s, %s, %s)"
                  " ON CONFLICT (run_id, stage) DO UPDATE SET position = excluded.position, hash = excluded.hash,"
                  " funnel = excluded.funnel", (run_id, stage, position, digest, dumps(funnel)))

    def run_stages(self, run_id: str) -> list[dict[str, Any]]:
        return [json.loads(funnel) for (funnel,) in self._all(
            "SELECT funnel FROM run_stages WHERE run_id = %s ORDER BY position", (run_id,))]

    def stage_cost(self, run_id: str, stage: str) -> tuple[float, int]:
        usd, sent = self._one(
            "SELECT coalesce(sum(cost), 0), coalesce(sum((cache_hit = 0 AND status = 'done')::int), 0) FROM tasks"
            " WHERE run_id = %s AND stage = %s", (run_id, stage))
        return float(usd), int(sent)

    # -- the report's questions -------------------------------------------------------------------------
    def group_summaries(self, run_id: str) -> list[GroupSummary]:
        # reasoning tokens of the requests sent come from their memo rows
        rows = self._all(
            "SELECT t.stage, t.model, count(*), sum((t.status = 'done')::int), sum((t.status = 'failed')::int),"
            " sum(t.cache_hit)::bigint, sum(CASE WHEN t.cache_hit = 0 THEN t.input_tokens ELSE 0 END)::bigint,"
            " sum(CASE WHEN t.cache_hit = 0 THEN t.output_tokens ELSE 0 END)::bigint, sum(t.cost),"
            " count(t.score), sum((t.status = 'done' AND t.valid = 0)::int), avg(t.score),"
            " coalesce(sum(CASE WHEN t.cache_hit = 0 THEN t.cached_tokens ELSE 0 END), 0)::bigint,"
            " sum(t.saved), count(t.batch_saved), sum(t.batch_saved), coalesce(sum(r.reasoning_tokens), 0)::bigint"
            " FROM tasks t LEFT JOIN responses r ON t.cache_hit = 0 AND t.status = 'done' AND r.key = t.key"
            " WHERE t.run_id = %s GROUP BY t.stage, t.model ORDER BY min(t.seq)", (run_id,))
        return [GroupSummary(*row[:8], _zero(row[8]), *row[9:13], _zero(row[13]), row[14], _zero(row[15]),
                             int(row[16])) for row in rows]

    def error_counts(self, run_id: str, stage: str, model: str) -> dict[str, int]:
        return dict(self._all(
            "SELECT error_class, count(*) FROM tasks WHERE run_id = %s AND stage = %s AND model = %s"
            f" AND status = 'failed' GROUP BY error_class ORDER BY error_class {_C} NULLS FIRST",
            (run_id, stage, model)))

    def latencies(self, run_id: str, stage: str, model: str) -> list[float]:
        return [latency for (latency,) in self._all(
            "SELECT latency FROM tasks WHERE run_id = %s AND stage = %s AND model = %s AND latency IS NOT NULL"
            " ORDER BY latency", (run_id, stage, model))]

    def accuracy_by_variant(self, run_id: str, stage: str, model: str, key: str) -> dict[str, float]:
        rows = self._all(f"SELECT {_jx('v')} AS v, avg(score) FROM (SELECT variant_json::jsonb #> %s::text[] AS v,"
                         f" score {_SCORED}) s GROUP BY 1", (_path("$." + key), run_id, stage, model))
        return {str(_sql_value(v)): acc for v, acc in _sorted([(_sql_value(v), a) for v, a in rows], 1)}

    def variant_axes(self, run_id: str, stage: str, model: str) -> list[str]:
        # in order of first appearance (tasks in seq order, each one's keys in its text's order), as SQLite's
        # DISTINCT over json_each returns them
        return [key for (key,) in self._all(
            "SELECT j.key FROM tasks t, json_each(t.variant_json::json) WITH ORDINALITY AS j(key, value, ord)"
            " WHERE t.run_id = %s AND t.stage = %s AND t.model = %s AND t.score IS NOT NULL"
            " GROUP BY j.key ORDER BY min(ARRAY[t.seq, j.ord])", (run_id, stage, model))]

    def accuracy_by_gold_type(self, run_id: str, stage: str, model: str) -> list[tuple[str, float]]:
        # a group's JSON type is its first task's (true and 1 are one group), as SQLite's bare column gives it
        rows = self._all(f"SELECT {_jx('g')}, (array_agg({_json_type('g')} ORDER BY seq))[1], avg(score) FROM"
                         f" (SELECT seq, result_json::jsonb -> 'gold' AS g, score {_SCORED}) s GROUP BY 1",
                         (run_id, stage, model))
        return [(kind, acc) for _, kind, acc in _sorted([(_sql_value(g), k, a) for g, k, a in rows], 1)]

    def letter_answers(self, run_id: str, stage: str, model: str) -> Iterator[tuple[str, str | None, Any]]:
        for letter, permutation, gold in self._stream(
                f"SELECT {_jx('l')}, p, {_jx('g')} FROM (SELECT seq, result_json::jsonb -> 'answer_letter' AS l,"
                " result_json::json -> 'permutation' AS p, result_json::jsonb -> 'gold' AS g, valid"
                f" {_SCORED}) s WHERE valid = 1 AND {_jx('l')} IS NOT NULL ORDER BY seq", (run_id, stage, model)):
            yield _sql_value(letter), _sql_value(permutation), _sql_value(gold)

    def seed_scores(self, run_id: str, stage: str, variant: dict[str, Any] | None = None
                    ) -> list[tuple[str, Any, float, int]]:
        names = list(variant or {})
        inner = "".join(f", variant_json::jsonb #> %s::text[] AS f{i}" for i in range(len(names)))
        where = "".join(f" AND {_jx(f'f{i}')} = %s" for i in range(len(names)))
        values = [Jsonb(int(v) if isinstance(v, bool) else v) for v in (variant or {}).values()]
        rows = self._all(
            f"SELECT model, {_jx('v')}, avg(score), count(score) FROM (SELECT model, variant_json::jsonb -> 'seed'"
            f" AS v, score{inner} FROM tasks WHERE run_id = %s AND stage = %s AND score IS NOT NULL) s"
            f" WHERE true{where} GROUP BY 1, 2", (*(_path("$." + name) for name in names), run_id, stage, *values))
        return _sorted([(m, _sql_value(seed), acc, n) for m, seed, acc, n in rows], 2)

    def accuracy_groups(self, run_id: str, stage: str, paths: list[str]) -> list[tuple]:
        inner = "".join(f", result_json::jsonb #> %s::text[] AS r{i}" for i in range(len(paths)))
        outer = "".join(f", {_jx(f'r{i}')}" for i in range(len(paths)))
        groups = "".join(f", {i + 2}" for i in range(len(paths)))
        rows = self._all(
            f"SELECT model{outer}, avg(score), count(score) FROM (SELECT model{inner}, score FROM tasks"
            f" WHERE run_id = %s AND stage = %s AND score IS NOT NULL) s GROUP BY 1{groups}",
            (*(_path(p) for p in paths), run_id, stage))
        width = 1 + len(paths)
        return _sorted([(*(_sql_value(v) for v in row[:width]), *row[width:]) for row in rows], width)

    def variant_kinds(self, run_id: str) -> list[tuple[str, str, str, int]]:
        return _sorted(self._all("SELECT stage, model, variant_json, count(*) FROM tasks WHERE run_id = %s"
                                 " GROUP BY stage, model, variant_json", (run_id,)), 3)

    def first_task(self, run_id: str) -> tuple[str, str] | None:
        row = self._one("SELECT item, row_id FROM tasks WHERE run_id = %s ORDER BY seq LIMIT 1", (run_id,))
        return (row[0], row[1]) if row else None

    def count_tasks(self, run_id: str, stage: str) -> int:
        return int(self._one("SELECT count(*) FROM tasks WHERE run_id = %s AND stage = %s", (run_id, stage))[0])

    def unmatched_verdicts(self, judge_id: str, judge_stage: str, run_id: str, stage: str) -> tuple[int, str | None]:
        count, example = self._one(
            f"SELECT count(*), min(j.row_id {_C}) FROM tasks j WHERE j.run_id = %s AND j.stage = %s AND NOT EXISTS"
            " (SELECT 1 FROM tasks m WHERE m.run_id = %s AND m.stage = %s AND m.item = j.row_id)",
            (judge_id, judge_stage, run_id, stage))
        return int(count), example

    def judged_groups(self, judge_id: str, judge_stage: str, suffix: str, run_id: str, stage: str) -> list[tuple]:
        rows = self._all(
            f"SELECT m.model, {_jx('m.seed')} AS seed, count(*), sum((j.status = 'done')::int),"
            f" sum((j.status = 'done' AND {_PARSED} = '1'::jsonb)::int),"
            " sum((j.status = 'done' AND j.valid = 0)::int),"
            f" min(CASE WHEN j.item IS NULL OR j.status != 'done' THEN m.item END {_C})"
            " FROM (SELECT model, item, variant_json::jsonb -> 'seed' AS seed FROM tasks WHERE run_id = %s"
            " AND stage = %s AND status = 'done') m"
            " LEFT JOIN tasks j ON j.run_id = %s AND j.stage = %s AND j.item = m.item || %s GROUP BY 1, 2",
            (run_id, stage, judge_id, judge_stage, suffix))
        return _sorted([(model, _sql_value(seed), *rest) for model, seed, *rest in rows], 2)
