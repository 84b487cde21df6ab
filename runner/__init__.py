"""llm-job-runner: run LLM API jobs from YAML files, cached, resumable, with cost control.

The Python API (:mod:`runner.api`)::

    from runner import run_job, load_results

    run = run_job("jobs/quickstart.yaml")      # or a dict: the job file's content
    df = run.results()                         # one row per task, a pandas DataFrame

The names are imported on first use, so ``import runner`` (and the ``runner`` command) stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runner.api import RunFailed, RunResult, arun_job, load_results, run_job

__all__ = ["RunFailed", "RunResult", "arun_job", "load_results", "run_job"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from runner import api

        return getattr(api, name)
    raise AttributeError(f"module 'runner' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
