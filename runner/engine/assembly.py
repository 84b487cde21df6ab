"""One run's engine, assembled: every part built once, here, with the parts it works with handed to its constructor,
so no part builds another or is wired to it afterwards. :func:`assemble` returns the :class:`Dispatcher` that
drives them (runner/engine/run.py calls it when a run starts).

Which part gets which:

- ``ChunkLeases`` (the run's ``Crew``, when one is given), ``Endpoints`` (the providers, the job's
  ``max_in_flight``, the crew), ``Triage`` (the store), ``ExactCounts`` (the endpoints, the store: the providers'
  input-token counts), ``Reserver`` (the store, the leases, the run's control, the counts, the service tiers);
- the prompt-cache plan: a ``PromptCachePlan`` where a stage plans provider prompt caching (``prompt_cache: auto``)
  and a provider caches prompts, with a ``StoredPrompts`` (over the reserver) where a provider keeps stored prefixes
  (else a ``NoStoredPrompts``); otherwise a ``NoPromptCache``, whose every call does nothing, so no part asks
  whether there is a plan;
- ``Sender`` (the endpoints, the leases, the retry settings, the plan: it marks each attempt; the service tiers:
  ``Tiers``, built once from the job, which the reserver and the provenance share);
- ``Recorder`` (the writer, the reserver, the triage, the leases, the result lines' ``Provenance``);
- the Batch API side: a ``Batcher`` (the reserver, the recorder, the endpoints, the writer, the plan: it marks a
  batch's lines, the tasks it spawns, ``send_online``) where a stage may use a Batch API, else a ``NoBatcher``,
  which wants no task;
- ``InFlight`` (one task's way: the reserver, the sender, the recorder, the endpoints, the leases, the batcher, the
  plan);
- ``Dispatcher`` (the loop over chunks: the triage, the leases, the reserver, the recorder, the in-flight part, the
  batcher, the plan, the provenance).

The Batch API side sends online what a deadline leaves through the in-flight part, which hands Batch API tasks to
the batcher: the one cycle among the parts, closed by ``send_online``, a function that calls the in-flight part
once it exists.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runner.engine.control import RunControl, Spawned
from runner.engine.dispatch import Dispatcher, Provenance
from runner.engine.endpoints import Endpoints
from runner.engine.exact_counts import ExactCounts
from runner.engine.inflight import InFlight
from runner.engine.leases import ChunkLeases
from runner.engine.null_parts import NoBatcher, NoPromptCache, NoStoredPrompts
from runner.engine.online import Sender
from runner.engine.recorder import Recorder
from runner.engine.reserver import Reserver
from runner.engine.stats import RunStats
from runner.engine.tiers import Tiers
from runner.engine.triage import Triage
from runner.engine.workers import Crew
from runner.plan.request import Task
from runner.providers.base import Provider
from runner.spec.schema import Job
from runner.store import Store, Writer
from runner.store.offloop import off_loop

# The Batch API side (runner/engine/batch.py), the deadline planner (runner/engine/deadline.py) and the prompt-cache
# plan (runner/engine/prompt_cache.py, stored_prompts.py) are imported below for a run that uses them: a run whose
# stages are all online and uncached starts without them.
if TYPE_CHECKING:
    from runner.engine.batch import Batcher
    from runner.engine.deadline import DeadlineSteer
    from runner.engine.prompt_cache import PromptCachePlan
    from runner.engine.stored_prompts import StoredPrompts

__all__ = ["assemble", "prompt_cache_plan"]


def assemble(
    *,
    run_id: str,
    job: Job,
    store: Store,
    writer: Writer,
    providers: dict[str, Provider],
    stats: RunStats,
    crew: Crew | None = None,
    resume: bool = False,
    joined: bool = False,
    sleep: Callable[[float], Any] = asyncio.sleep,
    deadline: float | None = None,
) -> Dispatcher:
    """The engine of one run in this process, parts and dispatcher. ``crew``: this process's membership of the run
    (leases, claims, a share of the rate limits, which it splits again as processes come and go); ``resume``: a
    resumed run, or one this process joins (what earlier attempts spent counts, and done tasks are skipped);
    ``joined``: joined as a worker (``runner work``); ``deadline``: when the run's answers are needed (epoch
    seconds), for stages in ``mode: auto``."""
    control = RunControl()
    spawned = Spawned()
    leases = ChunkLeases(stats)
    leases.crew = crew  # ChunkLeases takes its crew through this setter (which also hands the crew its lost-lease hook)
    endpoints = Endpoints(providers, max_in_flight=job.max_in_flight, crew=crew, pools=job.pools, notes=stats.notes)
    if crew is not None:
        crew.on_live = endpoints.share  # the rate limits are split again as processes join and leave
    triage = Triage(store, run_id, stats)
    counts = ExactCounts(endpoints=endpoints, store=store, stats=stats, sleep=sleep)
    steer = _steer(job, stats, deadline, store, run_id)  # the deadline planner, where a stage has one
    tiers = Tiers(job, steer)
    reserver = Reserver(run_id=run_id, job=job, store=store, stats=stats, control=control, leases=leases,
                        resume=resume, settled=writer.next_commit, counts=counts, tiers=tiers)
    prompt_cache = prompt_cache_plan(job, providers, run_id=run_id, reserver=reserver)
    reserver.cache_writes = prompt_cache.writes  # reservations priced for the cache writes the marks allow
    sender = Sender(endpoints=endpoints, leases=leases, stats=stats, retry=job.retry, sleep=sleep,
                    prompt_cache=prompt_cache, tiers=tiers)
    provenance = Provenance(job, run_id, tiers)
    recorder = Recorder(run_id=run_id, job=job, stats=stats, writer=writer, reserver=reserver, triage=triage,
                        leases=leases, provenance=provenance.of)
    flight: InFlight | None = None

    async def send_online(task: Task) -> bool:
        assert flight is not None  # built below, before anything is dispatched
        return await flight.send_online(task)

    batcher: Batcher | NoBatcher = NoBatcher()
    if any(job.stage_mode(stage) != "online" for stage in job.llm_stages()):
        from runner.engine.batch import Batcher

        batcher = Batcher(job=job, run_id=run_id, store=store, stats=stats, control=control, endpoints=endpoints,
                          reserver=reserver, recorder=recorder, writer=writer, prompt_cache=prompt_cache,
                          send_online=send_online, sleep=sleep, deadline=deadline, spawn=spawned.spawn,
                          steer=steer)
    flight = InFlight(control=control, stats=stats, endpoints=endpoints, leases=leases, reserver=reserver,
                      sender=sender, recorder=recorder, batcher=batcher, prompt_cache=prompt_cache, spawned=spawned)
    return Dispatcher(job=job, writer=writer, control=control, leases=leases, triage=triage, reserver=reserver,
                      recorder=recorder, flight=flight, batcher=batcher, prompt_cache=prompt_cache,
                      provenance=provenance, spawned=spawned, resume=resume, joined=joined)


def prompt_cache_plan(job: Job, providers: dict[str, Provider], *, run_id: str,
                      reserver: Reserver) -> PromptCachePlan | NoPromptCache:
    """The run's prompt-cache plan: planned where a stage asks for it (``prompt_cache: auto``) and a provider's API
    caches prompts, with the prefixes stored at a provider that keeps them; else the plan that does nothing."""
    if not (any(getattr(p, "prompt_cache_style", None) for p in providers.values())
            and any(job.stage_prompt_cache(stage) == "auto" for stage in job.llm_stages())):
        return NoPromptCache()
    from runner.engine.prompt_cache import PromptCachePlan

    stored: StoredPrompts | NoStoredPrompts = NoStoredPrompts()
    if any(p.stores_prompts for p in providers.values()):  # a provider that keeps prefixes (Gemini's)
        from runner.engine.stored_prompts import StoredPrompts

        stored = StoredPrompts(run_id=run_id, providers=providers, reserver=reserver)
    return PromptCachePlan(job, providers, stored=stored)


def _steer(job: Job, stats: RunStats, deadline: float | None, store: Store, run_id: str) -> DeadlineSteer | None:
    """The deadline planner's steer (:func:`runner.engine.deadline.steer_of`) where a stage is planned (``mode:
    auto`` and a deadline), else None."""
    if not any(job.stage_mode(s) == "auto" and job.stage_deadline(s) is not None for s in job.llm_stages()):
        return None
    from runner.engine.deadline import steer_of

    return steer_of(job, stats, deadline, off_loop(store).sync, run_id)
