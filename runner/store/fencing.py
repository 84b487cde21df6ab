"""The worker protocol's fence: a chunk lease as its holder knows it (:class:`Fence`), the refusal of a write whose
lease no longer holds (:class:`Fenced`), and the SQL fragments every backend checks leases and settles a lost
worker's reservations with (runner/store/sql_workers.py, runner/store/sqlite.py, runner/store/postgres.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.errors import StoreError

#: a leaving worker's reservations still open, but those of lines in a batch not yet collected (``?``: the worker)
LEFT_RESERVATIONS_SQL = (
    "UPDATE ledger SET kind = 'possibly_billed' WHERE worker = ? AND kind = 'reserved' AND id NOT IN"
    " (SELECT l.ledger_id FROM batch_lines l JOIN batches b ON b.id = l.batch_id WHERE b.state != 'collected'"
    " AND l.status = 'pending' AND l.ledger_id IS NOT NULL)")

#: the lease's worker has not been declared dead nor left (a worker without a row counts as live: the store's tests)
LIVE_SQL = "NOT EXISTS (SELECT 1 FROM workers w WHERE w.id = leases.worker AND w.state != 'live')"
#: a fence holds: its lease (run, stage, chunk) is still its worker's with its token, and that worker is live
HELD_SQL = ("SELECT 1 FROM leases WHERE run_id = ? AND stage = ? AND chunk = ? AND worker = ? AND token = ?"
            f" AND {LIVE_SQL}")
#: the worker ``?`` may judge others' heartbeats: it is live, its own heartbeats came without a gap for the last ``?``
#: seconds (its lease), and its lease still runs for ``?`` seconds (half of it: its last heartbeat is recent), on
#: the clock ``{clock}`` (the store's, as the statement runs). A store that stalled every worker (a stopped server,
#: a lock held elsewhere) leaves every lease expired when it answers again: a worker then waits a lease before it
#: trusts what the others' heartbeats say, and a statement sent before the stall and run after it finds its own
#: worker's heartbeat as old as the others'. A worker without a row (the store's tests) may.
STEADY_SQL = ("NOT EXISTS (SELECT 1 FROM workers me WHERE me.id = ? AND NOT (me.state = 'live'"
              " AND coalesce(me.steady, 0) <= {clock} - ? AND me.seen >= {clock} + ?))")
#: the reservation of a request whose worker lost its lease: it may have been sent, so it may have been billed
FENCED_RESERVATION_SQL = "UPDATE ledger SET kind = 'possibly_billed' WHERE id = ? AND kind = 'reserved'"


@dataclass(frozen=True, slots=True)
class Fence:
    """A chunk lease as its holder knows it (runner/engine/workers.py). Writes made on behalf of the lease carry it,
    and the store accepts them only while ``worker`` is live and the lease is still its with this ``token``: the
    token grows by one whenever the lease is taken over, so a worker that stalled past its lease and lost it (or was
    declared dead) cannot write for it any more, even if it got the chunk back later."""

    worker: str
    run_id: str
    stage: str
    chunk: int
    token: int


class Fenced(StoreError):
    """A write refused because its worker lost the lease it was made for, or was declared dead."""
