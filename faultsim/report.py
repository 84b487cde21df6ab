"""The totals of a chaos run and its table: seeds run, faults done per kind (and drawn but not reached or not
possible here), violations per guarantee, with the seeds that broke each."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from faultsim.checks import CHECKS
from faultsim.draw import KINDS
from faultsim.seeds import Verdict

__all__ = ["Totals"]


@dataclass
class Totals:
    run: int = 0
    passed_over: Counter = field(default_factory=Counter)
    injected: Counter = field(default_factory=Counter)
    not_reached: int = 0
    skipped: int = 0
    resumes: int = 0
    modes: Counter = field(default_factory=Counter)
    violations: dict[str, list[int]] = field(default_factory=lambda: {name: [] for name in CHECKS})

    def add(self, verdict: Verdict) -> None:
        if verdict.passed_over:
            self.passed_over[verdict.passed_over] += 1
            return
        s = verdict.scenario
        self.run += 1
        self.injected.update(verdict.injected)
        self.not_reached += len(verdict.not_reached)
        self.skipped += len(verdict.skipped)
        self.resumes += verdict.resumes
        self.modes.update([s.mode, s.backend, f"{s.workers} process(es)"])
        for name in verdict.violations:
            self.violations[name].append(s.seed)

    @property
    def violated(self) -> int:
        return sum(len(seeds) for seeds in self.violations.values())

    def table(self, seconds: float) -> str:
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(self.modes.items()))
        lines = [f"seeds run: {self.run} in {seconds:.0f} s ({kinds}); resumes: {self.resumes}"]
        lines += [f"passed over: {n} ({why})" for why, n in self.passed_over.items()]
        lines += ["", "| fault | done |", "|---|---|"]
        lines += [f"| {kind} | {self.injected[kind]} |" for kind in KINDS]
        lines.append(f"| all | {sum(self.injected.values())} (drawn but not reached before the run ended: "
                     f"{self.not_reached}; not possible here: {self.skipped}) |")
        lines += ["", "| guarantee | violations | seeds |", "|---|---|---|"]
        for name, seeds in self.violations.items():
            lines.append(f"| {name} | {len(seeds)} | {' '.join(map(str, seeds[:20]))} |")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "passed_over": dict(self.passed_over), "injected": dict(self.injected),
                "not_reached": self.not_reached, "skipped": self.skipped, "resumes": self.resumes,
                "violations": self.violations}
