"""Where each request the Batch API side holds stands (runner/engine/batch.py moves it along): the tasks waiting for
its answer (identical requests of several tasks are one line, one bill), the group it waits in until it is
submitted, this process's reservation of its worst case, the batch an earlier process of the run submitted it in,
and how many times it was submitted again. A line's answer or failure is recorded for every task waiting for it
(runner/engine/recorder.py); a line given back releases its reservation (runner/engine/reserver.py)."""

from __future__ import annotations

from runner.engine.batch_records import OpenBatch
from runner.engine.budget import Reservation
from runner.engine.recorder import Recorder, memo_of
from runner.engine.reserver import Reserver
from runner.errors import ProviderError
from runner.plan.request import Task
from runner.providers.base import Completion
from runner.store import Store
from runner.store.offloop import LoopStore, off_loop


class BatchLines:
    """One run's Batch API lines, by request key."""

    def __init__(self, *, store: Store | LoopStore, reserver: Reserver, recorder: Recorder) -> None:
        self.store = off_loop(store)
        self.reserver = reserver
        self.recorder = recorder
        #: per (stage, model): the first task of each key not yet submitted
        self.pending: dict[tuple[str, str], list[Task]] = {}
        #: per request key: every task waiting for its answer (pending, or in a submitted batch)
        self.waiting: dict[str, list[Task]] = {}
        #: per request key: this process's reservation of its worst case
        self.reservations: dict[str, Reservation] = {}
        #: per request key: the batch an earlier process of this run submitted it in
        self.resumed: dict[str, OpenBatch] = {}
        #: per request key: how many times it was submitted again
        self.resubmits: dict[str, int] = {}
        #: request keys submitted again after a batch was refused for other lines (a second refusal fails them)
        self.refiled: set[str] = set()

    def hold(self, task: Task) -> list[Task] | None:
        """Hold ``task`` until its line is answered: with the identical request held already (it shares that
        answer), for the batch an earlier process of this run submitted it in (nothing is sent), or at the end of its
        stage and model's group, which is returned (submitted once full); None when nothing is to be submitted."""
        key = task.key
        waiting = self.waiting.get(key)
        if waiting is not None:
            waiting.append(task)
            return None
        self.waiting[key] = [task]
        batch = self.resumed.get(key)
        if batch is not None:
            self.reservations[key] = self.reserver.hold_again(task, batch.keys.get(key))
            return None
        group = self.pending.setdefault((task.stage, task.model), [])
        group.append(task)
        return group

    def give_back(self, key: str, ledger_id: int | None) -> None:
        """A line that will not be answered in its batch: its reservation released (:meth:`release`)."""
        self.release(self.reservations.pop(key, None), ledger_id)

    def release(self, reservation: Reservation | None, ledger_id: int | None) -> None:
        """Release a line's reservation: this process's (budgets and ledger row), else the ledger row an earlier
        process left (``ledger_id``)."""
        if reservation is not None:
            self.reserver.release(reservation)
        elif ledger_id is not None:
            self.store.post("release", ledger_id)

    def resubmit(self, stage: str, model: str, key: str, tasks: list[Task]) -> None:
        """The line goes into its group again, to be submitted in a later batch (counted against
        ``max_resubmits``)."""
        self.resubmits[key] = self.resubmits.get(key, 0) + 1
        self.waiting[key] = tasks
        self.pending.setdefault((stage, model), []).append(tasks[0])

    def answer(self, tasks: list[Task], c: Completion, reservation: Reservation) -> None:
        """The line's answer, recorded at the Batch API's price for its first task and shared with the others."""
        first, twins = tasks[0], tasks[1:]
        self.recorder.fresh(first, c, 1, None, reservation, batch=True)
        for twin in twins:  # identical requests of other tasks: one line, one bill, the answer shared
            self.recorder.cached(twin, memo_of(c))

    def fail(self, key: str, tasks: list[Task], error: ProviderError) -> None:
        """Every task of the line fails with ``error``, after its submits so far."""
        for task in tasks:
            self.recorder.failed(task, error, attempts=1 + self.resubmits.get(key, 0), batch=True)

    def refuse(self, keys: dict[str, int | None], exc: ProviderError) -> None:
        """Lines not submitted, failed with ``exc``: their budgets given back, their ledger rows removed with the
        first failure recorded."""
        for key in keys:
            reservation = self.reservations.pop(key, None)
            if reservation is not None:
                self.reserver.release_budgets(reservation)
            for task in self.waiting.pop(key, []):
                self.recorder.failed(task, exc, attempts=1, release_id=keys[key])
                keys[key] = None  # the first failure removes the reservation row
