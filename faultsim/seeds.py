"""One seed from draw to verdict: drawn, run (or passed over when this machine cannot run its draw, or ``--only``
leaves it out), checked, and its files left for a look; the verdict prints itself and the command replaying it."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from faultsim.checks import check_all
from faultsim.draw import Scenario, draw
from faultsim.run import Env, SeedRun

__all__ = ["Verdict", "run_seed"]


@dataclass
class Verdict:
    scenario: Scenario
    passed_over: str | None = None  #: why the seed was not run
    violations: dict[str, list[str]] = field(default_factory=dict)  #: guarantee -> how it was broken
    injected: Counter = field(default_factory=Counter)
    not_reached: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    resumes: int = 0
    status: str = ""
    seconds: float = 0.0
    folder: str = ""

    def line(self) -> str:
        s = self.scenario
        if self.passed_over:
            return f"seed {s.seed}: passed over ({self.passed_over})"
        done = ", ".join(f"{kind} x{n}" if n > 1 else kind for kind, n in sorted(self.injected.items())) or "none"
        verdict = "VIOLATED " + ", ".join(self.violations) if self.violations else "ok"
        return (f"seed {s.seed}: {verdict} | {s.mode} {s.backend} {s.workers}p {s.tasks} tasks | faults done: {done}"
                f" | {self.status}, {self.resumes} resume(s), {self.seconds:.1f} s")

    def details(self) -> str:
        lines = [self.scenario.describe()]
        for name, found in self.violations.items():
            lines += [f"  {name}: {message}" for message in found]
        if self.not_reached:
            lines.append(f"  not reached: {'; '.join(self.not_reached)}")
        if self.skipped:
            lines.append(f"  skipped: {'; '.join(self.skipped)}")
        lines.append(f"  files: {self.folder}")
        lines.append(f"  replay: python scripts/chaos.py --seed {self.scenario.seed}")
        return "\n".join(lines)


def _left_out(scenario: Scenario, only: str | None) -> bool:
    if only in ("sqlite", "postgres"):
        return scenario.backend != only
    if only in ("online", "batch"):
        return scenario.mode != only
    if only == "workers":
        return scenario.workers < 2
    if only is not None:  # a fault's kind: the draws with that fault
        return all(fault.kind != only for fault in scenario.faults)
    return False


def run_seed(seed: int, env: Env, only: str | None = None) -> Verdict:
    scenario = draw(seed)
    verdict = Verdict(scenario)
    if _left_out(scenario, only):
        verdict.passed_over = f"--only {only}"
        return verdict
    if scenario.backend == "postgres" and env.pg is None:
        verdict.passed_over = "a PostgreSQL draw, and no PostgreSQL server here"
        return verdict
    started = time.monotonic()
    seed_run = SeedRun(scenario, env)
    record = seed_run.prepare()
    try:
        seed_run.run()
        found = check_all(scenario, record)
    finally:
        seed_run.cleanup()
    verdict.violations = {name: lines for name, lines in found.items() if lines}
    verdict.injected, verdict.not_reached, verdict.skipped = record.injected, record.not_reached, record.skipped
    verdict.resumes, verdict.status = record.resumes, record.status
    verdict.seconds, verdict.folder = time.monotonic() - started, str(seed_run.folder)
    return verdict
