"""The worker protocol's queries that need no clock, written once for SQLite and PostgreSQL: a request's claim
dropped with its answer or its worker (:meth:`WorkerSQL.drop_claims`), a lease checked inside a write
(:meth:`WorkerSQL.holds`: the answers of a worker whose lease was taken over are refused, the fence), chunks
finished, counted and reset, a worker leaving or declared dead.

What reads a clock or takes row locks (joining a run, heartbeats, leasing chunks, taking an expired lease,
claiming keys, finding dead workers) is each backend's own: :mod:`runner.store.sqlite` on this process's clock,
:mod:`runner.store.postgres` on the server's.
"""

from __future__ import annotations

from runner.store.fencing import HELD_SQL, LEFT_RESERVATIONS_SQL, LIVE_SQL, Fence
from runner.store.sql_base import SQLBase, Tx

__all__ = ["WorkerSQL"]


class WorkerSQL(SQLBase):
    """The shared half of the worker protocol (see the module's docstring)."""

    def drop_claims(self, tx: Tx, keys: list[str], worker: str | None = None) -> None:
        """Remove the claims of these keys (sorted: one lock order for every process). PostgreSQL takes the list as
        one parameter; SQLite runs one statement per key, so that its statement cache holds one text and not one per
        batch size. With ``worker``, only that worker's claims."""
        mine, extra = ("", ()) if worker is None else (" AND worker = ?", (worker,))
        if self.dialect.one_parameter_list:
            tx.execute(f"DELETE FROM claims WHERE key = ANY(?){mine}", (keys, *extra))
        else:
            tx.executemany(f"DELETE FROM claims WHERE key = ?{mine}", [(key, *extra) for key in keys])

    def holds(self, tx: Tx, fence: Fence) -> bool:
        """Whether the lease is still the fence's worker's, with its token, and that worker live (in a transaction;
        PostgreSQL locks the lease row until it ends, so it cannot be taken over while the write commits)."""
        return tx.execute(HELD_SQL + self.dialect.hold_lock, (fence.run_id, fence.stage, fence.chunk, fence.worker,
                                                              fence.token)).fetchone() is not None

    def leave_run(self, worker: str) -> None:
        def body(tx: Tx) -> None:
            tx.execute("UPDATE workers SET state = 'left' WHERE id = ? AND state = 'live'", (worker,))
            tx.execute(LEFT_RESERVATIONS_SQL, (worker,))
            tx.execute("UPDATE leases SET expires = 0 WHERE worker = ? AND done = 0", (worker,))
            tx.execute("DELETE FROM claims WHERE worker = ?", (worker,))
        self.atomic(body)

    def finish_chunks(self, run_id: str, stage: str, worker: str, chunks: list[int] | None = None,
                      tokens: list[int] | None = None) -> None:
        mark = "UPDATE leases SET done = 1 WHERE run_id = ? AND stage = ? AND worker = ?"
        if chunks is None:
            self.execute(f"{mark} AND done = 0 AND {LIVE_SQL}", (run_id, stage, worker))
        elif tokens is None:
            where, args = self.dialect.in_list("chunk", sorted(chunks))
            self.execute(f"{mark} AND {where} AND {LIVE_SQL}", (run_id, stage, worker, *args))
        else:
            rows = [(run_id, stage, worker, chunk, token) for chunk, token in zip(chunks, tokens, strict=True)]
            self.atomic(lambda tx: tx.executemany(f"{mark} AND chunk = ? AND token = ? AND {LIVE_SQL}", rows))

    def open_chunks(self, run_id: str, stage: str) -> int:
        return int(self.row("SELECT count(*) FROM leases WHERE run_id = ? AND stage = ? AND done = 0",
                            (run_id, stage))[0])

    def reset_chunks(self, run_id: str) -> None:
        self.execute("DELETE FROM leases WHERE run_id = ?", (run_id,))

    def release_keys(self, keys: list[str], worker: str) -> None:
        if keys:
            self.atomic(lambda tx: self.drop_claims(tx, sorted(keys), worker))

    def resolve_worker(self, run_id: str, worker: str) -> int:
        def body(tx: Tx) -> int:
            possibly = tx.execute("UPDATE ledger SET kind = 'possibly_billed' WHERE run_id = ? AND worker = ?"
                                  " AND kind = 'reserved'", (run_id, worker)).rowcount
            tx.execute("UPDATE workers SET state = 'dead' WHERE id = ?", (worker,))
            return possibly
        return self.atomic(body)
