"""Whether a run goes on: the one flag every part of the engine reads before it starts something new, and the error
that ended the run, when one did."""

from __future__ import annotations

from dataclasses import dataclass

from runner.errors import RunnerError


@dataclass(slots=True)
class RunControl:
    #: set by the first Ctrl-C, a run budget that ran out, or an error that ends the run: nothing new is dispatched
    stopping: bool = False
    #: the error that ends the run (a provider that cannot start, a refused key, an exhausted quota)
    fatal: RunnerError | None = None

    def stop(self) -> None:
        self.stopping = True

    def fail(self, exc: RunnerError) -> None:
        """End the run with ``exc`` (the first such error is the one the run reports)."""
        if self.fatal is None:
            self.fatal = exc
        self.stopping = True
