"""One seed's draw: the run (models, rows, seeds of shuffled options, online or Batch API, workers, store, budget,
the simulated server's latency) and its schedule of faults, all from ``random.Random(seed)`` and nothing else, so
``--seed K`` draws exactly the same on any machine. Whether a fault can be done here (PostgreSQL installed, a
tmpfs mountable) is decided when the seed runs, never in the draw, which would shift every later draw.

A fault's moment is a count of requests the simulated server answered and billed (online runs: the run's own
progress, whatever the machine's load) or seconds since the run started (Batch API runs, whose progress is the
batch's clock).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field

__all__ = ["BATCH_KINDS", "KINDS", "MODELS", "ONLINE_KINDS", "PRICE", "Fault", "Scenario", "draw"]

#: the models a seed draws from: the simulated server's own and two clouds' through it (all with a Batch API there)
MODELS = ("sim:chaos-a", "sim:chaos-b", "openai:gpt-4o-mini", "anthropic:claude-haiku-4-5")
#: the job's prices for every model, USD per million tokens (so every budget means the same on each)
PRICE = {"input": 1000.0, "output": 2000.0, "batch_input": 500.0, "batch_output": 1000.0}
#: a request's worst case at PRICE, about: ~50 input tokens and max_tokens 5
WORST_USD = 0.07

#: faults of an online run; "kill_worker" and "stop_worker" need a second process, "db_restart" PostgreSQL
ONLINE_KINDS = ("kill_submitter", "kill_worker", "stop_worker", "db_restart", "disk_full", "http_429", "http_500",
                "hang", "malformed")
#: faults of a Batch API run
BATCH_KINDS = ("kill_submitter", "kill_after_accept", "batch_expire", "batch_refused", "db_restart", "disk_full")
KINDS = tuple(dict.fromkeys(ONLINE_KINDS + BATCH_KINDS))
#: the simulated server's knob and the fractions drawn for each server fault
_SERVER = {"http_429": ("fault_429", (0.1, 0.3, 0.5)), "http_500": ("fault_500", (0.05, 0.1, 0.3)),
           "hang": ("fault_timeout", (0.02, 0.05, 0.1)), "malformed": ("fault_malformed", (0.05, 0.1, 0.3))}


@dataclass(frozen=True)
class Fault:
    kind: str
    #: answered requests (online) or seconds since the run started (batch) when it is done
    at: float
    #: server faults: the knob's fraction; db_restart: seconds down; stop/kill_worker: which worker (1 = first joiner)
    arg: float = 0.0
    #: server faults: seconds the knob stays on
    lasts: float = 0.0

    @property
    def knob(self) -> str | None:
        return _SERVER[self.kind][0] if self.kind in _SERVER else None

    def describe(self, trigger: str) -> str:
        if trigger == "answers":
            when = f"after {self.at:g} answers"
        else:
            when = "from the start" if self.at == 0 else f"{self.at:g} s in"
        extra = {"db_restart": f"down {self.arg:g} s", "kill_worker": f"worker {self.arg:g}",
                 "stop_worker": f"worker {self.arg:g}"}.get(self.kind, "")
        if self.knob:
            extra = f"{self.knob}={self.arg:g} for {self.lasts:g} s"
        return " ".join(part for part in (self.kind, when, extra) if part)


@dataclass(frozen=True)
class Scenario:
    seed: int
    mode: str  #: "online" or "batch"
    backend: str  #: "sqlite" or "postgres"
    models: tuple[str, ...]
    rows: int
    option_seeds: int  #: seeds of shuffled options: each row is asked once per seed and model
    workers: int  #: processes on the run: the submitter and workers - 1 `runner work`
    concurrency: int
    latency: float
    batch_delay: float
    budget: float | None  #: USD, or None
    #: the run is named (``runner submit --run-id``, every process of it a worker) rather than made by a plain submit
    named: bool = False
    faults: tuple[Fault, ...] = field(default=())

    @property
    def tasks(self) -> int:
        return self.rows * self.option_seeds * len(self.models)

    @property
    def trigger(self) -> str:
        return "answers" if self.mode == "online" else "seconds"

    def describe(self) -> str:
        budget = "no budget" if self.budget is None else f"budget ${self.budget:g}"
        run = (f"seed {self.seed}: {self.mode}, {self.backend}, {self.workers} process(es), {', '.join(self.models)},"
               f" {self.rows} rows x {self.option_seeds} option seed(s) = {self.tasks} tasks, concurrency "
               f"{self.concurrency}, latency {self.latency:g} s, {budget}")
        if self.mode == "batch":
            run += f", batches take {self.batch_delay:g} s"
        if self.named:
            run += ", a named run (--run-id)"
        faults = "; ".join(f.describe(self.trigger) for f in self.faults)
        return f"{run}\n  faults: {faults or 'none'}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def draw(seed: int) -> Scenario:
    """The run and the faults of ``seed``."""
    rng = random.Random(seed)
    mode = rng.choice(("online", "online", "batch"))
    backend = "postgres" if rng.random() < 0.3 else "sqlite"
    workers = rng.choice((1, 1, 2, 3)) if mode == "online" else 1
    if workers > 1:
        # a first process leases 256 tasks while alone, and with two models or more everything it can line up per
        # model (ARCHITECTURE.md, known debts): one model, two or three at a time, so the others find work past them
        models, rows, option_seeds = (rng.choice(MODELS),), rng.randint(50, 60), 6
        concurrency = rng.randint(2, 3)
    else:
        models = tuple(rng.sample(MODELS, rng.randint(1, 2)))
        rows, option_seeds = rng.randint(10, 60), rng.randint(1, 2)
        concurrency = rng.randint(2, 6)
    latency = rng.choice((0.005, 0.01, 0.02, 0.04))
    batch_delay = round(rng.uniform(0.5, 3.0), 2)
    tasks = rows * option_seeds * len(models)
    price = 0.5 if mode == "batch" else 1.0
    budget = None if rng.random() < 0.5 else round(tasks * WORST_USD * price * rng.uniform(0.3, 1.3), 2)
    kinds = [kind for kind in (ONLINE_KINDS if mode == "online" else BATCH_KINDS)
             if (workers > 1 or kind not in ("kill_worker", "stop_worker"))
             and (backend == "postgres" or kind != "db_restart")
             and (kind != "batch_refused" or any(not m.startswith("anthropic:") for m in models))]
    faults = []
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(kinds)
        if mode == "online":
            at = float(rng.randint(1, max(1, int(tasks * 0.8))))
        else:
            at = 0.0 if kind in ("kill_after_accept", "batch_refused") else round(rng.uniform(0.2, 4.0), 2)
        arg = lasts = 0.0
        if kind in _SERVER:
            arg, lasts = rng.choice(_SERVER[kind][1]), round(rng.uniform(0.5, 3.0), 2)
        elif kind == "db_restart":
            arg = round(rng.uniform(0.2, 1.5), 2)
        elif kind in ("kill_worker", "stop_worker"):
            arg = float(rng.randint(1, workers - 1))
        faults.append(Fault(kind, at, arg, lasts))
    faults.sort(key=lambda f: f.at)
    named = mode == "online" and rng.random() < 0.3  # Batch API stages run in the process that made the run
    return Scenario(seed, mode, backend, models, rows, option_seeds, workers, concurrency, latency, batch_delay,
                    budget, named, tuple(faults))
