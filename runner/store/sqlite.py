"""The SQLite store: the response memo, runs, tasks and the cost ledger in one file.

WAL mode and a busy timeout let ``runner runs`` and ``runner report`` read while a run writes. All writes of
a run go through one writer task (:mod:`runner.store.writer`) that commits in small batches; a response is
committed in the same transaction that marks its task done (ARCHITECTURE.md invariant 2), so a crash loses
only in-flight work. The queries are :mod:`runner.store.sql`'s; this module holds what is SQLite's own: the file,
its PRAGMAs, ``BEGIN IMMEDIATE`` transactions (the single writer's lock), and the worker protocol on this
process's clock.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from runner.errors import StoreError
from runner.store.base import TASK_COLUMNS, Store, default_path, now
from runner.store.dialect import SQLITE
from runner.store.fencing import STEADY_SQL
from runner.store.migrations import migrate
from runner.store.sql import SQLStore, T, Tx
from runner.store.sqlite_lock import ATTEMPT_S, LockWait, StoreLocked, is_busy

#: what SQLite's busy handler waits for the write lock in one attempt; runner/store/sqlite_lock.py waits longer
BUSY_TIMEOUT_S = ATTEMPT_S

# The task's time stamp is taken by SQLite at commit: one clock read per row, none in Python's hot path. REPLACE
# gives a task run again a new rowid: it moves to the end of the run's order.
_TASK_SQL = (
    f"INSERT OR REPLACE INTO tasks ({', '.join(TASK_COLUMNS)}, updated) "
    f"VALUES ({', '.join('?' for _ in TASK_COLUMNS)}, {SQLITE.stamp})"
)


def _enter_wal(conn: sqlite3.Connection) -> None:
    """``PRAGMA journal_mode=WAL``, tried again for up to BUSY_TIMEOUT_S while another process opening the same new
    file holds it: turning a file to WAL needs it alone for an instant, and SQLite refuses that at once, without its
    busy handler (waiting could deadlock), so processes started together on a new store would otherwise fail now
    and then with "database is locked". A file already in WAL mode answers at once."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    pause = 0.005
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if not is_busy(exc) or time.monotonic() > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


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
    import shlex  # an error's sentence only

    where = shlex.quote(path)
    resume = f"`runner resume {run_id}`" if run_id else "try again"
    if isinstance(exc, StoreLocked):
        holder = exc.holder
        wake = (f"continue it (`kill -CONT {holder.pid}`) or end it" if holder is not None and holder.stopped
                else "let it finish or end it")
        return (f"the store {path} stayed locked by {holder or 'another process'} for {exc.waited:.0f} s "
                f"(RUNNER_STORE_WAIT): {wake}, then {resume}")
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




#: the worker protocol's steadiness check on this process's clock (runner/store/base.py)
_STEADY = STEADY_SQL.format(clock="?")


class SQLiteStore(SQLStore):
    """The embedded store: one SQLite file in WAL mode, one connection per process, and one more for its heartbeats
    (:meth:`reopen`). A connection is used by one thread at a time: its calls are serialized by a lock (a run makes
    them from its store thread, runner/store/offloop.py; the opening phases and the tests from theirs)."""

    dialect = SQLITE
    task_sql = _TASK_SQL
    task_columns = "*"

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = str(path or default_path())
        #: waits for a write lock another process holds (runner/store/sqlite_lock.py)
        self.lock_wait = LockWait(self.path, self._set_busy)
        #: one thread's statement or transaction at a time on the connection
        self._lock = threading.RLock()
        try:
            self.conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                        check_same_thread=False)
            _enter_wal(self.conn)
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
            migrate(self.conn, SQLITE)
        except sqlite3.DatabaseError as exc:
            found = explain(exc, self.path)
            if found is not None and getattr(exc, "sqlite_errorcode", None) != sqlite3.SQLITE_NOTADB:
                raise StoreError(found) from None
            raise StoreError(f"the store {self.path} cannot be opened ({exc}); set --db or RUNNER_DB") from None

    @property
    def db(self) -> Any:
        """The file through sqlite-utils (``Database``), for looking at its tables; imported when first asked
        for, which the runner never does: it costs 0.1 s of every start."""
        from runner.store._sqlite_utils import sqlite_utils

        return sqlite_utils.Database(self.conn)

    def close(self) -> None:
        with self._lock:
            self.conn.close()

    def reopen(self) -> Store:
        return SQLiteStore(self.path)

    def failure(self, exc: BaseException, run_id: str | None = None) -> str | None:
        """The sentence for an error of this store (a full disk, a corrupt file), with how to go on: ``runner resume
        RUN_ID`` when ``run_id`` is given; None when ``exc`` is not about the store's file."""
        return explain(exc, self.path, run_id)

    # -- primitives (runner/store/sql.py) ---------------------------------------------------------------------
    # A statement that finds the store locked by another process past the busy handler is tried again, saying who
    # holds it, up to RUNNER_STORE_WAIT (runner/store/sqlite_lock.py): a statement refused with SQLITE_BUSY did
    # nothing, so running it again is safe.
    def _waiting(self, attempt: Callable[[], T]) -> T:
        with self._lock:
            changes = self.conn.total_changes
            return self.lock_wait.run(attempt, lambda: self.conn.in_transaction or self.conn.total_changes != changes)

    def _set_busy(self, seconds: float) -> None:
        self.conn.execute(f"PRAGMA busy_timeout={int(seconds * 1000)}")

    def rows(self, sql: str, args: Any = ()) -> list[tuple]:
        return self._waiting(lambda: self.conn.execute(sql, args).fetchall())

    def row(self, sql: str, args: Any = ()) -> tuple | None:
        # all rows: a RETURNING statement ends once its rows are read
        found = self._waiting(lambda: self.conn.execute(sql, args).fetchall())
        return found[0] if found else None

    def execute(self, sql: str, args: Any = ()) -> int:
        return self._waiting(lambda: self.conn.execute(sql, args).rowcount)

    def dicts(self, sql: str, args: Any = ()) -> list[dict[str, Any]]:
        def attempt() -> list[dict[str, Any]]:
            cursor = self.conn.execute(sql, args)
            names = [c[0] for c in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor]
        return self._waiting(attempt)

    def stream(self, sql: str, args: Any = ()) -> Iterator[tuple]:
        yield from self.conn.execute(sql, args)

    def atomic(self, body: Callable[[Tx], T]) -> T:
        """``body`` in one transaction that takes the write lock at its start (``BEGIN IMMEDIATE``)."""
        with self._lock:
            conn = self.conn
            self._waiting(lambda: conn.execute("BEGIN IMMEDIATE"))
            try:
                result = body(conn)
                conn.execute("COMMIT")
            except BaseException:
                # a COMMIT that failed (a full disk) may have rolled back already: a ROLLBACK then would hide its error
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return result

    # -- several processes on one run (runner/engine/workers.py): times are this process's clock, read once the
    # transaction holds the write lock (a heartbeat that waited for it is stamped when it is written) ------------
    def join_run(self, run_id: str, worker: str, host: str, pid: int, ttl: float) -> None:
        def body(conn: Tx) -> None:
            clock = time.time()
            conn.execute("INSERT OR REPLACE INTO workers (id, run_id, host, pid, started, seen, state, steady)"
                         " VALUES (?, ?, ?, ?, ?, ?, 'live', ?)",
                         (worker, run_id, host, pid, now(), clock + ttl, clock))
        self.atomic(body)

    def heartbeat(self, worker: str, ttl: float) -> list[tuple[str, int, int]] | None:
        def body(conn: Tx) -> list[tuple[str, int, int]] | None:
            clock = time.time()
            until = clock + ttl
            # more than half a lease since the last heartbeat (seen = last + lease): its steadiness starts again
            if not conn.execute("UPDATE workers SET steady = CASE WHEN seen < ? THEN ? ELSE coalesce(steady, ?) END,"
                                " seen = ? WHERE id = ? AND state = 'live'",
                                (clock + ttl / 2, clock, clock, until, worker)).rowcount:
                return None  # declared dead (or gone): nothing of it is extended
            conn.execute("UPDATE leases SET expires = ? WHERE worker = ? AND done = 0", (until, worker))
            conn.execute("UPDATE claims SET expires = ? WHERE worker = ?", (until, worker))
            return [(stage, int(chunk), int(token)) for stage, chunk, token in conn.execute(
                "SELECT stage, chunk, token FROM leases WHERE worker = ? AND done = 0 ORDER BY stage, chunk",
                (worker,)).fetchall()]
        return self.atomic(body)

    def workers(self, run_id: str) -> list[dict[str, Any]]:
        found = self.dicts("SELECT id, host, pid, started, seen, state FROM workers WHERE run_id = ?"
                           " ORDER BY started, id", (run_id,))
        clock = time.time()
        for worker in found:
            if worker["state"] == "live" and worker["seen"] < clock:
                worker["state"] = "dead"
            del worker["seen"]
        return found

    def _steady(self, conn: Tx, worker: str, clock: float, steady: float) -> bool:
        """Whether ``worker`` may take others' expired leases over now (runner/store/fencing.py, STEADY_SQL)."""
        return not steady or conn.execute(f"SELECT {_STEADY}", (worker, clock, steady, clock, steady / 2)
                                          ).fetchone()[0] == 1

    def lease_chunks(self, run_id: str, stage: str, chunks: list[int], worker: str, ttl: float, *,
                     steady: float = 0.0) -> dict[int, tuple[str, int] | None]:
        def body(conn: Tx) -> dict[int, tuple[str, int] | None]:
            clock = time.time()
            trusted = self._steady(conn, worker, clock, steady)
            got: dict[int, tuple[str, int] | None] = {}
            held = {chunk: (holder, expires, done, token) for chunk, holder, expires, done, token in conn.execute(
                "SELECT chunk, worker, expires, done, token FROM leases WHERE run_id = ? AND stage = ? AND chunk"
                " BETWEEN ? AND ?", (run_id, stage, min(chunks), max(chunks))).fetchall()}
            for chunk in chunks:
                lease = held.get(chunk)
                if lease is None:
                    got[chunk] = ("new", 1)
                    conn.execute("INSERT INTO leases (run_id, stage, chunk, worker, expires, token) VALUES"
                                 " (?, ?, ?, ?, ?, 1)", (run_id, stage, chunk, worker, clock + ttl))
                elif lease[2] or (lease[0] != worker and lease[1] >= clock):
                    got[chunk] = None
                elif lease[0] != worker and not trusted:
                    got[chunk] = None  # expired, but this worker is not steady enough to judge it
                else:  # a new token unless it is this worker's lease, still live
                    token = lease[3] + (0 if lease[0] == worker and lease[1] >= clock else 1)
                    got[chunk] = ("taken", token)
                    conn.execute("UPDATE leases SET worker = ?, expires = ?, token = ? WHERE run_id = ? AND stage = ?"
                                 " AND chunk = ?", (worker, clock + ttl, token, run_id, stage, chunk))
            return got
        return self.atomic(body)

    def take_expired_lease(self, run_id: str, stage: str, worker: str, ttl: float, *, steady: float = 0.0
                           ) -> tuple[int, int] | None:
        def body(conn: Tx) -> tuple[int, int] | None:
            clock = time.time()
            if not self._steady(conn, worker, clock, steady):
                return None
            taken = conn.execute(
                "UPDATE leases SET worker = ?, expires = ?, token = token + 1 WHERE run_id = ? AND stage = ? AND chunk"
                " = (SELECT chunk FROM leases WHERE run_id = ? AND stage = ? AND done = 0 AND expires < ? ORDER BY"
                " chunk LIMIT 1) RETURNING chunk, token", (worker, clock + ttl, run_id, stage, run_id, stage, clock)
            ).fetchall()
            return (int(taken[0][0]), int(taken[0][1])) if taken else None
        return self.atomic(body)

    def claim_keys(self, keys: list[str], worker: str, ttl: float) -> set[str]:
        def body(conn: Tx) -> set[str]:
            clock = time.time()
            ours: set[str] = set()
            for key in keys:
                claimed = conn.execute(
                    "INSERT INTO claims (key, worker, expires) VALUES (?, ?, ?) ON CONFLICT (key) DO UPDATE SET"
                    " worker = excluded.worker, expires = excluded.expires WHERE claims.expires < ? OR"
                    " claims.worker = excluded.worker RETURNING key", (key, worker, clock + ttl, clock)).fetchall()
                ours.update(k for (k,) in claimed)
            return ours
        return self.atomic(body)

    def dead_workers(self, run_id: str, observer: str | None = None, steady: float = 0.0) -> list[str]:
        clock = time.time()
        if observer is not None and steady:
            return [worker for (worker,) in self.rows(
                f"SELECT id FROM workers WHERE run_id = ? AND state = 'live' AND seen < ? AND {_STEADY}",
                (run_id, clock, observer, clock, steady, clock, steady / 2))]
        return [worker for (worker,) in self.rows(
            "SELECT id FROM workers WHERE run_id = ? AND state = 'live' AND seen < ?", (run_id, clock))]
