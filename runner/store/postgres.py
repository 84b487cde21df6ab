"""The PostgreSQL store: the same tables and answers as :class:`~runner.store.sqlite.SQLiteStore`, in a database
server that several processes (and machines) share: ``--db postgresql://user@host/dbname``.

One connection per process, in autocommit mode: a query is its own transaction, and the writes SQLite makes under
``BEGIN IMMEDIATE`` are one ``with conn.transaction():`` block here. The connection is shared by the threads of a
process under one lock (a transaction block is never interleaved with another thread's statements).

The queries are :mod:`runner.store.sql`'s and :mod:`runner.store.reads`'s, written once; :mod:`runner.store.dialect`
spells them for PostgreSQL so that they answer as SQLite does (order, JSON values, types). The ``rowid`` order of
tasks is the ``seq`` column here, renewed when a task row is replaced, as ``INSERT OR REPLACE`` renews a rowid.
This module holds what is PostgreSQL's own: the connection, transactions, advisory locks, ``FOR UPDATE SKIP
LOCKED``, and the worker protocol on the server's clock.

Lease and claim times are the database server's clock (``clock_timestamp()``), the same for every machine.

A worker's process may stop inside a transaction (a stopped or swapped-out process, a machine under load) while it
holds row locks or the run's reservation lock, and every other worker would wait on them until it wakes. So a
worker's session ends a transaction left idle longer than a quarter of its lease (``idle_in_transaction_session_
timeout``): the server rolls it back and frees its locks; when the process wakes, it connects again and runs the
whole transaction again, where its fence (a lease now another worker's) refuses what it may no longer write. The
bound holds only for a session that is idle while its process is stopped: no statement inside a transaction is
pipelined (:mod:`runner.store.pg_batches`), since a pipeline cut before its Sync leaves the session active, and the
timeout never fires for an active session. A worker's session is named ``runner WORKER`` (``application_name``), so
``pg_stat_activity`` says which worker holds what.

A server that ends this process's session (``pg_terminate_backend``, a restart, a failover) is connected to again,
tried with a growing pause for up to ``RUNNER_STORE_WAIT`` seconds (:data:`RECONNECT_WAIT_S` by default), before
the run ends, resumable. Nothing is done twice: a session found ended before a statement is sent (the server's
goodbye waits on the socket: :meth:`PostgresStore._ended`, a poll that costs no round trip) is the usual case, as
the server ends an idle session; a read is sent again; a transaction cut before its COMMIT was sent did not
commit, and runs again whole. A transaction cut at its COMMIT may or may not have committed: it learns its
transaction id before the COMMIT is sent, and the new session asks the server what became of it
(``txid_status``, which PostgreSQL keeps for this very case: "Transaction ID and Snapshot Information
Functions" in its manual): committed, the method returns what the transaction found; rolled back, it runs again.
A single write is sent as such a transaction (one that only reads is not), so it is never applied twice either.
One case stays unknown and ends the run, resumable: the server crashed and restarted in between and says the id
committed (after a crash an id may be given again: :meth:`PostgresStore._committed`).
"""

from __future__ import annotations

import itertools
import re
import select
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import psycopg

from runner.errors import StoreError
from runner.store.base import TASK_COLUMNS, Store, now
from runner.store.dialect import POSTGRES
from runner.store.migrations import migrate
from runner.store.pg_batches import execute_batched
from runner.store.pg_url import reason as said_reason
from runner.store.pg_url import redact
from runner.store.pg_workers import CLOCK, PgWorkerClock
from runner.store.sql import SQLStore, T, Tx
from runner.store.sqlite_lock import store_wait

#: seconds to wait for the server when the URL does not say (``connect_timeout``)
CONNECT_TIMEOUT_S = 10
#: seconds a session the server ended is tried again in all, unless RUNNER_STORE_WAIT says otherwise
RECONNECT_WAIT_S = 30.0
#: the first pause between two tries to connect again, doubled after each up to :data:`_PAUSE_MAX_S`
_PAUSE_S = 0.1
_PAUSE_MAX_S = 2.0
#: a statement that only reads (no row locks), so it may be sent again when the session ended under it
_READ = re.compile(r"\s*SELECT\b(?!.*\bFOR\s+(UPDATE|SHARE|NO\s+KEY|KEY)\b)", re.IGNORECASE | re.DOTALL)
#: rows per round trip when a result is streamed
_FETCH = 2000
#: the session's bound on a transaction left idle (module docstring)
_STALL_SQL = "SELECT set_config('idle_in_transaction_session_timeout', %s, false)"
#: the transaction's id, taken before its COMMIT is sent (NULL for one that wrote nothing; PostgreSQL 10 and later),
#: and when the server started (a restart in between makes the id's status ambiguous: :meth:`PostgresStore._committed`)
_XID_SQL = "SELECT txid_current_if_assigned(), pg_postmaster_start_time()"
_STARTED_SQL = "SELECT pg_postmaster_start_time()"
#: what became of a transaction: 'committed', 'aborted' or 'in progress'
_XID_STATUS_SQL = "SELECT txid_status(%s)"
#: ends the session still holding a transaction (the lost one) by its id; txid carries an epoch above the xid's 32 bits
_END_HOLDER_SQL = ("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                   " WHERE backend_xid = (%s::bigint %% 4294967296)::text::xid AND pid <> pg_backend_pid()")
#: the session's name in pg_stat_activity
_NAME_SQL = "SELECT set_config('application_name', %s, false)"

#: the first key of the advisory locks that order a run's task writes (:meth:`PostgresStore.order_task_writes`)
_TASK_WRITES = 7

# The task's time stamp is taken by the server at commit; a replaced task row gets a new seq (SQLite: a new rowid).
_TASK_SQL = (
    f"INSERT INTO tasks ({', '.join(TASK_COLUMNS)}, updated) VALUES ({', '.join('?' for _ in TASK_COLUMNS)},"
    f" {POSTGRES.stamp}) ON CONFLICT (run_id, stage, item) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in (*TASK_COLUMNS[3:], "updated", "seq"))
)


class _Stalled(Exception):
    """The server ended this process's transaction before its COMMIT was sent: left idle past the session's bound
    (the process stopped inside it), or the session ended (module docstring). Rolled back, so it may run again on
    a new connection."""


def _deadlock_retried(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run again a transaction PostgreSQL chose as a deadlock's victim (processes claiming, beating and committing
    at once may lock the same claims rows in different orders; keys are sorted where one statement takes many), or
    ended before its COMMIT (:class:`_Stalled`). Each method so marked is one transaction, with nothing committed
    before it, so running it again is safe."""
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


class _Tx:
    """A transaction's statements on the connection, in the shared queries' ``?`` spelling."""

    __slots__ = ("conn",)

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn

    def execute(self, sql: str, args: Any = ()) -> psycopg.Cursor:
        return self.conn.execute(POSTGRES.sql(sql), args)

    def executemany(self, sql: str, rows: Any) -> None:
        # never psycopg's executemany: its pipeline keeps a stopped process's session active (pg_batches.py)
        execute_batched(self.execute, sql, rows)


class PostgresStore(PgWorkerClock, SQLStore):
    """The shared store: a PostgreSQL database, one connection per process (thread-safe, serialized)."""

    dialect = POSTGRES
    task_sql = _TASK_SQL

    def __init__(self, url: str) -> None:
        self.path = redact(url)
        self._lock = threading.RLock()
        self._cursors = itertools.count(1)
        #: kept in memory only, to connect again after a stall (it may hold a password)
        self._url = url
        #: the session's bound on a transaction left idle, in ms (0: none); set when a worker joins a run
        self._stall_ms = 0
        #: the session's application_name once a worker joins a run (``runner WORKER``): pg_stat_activity then says
        #: which worker each session is, and what it holds
        self._app_name = ""
        #: seconds a session the server ended is tried again in all (module docstring)
        self._wait = store_wait(RECONNECT_WAIT_S)
        #: the current session's goodbye from the server, if it said one (:meth:`_ended`)
        self._farewell: list[str] = []
        try:
            self.conn = self._connect()
        except psycopg.Error as exc:
            raise StoreError(f"the PostgreSQL store {self.path} cannot be opened ({said_reason(exc, url)}): check that"
                             " the server is running and the URL is right, or set --db or RUNNER_DB") from None
        try:
            migrate(self.conn, POSTGRES)
            cursor = self.conn.execute("SELECT * FROM tasks LIMIT 0")
            #: the task table's columns as SQLite has them (seq is this store's rowid)
            self.task_columns = ", ".join(c.name for c in cursor.description or [] if c.name != "seq")
        except psycopg.Error as exc:
            self.conn.close()
            raise StoreError(f"the PostgreSQL store {self.path} cannot be opened ({said_reason(exc, url)}): check the"
                             " database and its permissions, or set --db or RUNNER_DB") from None

    def _connect(self) -> psycopg.Connection:
        kwargs: dict[str, Any] = {}
        if "connect_timeout" not in psycopg.conninfo.conninfo_to_dict(self._url):
            kwargs["connect_timeout"] = CONNECT_TIMEOUT_S
        conn = psycopg.connect(self._url, autocommit=True, **kwargs)
        farewell: list[str] = []  # the server's FATAL, said unasked when it ends the session (_ended)
        conn.add_notice_handler(lambda diag: farewell.append(diag.sqlstate or "")
                                if diag.severity_nonlocalized in ("FATAL", "PANIC") else None)
        self._farewell = farewell
        if self._stall_ms:
            conn.execute(_STALL_SQL, (f"{self._stall_ms}ms",))
        if self._app_name:
            conn.execute(_NAME_SQL, (self._app_name,))
        return conn

    def _bound_stalls(self, ttl: float) -> None:
        """A transaction this session leaves idle for more than a quarter of the lease (at least a second) is ended
        by the server (module docstring)."""
        ms = max(1000, int(ttl * 1000 / 4))
        if ms != self._stall_ms:
            self._stall_ms = ms
            with self._lock:
                self._live().execute(_STALL_SQL, (f"{ms}ms",))

    def close(self) -> None:
        with self._lock:
            self.conn.close()

    def reopen(self) -> Store:
        return PostgresStore(self._url)

    def failure(self, exc: BaseException, run_id: str | None = None) -> str | None:
        """The sentence for an error that is about the server rather than a statement: the connection is lost (a
        restart, a terminated backend) or its disk is full; with how to go on (``runner resume RUN_ID`` when
        ``run_id`` is given); None for any other error."""
        if not isinstance(exc, psycopg.Error):
            return None
        resume = (f"`runner resume {run_id}` (with the same --db or RUNNER_DB) continues the run" if run_id
                  else "try again")
        reason = said_reason(exc, "")
        if isinstance(exc, psycopg.errors.DiskFull):
            return (f"the disk of the PostgreSQL server of {self.path} is full ({reason}): free space there, "
                    f"then {resume}")
        if isinstance(exc, psycopg.OperationalError) or self.conn.broken or self.conn.closed:
            return f"the PostgreSQL store {self.path} went away ({reason}): once the server is back, {resume}"
        return None

    # -- plumbing -------------------------------------------------------------------------------------------
    @contextmanager
    def _tx(self) -> Iterator[psycopg.Connection]:
        """One transaction on the connection, no other thread's statement inside it. Ended by the server before its
        COMMIT was sent (this process stopped inside it, or the session ended): a new connection, and
        :class:`_Stalled` for the method to run it again. Lost at its COMMIT: a new connection, and the server says
        whether it committed (module docstring)."""
        with self._lock:
            committing, xid, started = False, None, None
            try:
                conn = self._live()
                with conn.transaction():
                    yield conn
                    xid, started = conn.execute(_XID_SQL).fetchone() or (None, None)
                    committing = True
            except psycopg.errors.IdleInTransactionSessionTimeout as exc:
                self._reconnect_after(exc)
            except psycopg.OperationalError as exc:
                # An error that leaves the connection working (a statement's own) is no loss. Lost before COMMIT
                # was sent (the stall bound's end, which the server does not always manage to say, or the session
                # ended), the transaction did not commit, so it runs again; lost at COMMIT, the server is asked.
                if not self.conn.broken:
                    raise
                if not committing:
                    self._reconnect_after(exc)
                elif not self._committed(xid, started, exc):
                    raise _Stalled from exc

    def _committed(self, xid: int | None, started: Any, exc: psycopg.Error) -> bool:
        """Whether the transaction ``xid``, whose COMMIT was cut, committed, asked on a new connection; one that
        wrote nothing (``xid`` None) counts as committed: what it read stands either way. ``exc`` itself when the
        server is not back within the wait, or cannot say.

        The server restarted since (``started`` differs): its sessions all ended, so the transaction is over; but
        after a crash an id whose records never reached the disk is given again, so a 'committed' may be another
        transaction's and cannot be trusted (the run ends, resumable, keeping its answers aside), while 'aborted'
        or 'in progress' (the id given again) mean this one did not commit."""
        with suppress(psycopg.Error):
            self.conn.close()
        deadline = time.monotonic() + self._wait
        try:
            self.conn = self._reconnected()
            if xid is None:
                return True
            restarted = self.conn.execute(_STARTED_SQL).fetchone()[0] != started
            while True:
                (status,) = self.conn.execute(_XID_STATUS_SQL, (xid,)).fetchone() or (None,)
                if restarted:
                    if status == "committed":
                        raise exc
                    return False
                if status in ("committed", "aborted"):
                    return status == "committed"
                # 'in progress': the old session's backend has not seen the connection end (a network cut) or is
                # rolling back; the id is this process's, idle in that transaction, so its session is ended here
                self.conn.execute(_END_HOLDER_SQL, (xid,))
                if time.monotonic() >= deadline:
                    raise exc
                time.sleep(_PAUSE_S)
        except psycopg.Error:
            raise exc from None

    def _reconnect_after(self, exc: psycopg.Error) -> None:
        """A new connection after the server ended this one inside a transaction, and :class:`_Stalled` for the
        method to run that transaction again; ``exc`` itself when the server is not back within the wait."""
        with suppress(psycopg.Error):
            self.conn.close()
        try:
            self.conn = self._reconnected()
        except psycopg.Error:
            raise exc from None
        raise _Stalled from exc

    def _reconnected(self) -> psycopg.Connection:
        """A new connection, tried again with a growing pause while the server refuses it (restarting, or not
        taking connections), for :attr:`_wait` seconds in all; the last refusal when it does not come back."""
        deadline, pause = time.monotonic() + self._wait, _PAUSE_S
        while True:
            try:
                return self._connect()
            except psycopg.OperationalError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
            time.sleep(min(pause, left))
            pause = min(pause * 2, _PAUSE_MAX_S)

    def _live(self) -> psycopg.Connection:
        """The connection, a new one when the last was lost or ended: after a statement failed on it (it raised
        already; without this, every later call would fail with "the connection is closed" though the server is
        there), or found ended before anything is sent on it (:meth:`_ended`). Called holding the lock."""
        if self.conn.closed or self.conn.broken or self._ended():
            with suppress(psycopg.Error):
                self.conn.close()
            self.conn = self._reconnected()
        return self.conn

    def _ended(self) -> bool:
        """Whether the server ended this idle session: its goodbye (FATAL, e.g. 57P01 "terminating connection due
        to administrator command") and the end of the stream wait unread on the socket. A poll, no round trip;
        anything else unread (a notice, a parameter's new value) is taken in as libpq would."""
        if self.conn.pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            return False
        try:
            if not select.select([self.conn.fileno()], [], [], 0)[0]:
                return False
            pgconn = self.conn.pgconn
            pgconn.consume_input()  # raises at the end of the stream
            pgconn.is_busy()  # parses what came: a goodbye goes to the notice handler (_connect)
        except (psycopg.OperationalError, OSError, ValueError):
            return True
        return bool(self._farewell) or self.conn.pgconn.status != psycopg.pq.ConnStatus.OK

    def _again(self, sql: str, run: Callable[[psycopg.Connection], T]) -> T:
        """``run`` a single statement on the live connection. A read is run again on a new connection when the
        session ended under it; a write is run as a transaction (:meth:`_tx`), so it is never applied twice."""
        if not _READ.match(sql):
            return _deadlock_retried(self._written)(run)
        with self._lock:
            try:
                return run(self._live())
            except psycopg.OperationalError:
                if not self.conn.broken:
                    raise
                with suppress(psycopg.Error):
                    self.conn.close()
                self.conn = self._reconnected()
                return run(self.conn)

    def _written(self, run: Callable[[psycopg.Connection], T]) -> T:
        with self._tx() as conn:
            return run(conn)

    def atomic(self, body: Callable[[Tx], T]) -> T:
        return _deadlock_retried(self._atomic_once)(body)

    def _atomic_once(self, body: Callable[[Tx], T]) -> T:
        with self._tx() as conn:
            return body(_Tx(conn))

    def rows(self, sql: str, args: Any = ()) -> list[tuple]:
        return self._again(sql, lambda conn: conn.execute(POSTGRES.sql(sql), args).fetchall())

    def row(self, sql: str, args: Any = ()) -> tuple | None:
        return self._again(sql, lambda conn: conn.execute(POSTGRES.sql(sql), args).fetchone())

    def execute(self, sql: str, args: Any = ()) -> int:
        return self._again(sql, lambda conn: conn.execute(POSTGRES.sql(sql), args).rowcount)

    def dicts(self, sql: str, args: Any = ()) -> list[dict[str, Any]]:
        def run(conn: psycopg.Connection) -> list[dict[str, Any]]:
            cursor = conn.execute(POSTGRES.sql(sql), args)
            names = [c.name for c in cursor.description or []]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        return self._again(sql, run)

    def stream(self, sql: str, args: Any = ()) -> Iterator[tuple]:
        """A query's rows through a server-side cursor, fetched in slices: memory does not grow with the result."""
        with self._lock:
            cursor = self._live().cursor(f"runner_stream_{next(self._cursors)}", withhold=True)
            cursor.execute(POSTGRES.sql(sql), args)
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

    def lock_run_budget(self, tx: Tx, run_id: str) -> None:
        tx.execute("SELECT pg_advisory_xact_lock(hashtext(?))", (run_id,))

    def order_task_writes(self, tx: Tx, run_ids: list[str]) -> None:
        # A task's seq is drawn when it is written but seen by others when its transaction commits: two processes'
        # transactions could commit in the other order, and a reader that had read up to the later seq would never
        # read the earlier one (an early-stopping worker then waited forever for an item another worker had
        # answered). Writers of a run's tasks therefore take turns, first thing in their transaction (so no lock
        # is held while waiting for this one). The two-key form: its keys are apart from the budget's one-key locks.
        for run_id in run_ids:
            tx.execute(f"SELECT pg_advisory_xact_lock({_TASK_WRITES}, hashtext(?))", (run_id,))

    # -- several processes on one run (runner/engine/workers.py): times are the server's clock -------------------
    def join_run(self, run_id: str, worker: str, host: str, pid: int, ttl: float) -> None:
        self._bound_stalls(ttl)
        self._app_name = f"runner {worker}"[:63]  # the server keeps 63 bytes
        with self._lock:
            self._live().execute(_NAME_SQL, (self._app_name,))
        self.execute("INSERT INTO workers (id, run_id, host, pid, started, seen, state, steady) VALUES"
                     f" (?, ?, ?, ?, ?, {CLOCK} + ?, 'live', {CLOCK}) ON CONFLICT (id) DO UPDATE SET"
                     " run_id = excluded.run_id, host = excluded.host, pid = excluded.pid, started = excluded.started,"
                     " seen = excluded.seen, state = excluded.state, steady = excluded.steady",
                     (worker, run_id, host, pid, now(), ttl))

    def heartbeat(self, worker: str, ttl: float) -> list[tuple[str, int, int]] | None:
        self._bound_stalls(ttl)  # a widened lease widens the bound too

        def body(tx: Tx) -> list[tuple[str, int, int]] | None:
            (clock,) = tx.execute(f"SELECT {CLOCK}").fetchone()
            until = clock + ttl
            # more than half a lease since the last heartbeat (seen = last + lease): its steadiness starts again
            if not tx.execute("UPDATE workers SET steady = CASE WHEN seen < ? THEN ? ELSE coalesce(steady, ?) END,"
                              " seen = ? WHERE id = ? AND state = 'live'",
                              (clock + ttl / 2, clock, clock, until, worker)).rowcount:
                return None  # declared dead (or gone): nothing of it is extended
            held = tx.execute("UPDATE leases SET expires = ? WHERE worker = ? AND done = 0 RETURNING stage, chunk,"
                              " token", (until, worker)).fetchall()
            tx.execute("UPDATE claims SET expires = ? WHERE worker = ?", (until, worker))
            return sorted((stage, int(chunk), int(token)) for stage, chunk, token in held)
        return self.atomic(body)

    def claim_keys(self, keys: list[str], worker: str, ttl: float) -> set[str]:
        if not keys:
            return set()
        unique = sorted(set(keys))  # one statement may not update a row twice; one order for every process
        return _deadlock_retried(lambda: {key for (key,) in self.rows(
            f"INSERT INTO claims (key, worker, expires) SELECT k, ?, {CLOCK} + ? FROM unnest(?::text[]) AS k"
            " ON CONFLICT (key) DO UPDATE SET worker = excluded.worker, expires = excluded.expires"
            " WHERE claims.expires < excluded.expires - ? OR claims.worker = excluded.worker RETURNING key",
            (worker, ttl, unique, ttl))})()
