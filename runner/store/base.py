"""The store's interface: everything the runner keeps, and every question it asks of what it kept.

The engine, replay and pipelines talk to a :class:`Store` and never to a database connection; the reports, the
estimate and the cost sums ask :class:`runner.store.reads.Reads`. Both backends (:mod:`runner.store.sqlite`, the
embedded default, and :mod:`runner.store.postgres`) share their queries (:mod:`runner.store.sql`).

What is kept:

    responses   the memo: one row per distinct request ever answered, under its cache key (with the model's
                thinking text and reasoning tokens, kept apart from the answer)
    runs        one row per run: its job as JSON, status, pid, totals
    tasks       one row per finished (done or failed) task of a run, with its result line
    ledger      money and tokens: reservations in flight, charges, and possibly billed amounts after a crash
    stage_replays, stage_outputs, stage_rows, run_stages
                content-addressed stage results (replay of evaluation stages, pipeline stage outputs)
    stage_stops what a stage's ``stop:`` rule decided and its confidence sequences (runner/engine/early_stop.py)
    token_counts
                input tokens a provider's count endpoint counted for a prompt (runner/engine/exact_counts.py)

A task row is a :class:`~runner.store.rows.TaskRow`, a memo row a :class:`~runner.store.rows.ResponseRow`, a ledger
row a :class:`~runner.store.rows.LedgerRow` (runner/store/rows.py). The writer (:mod:`runner.store.writer`) commits
finished tasks with their responses and ledger rows through :meth:`Store.write_batch`, in one transaction
(ARCHITECTURE.md invariant 2).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from runner.errors import StoreError
from runner.store.fencing import Fence, Fenced
from runner.store.rows import LedgerRow, ResponseRow, TaskRow

DEFAULT_DB = "cache.sqlite"

#: the columns a task, memo and ledger row write, in order: the fields of the typed rows
TASK_COLUMNS: tuple[str, ...] = TaskRow._fields
RESPONSE_COLUMNS: tuple[str, ...] = ResponseRow._fields
LEDGER_COLUMNS: tuple[str, ...] = LedgerRow._fields

#: compact JSON for result lines and stored columns
dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def default_path() -> str:
    return os.environ.get("RUNNER_DB") or DEFAULT_DB


@dataclass(slots=True)
class CachedResponse:
    """A memo row as the engine needs it: the answer, what it cost, and the model's thinking (kept apart from the
    answer, so that a cache hit gives the result line a fresh answer gave)."""

    text: str
    finish_reason: str | None
    input_tokens: int
    output_tokens: int
    cached_tokens: int
    cost: float
    thinking: str | None = None
    #: output tokens spent thinking (counted in ``output_tokens`` too)
    reasoning_tokens: int = 0
    #: the model the provider said answered, and what sent the request (the result line's provenance)
    reported_model: str | None = None
    sent_with: str | None = None


class RunExists(StoreError):
    """A run was to be created under an id (``--run-id``) that another run already has."""


@dataclass(frozen=True, slots=True)
class ReserveAsk:
    """One request's worst case to reserve in the ledger, as :meth:`Store.reserve_within` takes it (without
    ``limits`` or ``fence``: as :meth:`Store.reserve` does); many go in one transaction (:meth:`Store.reserve_all`)."""

    run_id: str
    stage: str
    model: str
    key: str
    usd: float
    tokens: int = 0
    worker: str | None = None
    fence: Fence | None = None
    limits: dict[str, float] | None = None
    token_limits: dict[str, int] | None = None


@dataclass(slots=True)
class Finished:
    """One finished task on its way to the store: its row, the memo and ledger rows it brings, and the
    reservation its ledger charge settles. ``fence``: the lease the task was dispatched under, if any."""

    task: TaskRow
    response: ResponseRow | None = None
    ledger: LedgerRow | None = None
    result_line: str = ""
    stage: str = ""
    release_id: int | None = None
    fence: Fence | None = None



class Store(ABC):
    """The runner's persistent state. Every method is one short transaction or one query."""

    #: where the store lives (a file path or a URL), for messages
    path: str

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the connection."""

    def reopen(self) -> Store:
        """Another connection to the same store, its own: a run's heartbeats go through one of their own, so that they
        never wait behind the writer's commits (runner/store/offloop.py)."""
        raise NotImplementedError(f"{type(self).__name__} cannot open a second connection")

    # -- the memo ----------------------------------------------------------------------------------
    @abstractmethod
    def lookup(self, key: str) -> CachedResponse | None:
        """The memo row of one cache key."""

    @abstractmethod
    def lookup_many(self, keys: list[str]) -> dict[str, CachedResponse]:
        """The memo rows of several keys in one query (the dispatcher asks per chunk of requests)."""

    @abstractmethod
    def memo_keys(self) -> set[str]:
        """Every cache key in the memo."""

    @abstractmethod
    def responses(self) -> list[dict[str, Any]]:
        """Every memo row as a dict (tests and tools; not for large stores)."""

    # -- runs --------------------------------------------------------------------------------------
    @abstractmethod
    def create_run(self, job_name: str, job_path: str, job_json: str, fingerprint: str, total: int,
                   run_id: str | None = None) -> str:
        """A new run, status ``running``; returns its id: ``run_id`` when given (:class:`RunExists` when a run
        has it: of several processes creating one named run at once, one creates it), else a new one."""

    @abstractmethod
    def get_run(self, run_id: str) -> dict[str, Any]:
        """A run by its id or a unique part of it; ``StoreError`` naming ``runner runs`` when there is none."""

    @abstractmethod
    def set_run(self, run_id: str, **fields: Any) -> None:
        """Update a run's columns."""

    @abstractmethod
    def list_runs(self, limit: int = 50) -> list[dict[str, Any]]:
        """The latest runs with their done, failed and spend figures."""

    # -- tasks -------------------------------------------------------------------------------------
    @abstractmethod
    def task_status(self, run_id: str, stage: str, item: str) -> str | None:
        """The status of one task, None when it has not finished."""

    @abstractmethod
    def done_items(self, run_id: str, stage: str, items: list[str]) -> set[str]:
        """Which of ``items`` this run has finished already (for resume)."""

    @abstractmethod
    def has_tasks(self, run_id: str, stage: str) -> bool:
        """Whether the run has finished any task of the stage."""

    @abstractmethod
    def stage_progress(self, run_id: str, stage: str) -> tuple[int, int]:
        """(done, not done) tasks of a stage in a run."""

    @abstractmethod
    def iter_results(self, run_id: str, stage: str) -> Iterator[str]:
        """The stored result lines of a stage, in a stable order, streamed."""

    @abstractmethod
    def stage_scores(self, run_id: str, stage: str, after: int = 0) -> tuple[int, list[dict[str, Any]]]:
        """The stage's tasks written since position ``after`` (item, model, row_id, status, score) and the next
        position: what an early-stopping rule reads of other workers' answers."""

    @abstractmethod
    def tasks(self, run_id: str | None = None, **where: Any) -> list[dict[str, Any]]:
        """Task rows as dicts, optionally filtered by run and equal column values (tests and tools)."""

    @abstractmethod
    def write_batch(self, tasks: list[tuple], responses: list[tuple], ledger: list[tuple],
                    released: list[tuple[int]] | None = None, fenced: list[Finished] | None = None
                    ) -> list[Finished]:
        """One transaction: the responses, the tasks they finish, their ledger charges, and the removal of the
        reservations those charges settle. ``fenced``: finished tasks written only if their lease still holds
        (:class:`~runner.store.fencing.Fence`; their responses are among ``responses``, which are always written:
        the memo is content-addressed). A refused one's task row and charge are not written and its reservation
        becomes possibly billed (or is removed when the request failed unbilled). Returns the refused ones."""

    def write_finished(self, batch: list[Finished]) -> list[Finished]:
        """Commit finished tasks in one transaction (:meth:`write_batch`); returns those written (a task whose lease
        was lost is not: its answer goes to the memo only)."""
        plain = [f for f in batch if f.fence is None]
        fenced = [f for f in batch if f.fence is not None]
        refused = self.write_batch([f.task for f in plain], [f.response for f in batch if f.response is not None],
                                   [f.ledger for f in plain if f.ledger is not None],
                                   [(f.release_id,) for f in plain if f.release_id is not None], fenced or None)
        if not refused:
            return batch
        dropped = {id(f) for f in refused}
        return [f for f in batch if id(f) not in dropped]

    @abstractmethod
    def copy_tasks(self, source: str, source_stage: str, run_id: str, stage: str) -> list[tuple[str, int, int, float,
                                                                                                   float]]:
        """Copy a stage's done tasks from run ``source`` into ``run_id`` (renamed to ``stage``) as cache hits that
        cost nothing and saved what the original cost, in one transaction. Returns per model (model, tasks,
        scored, correct, saved) of the copied stage."""

    @abstractmethod
    def done_by_model(self, run_id: str, stage: str) -> dict[str, tuple[int, int]]:
        """Per model, (done tasks, their output tokens) of a stage in a run."""

    # -- the ledger ----------------------------------------------------------------------------------
    @abstractmethod
    def reserve(self, run_id: str, stage: str, model: str, key: str, usd: float, worker: str | None = None, *,
                fence: Fence | None = None, tokens: int = 0) -> int:
        """Record a request's worst-case cost (``usd`` and ``tokens``) before it is sent, committed at once so a
        crash leaves it; returns the reservation's id. With a ``fence``, :class:`~runner.store.fencing.Fenced` when
        that lease does not hold."""

    @abstractmethod
    def release(self, ledger_id: int) -> None:
        """Remove a reservation whose request ended unbilled."""

    @abstractmethod
    def keep_possibly_billed(self, run_id: str, stage: str, model: str, key: str, usd: float, tokens: int,
                             ledger_id: int | None, worker: str | None = None) -> None:
        """An attempt that may have been billed got no answer (it timed out): its reservation ``ledger_id`` becomes
        'possibly_billed'; without one, a 'possibly_billed' row of ``usd`` and ``tokens`` is written."""

    @abstractmethod
    def resolve_reservations(self, run_id: str) -> tuple[int, int]:
        """After a crash: a reservation whose answer is in the memo is settled to its cost and tokens; the others
        stay charged at their worst case (USD and tokens) as 'possibly_billed'. Returns (settled, possibly
        billed)."""

    @abstractmethod
    def spent(self, run_id: str) -> list[tuple[str, str, float, int]]:
        """(stage, model, USD charged or possibly billed, tokens sent or possibly billed) of a run so far, for a
        resume's budgets."""

    @abstractmethod
    def charged(self, run_id: str) -> float:
        """USD the ledger charged a run."""

    @abstractmethod
    def ledger(self, run_id: str | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        """Ledger rows as dicts (tests and tools)."""

    # -- Batch API requests (runner/engine/batch.py) --------------------------------------------------------
    @abstractmethod
    def record_batch(self, batch_id: str, run_id: str, stage: str, model: str, provider_batch_id: str | None,
                     round: int, lines: list[tuple[str, int | None]], *, state: str = "running") -> None:
        """A batch just submitted: its provider id and its lines (request key, ledger reservation id), in one
        transaction, so a later process polls it instead of submitting it again. With ``state`` "submitting" and
        no provider id, the intent to submit it, written before the provider is asked: a process killed before
        the id is written (:meth:`update_batch` ``provider_batch_id``, state "running") leaves this record, and the
        next one looks the batch up by its label instead of submitting its lines again."""

    @abstractmethod
    def open_batches(self, run_id: str, stage: str) -> list[dict[str, Any]]:
        """The batches of a stage not yet collected, each with ``lines``: {key: (ledger id, status)}."""

    @abstractmethod
    def update_batch(self, batch_id: str, **fields: Any) -> None:
        """Update a batch's columns (state, provider_state, updated)."""

    @abstractmethod
    def finish_batch(self, batch_id: str, statuses: dict[str, str]) -> None:
        """A batch's results were taken: each line's status (done, retry, failed) and the batch ``collected``."""

    @abstractmethod
    def drop_batch(self, batch_id: str) -> None:
        """Forget a batch's intent and its lines: the provider never accepted the batch (its lines' reservations
        are released by the engine first)."""

    @abstractmethod
    def batches(self, run_id: str) -> list[dict[str, Any]]:
        """Every batch of a run, with its line counts by status (the report and the live view)."""

    # -- several processes on one run (runner/engine/workers.py) -------------------------------------------
    # Lease and claim times are the store's clock (the database server's, for a shared store), in seconds.
    @abstractmethod
    def join_run(self, run_id: str, worker: str, host: str, pid: int, ttl: float) -> None:
        """Register a process working on a run; it stays live while its heartbeats come within ``ttl``."""

    @abstractmethod
    def heartbeat(self, worker: str, ttl: float) -> list[tuple[str, int, int]] | None:
        """The worker is alive: extend its registration, its chunk leases and its request claims by ``ttl``, and
        return the leases it still holds, (stage, chunk, token), not done. None when the worker is not live any
        more (declared dead, or left): nothing is extended. A late heartbeat of a worker nobody declared dead yet
        keeps it live; the leases others took over meanwhile are not in the answer."""

    @abstractmethod
    def leave_run(self, worker: str) -> None:
        """The worker stops: its leases of chunks not done and its request claims are given up at once, and its
        reservations still open (requests abandoned in flight) become possibly billed, as after a crash (those of
        lines in a submitted batch stay: the batch is polled again)."""

    @abstractmethod
    def workers(self, run_id: str) -> list[dict[str, Any]]:
        """The processes that joined a run: id, host, pid, started, state (live, left or dead)."""

    @abstractmethod
    def lease_chunks(self, run_id: str, stage: str, chunks: list[int], worker: str, ttl: float, *,
                     steady: float = 0.0) -> dict[int, tuple[str, int] | None]:
        """Lease chunks of a stage's planned tasks, in one transaction; per chunk (``"new"``, token) when nobody
        had it, (``"taken"``, token) when it was this worker's already or taken over from a worker whose lease
        expired (some of its tasks may be done; the token grows unless it was this worker's and live), None when
        another live worker holds it or it is done. With ``steady`` (the worker's lease), an expired lease is taken
        over only while the worker itself is steady (:data:`~runner.store.fencing.STEADY_SQL`, as the statement
        runs); else None too."""

    def claim_chunks(self, run_id: str, stage: str, chunks: list[int], worker: str, ttl: float
                     ) -> dict[int, str | None]:
        """:meth:`lease_chunks` without the tokens."""
        return {chunk: got and got[0] for chunk, got in self.lease_chunks(run_id, stage, chunks, worker, ttl).items()}

    def claim_chunk(self, run_id: str, stage: str, chunk: int, worker: str, ttl: float) -> str | None:
        """:meth:`claim_chunks` of one chunk."""
        return self.claim_chunks(run_id, stage, [chunk], worker, ttl)[chunk]

    @abstractmethod
    def take_expired_lease(self, run_id: str, stage: str, worker: str, ttl: float, *, steady: float = 0.0
                           ) -> tuple[int, int] | None:
        """Take over one chunk not done whose lease expired (its worker died or stalled): (chunk, new token), or
        None; with ``steady``, None while the worker itself is not steady (:meth:`lease_chunks`)."""

    def take_expired_chunk(self, run_id: str, stage: str, worker: str, ttl: float) -> int | None:
        """:meth:`take_expired_lease` without the token."""
        got = self.take_expired_lease(run_id, stage, worker, ttl)
        return None if got is None else got[0]

    @abstractmethod
    def finish_chunks(self, run_id: str, stage: str, worker: str, chunks: list[int] | None = None,
                      tokens: list[int] | None = None) -> None:
        """These chunks of the stage this worker holds (all of them by default; with ``tokens``, only where the
        lease still has that token) are done: their tasks are committed. Nothing is done for a worker that is not
        live."""

    @abstractmethod
    def open_chunks(self, run_id: str, stage: str) -> int:
        """Chunks of the stage leased and not done (by any worker, live or not)."""

    @abstractmethod
    def reset_chunks(self, run_id: str) -> None:
        """Forget a run's chunk leases (a resume plans every chunk again and skips what is done)."""

    @abstractmethod
    def claim_keys(self, keys: list[str], worker: str, ttl: float) -> set[str]:
        """Claim the right to send these requests; returns the keys now this worker's (unclaimed, claimed by
        it, or whose claim expired). An identical request claimed by another live process is not sent twice:
        its answer will be in the memo. Claims go when the answer is committed (:meth:`write_batch`)."""

    @abstractmethod
    def release_keys(self, keys: list[str], worker: str) -> None:
        """Give up claims of requests that ended without an answer."""

    @abstractmethod
    def dead_workers(self, run_id: str, observer: str | None = None, steady: float = 0.0) -> list[str]:
        """Workers of the run whose heartbeat expired and whose reservations are not resolved yet; none while the
        ``observer`` (a worker asking) is not steady for ``steady`` seconds (:meth:`lease_chunks`)."""

    @abstractmethod
    def resolve_worker(self, run_id: str, worker: str) -> int:
        """A dead worker's reservations all become possibly billed (its answers were lost: one committed would
        have removed its reservation, and an answer in the memo now is another process's), and the worker is
        marked dead. Returns how many."""

    @abstractmethod
    def reserve_within(self, run_id: str, stage: str, model: str, key: str, usd: float,
                       limits: dict[str, float], worker: str | None = None, *, fence: Fence | None = None,
                       tokens: int = 0, token_limits: dict[str, int] | None = None
                       ) -> tuple[int | None, str | None, int]:
        """Reserve a request's worst case (``usd`` and ``tokens``) in the ledger only if it fits every budget in
        ``limits`` (USD by scope: ``run``, ``stage:NAME``, ``model:NAME``) and in ``token_limits`` (tokens, by the
        same scope names), counting every process's charges and reservations, in one transaction. Returns (ledger
        id, None, 0), or (None, the scope without room, reservations in flight in it). With a ``fence``,
        :class:`~runner.store.fencing.Fenced` when that lease does not hold."""

    @abstractmethod
    def reserve_all(self, asks: list[ReserveAsk]) -> list[tuple[int | None, str | None, int] | Fenced]:
        """Several reservations in one transaction (one commit: the engine's group commit, runner/engine/
        ledger_writes.py), each answered, in order, as :meth:`reserve_within` answers it (an ask without limits
        always fits); each sees the reservations before it. An ask whose lease does not hold gets its
        :class:`~runner.store.fencing.Fenced` in its place, and the others are written."""

    # -- input tokens counted by the providers (runner/engine/exact_counts.py) -----------------------------
    @abstractmethod
    def token_counts(self, keys: list[str]) -> dict[str, int]:
        """The stored input-token counts of these count keys (``count_key`` in runner/providers/token_counts.py),
        by key; a key never counted is left out."""

    @abstractmethod
    def save_token_counts(self, rows: list[tuple[str, str, str, int]]) -> None:
        """Keep (count key, provider, model, tokens) rows; a key stored already keeps its first count."""

    # -- evaluation stages finished whole (runner/engine/replay.py) -----------------------------------------
    @abstractmethod
    def replayable(self, digest: str) -> tuple[str, int] | None:
        """(run id, task count) of the latest run that finished a stage with this content address."""

    @abstractmethod
    def record_replayable(self, digest: str, run_id: str, stage: str, tasks: int) -> None:
        """Record that ``run_id`` finished the stage at this address with ``tasks`` tasks all done."""

    # -- pipelines: content-addressed stage outputs ---------------------------------------------------------
    @abstractmethod
    def stage_output(self, digest: str) -> dict[str, Any] | None:
        """A complete, reusable output of a pipeline stage with this content address, or None."""

    @abstractmethod
    def stage_rows(self, digest: str) -> list[dict[str, Any]]:
        """The rows of a stored stage output, in order."""

    @abstractmethod
    def save_stage_output(self, digest: str, stage: str, run_id: str, rows: list[dict[str, Any]], cost: float,
                          funnel: dict[str, Any]) -> None:
        """Store a pipeline stage's output rows under its address (one transaction)."""

    @abstractmethod
    def record_run_stage(self, run_id: str, stage: str, position: int, digest: str, funnel: dict[str, Any]) -> None:
        """What a pipeline stage did in this run (the funnel report's row)."""

    @abstractmethod
    def run_stages(self, run_id: str) -> list[dict[str, Any]]:
        """The funnel rows of a run's pipeline stages, in order."""

    @abstractmethod
    def record_stop(self, run_id: str, stage: str, record: dict[str, Any]) -> None:
        """A stage's early-stopping record as the run left it (a resume's replaces it)."""

    @abstractmethod
    def stops(self, run_id: str) -> list[dict[str, Any]]:
        """The run's early-stopping records, one per stage with a ``stop:`` rule."""

    @abstractmethod
    def stage_cost(self, run_id: str, stage: str) -> tuple[float, int]:
        """(USD, requests sent) of a stage's tasks in a run."""
