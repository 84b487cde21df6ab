"""The worker protocol's queries that read the clock, on PostgreSQL: the server's clock (``clock_timestamp()``), the
same for every machine on the run. Which workers are live or dead, leasing chunks and taking an expired lease over
(``FOR UPDATE SKIP LOCKED``), each gated on the asking worker's steadiness (runner/store/fencing.py, STEADY_SQL).
Joining, heartbeats and request claims set the session's bounds too, and stay with the session
(:mod:`runner.store.postgres`); the queries that need no clock are :mod:`runner.store.sql_workers`'s."""

from __future__ import annotations

from typing import Any

from runner.store.dialect import POSTGRES
from runner.store.fencing import STEADY_SQL
from runner.store.sql_base import SQLBase, Tx

__all__ = ["CLOCK", "TEXT_ORDER", "PgWorkerClock"]

#: the server's clock in seconds since the epoch
CLOCK = "extract(epoch from clock_timestamp())::float8"
#: ORDER BY a text column as SQLite orders it
TEXT_ORDER = POSTGRES.text_order
#: the worker protocol's steadiness check on the server's clock (runner/store/base.py)
_STEADY = STEADY_SQL.format(clock=CLOCK)


class PgWorkerClock(SQLBase):
    """The clock-reading half of the worker protocol (see the module's docstring)."""

    def workers(self, run_id: str) -> list[dict[str, Any]]:
        found = self.dicts(f"SELECT id, host, pid, started, seen < {CLOCK} AS expired, state FROM workers"
                           f" WHERE run_id = ? ORDER BY started{TEXT_ORDER} NULLS FIRST, id{TEXT_ORDER}", (run_id,))
        for worker in found:
            if worker.pop("expired") and worker["state"] == "live":
                worker["state"] = "dead"
        return found

    def lease_chunks(self, run_id: str, stage: str, chunks: list[int], worker: str, ttl: float, *,
                     steady: float = 0.0) -> dict[int, tuple[str, int] | None]:
        # xmax is 0 in a row this statement inserted and set in a row it updated (taken over); the token grows
        # unless the lease was this worker's and live; another's expired lease only while this worker is steady
        gate, gated = (f" AND {_STEADY}", (worker, steady, steady / 2)) if steady else ("", ())
        leased = self.rows(
            f"INSERT INTO leases (run_id, stage, chunk, worker, expires, token) SELECT ?, ?, c, ?, {CLOCK} + ?, 1"
            " FROM unnest(?::bigint[]) AS c"
            " ON CONFLICT (run_id, stage, chunk) DO UPDATE SET worker = excluded.worker, expires = excluded.expires,"
            " token = leases.token + CASE WHEN leases.worker = excluded.worker AND leases.expires >= excluded.expires"
            " - ? THEN 0 ELSE 1 END"
            f" WHERE leases.done = 0 AND ((leases.expires < excluded.expires - ?{gate})"
            " OR leases.worker = excluded.worker) RETURNING chunk, xmax = 0, token",
            (run_id, stage, worker, ttl, list(dict.fromkeys(chunks)), ttl, ttl, *gated))
        got: dict[int, tuple[str, int] | None] = dict.fromkeys(chunks)
        for chunk, inserted, token in leased:
            got[int(chunk)] = ("new" if inserted else "taken", int(token))
        return got

    def take_expired_lease(self, run_id: str, stage: str, worker: str, ttl: float, *, steady: float = 0.0
                           ) -> tuple[int, int] | None:
        gate, gated = (f" AND {_STEADY}", (worker, steady, steady / 2)) if steady else ("", ())

        def body(tx: Tx) -> tuple[int, int] | None:
            expired = tx.execute(
                f"SELECT chunk FROM leases WHERE run_id = ? AND stage = ? AND done = 0 AND expires < {CLOCK}{gate}"
                " ORDER BY chunk LIMIT 1 FOR UPDATE SKIP LOCKED", (run_id, stage, *gated)).fetchone()
            if expired is None:
                return None
            (token,) = tx.execute(f"UPDATE leases SET worker = ?, expires = {CLOCK} + ?, token = token + 1"
                                  " WHERE run_id = ? AND stage = ? AND chunk = ? RETURNING token",
                                  (worker, ttl, run_id, stage, expired[0])).fetchone()
            return int(expired[0]), int(token)
        return self.atomic(body)

    def dead_workers(self, run_id: str, observer: str | None = None, steady: float = 0.0) -> list[str]:
        gate, gated = (f" AND {_STEADY}", (observer, steady, steady / 2)) if observer is not None and steady \
            else ("", ())
        return [worker for (worker,) in self.rows(
            f"SELECT id FROM workers WHERE run_id = ? AND state = 'live' AND seen < {CLOCK}{gate}"
            f" ORDER BY started{TEXT_ORDER} NULLS FIRST, id{TEXT_ORDER}", (run_id, *gated))]
